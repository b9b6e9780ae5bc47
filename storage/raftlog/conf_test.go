package raftlog

import (
	"bytes"
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

// TestRepairChangedMembership: once raft/conf records a membership change,
// raft/meta's voters are not the group's, so repair refuses the steps that
// rest on them (a lost raft/hardstate or raft/meta rebuilt, a damaged
// uncommitted entry that no peer holds cut), writing nothing, while a
// damaged entry a peer holds identically is still taken from it (Log
// Matching needs no membership), with flags that name the current members
// rather than the bootstrap ones. A damaged raft/conf is refused too.
func TestRepairChangedMembership(t *testing.T) {
	common, suf := genLogs(t, 8, 40, 10, 41, 42)
	own, other := suf[0], suf[1]
	dataAt := func(ents []*pb.Entry) uint64 {
		for _, e := range ents[2 : len(ents)-2] {
			if classify(e) == KindData {
				return e.GetIndex()
			}
		}
		t.Fatal("no DATA entry")
		return 0
	}
	// member3 is member 3 of voters 1-3 holding ents, commit 40, with a
	// change recorded (learner 4 added at 20) when changed, and the
	// payload of entry at flipped.
	member3 := func(t *testing.T, changed bool, at uint64, ents ...[]*pb.Entry) *vfs.MemFS {
		fs := writeReplica(t, metaOf(3), hardState(9, 3, 40), ents...)
		r, err := openReplicaAs(fs, metaOf(3))
		if err != nil {
			t.Fatal(err)
		}
		if changed {
			if err := r.log.SetMembership(ConfChange{Membership: Membership{Index: 20, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
				Addrs: map[uint64]string{4: "127.0.0.1:4"}}); err != nil {
				t.Fatal(err)
			}
		}
		if at != 0 {
			u, err := r.log.unitAt(at)
			if err != nil {
				t.Fatal(err)
			}
			r.cl.At(u.Pos)[u.Len/2] ^= 0x08
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	peer := func(t *testing.T, id uint64, ents ...[]*pb.Entry) Peer {
		return peerOf(id, openAs(t, writeReplica(t, metaOf(id), hardState(9, 3, 40), ents...), metaOf(id)))
	}
	refused := func(t *testing.T, fs *vfs.MemFS, o RepairOptions, want string) {
		t.Helper()
		before := map[string][]byte{}
		for _, f := range []string{"/d/raft/hardstate", "/d/raft/meta", "/d/raft/conf", "/d/raft/index/" + indexName(0)} {
			before[f], _ = fs.ReadFile(f)
		}
		_, err := repairWith(fs, o)
		if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v, want ErrRepair saying %q", err, want)
		}
		for f, b := range before {
			if after, _ := fs.ReadFile(f); !bytes.Equal(b, after) {
				t.Fatalf("the refused repair wrote %s", f)
			}
		}
		names, _ := fs.ReadDir("/d/raft/index")
		for _, n := range names {
			if strings.HasSuffix(n.Name, ".broken") {
				t.Fatal("the refused repair cut the log")
			}
		}
	}

	t.Run("a committed entry a peer holds", func(t *testing.T) {
		at := dataAt(common)
		fs := member3(t, true, at, common)
		current := metaOf(3, 1, 3, 4) // the flags name today's members
		current.ClusterUUID = "another digest"
		rep, err := repairWith(fs, RepairOptions{Peers: []Peer{peer(t, 1, common)}, Self: current})
		if err != nil || len(rep.Repaired) != 1 || rep.Repaired[0] != at {
			t.Fatalf("repaired %v (%v), want entry %d", rep.Repaired, err, at)
		}
		r := openAs(t, fs, metaOf(3))
		ents, err := r.log.Entries(1, 41, ^uint64(0))
		if err != nil {
			t.Fatal(err)
		}
		for k, e := range ents {
			if err := sameEntry(common[k], e); err != nil {
				t.Fatalf("after the repair: %v", err)
			}
		}
		if m := r.log.Conf(); len(m.Records) != 1 || m.Addrs[4] != "127.0.0.1:4" {
			t.Fatalf("raft/conf after the repair: %+v", m)
		}
	})
	t.Run("flags that name another node", func(t *testing.T) {
		fs := member3(t, true, dataAt(common), common)
		_, err := repairWith(fs, RepairOptions{Peers: []Peer{peer(t, 1, common)}, Self: metaOf(2, 1, 3, 4)})
		if !errors.Is(err, ErrMetaMismatch) {
			t.Fatalf("repair as node 2: %v, want ErrMetaMismatch", err)
		}
	})
	t.Run("an uncommitted entry no peer holds", func(t *testing.T) {
		at := dataAt(own)
		peers := func() []Peer { return []Peer{peer(t, 1, common), peer(t, 2, common, other)} }
		// Unchanged, both peers lacking it is enough to cut it
		// (TestRepairCutsEntryNoMajorityHolds); changed, it is not.
		if rep, err := repairWith(member3(t, false, at, common, own), RepairOptions{Peers: peers()}); err != nil || rep.CutFrom != at {
			t.Fatalf("unchanged: cut from %d (%v), want %d", rep.CutFrom, err, at)
		}
		refused(t, member3(t, true, at, common, own), RepairOptions{Peers: peers()}, "cannot tell whether it was committed")
	})
	t.Run("lost hardstate", func(t *testing.T) {
		fs := member3(t, true, 0, common)
		fs.WriteFile("/d/raft/hardstate", make([]byte, 2*slotSize))
		refused(t, fs, RepairOptions{Peers: []Peer{peer(t, 1, common), peer(t, 2, common)}},
			"raft/hardstate is lost and the group's membership changed")
	})
	t.Run("damaged meta", func(t *testing.T) {
		fs := member3(t, true, 0, common)
		b, _ := fs.ReadFile("/d/raft/meta")
		b[3] ^= 1
		fs.WriteFile("/d/raft/meta", b)
		refused(t, fs, RepairOptions{Peers: []Peer{peer(t, 1, common)}, Self: metaOf(3)}, "raft/meta is damaged and the group's membership changed")
	})
	t.Run("damaged conf", func(t *testing.T) {
		fs := member3(t, true, dataAt(common), common)
		b, _ := fs.ReadFile("/d/raft/conf")
		b[len(b)/2] ^= 1
		fs.WriteFile("/d/raft/conf", b)
		refused(t, fs, RepairOptions{Peers: []Peer{peer(t, 1, common)}}, "repair does not rebuild raft/conf")
	})
}
