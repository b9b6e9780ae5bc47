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
//
// The same Log Matching, read backwards, says when a peer provably lacks
// this replica's entry i: its log ends before i, or it holds another entry
// (another unit) at i or at any index below i where this replica's unit
// holds. A damaged entry past the commit index that no peer holds may be
// cut (the log truncated from it, the units kept in index/<i>.broken,
// the commitlog bytes cut by the next start's recovery, which keeps
// commitlog/<offset>.broken) only when it cannot have been committed: a
// commit needs a majority of the voters to hold the entry, the holders
// are among the voters not proven to lack it (this replica included: it
// held the entry and may have acknowledged it), so the voters proven to
// lack it must leave fewer than a majority. With 3 voters both peers must
// lack it; with 5, three of the four peers (two peers that are down could
// hold it, and with this replica they would be a majority).
//
// Repair also rebuilds the two small files a replica cannot start without:
// raft/meta from a peer's (rebuildMeta) and raft/hardstate from the
// peers' terms and commit indexes (rebuildHardState).

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

// Peer is one member Repair may ask: its raft id (as --from names it),
// its identity and raft state (the FetchState peer RPC; nil if unknown)
// and its entries (FetchRange).
type Peer struct {
	ID    uint64
	State func() (PeerState, error)
	Fetch Fetcher
}

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
	// Peers are the members to ask, in order (the leader first is best):
	// a damaged entry is taken from the first that holds it.
	Peers []Peer
	// Self is this member as its flags name it (node id, group, cluster
	// id, file size, members; LogBase unused). A damaged raft/meta is
	// rebuilt only with it; an intact one must match it. NodeID 0: not
	// given.
	Self Meta
	// Applied and AppliedTerm are the checkpoint's raft point
	// (consumequeue.RaftPoint): a rebuilt HardState commits at least
	// Applied, which this member applied and so saw committed.
	Applied, AppliedTerm uint64
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

// HardState is a HardState Repair wrote.
type HardState struct {
	Term   uint64 `json:"term"`
	Vote   uint64 `json:"vote"`
	Commit uint64 `json:"commit"`
}

// PeerAnswer is what one peer said about itself (State).
type PeerAnswer struct {
	ID      uint64 `json:"id"`
	Term    uint64 `json:"term,omitempty"`
	Commit  uint64 `json:"commit,omitempty"`
	Last    uint64 `json:"last,omitempty"`
	Joining bool   `json:"joining,omitempty"`
	Error   string `json:"error,omitempty"`
}

// RepairReport says what Repair found and did.
type RepairReport struct {
	Entries    uint64   `json:"entries"` // units checked
	Commit     uint64   `json:"commit"`  // this replica's HardState.Commit
	PeerCommit uint64   `json:"peer_commit"`
	Damaged    []Damage `json:"damaged"`
	Repaired   []uint64 `json:"repaired"`
	Bytes      int64    `json:"bytes"` // payload bytes rewritten
	// MetaRebuilt: raft/meta was damaged (or missing) and was rebuilt
	// from a peer's.
	MetaRebuilt bool `json:"meta_rebuilt,omitempty"`
	// HardState is the HardState written in place of a lost one (nil:
	// raft/hardstate held).
	HardState *HardState `json:"hardstate_rebuilt,omitempty"`
	// CutFrom is the index the log was cut from (0: none): a damaged
	// entry past the commit index that no peer holds and that cannot
	// have been committed.
	CutFrom uint64 `json:"cut_from,omitempty"`
	// Peers is what the peers asked said about themselves.
	Peers []PeerAnswer `json:"peers,omitempty"`
}

// ErrRepair wraps every refusal of Repair to take a peer's entry.
var ErrRepair = errors.New("raftlog: repair")

