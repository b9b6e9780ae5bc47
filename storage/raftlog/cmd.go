package raftlog

import (
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
)

// LastCmd finds the newest CMD entry in [lo, hi] whose payload match
// accepts, scanning the units backwards from hi to lo (FirstIndex if
// higher; the caller knows the newest below lo some other way): a
// store recovers state that CMD entries replicate (the delay scheduler's
// progress, design replication.md §3.5) without replaying the log, since
// raft restarts at Applied = the commit index and never hands those
// entries back. Only CMD payloads are read (from the meta-log, each
// checked against its unit's CRC); the scan stops at the first match.
// It returns the payload and its index, or nil and 0 when none matches.
func (l *Log) LastCmd(lo, hi uint64, match func([]byte) bool) ([]byte, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return nil, 0, l.stopped
	}
	hi = min(hi, l.last)
	for i := hi; i >= max(lo, l.first) && i > 0; i-- {
		u, err := l.unitLocked(i)
		if err != nil {
			return nil, 0, err
		}
		if u.Kind != KindCmd {
			continue
		}
		b := make([]byte, u.Len)
		if _, err := l.metaLog.ReadAt(b, u.Pos); err != nil && u.Len > 0 {
			return nil, 0, fmt.Errorf("raftlog: read meta-log at %d for entry %d: %w", u.Pos, i, err)
		}
		if crc32c(b) != u.DataCRC {
			return nil, 0, l.corrupt(i, u, "payload CRC mismatch")
		}
		if match(b) {
			return b, i, nil
		}
	}
	return nil, 0, nil
}

// Cmds calls fn with every CMD entry in [lo, hi] whose payload match
// accepts, in log order (a store replays state kept in commands it may
// not have persisted itself: the topic table, from the index its file
// records). Entries below FirstIndex are gone (compacted): the scan starts
// at FirstIndex then. Payloads are checked against their units' CRCs.
func (l *Log) Cmds(lo, hi uint64, match func([]byte) bool, fn func(index uint64, b []byte) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	hi = min(hi, l.last)
	for i := max(lo, l.first, 1); i <= hi; i++ {
		u, err := l.unitLocked(i)
		if err != nil {
			return err
		}
		if u.Kind != KindCmd {
			continue
		}
		b := make([]byte, u.Len)
		if _, err := l.metaLog.ReadAt(b, u.Pos); err != nil && u.Len > 0 {
			return fmt.Errorf("raftlog: read meta-log at %d for entry %d: %w", u.Pos, i, err)
		}
		if crc32c(b) != u.DataCRC {
			return l.corrupt(i, u, "payload CRC mismatch")
		}
		if match(b) {
			if err := fn(i, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// LastConf is the newest CONF entry at or below LastIndex (0: none from
// FirstIndex on), when known: from the walk of the index at Open and
// raft/mark, then from each Append; a truncation that cut it leaves it
// unknown (the entry before it is not looked for) until the next CONF
// entry or Open. The raft loop's restart replays conf entries (Confs)
// only when one lies past the membership raft/conf recorded: scanning
// for none walked every retained unit at each start (BENCHMARKS.md "A
// start reads what recovery checks").
func (l *Log) LastConf() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.newestConf.index, l.newestConf.known
}

// Confs calls fn with every CONF entry in [lo, hi], in log order, as
// raft's entry (type EntryConfChange or EntryConfChangeV2): the raft loop
// applies again, at a restart, the conf changes committed past the
// membership record raft/conf holds at the commit (see confName). Entries
// below FirstIndex are gone: the scan starts at FirstIndex then. fn runs
// without the Log's lock.
func (l *Log) Confs(lo, hi uint64, fn func(e *pb.Entry) error) error {
	var ents []*pb.Entry
	l.mu.Lock()
	if l.stopped != nil {
		l.mu.Unlock()
		return l.stopped
	}
	hi = min(hi, l.last)
	for i := max(lo, l.first, 1); i <= hi; i++ {
		u, err := l.unitLocked(i)
		if err == nil && u.Kind != KindConf {
			continue
		}
		var e *pb.Entry
		if err == nil {
			e, err = l.entryLocked(i)
		}
		if err == nil && crc32c(e.GetData()) != u.DataCRC {
			err = l.corrupt(i, u, "payload CRC mismatch")
		}
		if err != nil {
			l.mu.Unlock()
			return err
		}
		ents = append(ents, e)
	}
	l.mu.Unlock()
	for _, e := range ents {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}
