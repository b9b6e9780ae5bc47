package raftlog

import (
	"errors"
	"slices"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/vfs"
)

// appendEmpty appends empty entries [from, to] of term 1 and commits up to
// commit, synced.
func appendEmpty(t *testing.T, l *Log, from, to, commit uint64) {
	t.Helper()
	var ents []*pb.Entry
	for i := from; i <= to; i++ {
		ents = append(ents, &pb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(i)})
	}
	if err := l.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := l.SetHardState(&pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(commit)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestMembershipRecords: raft/conf keeps the membership conf changes
// made, by raft index. InitialState (what raft restarts with) is the
// record at or below the commit, the bootstrap membership of raft/meta
// before any; a record above the commit (a snapshot being installed) waits
// for the commit to reach it; records older than the newest at or below
// the commit are dropped; the addresses and removals accumulate; all of it
// survives a reopen; a reopen with other bootstrap members is accepted
// once the membership changed (the flags no longer describe it), and a
// member whose id was removed refuses to open.
func TestMembershipRecords(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	l := r.log
	cs := func() *pb.ConfState {
		t.Helper()
		_, c, err := l.InitialState()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := cs(); !slices.Equal(c.GetVoters(), []uint64{1, 2, 3}) || len(c.GetLearners()) != 0 {
		t.Fatalf("bootstrap ConfState %v", c)
	}
	appendEmpty(t, l, 1, 10, 6)
	set := func(c ConfChange) {
		t.Helper()
		if err := l.SetMembership(c); err != nil {
			t.Fatal(err)
		}
	}
	set(ConfChange{Membership: Membership{Index: 4, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}, Addrs: map[uint64]string{4: "127.0.0.1:4"}})
	set(ConfChange{Membership: Membership{Index: 6, Voters: []uint64{1, 2, 3, 4}}})
	// Above the commit (6): InitialState does not take it yet.
	set(ConfChange{Membership: Membership{Index: 9, Voters: []uint64{1, 2, 4}}, Removed: []uint64{3}})
	if c := cs(); !slices.Equal(c.GetVoters(), []uint64{1, 2, 3, 4}) {
		t.Fatalf("ConfState at commit 6: %v", c)
	}
	conf := l.Conf()
	if idx := []uint64{conf.Records[0].Index, conf.Records[1].Index}; len(conf.Records) != 2 || !slices.Equal(idx, []uint64{6, 9}) {
		t.Fatalf("records %+v: want those at 6 (newest at or below the commit) and 9", conf.Records)
	}
	if conf.Addrs[4] != "127.0.0.1:4" || !slices.Equal(conf.Removed, []uint64{3}) {
		t.Fatalf("addresses %v, removed %v", conf.Addrs, conf.Removed)
	}
	if m := l.MembershipAt(5); m.Index != 0 || !slices.Equal(m.Voters, []uint64{1, 2, 3}) {
		// The record at 4 was dropped; below the oldest record kept the
		// log answers with the bootstrap (only the raft loop's replay
		// above the commit's record asks about indexes that low).
		t.Fatalf("MembershipAt(5) = %+v", m)
	}
	appendEmpty(t, l, 11, 12, 12)
	if c := cs(); !slices.Equal(c.GetVoters(), []uint64{1, 2, 4}) {
		t.Fatalf("ConfState at commit 12: %v", c)
	}
	if s, err := l.Snapshot(); err != nil || !slices.Equal(s.GetMetadata().GetConfState().GetVoters(), []uint64{1, 2, 3}) {
		// The base is index 0: the bootstrap membership.
		t.Fatalf("Snapshot's ConfState: %v %v", s.GetMetadata().GetConfState(), err)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}

	// Reopened with other bootstrap members (flags that list the group as
	// it is now): accepted, the membership is raft/conf's.
	other := testMeta
	other.Voters, other.ClusterUUID = []uint64{1, 2, 4}, "another digest"
	r2, err := openReplicaAs(fs, other)
	if err != nil {
		t.Fatalf("reopen after a change with the current members: %v", err)
	}
	if _, c, _ := r2.log.InitialState(); !slices.Equal(c.GetVoters(), []uint64{1, 2, 4}) {
		t.Fatalf("ConfState after a reopen: %v", c)
	}
	if got := r2.log.Conf(); got.Addrs[4] != "127.0.0.1:4" || !slices.Equal(got.Removed, []uint64{3}) {
		t.Fatalf("raft/conf after a reopen: %+v", got)
	}
	if err := r2.close(); err != nil {
		t.Fatal(err)
	}
	// Member 3 (removed) may not open this data dir's membership: a dir
	// of its own with its removal recorded refuses to start.
	fs3 := vfs.NewMem()
	meta3 := testMeta
	meta3.NodeID = 3
	r3, err := openReplicaAs(fs3, meta3)
	if err != nil {
		t.Fatal(err)
	}
	appendEmpty(t, r3.log, 1, 3, 3)
	if err := r3.log.SetMembership(ConfChange{Membership: Membership{Index: 3, Voters: []uint64{1, 2}}, Removed: []uint64{3}}); err != nil {
		t.Fatal(err)
	}
	if err := r3.close(); err != nil {
		t.Fatal(err)
	}
	if r, err := openReplicaAs(fs3, meta3); !errors.Is(err, ErrRemoved) {
		if err == nil {
			r.close()
		}
		t.Fatalf("a removed member opened its data dir: %v", err)
	}
}

// TestMetaCheckedUntilMembershipChanges: without a conf change, a reopen
// with other members is refused, as before membership changes existed.
func TestMetaCheckedUntilMembershipChanges(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	other := testMeta
	other.Voters = []uint64{1, 2, 4}
	if r, err := openReplicaAs(fs, other); !errors.Is(err, ErrMetaMismatch) {
		if err == nil {
			r.close()
		}
		t.Fatalf("reopen with other members and no change: %v", err)
	}
}

// TestRepairRefusesChangedMembership: repair's quorum rules count raft/meta's
// bootstrap voters, so a member whose group changed its membership is
// refused (nothing written) rather than judged against the wrong voters.
func TestRepairRefusesChangedMembership(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	appendEmpty(t, r.log, 1, 3, 3)
	if err := r.log.SetMembership(ConfChange{Membership: Membership{Index: 2, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	peerFS := vfs.NewMem()
	peer := mustOpen(t, peerFS)
	defer peer.close()
	rep, err := repairFrom(fs, peer)
	if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), "membership changed") {
		t.Fatalf("repair of a member whose membership changed: %+v %v", rep, err)
	}
}