// Repair repairs the raft directory o.Dir of a stopped member from its
// peers. In order: (1) a damaged raft/meta (or a missing one while the
// log holds entries) is rebuilt from a peer's (rebuildMeta); (2) a lost
// raft/hardstate (no valid slot, or no file, while the log holds
// entries) is rebuilt from the peers' terms and commit indexes
// (rebuildHardState); (3) the damaged entries (units that fail their
// CRC, payloads that fail the unit's data CRC) are fetched from the
// first peer that holds the same entry, checked (unit CRC, data CRC,
// every record's CRCs and PHYSICALOFFSET, the identity rules above) and
// rewritten in place, payload then unit, with a sync after each; a
// damaged entry past the commit index that no peer holds is cut when the
// peers that provably lack it show it cannot have been committed. Damage
// that recovery calls torn (past the commit index, an all-zero sector,
// or the last unit) is left for recovery to cut when no peer has an
// identical entry. It refuses (ErrRepair) rather than guess, naming the
// entry or file and the members it needs to hear from; nothing of a
// refused entry is written.
func Repair(o RepairOptions) (rep RepairReport, err error) {
	if o.IndexUnits <= 0 {
		o.IndexUnits = detectUnits(o.FS, o.Dir)
	}
	if o.MaxDamaged <= 0 {
		o.MaxDamaged = 1 << 20
	}
	r := &repairer{o: o, rep: &rep, states: map[uint64]*peerState{}}
	defer r.reportPeers() // into the named result: what the peers said, also on a refusal
	// The repair's quorum rules count the voters of raft/meta, the
	// bootstrap membership: once raft/conf records a change they are not
	// the group's voters any more, so the steps that rest on them (a lost
	// raft/meta or raft/hardstate rebuilt, an uncommitted entry cut) are
	// refused then. Taking a peer's copy of an entry rests on Log
	// Matching alone, whatever the membership: that is still done.
	c, err := readConf(o.FS, o.Dir)
	if err != nil {
		return rep, fmt.Errorf("%w: %w: repair does not rebuild raft/conf; remove the member and add a new one (a new id, "+
			"an empty data dir) instead", ErrRepair, err)
	}
	r.changed = len(c.Records) > 0
	meta, rebuilt, err := r.readMeta()
	if err != nil {
		return rep, err
	}
	r.meta = meta
	lb, err := readBase(o.FS, o.Dir, meta)
	if err != nil {
		return rep, err
	}
	x, err := loadIndex(o.FS, filepath.Join(o.Dir, "index"), uint64(o.IndexUnits), lb.Index+1)
	if err != nil {
		return rep, err
	}
	defer x.close()
	r.x, r.logBase, r.first, r.base = x, lb.DataEnd, lb.Index+1, lb
	// The next start walks every unit again, as repair does (mark.go).
	if err := removeMark(o.FS, o.Dir); err != nil {
		return rep, err
	}
	if rebuilt {
		if err := r.writeMeta(); err != nil {
			return rep, err
		}
		rep.MetaRebuilt = true
	}
	if err := o.FS.MkdirAll(filepath.Join(o.Dir, "meta-log")); err != nil {
		return rep, fmt.Errorf("raftlog: %w", err)
	}
	metaLog, err := o.FS.OpenFile(filepath.Join(o.Dir, "meta-log", indexName(0)), true)
	if err != nil {
		return rep, fmt.Errorf("raftlog: open meta-log: %w", err)
	}
	defer metaLog.Close()
	r.metaLog = metaLog
	hs, found, err := readHardState(o.FS, o.Dir)
	if err != nil {
		return rep, err
	}
	if b := x.slot(r.first); !found && (lb.Index > 0 || (b != nil && !commitlog.AllZero(b))) {
		if hs, err = r.rebuildHardState(); err != nil {
			return rep, err
		}
		rep.HardState = &HardState{Term: hs.Term, Vote: hs.Vote, Commit: hs.Commit}
	}
	r.commit = hs.Commit
	rep.Commit = hs.Commit
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
		if rep.CutFrom != 0 && d.Index >= rep.CutFrom {
			break // cut with the entry before it
		}
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
		n, err := r.repair(d)
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
	rep     *RepairReport
	meta    Meta
	x       *index
	metaLog vfs.File
	commit  uint64
	base    logBase
	logBase int64  // the commitlog offset the walk starts at (raft/base's data end)
	first   uint64 // FirstIndex (raft/base's index + 1)
	last    uint64 // the last index whose unit holds (or commit, if above)
	damaged []Damage
	states  map[uint64]*peerState // State answers, by peer id
	oldMeta []byte                // the damaged raft/meta (nil: missing)
	// changed: raft/conf records a membership change, so raft/meta's
	// voters are not the group's (see Repair).
	changed bool
}

