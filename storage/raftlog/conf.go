package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// confName is raft/conf: the group's membership as the conf changes this
// replica applied left it. raft/meta keeps the bootstrap membership (what
// the flags said at the first start, digested into the cluster id); once
// a conf change is applied, raft/conf is what raft restarts with.
//
// Raft needs, at a restart, the ConfState as of the applied index it is
// given (etcd-raft replays no entry at or below it). The store restarts
// raft at the commit index on disk, which a command's apply syncs before
// the conf change is applied (replica.handle), so a crash can leave the
// commit past a conf change raft/conf does not hold yet: InitialState
// returns the membership recorded at or below the commit, and the raft
// loop applies the conf entries above that record again (replica.New).
// Entries are compacted only once applied, and applying a conf change
// writes raft/conf first, so those entries are still in the log.
//
// A record above the commit exists only while a snapshot is being
// installed (the membership at the snapshot's index is recorded before
// the install raises the commit to it): InitialState ignores it until
// then.
const confName = "conf"

// maxConfRecords bounds raft/conf's records: only the newest at or below
// the commit and those above it are kept, so more than a few means a bug.
const maxConfRecords = 16

// Membership is the group's membership at a raft index.
type Membership struct {
	// Index is the raft index of the conf change that made it (0: the
	// bootstrap membership of raft/meta).
	Index uint64 `json:"index"`
	// Voters and Learners as in raftpb.ConfState; VotersOutgoing,
	// LearnersNext and AutoLeave describe a joint configuration (storaged
	// proposes only simple changes, but raft may hand any).
	Voters         []uint64 `json:"voters,omitempty"`
	Learners       []uint64 `json:"learners,omitempty"`
	VotersOutgoing []uint64 `json:"voters_outgoing,omitempty"`
	LearnersNext   []uint64 `json:"learners_next,omitempty"`
	AutoLeave      bool     `json:"auto_leave,omitempty"`
}

// ConfState is m as raft's ConfState.
func (m Membership) ConfState() *pb.ConfState {
	return &pb.ConfState{Voters: slices.Clone(m.Voters), Learners: slices.Clone(m.Learners),
		VotersOutgoing: slices.Clone(m.VotersOutgoing), LearnersNext: slices.Clone(m.LearnersNext), AutoLeave: boolPtr(m.AutoLeave)}
}

func boolPtr(b bool) *bool {
	if !b {
		return nil
	}
	return &b
}

// MembershipOf is cs at raft index index, its id lists sorted.
func MembershipOf(index uint64, cs *pb.ConfState) Membership {
	sorted := func(v []uint64) []uint64 {
		if len(v) == 0 {
			return nil
		}
		return slices.Sorted(slices.Values(v))
	}
	return Membership{Index: index, Voters: sorted(cs.GetVoters()), Learners: sorted(cs.GetLearners()),
		VotersOutgoing: sorted(cs.GetVotersOutgoing()), LearnersNext: sorted(cs.GetLearnersNext()), AutoLeave: cs.GetAutoLeave()}
}

// Members is every id of m: voters (incoming and outgoing) and learners
// (current and next), sorted, once each.
func (m Membership) Members() []uint64 {
	all := slices.Concat(m.Voters, m.Learners, m.VotersOutgoing, m.LearnersNext)
	slices.Sort(all)
	return slices.Compact(all)
}

// IsLearner: id is a learner of m (and not a voter of either half).
func (m Membership) IsLearner(id uint64) bool {
	return (slices.Contains(m.Learners, id) || slices.Contains(m.LearnersNext, id)) &&
		!slices.Contains(m.Voters, id) && !slices.Contains(m.VotersOutgoing, id)
}

// Clone returns a deep copy of m.
func (m Membership) Clone() Membership {
	m.Voters, m.Learners = slices.Clone(m.Voters), slices.Clone(m.Learners)
	m.VotersOutgoing, m.LearnersNext = slices.Clone(m.VotersOutgoing), slices.Clone(m.LearnersNext)
	return m
}

// Conf is raft/conf: the membership records, the peer addresses the conf
// changes carried, and the ids removed from the group.
type Conf struct {
	// Records are ascending by Index.
	Records []Membership `json:"records"`
	// Addrs maps a member added by a conf change to the peer address the
	// change named (members of the bootstrap have theirs in the flags).
	Addrs map[uint64]string `json:"addrs,omitempty"`
	// Removed are the ids removed from the group: raft ids are never
	// reused (a removed id's old votes and log could confuse the group),
	// and a data dir whose id was removed refuses to start.
	Removed []uint64 `json:"removed,omitempty"`
}

