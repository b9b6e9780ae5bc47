package raftlog

import (
	"bytes"
	"io"
	"log"
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/storaged/storaged/storage/vfs"
)

// TestRaftGroupByteIdentical runs three etcd-raft RawNodes over raftlog in
// one process, with the classic Ready loop the raft loop will run (Append,
// SetHardState, Sync, then send) and the leader path of doc.go: the leader
// stamps records from its tail and proposes, and its bytes reach its
// commitlog through Append like a follower's. After a few hundred stamped
// proposals of random sizes (many rolls), every replica holds the same
// entries and byte-identical commitlog files, blanks included, and the
// same after all three restart.
func TestRaftGroupByteIdentical(t *testing.T) {
	fss := []*vfs.MemFS{vfs.NewMem(), vfs.NewMem(), vfs.NewMem()}
	reps := make([]*replica, 3)
	nodes := make([]*raft.RawNode, 3)
	start := func() {
		for i := range reps {
			meta := testMeta
			meta.NodeID = uint64(i + 1)
			r, err := openReplicaAs(fss[i], meta)
			if err != nil {
				t.Fatal(err)
			}
			reps[i] = r
			rn, err := raft.NewRawNode(&raft.Config{ID: uint64(i + 1), ElectionTick: 10, HeartbeatTick: 1,
				Storage: reps[i].log, MaxSizePerMsg: 64 << 10, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true,
				DisableProposalForwarding: true, Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}})
			if err != nil {
				t.Fatal(err)
			}
			nodes[i] = rn
		}
	}
	stop := func() {
		for _, r := range reps {
			if err := r.close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// settle runs every node's Ready loop and delivers messages until
	// nothing moves.
	settle := func() {
		for moved := true; moved; {
			moved = false
			var out []*pb.Message
			for i, rn := range nodes {
				for rn.HasReady() {
					moved = true
					rd := rn.Ready()
					if err := reps[i].log.Append(rd.Entries); err != nil {
						t.Fatal(err)
					}
					if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
						if err := reps[i].log.SetHardState(rd.HardState); err != nil {
							t.Fatal(err)
						}
					}
					if err := reps[i].log.Sync(); err != nil {
						t.Fatal(err)
					}
					out = append(out, rd.Messages...)
					rn.Advance(rd)
				}
			}
			for _, m := range out {
				if err := nodes[m.GetTo()-1].Step(m); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	start()
	defer func() { stop() }()
	if err := nodes[0].Campaign(); err != nil {
		t.Fatal(err)
	}
	settle()
	if nodes[0].Status().RaftState != raft.StateLeader {
		t.Fatalf("node 1 is %v after its campaign", nodes[0].Status().RaftState)
	}
	// Ready: the leader's empty entry is committed and its log is all
	// applied; the tail starts at the log's end.
	last, _ := reps[0].log.LastIndex()
	tail, err := reps[0].log.NextPos(last, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for p := 0; p < 300; p++ {
		specs := records(rng, 1+rng.IntN(3))
		pos := Place(tail, specsLen(specs), testFileSize)
		if err := nodes[0].Propose(encodeAt(specs, pos)); err != nil {
			t.Fatal(err)
		}
		tail = pos + int64(specsLen(specs))
		if rng.IntN(4) == 0 {
			settle()
		}
	}
	settle()
	for range 2 { // heartbeats carry the final commit index to the followers
		nodes[0].Tick()
		settle()
	}
	check := func(when string) {
		l0, _ := reps[0].log.LastIndex()
		want, err := reps[0].log.Entries(1, l0+1, ^uint64(0))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range reps {
			li, _ := r.log.LastIndex()
			hs, _, _ := r.log.InitialState()
			if li != l0 || hs.GetCommit() != l0 {
				t.Fatalf("%s: node %d: last %d commit %d, leader's last %d", when, i+1, li, hs.GetCommit(), l0)
			}
			got, err := r.log.Entries(1, li+1, ^uint64(0))
			if err != nil {
				t.Fatal(err)
			}
			for j := range want {
				if err := sameEntry(want[j], got[j]); err != nil {
					t.Fatalf("%s: node %d: %v", when, i+1, err)
				}
			}
			if r.cl.MaxOffset() != reps[0].cl.MaxOffset() || r.cl.MaxOffset() != tail {
				t.Fatalf("%s: node %d: commitlog ends at %d, the leader's at %d, its tail at %d", when, i+1, r.cl.MaxOffset(), reps[0].cl.MaxOffset(), tail)
			}
			for off := int64(0); off < tail; off += testFileSize {
				if !bytes.Equal(r.cl.At(off), reps[0].cl.At(off)) {
					t.Fatalf("%s: node %d: commitlog file at %d differs from the leader's", when, i+1, off)
				}
			}
		}
		if tail < 3*testFileSize {
			t.Fatalf("only %d bytes: the test covers too few rolls", tail)
		}
	}
	check("running")
	stop()
	start()
	check("after a restart of all three")
}
