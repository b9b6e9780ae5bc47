package raftlog

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// recover reconciles the index with the commitlog and the meta-log (design
// §3.4 steps 2-5). The commitlog has been recovered by its own scan
// (commitlog.Recover: records checked from the checkpoint on, a torn tail
// past the flushed offset cut). The durable end is the last index whose
// unit, and every unit before it, holds: unit CRC, term not below its
// predecessor's, and a payload that is there: a DATA entry's
// [pos, pos+len) continues the previous DATA entry (or starts the next
// file behind a blank), lies inside the recovered commitlog, and, unless
// it ends below where the commitlog's scan started (Options.Checked: its
// bytes are not read), starts with a record whose PHYSICALOFFSET is pos
// and (past the checkpoint's flushed offset, where the commitlog scan did
// not vouch for it) matches dataCRC; a CONF/CMD payload continues the
// meta-log and matches dataCRC.
//
// Past the durable end everything is cut, keeping copies: commitlog bytes
// in commitlog/<offset>.broken, the index units zeroed (and synced), the
// meta-log cut. A durable end below HardState.Commit (an entry this node
// acknowledged as part of a quorum is gone: etcd-raft would panic with
// "tocommit is out of range") or DATA ending below the checkpoint's
// flushed offset is a *CorruptionError: the node refuses to start and
// never truncates acknowledged entries.
func (l *Log) recover() error {
	metaSize, err := l.opts.FS.Size(filepath.Join(l.opts.Dir, "meta-log", indexName(0)))
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	fileSize := l.meta.FileSize
	clMin, clEnd := l.cl.MinOffset(), l.cl.MaxOffset()
	// From raft/mark when it holds (mark.go), else from the base.
	from, conf := l.loadMark(metaSize, clEnd)
	dEnd, mEnd := from.DataEnd, from.MetaEnd
	prevTerm := from.Term
	last := max(from.Index, l.first-1)
	why := ""
	for i := last + 1; ; i++ {
		b := l.idx.slot(i)
		if b == nil {
			break
		}
		u, err := DecodeUnit(b)
		if errors.Is(err, ErrUnitZero) {
			break
		}
		if err != nil {
			why = fmt.Sprintf("entry %d: %v", i, err)
			if j, ok := holdsAfter(l.idx, i); ok && i > l.hs.cur.Commit {
				// A kill -9 tears only the unit being written, the last
				// one; a power cut leaves each 32 B unit (inside one
				// sector) old or new. A damaged unit with units that hold
				// after it is damage to synced, possibly acknowledged
				// entries (design §3.4): never cut them.
				return &base.CorruptionError{File: "raft/index/" + indexName(i-i%l.idx.units), Offset: dEnd, Flushed: l.opts.Flushed,
					Reason: fmt.Sprintf("%s, past the commit index %d but followed by entry %d whose unit holds: damage to synced "+
						"entries, not a torn write (storaged replica repair --from PEER fetches them)", why, l.hs.cur.Commit, j)}
			}
			break
		}
		if u.Term < prevTerm {
			why = fmt.Sprintf("entry %d: term %d below its predecessor's %d", i, u.Term, prevTerm)
			break
		}
		if reason := l.checkPayload(u, dEnd, mEnd, metaSize, clMin, clEnd, fileSize); reason != "" {
			why = fmt.Sprintf("entry %d (%s, term %d, %d bytes at %d): %s", i, u.Kind, u.Term, u.Len, u.Pos, reason)
			break
		}
		switch u.Kind {
		case KindData:
			dEnd = u.Pos + int64(u.Len)
		case KindConf, KindCmd:
			mEnd = u.Pos + int64(u.Len)
			if u.Kind == KindConf {
				conf = confAt{index: i, known: true}
			}
		}
		prevTerm, last = u.Term, i
	}
	commit := l.hs.cur.Commit
	if commit > last {
		reason := fmt.Sprintf("HardState.Commit %d is past the last durable raft entry %d", commit, last)
		if why != "" {
			reason += " (" + why + ")"
		}
		return &base.CorruptionError{File: "raft/index/" + indexName((last+1)-(last+1)%l.idx.units), Offset: dEnd, Flushed: l.opts.Flushed, Reason: reason}
	}
	if dEnd < l.opts.Flushed {
		reason := fmt.Sprintf("the raft entries end at commitlog offset %d, below the flushed checkpoint", dEnd)
		if why != "" {
			reason += " (" + why + ")"
		}
		return &base.CorruptionError{File: "raft/index", Offset: dEnd, Flushed: l.opts.Flushed, Reason: reason}
	}
	// Cut past the durable end, keeping copies.
	if err := l.cutCommitlog(dEnd, ".broken"); err != nil {
		return err
	}
	if metaSize > mEnd {
		if err := l.metaLog.Truncate(mEnd); err != nil {
			return fmt.Errorf("raftlog: cut meta-log: %w", err)
		}
		if err := l.metaLog.Sync(); err != nil {
			return fmt.Errorf("raftlog: sync meta-log: %w", err)
		}
	}
	if err := l.saveUnits(last + 1); err != nil {
		return err
	}
	if _, err := l.idx.zeroFrom(last + 1); err != nil {
		return err
	}
	// What survived may sit unsynced in the page cache after a kill -9:
	// make it durable before raft builds on it.
	if _, err := l.cl.Sync(0); err != nil {
		return fmt.Errorf("raftlog: sync commitlog: %w", err)
	}
	if err := l.idx.sync(l.first, last); err != nil {
		return err
	}
	if err := l.metaLog.Sync(); err != nil {
		return fmt.Errorf("raftlog: sync meta-log: %w", err)
	}
	l.last, l.dataEnd, l.metaEnd = last, dEnd, mEnd
	l.synced, l.hot = last, last
	l.durableEnd.Store(dEnd)
	l.newestConf = conf
	l.mark = markPoint{logBase{Index: last, DataEnd: dEnd, MetaEnd: mEnd}, conf}
	l.walked, l.walkedTo = max(from.Index, l.first-1)+1, last
	if from.Index >= l.first {
		l.markSaved = from.Index
	}
	return nil
}