// peerState is one peer's State answer, asked once.
type peerState struct {
	st  PeerState
	err error
}

// state asks p for its state once; a peer that names itself with another
// id than --from gave it is an error.
func (r *repairer) state(p Peer) (PeerState, error) {
	if s, ok := r.states[p.ID]; ok {
		return s.st, s.err
	}
	s := &peerState{}
	if p.State == nil {
		s.err = errors.New("its state is not known (no FetchState)")
	} else if s.st, s.err = p.State(); s.err == nil && s.st.Meta.NodeID != p.ID {
		s.err = fmt.Errorf("%w: the member given as %d says it is member %d", ErrRepair, p.ID, s.st.Meta.NodeID)
	}
	r.states[p.ID] = s
	return s.st, s.err
}

// reportPeers copies the State answers into the report.
func (r *repairer) reportPeers() {
	for _, p := range r.o.Peers {
		s, ok := r.states[p.ID]
		if !ok {
			continue
		}
		a := PeerAnswer{ID: p.ID, Term: s.st.Term, Commit: s.st.Commit, Last: s.st.Last, Joining: s.st.Joining}
		if s.err != nil {
			a = PeerAnswer{ID: p.ID, Error: s.err.Error()}
		}
		r.rep.Peers = append(r.rep.Peers, a)
	}
}

