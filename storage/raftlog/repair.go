package raftlog

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// Range repair (design replication.md §3.4): a replica that refuses to
// start because entries it holds are damaged (a bit flip below the commit
// point, or in synced entries past it) fetches those entries from a peer
// and rewrites them in place. Raft's Log Matching property makes this
// exact: two logs holding an entry with the same index and term hold the
// same entries up to it, and Option A makes "the same entry" mean the same
// bytes at the same commitlog offset. So an entry whose own unit holds is
// taken from a peer only when the peer's unit is identical; one whose unit
// is damaged is taken when the peer's unit of a later entry this replica
// still holds is identical to it (the anchor), or when both sides have
// committed that index.

// RangeEntry is one raft entry as a peer ships it (FetchRange): its index
// unit as on disk and its payload (the commitlog bytes of a DATA entry,
// the meta-log payload of a CONF or CMD entry, nothing for EMPTY).
type RangeEntry struct {
	Index uint64
	Unit  []byte
	Data  []byte
}

// Range is what ReadRange returns: the entries and the serving replica's
// commit index and last synced index.
type Range struct {
	Commit, Last uint64
	Entries      []RangeEntry
}

// ReadRange copies entries [lo, hi) out of the log for a peer's repair, at
// most maxBytes of payload (at least one entry), only synced ones, each
// checked against its unit's CRCs (a damaged entry is never shipped: the
// error names it). An empty Range says the log ends before lo.
func (l *Log) ReadRange(lo, hi uint64, maxBytes int) (Range, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return Range{}, l.stopped
	}
	out := Range{Commit: l.hs.cur.Commit, Last: l.synced}
	if lo < l.first {
		return out, fmt.Errorf("raftlog: entries from %d are compacted (first %d)", lo, l.first)
	}
	size := 0
	for i := lo; i < hi && i <= l.synced; i++ {
		b := l.idx.slot(i)
		if b == nil {
			break
		}
		u, err := l.unitLocked(i)
		if err != nil {
			return out, err
		}
		if len(out.Entries) > 0 && size+int(u.Len) > maxBytes {
			break
		}
		e, err := l.entryLocked(i)
		if err != nil {
			return out, err
		}
		if crc32c(e.GetData()) != u.DataCRC && u.Kind != KindEmpty {
			return out, l.corrupt(i, u, "payload CRC mismatch")
		}
		out.Entries = append(out.Entries, RangeEntry{Index: i, Unit: bytes.Clone(b), Data: e.GetData()})
		size += int(u.Len)
	}
	return out, nil
}

// Fetcher fetches entries from lo on (and before hi) from a peer: the
// Range may hold fewer than hi-lo entries (a bounded chunk); an empty one
// says the peer's log ends before lo.
type Fetcher func(lo, hi uint64) (Range, error)

// RepairOptions configure Repair.
type RepairOptions struct {
	FS vfs.FS
	// Dir is the raft directory (the store's Dir/raft).
	Dir string
	// Commitlog is the store's commitlog opened offline (commitlog.Open,
	// neither recovered nor started), with the data dir locked.
	Commitlog *commitlog.Log
	// IndexUnits is Options.IndexUnits (0: read from the first index file).
	IndexUnits int
	// RequireCRC: every record carries the whole-record CRC.
	RequireCRC bool
	// Fetch reads entries from the peer.
	Fetch Fetcher
	// MaxDamaged bounds the damaged entries Repair takes on (0: 1<<20).
	MaxDamaged int
}

// Damage is one damaged entry.
type Damage struct {
	Index uint64 `json:"index"`
	What  string `json:"what"`
	// Torn: past the commit index and with an all-zero sector (or the
	// last unit): recovery cuts it, repair need not fetch it.
	Torn bool `json:"torn,omitempty"`
	// blankAt is the offset of a damaged END_OF_FILE blank before the
	// entry (the entry itself holds), -1 otherwise.
	blankAt int64
}

// RepairReport says what Repair found and did.
type RepairReport struct {
	Entries    uint64   `json:"entries"` // units checked
	Commit     uint64   `json:"commit"`  // this replica's HardState.Commit
	PeerCommit uint64   `json:"peer_commit"`
	Damaged    []Damage `json:"damaged"`
	Repaired   []uint64 `json:"repaired"`
	Bytes      int64    `json:"bytes"` // payload bytes rewritten
}

// ErrRepair wraps every refusal of Repair to take a peer's entry.
var ErrRepair = errors.New("raftlog: repair")