// Clone returns a deep copy of c.
func (c Conf) Clone() Conf {
	out := Conf{Addrs: maps.Clone(c.Addrs), Removed: slices.Clone(c.Removed)}
	for _, r := range c.Records {
		out.Records = append(out.Records, r.Clone())
	}
	return out
}

// at is the newest record at or below index i (ok false: none).
func (c Conf) at(i uint64) (Membership, bool) {
	for k := len(c.Records) - 1; k >= 0; k-- {
		if c.Records[k].Index <= i {
			return c.Records[k], true
		}
	}
	return Membership{}, false
}

// ErrRemoved: this replica's id was removed from the group (raft/conf); a
// removed id never serves again.
var ErrRemoved = errors.New("raftlog: this member was removed from the group")

// readConf reads raft/conf from dir; a dir without one has an empty Conf.
func readConf(fsys vfs.FS, dir string) (Conf, error) {
	b, err := fsys.ReadFile(filepath.Join(dir, confName))
	if errors.Is(err, fs.ErrNotExist) {
		return Conf{}, nil
	}
	if err != nil {
		return Conf{}, fmt.Errorf("raftlog: read conf: %w", err)
	}
	body, ok := base.Unseal(b)
	var c Conf
	if !ok || json.Unmarshal(body, &c) != nil {
		return Conf{}, &base.CorruptionError{File: "raft/conf", Reason: "raft/conf fails its CRC or does not decode " +
			"(repair does not rebuild it: remove this member from the group and add a new one, with a new id and an empty data dir)"}
	}
	return c, nil
}

// membershipLocked is the membership at raft index i: the newest record
// at or below it, else the bootstrap membership of raft/meta.
// REQUIRES: l.mu.
func (l *Log) membershipLocked(i uint64) Membership {
	if m, ok := l.conf.at(i); ok {
		return m.Clone()
	}
	return Membership{Voters: slices.Clone(l.meta.Voters), Learners: slices.Clone(l.meta.Learners)}
}

// MembershipAt is the membership at raft index i as this replica recorded
// it (see confName for which indexes it knows).
func (l *Log) MembershipAt(i uint64) Membership {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.membershipLocked(i)
}

// Conf returns raft/conf as on disk (empty before any conf change).
func (l *Log) Conf() Conf {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conf.Clone()
}

// ConfChange is what applying one conf change adds to raft/conf.
type ConfChange struct {
	// Membership is the membership the change made, at its raft index.
	Membership Membership
	// Addrs are the peer addresses the change names (added members).
	Addrs map[uint64]string
	// Removed are the ids the change removed.
	Removed []uint64
}

// SetMembership records, durably, the membership a conf change (or an
// installed snapshot) made at its raft index, with the peer addresses and
// removals it carries. A record at that index is replaced (a restart
// applies the conf entries above the commit's record again). Records
// below the newest one at or below the durable commit are dropped.
func (l *Log) SetMembership(c ConfChange) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	next := l.conf.Clone()
	i := c.Membership.Index
	next.Records = slices.DeleteFunc(next.Records, func(m Membership) bool { return m.Index == i })
	next.Records = append(next.Records, c.Membership.Clone())
	slices.SortFunc(next.Records, func(a, b Membership) int { return cmpUint(a.Index, b.Index) })
	// Against the durable commit: a restart may come back at it, and
	// needs the record at or below it.
	commit := l.durableCommitLocked()
	keep := 0
	for k, m := range next.Records {
		if m.Index <= commit {
			keep = k // the newest at or below the commit
		}
	}
	next.Records = next.Records[keep:]
	if len(next.Records) > maxConfRecords {
		return fmt.Errorf("raftlog: %d membership records above the commit %d", len(next.Records), commit)
	}
	for id, addr := range c.Addrs {
		if next.Addrs == nil {
			next.Addrs = map[uint64]string{}
		}
		next.Addrs[id] = addr
	}
	for _, id := range c.Removed {
		if !slices.Contains(next.Removed, id) {
			next.Removed = append(next.Removed, id)
		}
		delete(next.Addrs, id)
	}
	slices.Sort(next.Removed)
	body, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(l.opts.FS, l.opts.Dir, confName, base.Seal(body)); err != nil {
		return l.stop(fmt.Errorf("raftlog: write conf: %w", err))
	}
	l.conf = next
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