// readMeta reads raft/meta, checked against o.Self when given. A damaged
// one, or a missing one while the log holds entries, is rebuilt from a
// peer's (rebuilt true: writeMeta writes it once the log has been checked
// against it).
func (r *repairer) readMeta() (Meta, bool, error) {
	o := r.o
	b, err := o.FS.ReadFile(filepath.Join(o.Dir, metaName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		held, herr := holdsEntries(o.FS, o.Dir, o.IndexUnits)
		if herr != nil {
			return Meta{}, false, herr
		}
		if !held {
			return Meta{}, false, fmt.Errorf("%w: no raft/meta (not a group member's data dir?): %w", ErrRepair, err)
		}
	case err != nil:
		return Meta{}, false, fmt.Errorf("raftlog: read meta: %w", err)
	default:
		body, ok := base.Unseal(b)
		var m Meta
		if ok && json.Unmarshal(body, &m) == nil {
			if o.Self.NodeID != 0 {
				want := o.Self
				if r.changed {
					// As a start after a change (openMeta): the flags may
					// name the current members, and a joined member's
					// cluster id is not the digest of its flags.
					want.ClusterUUID, want.Voters, want.Learners = "", m.Voters, m.Learners
				}
				if err := checkMeta(m, want); err != nil {
					return m, false, fmt.Errorf("%w: the flags do not name this data dir's member: %w", ErrRepair, err)
				}
			}
			return m, false, nil
		}
		r.oldMeta = b
	}
	m, err := r.rebuildMeta()
	return m, err == nil, err
}

// rebuildMeta makes raft/meta anew from the peers' (design §2.1: node id,
// group, cluster id, file size, bootstrap members, LogBase): this
// member's id comes from o.Self (--raft-id), everything else from the
// first peer that answers, and every peer that answers must agree with
// what this member's flags say (group, cluster id, file size, members),
// or the repair refuses: a raft/meta is never guessed.
func (r *repairer) rebuildMeta() (Meta, error) {
	o := r.o
	what := "damaged"
	if r.oldMeta == nil {
		what = "missing"
	}
	if r.changed {
		return Meta{}, fmt.Errorf("%w: raft/meta is %s and the group's membership changed since this member bootstrapped "+
			"(raft/conf): repair rebuilds raft/meta only for a member of an unchanged group; remove the member and add a new one "+
			"(a new id, an empty data dir) instead", ErrRepair, what)
	}
	if o.Self.NodeID == 0 {
		return Meta{}, fmt.Errorf("%w: raft/meta is %s: rebuilding it needs this member's own flags (--raft-id, --raft-peers, "+
			"--raft-group, --raft-learners, --file-size as it runs with)", ErrRepair, what)
	}
	self := o.Self
	var out *Meta
	var errs []error
	for _, p := range o.Peers {
		if p.ID == self.NodeID {
			return Meta{}, fmt.Errorf("%w: --from names member %d, this member's own id", ErrRepair, p.ID)
		}
		st, err := r.state(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", p.ID, err))
			continue
		}
		pm := st.Meta
		want := self
		want.NodeID = p.ID
		if err := checkMeta(pm, want); err != nil {
			return Meta{}, fmt.Errorf("%w: member %d's raft/meta disagrees with this member's flags: %w", ErrRepair, p.ID, err)
		}
		if !slices.Contains(pm.Voters, self.NodeID) && !slices.Contains(pm.Learners, self.NodeID) {
			return Meta{}, fmt.Errorf("%w: member %d's raft/meta does not list member %d", ErrRepair, p.ID, self.NodeID)
		}
		if out == nil {
			m := pm
			m.NodeID = self.NodeID
			out = &m
		} else if pm.LogBase != out.LogBase {
			return Meta{}, fmt.Errorf("%w: members disagree on where the first DATA entry lies (%d, %d)", ErrRepair, out.LogBase, pm.LogBase)
		}
	}
	if out == nil {
		return Meta{}, fmt.Errorf("%w: raft/meta is %s and no member answered to rebuild it: %w", ErrRepair, what, errors.Join(errs...))
	}
	return *out, nil
}

// writeMeta checks the rebuilt raft/meta against the log it must
// describe (LogBase: where the first DATA entry lies) and writes it
// atomically, keeping the damaged one as meta.broken.
func (r *repairer) writeMeta() error {
	o, m := r.o, r.meta
	size := m.FileSize
	dEnd, exact := r.base.DataEnd, true
	for i := r.first; r.base.Index == 0; i++ {
		b := r.x.slot(i)
		if b == nil {
			break
		}
		u, err := DecodeUnit(b)
		if errors.Is(err, ErrUnitZero) {
			break
		}
		if err != nil {
			exact = false // a damaged unit may be a DATA entry: only a bound
			continue
		}
		if u.Kind != KindData {
			continue
		}
		blank := u.Flags&FlagBlank != 0
		ok := u.Pos >= dEnd
		if exact {
			ok = (!blank && u.Pos == dEnd) || (blank && dEnd%size != 0 && u.Pos == dEnd-dEnd%size+size)
		}
		if !ok {
			return fmt.Errorf("%w: the peers' raft/meta puts the first DATA entry at commitlog offset %d, this member's entry %d "+
				"lies at %d: not this log's meta", ErrRepair, dEnd, i, u.Pos)
		}
		break
	}
	if r.oldMeta != nil {
		if err := o.FS.WriteFile(filepath.Join(o.Dir, metaName+".broken"), r.oldMeta); err != nil {
			return fmt.Errorf("raftlog: keep the damaged meta: %w", err)
		}
	}
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(o.FS, o.Dir, metaName, base.Seal(body)); err != nil {
		return fmt.Errorf("raftlog: write meta: %w", err)
	}
	return nil
}

// rebuildHardState writes a HardState in place of a lost one (design
// §3.4). It must not let this member vote twice in a term, nor forget
// a commit below what its consume queues reflect:
//
//   - term = the highest of the peers' terms and of this log's terms, and
//     vote = this member's own id (0 for a learner). Raft grants a vote in
//     term T only when T is above the current term, or equal to it with
//     no vote or the same candidate: with vote = self it grants none in
//     this term, so it can vote again only in terms above it. A second
//     vote there is harmful only if some candidate W won such a term T
//     with this member's earlier vote (or this member won it): W's voters
//     all reached term T and persisted it, and they are a majority that
//     includes this member, so if the peers that answered meet every
//     majority that includes this member, one of them is at T or above and
//     the term chosen is too. So the voters that answer must leave fewer
//     than a majority-minus-one silent: with 3 voters both peers, with 5
//     three of the four (a joining peer, whose data dir was lost, does not
//     count: its term may be below one it voted in). A term only this
//     member reached (its own candidacy that nobody heard) may be voted
//     in again: nobody won it with its vote. A vote for itself that it
//     never cast is harmless: it never campaigns in the term it holds
//     (a campaign raises the term first). term+1 with vote 0 would be
//     as safe, but a follower at a term above its leader's would depose
//     it; term with vote = self rejoins quietly.
//   - commit = the highest index this member holds identically to a peer
//     that has committed it (the same unit at the same index is the same
//     entry, by Log Matching, and an index at or below a peer's commit is
//     committed), and at least the checkpoint's applied index (this
//     member applied it, so saw it committed, and recovery refuses a
//     checkpoint ahead of the raft log's commit) and the compacted base.
//
// It is written with the normal two-slot synced write; the damaged file
// is kept as hardstate.broken when it was not all zero.
func (r *repairer) rebuildHardState() (slot, error) {
	o, m := r.o, r.meta
	if r.changed {
		// Which majorities a vote took part in depends on the membership
		// of the moment, which raft/meta's voters no longer are.
		return slot{}, fmt.Errorf("%w: raft/hardstate is lost and the group's membership changed since this member "+
			"bootstrapped (raft/conf): repair rebuilds it only for a member of an unchanged group; remove the member and add "+
			"a new one (a new id, an empty data dir) instead", ErrRepair)
	}
	self := m.NodeID
	voter := slices.Contains(m.Voters, self)
	last, term := r.base.Index, r.base.Term
	for i := r.first; ; i++ {
		b := r.x.slot(i)
		if b == nil {
			break
		}
		u, err := DecodeUnit(b)
		if errors.Is(err, ErrUnitZero) {
			if _, ok := holdsAfter(r.x, i); !ok {
				break
			}
		}
		if err != nil {
			continue
		}
		last, term = i, max(term, u.Term)
	}
	var answered, heard []uint64
	var errs []error
	for _, p := range o.Peers {
		st, err := r.state(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", p.ID, err))
			continue
		}
		heard = append(heard, p.ID)
		term = max(term, st.Term)
		if slices.Contains(m.Voters, p.ID) && p.ID != self && !st.Joining {
			answered = append(answered, p.ID)
		}
	}
	if voter {
		q := len(m.Voters)/2 + 1
		var silent []uint64
		for _, v := range m.Voters {
			if v != self && !slices.Contains(answered, v) {
				silent = append(silent, v)
			}
		}
		if len(silent) >= q-1 {
			return slot{}, fmt.Errorf("%w: raft/hardstate is lost: rebuilding it without risking a second vote in one term needs the "+
				"terms of enough voters that every majority including member %d has one that answered: voters %v answered %v; "+
				"reach %d more of members %v (--from, each as id=host:port; a joining member does not count) (%v)",
				ErrRepair, self, m.Voters, answered, len(silent)-q+2, silent, errors.Join(errs...))
		}
	} else if len(heard) == 0 {
		return slot{}, fmt.Errorf("%w: raft/hardstate is lost and no member answered: %w", ErrRepair, errors.Join(errs...))
	}
	commit := r.base.Index
	for _, p := range o.Peers {
		st, err := r.state(p)
		if err != nil {
			continue
		}
		c, err := r.highestIdentical(p, min(st.Commit, last))
		if err != nil {
			return slot{}, err
		}
		r.rep.PeerCommit = max(r.rep.PeerCommit, st.Commit)
		commit = max(commit, c)
	}
	if a := o.Applied; a > commit {
		u, err := DecodeUnit(r.x.slot(a))
		if a > last || err != nil || u.Term != o.AppliedTerm {
			return slot{}, fmt.Errorf("%w: raft/hardstate is lost and the checkpoint says entry %d (term %d) was applied, but this "+
				"member does not hold it (last %d): restore the data dir, or rebuild the member", ErrRepair, a, o.AppliedTerm, last)
		}
		commit = a
	}
	vote := uint64(0)
	if voter {
		vote = self
	}
	path := filepath.Join(o.Dir, hardStateName)
	if old, err := o.FS.ReadFile(path); err == nil && !commitlog.AllZero(old) {
		if err := o.FS.WriteFile(path+".broken", old); err != nil {
			return slot{}, fmt.Errorf("raftlog: keep the damaged hardstate: %w", err)
		}
	}
	h, err := openHardState(o.FS, path)
	if err != nil {
		return slot{}, err
	}
	err = h.write(term, vote, commit)
	if err == nil {
		err = h.syncCommit() // synced whatever the old slots held
	}
	if cerr := h.close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = base.SyncDir(o.FS, o.Dir)
	}
	if err != nil {
		return slot{}, fmt.Errorf("raftlog: rebuild hardstate: %w", err)
	}
	return h.cur, nil
}