// Repair finds the damaged entries of the raft log in o.Dir (units that
// fail their CRC, payloads that fail the unit's data CRC), fetches them
// from a peer, checks them (unit CRC, data CRC, every record's CRCs and
// PHYSICALOFFSET, the identity rules above), rewrites payload then unit in
// place with a sync after each, and checks the log again. Damage that
// recovery calls torn (past the commit index, an all-zero sector, or the
// last unit) is left for recovery to cut when the peer has no identical
// entry. It refuses (ErrRepair) rather than guess: a peer that lacks an
// entry or holds another one at a damaged index names the index, and
// nothing of that entry is written.
func Repair(o RepairOptions) (RepairReport, error) {
	if o.IndexUnits <= 0 {
		o.IndexUnits = detectUnits(o.FS, o.Dir)
	}
	if o.MaxDamaged <= 0 {
		o.MaxDamaged = 1 << 20
	}
	var rep RepairReport
	if _, err := o.FS.ReadFile(filepath.Join(o.Dir, metaName)); err != nil {
		return rep, fmt.Errorf("%w: no raft/meta (not a group member's data dir?): %w", ErrRepair, err)
	}
	hsb, err := o.FS.ReadFile(filepath.Join(o.Dir, "hardstate"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("raftlog: read hardstate: %w", err)
	}
	hs, _ := decodeHardState(hsb)
	rep.Commit = hs.Commit
	mb, err := o.FS.ReadFile(filepath.Join(o.Dir, metaName))
	if err != nil {
		return rep, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(mb)
	var meta Meta
	if !ok || json.Unmarshal(body, &meta) != nil {
		return rep, fmt.Errorf("%w: raft/meta is damaged", ErrRepair)
	}
	lb, err := readBase(o.FS, o.Dir, meta)
	if err != nil {
		return rep, err
	}
	x, err := loadIndex(o.FS, filepath.Join(o.Dir, "index"), uint64(o.IndexUnits), lb.Index+1)
	if err != nil {
		return rep, err
	}
	defer x.close()
	metaLog, err := o.FS.OpenFile(filepath.Join(o.Dir, "meta-log", indexName(0)), true)
	if err != nil {
		return rep, fmt.Errorf("raftlog: open meta-log: %w", err)
	}
	defer metaLog.Close()
	r := &repairer{o: o, x: x, metaLog: metaLog, commit: hs.Commit, logBase: lb.DataEnd, first: lb.Index + 1}
	r.find()
	rep.Entries, rep.Damaged = r.last, r.damaged
	// A blank after a damaged unit is found once that unit is back: a
	// second pass takes it.
	for pass := 0; pass < 2 && len(r.damaged) > 0; pass++ {
		if err := r.repairAll(&rep); err != nil {
			return rep, err
		}
		r.damaged = nil
		r.find()
		if pass == 0 {
			for _, d := range r.damaged {
				if !slices.ContainsFunc(rep.Damaged, func(x Damage) bool { return x.Index == d.Index && x.blankAt == d.blankAt }) {
					rep.Damaged = append(rep.Damaged, d)
				}
			}
		}
	}
	for _, d := range r.damaged {
		if !d.Torn {
			return rep, fmt.Errorf("%w: entry %d is still damaged after the repair: %s", ErrRepair, d.Index, d.What)
		}
	}
	return rep, nil
}

// repairAll repairs r.damaged.
func (r *repairer) repairAll(rep *RepairReport) error {
	o := r.o
	if len(r.damaged) > o.MaxDamaged {
		return fmt.Errorf("%w: %d damaged entries, more than %d", ErrRepair, len(r.damaged), o.MaxDamaged)
	}
	for _, d := range r.damaged {
		if d.Torn && slices.Contains(rep.Repaired, d.Index) {
			continue
		}
		if d.blankAt >= 0 {
			// An END_OF_FILE blank: its bytes follow from the unit alone.
			if err := r.rewriteBlank(d.blankAt); err != nil {
				return err
			}
			rep.Repaired = append(rep.Repaired, d.Index)
			rep.Bytes += record.BlankLen
			continue
		}
		n, peerCommit, err := r.repair(d)
		rep.PeerCommit = max(rep.PeerCommit, peerCommit)
		if err != nil {
			return err
		}
		if n >= 0 {
			rep.Repaired = append(rep.Repaired, d.Index)
			rep.Bytes += n
		}
	}
	return nil
}

type repairer struct {
	o       RepairOptions
	x       *index
	metaLog vfs.File
	commit  uint64
	logBase int64  // the commitlog offset the walk starts at (raft/base's data end)
	first   uint64 // FirstIndex (raft/base's index + 1)
	last    uint64 // the last index whose unit holds (or commit, if above)
	damaged []Damage
}

// find walks the units from FirstIndex to the last one that holds (or the
// commit index) and records the damaged entries.
func (r *repairer) find() {
	var cand []Damage
	r.last = r.first - 1
	dEnd := r.logBase
	for i := r.first; ; i++ {
		b := r.x.slot(i)
		if b == nil {
			break
		}
		u, err := DecodeUnit(b)
		if errors.Is(err, ErrUnitZero) && i > r.commit {
			if _, ok := holdsAfter(r.x, i); !ok {
				break
			}
		}
		if err != nil {
			cand = append(cand, Damage{Index: i, What: "unit: " + err.Error(), blankAt: -1})
			dEnd = -1 // unknown until the next DATA unit that holds
			continue
		}
		r.last = i
		if u.Kind == KindData && u.Flags&FlagBlank != 0 && dEnd >= 0 && u.Pos > dEnd {
			size := r.o.Commitlog.FileSize()
			b := r.o.Commitlog.At(dEnd)
			if len(b) < record.BlankLen || !record.IsBlank(b) || int64(binary.BigEndian.Uint32(b)) != size-dEnd%size {
				cand = append(cand, Damage{Index: i, What: fmt.Sprintf("the END_OF_FILE blank at %d before entry %d", dEnd, i), blankAt: dEnd})
			}
		}
		if what, torn := r.checkPayload(u); what != "" {
			cand = append(cand, Damage{Index: i, What: fmt.Sprintf("%s entry (term %d, %d bytes at %d): %s", u.Kind, u.Term, u.Len, u.Pos, what),
				Torn: torn && i > r.commit, blankAt: -1})
		}
		if u.Kind == KindData {
			dEnd = u.Pos + int64(u.Len)
		}
	}
	end := max(r.last, r.commit)
	for _, d := range cand {
		if d.Index > end {
			break // a torn last unit: recovery cuts it
		}
		r.damaged = append(r.damaged, d)
	}
}

// checkPayload says why u's payload fails its CRC ("" if it holds) and
// whether the damage has an all-zero sector.
func (r *repairer) checkPayload(u Unit) (string, bool) {
	switch u.Kind {
	case KindEmpty:
		return "", false
	case KindConf, KindCmd:
		b := make([]byte, u.Len)
		if _, err := r.metaLog.ReadAt(b, u.Pos); err != nil && u.Len > 0 {
			return "read meta-log: " + err.Error(), false
		}
		if crc32c(b) != u.DataCRC {
			return "meta-log payload CRC mismatch", false
		}
		return "", false
	}
	cl := r.o.Commitlog
	b := cl.At(u.Pos)
	if int64(len(b)) < int64(u.Len) {
		return "its commitlog bytes are missing", true
	}
	b = b[:u.Len]
	if crc32c(b) != u.DataCRC {
		return "commitlog bytes fail the data CRC", commitlog.HasZeroSector(b, u.Pos%cl.FileSize())
	}
	return "", false
}

// repair fetches and rewrites the damaged entry d. It returns the payload
// bytes written, or -1 when it left a torn entry for recovery.
func (r *repairer) repair(d Damage) (int64, uint64, error) {
	i := d.Index
	local := r.x.slot(i)
	_, uerr := DecodeUnit(local)
	anchor := i
	if uerr != nil {
		if j, ok := holdsAfter(r.x, i); ok {
			anchor = j
		} else {
			anchor = 0 // no later unit holds: only a commit on both sides identifies the entry
		}
	}
	hi := max(anchor, i) + 1
	got, err := r.fetch(i, hi)
	if err != nil {
		return 0, 0, err
	}
	peerCommit := got.Commit
	if len(got.Entries) == 0 || got.Entries[0].Index != i {
		if d.Torn {
			return -1, peerCommit, nil
		}
		return 0, peerCommit, fmt.Errorf("%w: the peer has no entry %d (its log ends at %d, commit %d): repair from another member, "+
			"the leader holds every committed entry", ErrRepair, i, got.Last, got.Commit)
	}
	e := got.Entries[0]
	pu, err := DecodeUnit(e.Unit)
	if err != nil || len(e.Unit) != UnitSize {
		return 0, peerCommit, fmt.Errorf("%w: the peer's unit of entry %d: %v", ErrRepair, i, err)
	}
	same := false
	switch {
	case uerr == nil:
		same = bytes.Equal(e.Unit, local)
	case anchor > i:
		a := got.Entries[len(got.Entries)-1]
		same = a.Index == anchor && bytes.Equal(a.Unit, r.x.slot(anchor))
	}
	if !same && i <= r.commit && i <= got.Commit && uerr != nil {
		same = true // committed on both sides: one entry per index
	}
	if !same {
		if d.Torn {
			return -1, peerCommit, nil
		}
		return 0, peerCommit, fmt.Errorf("%w: the peer's entry %d (term %d) is not this replica's (raft says an entry is the "+
			"same only with the same index and term): repair from another member, the leader holds every committed entry",
			ErrRepair, i, pu.Term)
	}
	if err := r.verify(i, pu, e.Data); err != nil {
		return 0, peerCommit, err
	}
	if err := r.write(i, pu, e); err != nil {
		return 0, peerCommit, err
	}
	return int64(len(e.Data)), peerCommit, nil
}

// fetch reads [lo, hi) from the peer, chunk by chunk.
func (r *repairer) fetch(lo, hi uint64) (Range, error) {
	var out Range
	for next := lo; next < hi; {
		got, err := r.o.Fetch(next, hi)
		if err != nil {
			return out, fmt.Errorf("%w: fetch entries [%d, %d): %w", ErrRepair, next, hi, err)
		}
		out.Commit, out.Last = got.Commit, got.Last
		if len(got.Entries) == 0 {
			break
		}
		for k, e := range got.Entries {
			if e.Index != next+uint64(k) || e.Index >= hi {
				return out, fmt.Errorf("%w: the peer sent entry %d, want %d", ErrRepair, e.Index, next+uint64(k))
			}
		}
		out.Entries = append(out.Entries, got.Entries...)
		next += uint64(len(got.Entries))
	}
	return out, nil
}

// verify checks a peer's payload against its unit and, for DATA, every
// record: CRCs, and PHYSICALOFFSET where it will lie.
func (r *repairer) verify(i uint64, u Unit, data []byte) error {
	if int64(len(data)) != int64(u.Len) || (u.Kind != KindEmpty && crc32c(data) != u.DataCRC) {
		return fmt.Errorf("%w: the peer's payload of entry %d (%d bytes) does not match its unit (%d bytes)", ErrRepair, i, len(data), u.Len)
	}
	if u.Kind != KindData {
		return nil
	}
	for off := 0; off < len(data); {
		h, err := record.Check(data[off:], r.o.RequireCRC)
		if err != nil {
			return fmt.Errorf("%w: the peer's entry %d: record at +%d: %w", ErrRepair, i, off, err)
		}
		if h.PhysOffset != u.Pos+int64(off) {
			return fmt.Errorf("%w: the peer's entry %d: record at +%d stamped for %d, lies at %d", ErrRepair, i, off, h.PhysOffset, u.Pos+int64(off))
		}
		off += int(h.Total)
	}
	if b := r.o.Commitlog.At(u.Pos); int64(len(b)) < int64(u.Len) {
		return fmt.Errorf("%w: entry %d's place in the commitlog (%d bytes at %d) is not in this replica's files", ErrRepair, i, u.Len, u.Pos)
	}
	return nil
}

// write puts the payload in place and syncs it, then the unit, as Append
// and Sync order them.
func (r *repairer) write(i uint64, u Unit, e RangeEntry) error {
	switch u.Kind {
	case KindData:
		if err := r.o.Commitlog.Rewrite(u.Pos, e.Data); err != nil {
			return fmt.Errorf("raftlog: repair entry %d: %w", i, err)
		}
	case KindConf, KindCmd:
		if _, err := r.metaLog.WriteAt(e.Data, u.Pos); err != nil {
			return fmt.Errorf("raftlog: repair entry %d: write meta-log: %w", i, err)
		}
		if err := r.metaLog.Sync(); err != nil {
			return fmt.Errorf("raftlog: repair entry %d: sync meta-log: %w", i, err)
		}
	}
	copy(r.x.slot(i), e.Unit)
	return r.x.sync(i, i)
}

// rewriteBlank writes the END_OF_FILE blank at off (to its file's end)
// and syncs it.
func (r *repairer) rewriteBlank(off int64) error {
	size := r.o.Commitlog.FileSize()
	b := make([]byte, record.BlankLen)
	record.PutBlank(b, int(size-off%size))
	if err := r.o.Commitlog.Rewrite(off, b); err != nil {
		return fmt.Errorf("raftlog: repair the blank at %d: %w", off, err)
	}
	return nil
}