// checkPayload says why u's payload is not there, or "".
func (l *Log) checkPayload(u Unit, dEnd, mEnd, metaSize, clMin, clEnd, fileSize int64) string {
	switch u.Kind {
	case KindEmpty:
		return ""
	case KindConf, KindCmd:
		if u.Pos != mEnd {
			return fmt.Sprintf("meta-log payload at %d, the previous one ends at %d", u.Pos, mEnd)
		}
		if u.Pos+int64(u.Len) > metaSize {
			return fmt.Sprintf("the meta-log ends at %d", metaSize)
		}
		b := make([]byte, u.Len)
		if _, err := l.metaLog.ReadAt(b, u.Pos); err != nil && u.Len > 0 {
			return "read meta-log: " + err.Error()
		}
		if crc32c(b) != u.DataCRC {
			return "payload CRC mismatch"
		}
		return ""
	}
	// DATA.
	blank := u.Flags&FlagBlank != 0
	switch {
	case !blank && u.Pos != dEnd:
		return fmt.Sprintf("the previous DATA entry ends at %d", dEnd)
	case blank && (u.Pos%fileSize != 0 || u.Pos != dEnd-dEnd%fileSize+fileSize || dEnd%fileSize == 0):
		return fmt.Sprintf("a blank cannot take it from %d to %d", dEnd, u.Pos)
	case u.Pos+int64(u.Len) > clEnd:
		return fmt.Sprintf("the recovered commitlog ends at %d", clEnd)
	case u.Pos < clMin:
		return fmt.Sprintf("the commitlog starts at %d", clMin) // retention and snapshots come later
	case u.Pos+int64(u.Len) <= l.opts.Checked:
		return "" // below the commitlog scan's start: taken on its unit (Options.Checked)
	}
	l.cl.ReadLock()
	defer l.cl.ReadUnlock()
	b := l.cl.At(u.Pos)
	if int64(len(b)) < int64(u.Len) || len(b) < record.PosPhysOffset+8 {
		return "its bytes cross a file end"
	}
	if got := record.PhysOffset(b); got != u.Pos {
		return fmt.Sprintf("the record there has PHYSICALOFFSET %d", got)
	}
	if u.Pos+int64(u.Len) > l.opts.Flushed && crc32c(b[:u.Len]) != u.DataCRC {
		return "payload CRC mismatch"
	}
	return ""
}

// saveUnits copies the non-zero units from index k on, up to the last
// non-zero one, to raft/index/<k>.broken before recovery zeroes them.
func (l *Log) saveUnits(k uint64) error { return saveUnits(l.opts.FS, l.opts.Dir, l.idx, k) }

// saveUnits copies the non-zero units of x from index k on, up to the
// last non-zero one, to <dir>/index/<k>.broken (recovery's cut, and
// repair's).
func saveUnits(fsys vfs.FS, dir string, x *index, k uint64) error {
	last, ok := x.lastNonZero(k)
	if !ok {
		return nil
	}
	saved := make([]byte, 0, (last-k+1)*UnitSize)
	for i := k; i <= last; i++ {
		saved = append(saved, x.slot(i)...)
	}
	name := filepath.Join(dir, "index", indexName(k)+".broken")
	if err := fsys.WriteFile(name, saved); err != nil {
		return fmt.Errorf("raftlog: save the cut index units: %w", err)
	}
	return nil
}

// holdsAfter finds a unit of x that holds after index i, before the first
// zero unit: recovery and the offline repair both ask it.
func holdsAfter(x *index, i uint64) (uint64, bool) {
	for j := i + 1; ; j++ {
		b := x.slot(j)
		if b == nil {
			return 0, false
		}
		if _, err := DecodeUnit(b); err == nil {
			return j, true
		} else if errors.Is(err, ErrUnitZero) {
			return 0, false
		}
	}
}