// highestIdentical is the highest index at or below hi whose unit holds
// here and is identical on peer p (FirstIndex-1 when none): by Log
// Matching the identical ones are a prefix of the units that hold, so a
// binary search over them finds it with a few one-entry fetches.
func (r *repairer) highestIdentical(p Peer, hi uint64) (uint64, error) {
	holds := func(j uint64) bool { _, err := DecodeUnit(r.x.slot(j)); return err == nil }
	best := r.first - 1
	for lo := r.first; lo <= hi; {
		mid := lo + (hi-lo)/2
		j := mid
		for j >= lo && !holds(j) {
			j--
		}
		if j < lo || j > mid { // none in [lo, mid]: the first one above
			for j = mid + 1; j <= hi && !holds(j); j++ {
			}
			if j > hi {
				break
			}
		}
		got, err := p.Fetch(j, j+1)
		if err != nil {
			return 0, fmt.Errorf("%w: fetch entry %d from member %d: %w", ErrRepair, j, p.ID, err)
		}
		if len(got.Entries) > 0 && got.Entries[0].Index == j && bytes.Equal(got.Entries[0].Unit, r.x.slot(j)) {
			best, lo = j, j+1
		} else {
			hi = j - 1
		}
	}
	return best, nil
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

// outcome is what one peer did for a damaged entry.
type outcome int

const (
	took    outcome = iota // the peer's identical entry was written
	lacks                  // the peer provably lacks this replica's entry
	unknown                // unreachable, damaged there, or not comparable
)

// repair fetches the damaged entry d from the first peer that holds the
// same entry and rewrites it. It returns the payload bytes written, or -1
// when it left a torn entry for recovery or cut the log from d (past the
// commit index, held by no peer, and provably never committed).
func (r *repairer) repair(d Damage) (int64, error) {
	i := d.Index
	var lacking []uint64
	var why []string
	for _, p := range r.o.Peers {
		res, n, err := r.repairFrom(p, d)
		switch res {
		case took:
			return n, nil
		case lacks:
			if st, serr := r.state(p); serr == nil && !st.Joining {
				lacking = append(lacking, p.ID)
			} else if serr == nil {
				err = fmt.Errorf("%w (but it is joining: its log proves nothing)", err)
			}
		}
		if err == nil {
			continue
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return 0, fatal.err
		}
		why = append(why, fmt.Sprintf("member %d: %v", p.ID, err))
	}
	if d.Torn {
		return -1, nil
	}
	detail := ""
	if len(why) > 0 {
		detail = " (" + joinReasons(why) + ")"
	}
	if i <= r.commit {
		return 0, fmt.Errorf("%w: no member asked holds entry %d, committed here (commit %d): repair from another member, the "+
			"leader holds every committed entry%s", ErrRepair, i, r.commit, detail)
	}
	// Past the commit index and held by no peer asked: cut it if it cannot
	// have been committed (see the top of this file).
	if r.changed {
		// Whether it can have been committed depends on the membership
		// of the moment, which raft/meta's voters no longer are.
		return 0, fmt.Errorf("%w: entry %d, past the commit index %d, is damaged and no member asked holds it, and the "+
			"group's membership changed since this member bootstrapped (raft/conf), so repair cannot tell whether it was "+
			"committed: repair from a member that holds it (the leader, if it was committed), or remove this member and add a "+
			"new one%s", ErrRepair, i, r.commit, detail)
	}
	v := r.meta.Voters
	q := len(v)/2 + 1
	var lackV []uint64
	for _, id := range lacking {
		if slices.Contains(v, id) && id != r.meta.NodeID {
			lackV = append(lackV, id)
		}
	}
	if len(v)-len(lackV) < q {
		if err := r.cut(i); err != nil {
			return 0, err
		}
		return -1, nil
	}
	var others []uint64
	for _, id := range v {
		if id != r.meta.NodeID && !slices.Contains(lackV, id) {
			others = append(others, id)
		}
	}
	return 0, fmt.Errorf("%w: entry %d, past the commit index %d, is damaged and no member asked holds it; it may have been "+
		"committed (a majority is %d of voters %v) unless enough voters lack it: %d lack it provably (%v); reach %d more of "+
		"members %v (--from, each as id=host:port) to cut it, or one that holds it to repair it%s",
		ErrRepair, i, r.commit, q, v, len(lackV), lackV, len(v)-q+1-len(lackV), others, detail)
}

// joinReasons joins the peers' answers for an error message.
func joinReasons(why []string) string {
	var b bytes.Buffer
	for k, w := range why {
		if k > 0 {
			b.WriteString("; ")
		}
		b.WriteString(w)
	}
	return b.String()
}

// fatalError is a local failure while taking a peer's entry (a write):
// the repair stops.
type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }

