package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"go.etcd.io/raft/v3"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// logBase is raft/base: where the raft log starts once it was compacted
// (design §3.5: FirstIndex moves up, to the start of the catch-up window
// or past what retention deleted). Index is FirstIndex-1, the last entry
// dropped; Term its term (Term(FirstIndex-1) answers it); DataEnd and
// MetaEnd the commitlog and meta-log offsets past the last DATA and
// CONF/CMD payloads up to it, where recovery's walk of the index starts.
// Absent: index 0, term 0, DataEnd = raft/meta's LogBase, MetaEnd 0.
type logBase struct {
	Index   uint64 `json:"index"`
	Term    uint64 `json:"term"`
	DataEnd int64  `json:"data_end"`
	MetaEnd int64  `json:"meta_end"`
}

const baseName = "base"

// readBase reads dir/base, or the bootstrap base of meta when there is none.
func readBase(fsys vfs.FS, dir string, meta Meta) (logBase, error) {
	b, err := fsys.ReadFile(filepath.Join(dir, baseName))
	if errors.Is(err, fs.ErrNotExist) {
		return logBase{DataEnd: meta.LogBase}, nil
	}
	if err != nil {
		return logBase{}, fmt.Errorf("raftlog: read base: %w", err)
	}
	body, ok := base.Unseal(b)
	var lb logBase
	if !ok || json.Unmarshal(body, &lb) != nil || lb.DataEnd < meta.LogBase || lb.MetaEnd < 0 {
		return logBase{}, &base.CorruptionError{File: "raft/base", Reason: "raft/base is damaged"}
	}
	return lb, nil
}

// writeBase replaces dir/base atomically (temp file, rename, dir sync).
func writeBase(fsys vfs.FS, dir string, lb logBase) error {
	body, err := json.Marshal(lb)
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(fsys, dir, baseName, base.Seal(body)); err != nil {
		return fmt.Errorf("raftlog: write base: %w", err)
	}
	return nil
}

// ErrCompactUncommitted: Compact past the durable commit index.
var ErrCompactUncommitted = errors.New("raftlog: compaction past the durable commit index")

// Compact drops the entries up to and including i, as
// raft.MemoryStorage.Compact does: FirstIndex becomes i+1 and Term(i)
// stays answerable (the base). Only durably committed entries may go (i
// at most the HardState commit on disk). raft/base is written first
// (atomically), then the index files wholly below the new FirstIndex are
// deleted; a crash between the two leaves files that the next Open
// ignores and deletes. The commitlog is not touched: retention deletes
// its files, never past the data the log still holds (DataEnd of the
// base). i at or below FirstIndex-1 is raft.ErrCompacted.
func (l *Log) Compact(i uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	if i < l.first {
		return fmt.Errorf("raftlog: compact %d: %w", i, raft.ErrCompacted)
	}
	if i > l.hs.cur.Commit || i > l.synced {
		return fmt.Errorf("%w: %d, commit %d on disk, synced %d", ErrCompactUncommitted, i, l.hs.cur.Commit, l.synced)
	}
	u, err := l.unitLocked(i)
	if err != nil {
		return err
	}
	d, err := l.dataEndAt(i)
	if err != nil {
		return err
	}
	m, err := l.metaEndAt(i)
	if err != nil {
		return err
	}
	lb := logBase{Index: i, Term: u.Term, DataEnd: d, MetaEnd: m}
	if err := writeBase(l.opts.FS, l.opts.Dir, lb); err != nil {
		return l.stop(err)
	}
	l.base, l.first = lb, i+1
	if err := l.idx.dropBelow(l.first); err != nil {
		return l.stop(err)
	}
	return nil
}

// Base returns FirstIndex-1, its term and the commitlog offset past the
// last DATA entry up to it: what a snapshot of the compacted prefix
// covers, and the lowest end retention must keep the commitlog files of
// (everything from DataEnd on is still entries the log serves).
func (l *Log) Base() (index, term uint64, dataEnd int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.base.Index, l.base.Term, l.base.DataEnd
}

// DataEndAt is the commitlog offset past the last DATA entry at or below
// index i (FirstIndex-1 ≤ i ≤ LastIndex): the commit end a snapshot at i
// covers.
func (l *Log) DataEndAt(i uint64) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i+1 < l.first || i > l.last {
		return 0, fmt.Errorf("raftlog: no entry %d (first %d, last %d)", i, l.first, l.last)
	}
	return l.dataEndAt(i)
}
