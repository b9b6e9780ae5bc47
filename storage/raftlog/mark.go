package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// raft/mark is where recovery's walk of the index may start (design §3.4
// step 3 scans the index from the checkpoint): an entry whose unit and
// every unit before it were synced, with its term and the commitlog and
// meta-log offsets past the DATA and CONF/CMD payloads up to it, the
// shape of raft/base. Without it the walk starts at FirstIndex and
// decodes every retained unit (4.5 M of them, 144 MB of index, for 5.3 GB
// of commitlog: BENCHMARKS.md "A start reads what recovery checks"), so a
// start would grow with retention.
//
// A mark is taken only if the unit at its index is still the very unit
// marked (the CRC of its 32 bytes: term, kind, position, length, data
// CRC). One leader makes at most one entry per index and term (Log
// Matching), so the entry there is the one marked, with the same entries
// before it: the same DATA positions (stamped by the leader) and the same
// meta-log positions (appended in order from the same base). A truncation
// that cut the marked entry left a zero unit or another entry there: the
// mark is ignored and the walk starts at FirstIndex. What changes
// positions otherwise removes the mark first: a snapshot install
// (InstallBase empties the meta-log) and the offline repair.
//
// The units below a mark are not checked at start: damage there is found
// by the reads that cross it (unitLocked, Entries), by `storaged replica
// repair`, which walks every unit, and by a start without a mark.
const markName = "mark"

// confAt is the newest CONF entry at or below some index (0: none from
// FirstIndex on), when known.
type confAt struct {
	index uint64
	known bool
}

// markPoint is what raft/mark is written from: a synced entry, the ends
// up to it, and its confAt.
type markPoint struct {
	logBase
	conf confAt
}

// logMark is raft/mark: logBase for the marked entry, and the CRC-32C of
// its unit.
type logMark struct {
	logBase
	UnitCRC uint32 `json:"unit_crc"`
	// LastConf is the newest CONF entry at or below Index (0: none from
	// FirstIndex on); absent when it was not known (LastConf).
	LastConf *uint64 `json:"last_conf,omitempty"`
}

// MarkEvery is how many entries past the last raft/mark the synced log
// must be before the store's checkpoint writes a new one (SaveMark): a
// start after a crash walks at most about this many units past it, plus
// those synced since, and the mark costs one small synced write per this
// many entries.
const MarkEvery = 1 << 16

// SaveMark writes raft/mark for the last synced entry when it is at least
// every entries past the mark written last (1: whenever it moved, as a
// clean close does). It syncs nothing of the log: the mark names only
// what Sync made durable. A failure costs the next start a longer walk,
// nothing else; the caller may log it and go on.
func (l *Log) SaveMark(every uint64) error {
	l.markMu.Lock()
	defer l.markMu.Unlock()
	l.mu.Lock()
	mp, cut := l.mark, l.markCut
	m := mp.logBase
	if l.stopped != nil || l.idx == nil || m.Index == 0 || m.Index < l.first || m.Index < l.markSaved+max(every, 1) {
		l.mu.Unlock()
		return nil
	}
	slot := l.idx.slot(m.Index)
	u, err := l.unitLocked(m.Index)
	var sum uint32
	if err == nil {
		sum = crc32c(slot)
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	m.Term = u.Term
	mk := logMark{logBase: m, UnitCRC: sum}
	if mp.conf.known {
		mk.LastConf = &mp.conf.index
	}
	if err := writeMark(l.opts.FS, l.opts.Dir, mk); err != nil {
		return err
	}
	l.mu.Lock()
	if l.markCut == cut {
		l.markSaved = m.Index
	}
	l.mu.Unlock()
	return nil
}

// RecoveryWalk says where Open's walk of the index began (FirstIndex, or
// past raft/mark) and the last index it recovered: it checked the units
// from..last (none when from > last).
func (l *Log) RecoveryWalk() (from, last uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.walked, l.walkedTo
}

func writeMark(fsys vfs.FS, dir string, m logMark) error { return writeSealed(fsys, dir, markName, m) }

// removeMark removes dir/mark durably (InstallBase, Repair).
func removeMark(fsys vfs.FS, dir string) error {
	if err := fsys.Remove(filepath.Join(dir, markName)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("raftlog: remove mark: %w", err)
	}
	if err := base.SyncDir(fsys, dir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return nil
}

// loadMark is where recovery's walk starts: raft/mark when it holds (a
// sealed file whose index lies in the log, whose unit is the one marked
// and ends where the mark says, and whose offsets lie inside the recovered
// commitlog and meta-log), else the base. Any doubt walks from the base,
// which checks everything. conf is the mark's (not known if it recorded
// none); from the base, none yet.
func (l *Log) loadMark(metaSize, clEnd int64) (logBase, confAt) {
	fromBase := confAt{known: true}
	b, err := l.opts.FS.ReadFile(filepath.Join(l.opts.Dir, markName))
	if err != nil {
		return l.base, fromBase
	}
	body, ok := base.Unseal(b)
	var mk logMark
	m := &mk.logBase
	if !ok || json.Unmarshal(body, &mk) != nil || m.Index < l.first || m.Term < l.base.Term ||
		m.DataEnd < l.base.DataEnd || m.DataEnd > clEnd || m.MetaEnd < l.base.MetaEnd || m.MetaEnd > metaSize {
		return l.base, fromBase
	}
	slot := l.idx.slot(m.Index)
	if slot == nil {
		return l.base, fromBase
	}
	u, err := DecodeUnit(slot)
	if err != nil || u.Term != m.Term || crc32c(slot) != mk.UnitCRC {
		return l.base, fromBase
	}
	switch u.Kind {
	case KindData:
		ok = u.Pos+int64(u.Len) == m.DataEnd
	case KindConf, KindCmd:
		ok = u.Pos+int64(u.Len) == m.MetaEnd
	}
	if !ok {
		return l.base, fromBase
	}
	var conf confAt
	if mk.LastConf != nil {
		conf = confAt{index: *mk.LastConf, known: true}
	}
	return *m, conf
}