// cut truncates the log from index i (past the commit index): the units
// from i on are kept in index/<i>.broken and zeroed, synced. The
// commitlog bytes and meta-log payloads past entry i-1 are no longer
// vouched for by any unit, so the next start's recovery cuts them as it
// cuts any unindexed tail (keeping commitlog/<offset>.broken).
func (r *repairer) cut(i uint64) error {
	if i <= r.commit {
		return fmt.Errorf("%w: entry %d, commit %d", ErrTruncateCommitted, i, r.commit)
	}
	if err := saveUnits(r.o.FS, r.o.Dir, r.x, i); err != nil {
		return err
	}
	if _, err := r.x.zeroFrom(i); err != nil {
		return err
	}
	r.rep.CutFrom = i
	return nil
}

// repairFrom tries to take the damaged entry d from peer p: took (n
// payload bytes written), lacks (p provably does not hold this replica's
// entry: its log ends before it, or it holds another entry at it or at
// an index below it where this replica's unit holds), or unknown. An
// error wrapped in *fatalError is a local failure.
func (r *repairer) repairFrom(p Peer, d Damage) (outcome, int64, error) {
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
	got, err := r.fetch(p, i, hi)
	if err != nil {
		return unknown, 0, err
	}
	r.rep.PeerCommit = max(r.rep.PeerCommit, got.Commit)
	if len(got.Entries) == 0 || got.Entries[0].Index != i {
		return lacks, 0, fmt.Errorf("it has no entry %d (its log ends at %d, commit %d)", i, got.Last, got.Commit)
	}
	e := got.Entries[0]
	pu, err := DecodeUnit(e.Unit)
	if err != nil || len(e.Unit) != UnitSize {
		return unknown, 0, fmt.Errorf("its unit of entry %d: %v", i, err)
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
		if uerr == nil {
			return lacks, 0, fmt.Errorf("it holds another entry %d (term %d; raft says an entry is the same only with the same "+
				"index and term)", i, pu.Term)
		}
		// This replica's unit of i is damaged: another entry below i
		// where its unit holds proves the peer lacks i too.
		for k := i - 1; k >= r.first; k-- {
			lu := r.x.slot(k)
			if _, err := DecodeUnit(lu); err != nil {
				continue
			}
			below, err := r.fetch(p, k, k+1)
			if err != nil {
				return unknown, 0, err
			}
			if len(below.Entries) == 0 || !bytes.Equal(below.Entries[0].Unit, lu) {
				return lacks, 0, fmt.Errorf("it holds another entry %d below the damaged entry %d", k, i)
			}
			break
		}
		return unknown, 0, fmt.Errorf("its entry %d (term %d) cannot be compared with this replica's, whose unit is damaged", i, pu.Term)
	}
	if err := r.verify(i, pu, e.Data); err != nil {
		return unknown, 0, err
	}
	if err := r.write(i, pu, e); err != nil {
		return unknown, 0, &fatalError{err}
	}
	return took, int64(len(e.Data)), nil
}

// fetch reads [lo, hi) from peer p, chunk by chunk.
func (r *repairer) fetch(p Peer, lo, hi uint64) (Range, error) {
	var out Range
	for next := lo; next < hi; {
		got, err := p.Fetch(next, hi)
		if err != nil {
			return out, fmt.Errorf("fetch entries [%d, %d): %w", next, hi, err)
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
