package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"

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
	return writeSealed(fsys, dir, baseName, lb)
}

// writeSealed replaces dir/name with v as sealed JSON, atomically (temp
// file, rename, dir sync): raft/base, raft/mark.
func writeSealed(fsys vfs.FS, dir, name string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(fsys, dir, name, base.Seal(body)); err != nil {
		return fmt.Errorf("raftlog: write %s: %w", name, err)
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
	// Against the commit on disk: raft needs commit ≥ FirstIndex-1 at
	// restart, and a power cut may take back a commit that was only written
	// (hardstate.go), so the commit written is synced first.
	if err := l.syncCommitLocked(); err != nil {
		return err
	}
	if c := l.durableCommitLocked(); i > c || i > l.synced {
		return fmt.Errorf("%w: %d, commit %d on disk, synced %d", ErrCompactUncommitted, i, c, l.synced)
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
	l.cache.dropBelow(l.first)
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
	if l.closed {
		return 0, l.stopped // its index files are unmapped
	}
	if i+1 < l.first || i > l.last {
		return 0, fmt.Errorf("raftlog: no entry %d (first %d, last %d)", i, l.first, l.last)
	}
	return l.dataEndAt(i)
}

// InstallBase resets the raft log in the raft directory dir to a base at
// a snapshot's index (design replication.md §3.5; raft.MemoryStorage's
// ApplySnapshot): FirstIndex becomes index+1, Term(index) is term, and
// the commitlog data up to the base ends at dataEnd, where the next DATA
// entry goes. In order, each step synced and each idempotent, so that a
// store finishing an interrupted install reruns them all: (1) the
// HardState's commit is raised to index and its term to term (raft
// requires commit ≥ FirstIndex-1 at restart; a term raised forgets the
// older term's vote, as raft's becomeFollower does); (2) raft/mark is
// removed and raft/base written; (3) the meta-log is emptied (the
// CONF/CMD payloads it held lie at or below the base); (4) every index
// file is deleted. The commitlog is the caller's to swap first. step, if
// set, is told each step done (a test seam for crash points). Nothing may
// have the files open.
func InstallBase(fsys vfs.FS, dir string, index, term uint64, dataEnd int64, step func(string)) error {
	if step == nil {
		step = func(string) {}
	}
	hs, err := openHardState(fsys, filepath.Join(dir, "hardstate"))
	if err != nil {
		return err
	}
	if c := hs.cur; c.Commit < index || c.Term < term {
		t, v := c.Term, c.Vote
		if term > t {
			t, v = term, 0
		}
		err = hs.write(t, v, max(c.Commit, index))
		if err == nil {
			err = hs.syncCommit() // the raised commit too: raft needs commit ≥ FirstIndex-1 at restart
		}
	}
	if cerr := hs.close(); err == nil && cerr != nil {
		err = fmt.Errorf("raftlog: close hardstate: %w", cerr)
	}
	if err != nil {
		return err
	}
	step("raftlog: hardstate")
	// raft/mark goes first: its meta-log offset would not hold once the
	// meta-log is emptied (mark.go).
	if err := removeMark(fsys, dir); err != nil {
		return err
	}
	if err := writeBase(fsys, dir, logBase{Index: index, Term: term, DataEnd: dataEnd}); err != nil {
		return err
	}
	step("raftlog: base")
	if err := fsys.MkdirAll(filepath.Join(dir, "meta-log")); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	ml, err := fsys.OpenFile(filepath.Join(dir, "meta-log", indexName(0)), true)
	if err != nil {
		return fmt.Errorf("raftlog: open meta-log: %w", err)
	}
	err = ml.Truncate(0)
	if err == nil {
		err = ml.Sync()
	}
	if cerr := ml.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftlog: empty the meta-log: %w", err)
	}
	step("raftlog: meta-log")
	idir := filepath.Join(dir, "index")
	if err := fsys.MkdirAll(idir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	ents, err := fsys.ReadDir(idir)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	for _, e := range ents {
		if e.IsDir || len(e.Name) != 20 {
			continue
		}
		if _, err := strconv.ParseUint(e.Name, 10, 64); err != nil {
			continue
		}
		if err := fsys.Remove(filepath.Join(idir, e.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("raftlog: remove index file %s: %w", e.Name, err)
		}
	}
	if err := base.SyncDir(fsys, idir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	step("raftlog: index")
	return nil
}

// InstallSnapshot is InstallBase on the open log, raft's ApplySnapshot:
// the log's files are closed, reset on disk, and opened again, and
// FirstIndex-1 = LastIndex = index, Term(index) = term, the data and
// durable ends dataEnd (the commitlog must have been swapped to the
// snapshot's files already: its end is dataEnd). An error stops the log.
func (l *Log) InstallSnapshot(index, term uint64, dataEnd int64, step func(string)) error {
	l.markMu.Lock() // a SaveMark under way writes its mark before InstallBase removes it
	defer l.markMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	if end := l.cl.MaxOffset(); end != dataEnd {
		return l.stop(fmt.Errorf("raftlog: install a snapshot ending at %d over a commitlog ending at %d", dataEnd, end))
	}
	if index+1 < l.first {
		return l.stop(fmt.Errorf("raftlog: install a snapshot at %d below the base %d", index, l.first-1))
	}
	err := l.closeFiles()
	l.hsMu.Lock()
	l.idx, l.metaLog, l.hs = nil, nil, nil
	l.hsMu.Unlock()
	if err != nil {
		return l.stop(err)
	}
	if err := InstallBase(l.opts.FS, l.opts.Dir, index, term, dataEnd, step); err != nil {
		return l.stop(err)
	}
	hs, err := openHardState(l.opts.FS, filepath.Join(l.opts.Dir, "hardstate"))
	if err != nil {
		return l.stop(err)
	}
	l.hsMu.Lock()
	l.hs = hs
	l.hsMu.Unlock()
	if l.metaLog, err = l.opts.FS.OpenFile(filepath.Join(l.opts.Dir, "meta-log", indexName(0)), true); err != nil {
		return l.stop(fmt.Errorf("raftlog: open meta-log: %w", err))
	}
	if l.idx, err = loadIndex(l.opts.FS, filepath.Join(l.opts.Dir, "index"), uint64(l.opts.IndexUnits), index+1); err != nil {
		return l.stop(err)
	}
	l.base = logBase{Index: index, Term: term, DataEnd: dataEnd}
	l.first, l.last = index+1, index
	l.cache.reset()
	l.dataEnd, l.metaEnd, l.metaDirty = dataEnd, 0, false
	l.synced, l.hot = index, index
	l.durableEnd.Store(dataEnd)
	l.mark, l.markSaved = markPoint{}, 0
	l.markCut++
	l.newestConf = confAt{known: true} // nothing past the base
	if l.pending != nil && l.pending.GetCommit() < index {
		l.pending = nil // superseded by the HardState InstallBase wrote
	}
	return nil
}

// CompactBelow drops the entries whose commitlog data lies below off,
// because retention is about to delete the files below off (design
// §3.5): Compact(i) for i the index before the first DATA entry at or
// past off (every entry when there is none), as far as entries are
// durably committed and applied (at most applied: raft reads the entries
// it has not handed out yet from the log). A DATA entry below off past
// that bound (it cannot be: retention keeps what is not indexed, and only
// applied entries are) is ErrCompactUncommitted, and the files must stay.
// Entries at or below FirstIndex-1 are gone already: nothing to do. So is
// a log without a DATA entry below off: no entry refers to the files that
// go, and compacting it would leave raft only snapshots for a follower
// behind it, of an empty commitlog they have no file for, which followers
// refuse (a group that had stored nothing stayed stuck so: TestGroupSim
// seed 4223).
func (l *Log) CompactBelow(off int64, applied uint64) error {
	l.mu.Lock()
	if l.stopped != nil {
		l.mu.Unlock()
		return l.stopped
	}
	if err := l.syncCommitLocked(); err != nil { // see Compact
		l.mu.Unlock()
		return err
	}
	limit := min(l.durableCommitLocked(), l.synced, applied)
	i := l.last
	below := false // a DATA entry below off
	for j := l.first; j <= l.last; j++ {
		u, err := l.unitLocked(j)
		if err != nil {
			l.mu.Unlock()
			return err
		}
		if u.Kind == KindData && u.Pos >= off {
			i = j - 1
			break
		}
		if u.Kind == KindData && j > limit {
			l.mu.Unlock()
			return fmt.Errorf("%w: entry %d holds data at %d, below %d, commit %d on disk", ErrCompactUncommitted, j, u.Pos, off, limit)
		}
		below = below || u.Kind == KindData
	}
	i = min(i, limit)
	first := l.first
	l.mu.Unlock()
	if i < first || !below {
		return nil
	}
	return l.Compact(i)
}
