package replica

import (
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

func ent(index, term uint64, size int) *pb.Entry {
	return &pb.Entry{Index: new(index), Term: new(term), Data: make([]byte, size)}
}

func app(to, term, index, logTerm, commit uint64, ents ...*pb.Entry) *pb.Message {
	return &pb.Message{Type: pb.MsgApp.Enum(), To: new(to), From: new(uint64(1)), Term: new(term), Index: new(index),
		LogTerm: new(logTerm), Commit: new(commit), Entries: ents}
}

func resp(to, term, index uint64, reject bool) *pb.Message {
	return &pb.Message{Type: pb.MsgAppResp.Enum(), To: new(to), From: new(uint64(2)), Term: new(term), Index: new(index),
		Reject: new(reject)}
}

// show renders messages for comparison: type, destination, term, index,
// log term, commit, reject and the entries' indexes.
func show(msgs []*pb.Message) string {
	s := ""
	for _, m := range msgs {
		var idx []uint64
		for _, e := range m.Entries {
			idx = append(idx, e.GetIndex())
		}
		s += fmt.Sprintf("[%v to=%d t=%d i=%d lt=%d c=%d rej=%v %v] ", m.GetType(), m.GetTo(), m.GetTerm(), m.GetIndex(),
			m.GetLogTerm(), m.GetCommit(), m.GetReject(), idx)
	}
	return s
}

// TestCoalesce: the rewrites coalesce makes and the ones it must not.
func TestCoalesce(t *testing.T) {
	big := maxSizePerMsg / 2
	for _, tc := range []struct {
		name     string
		in, want []*pb.Message
	}{
		{"contiguous appends merge, per peer, with the highest commit",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(3, 5, 10, 5, 9, ent(11, 5, 1)),
				app(2, 5, 11, 5, 10, ent(12, 5, 1)), app(3, 5, 11, 5, 10, ent(12, 5, 1)), app(2, 5, 12, 5, 10, ent(13, 5, 1), ent(14, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 10, ent(11, 5, 1), ent(12, 5, 1), ent(13, 5, 1), ent(14, 5, 1)),
				app(3, 5, 10, 5, 10, ent(11, 5, 1), ent(12, 5, 1))}},
		{"a gap does not merge",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(2, 5, 12, 5, 9, ent(13, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(2, 5, 12, 5, 9, ent(13, 5, 1))}},
		{"an overlap does not merge",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1), ent(12, 5, 1)), app(2, 5, 11, 5, 9, ent(12, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1), ent(12, 5, 1)), app(2, 5, 11, 5, 9, ent(12, 5, 1))}},
		{"another log term at the join does not merge",
			[]*pb.Message{app(2, 5, 10, 4, 9, ent(11, 4, 1)), app(2, 5, 11, 5, 9, ent(12, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 4, 9, ent(11, 4, 1)), app(2, 5, 11, 5, 9, ent(12, 5, 1))}},
		{"another message term does not merge",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(2, 6, 11, 5, 9, ent(12, 6, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(2, 6, 11, 5, 9, ent(12, 6, 1))}},
		{"an empty append (a probe, a commit update) merges with the append that continues it",
			[]*pb.Message{app(2, 5, 10, 5, 9), app(2, 5, 10, 5, 10, ent(11, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 10, ent(11, 5, 1))}},
		{"an empty append that continues an append merges into it, with its higher commit",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), app(2, 5, 11, 5, 11), app(2, 5, 11, 5, 11, ent(12, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 11, ent(11, 5, 1), ent(12, 5, 1))}},
		{"empty appends at one index merge; at another they do not",
			[]*pb.Message{app(2, 5, 10, 5, 9), app(2, 5, 10, 5, 10), app(2, 5, 12, 5, 10)},
			[]*pb.Message{app(2, 5, 10, 5, 10), app(2, 5, 12, 5, 10)}},
		{"a message to the same peer in between stops the merge",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), {Type: pb.MsgHeartbeat.Enum(), To: new(uint64(2)), Term: new(uint64(5))},
				app(2, 5, 11, 5, 9, ent(12, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, 1)), {Type: pb.MsgHeartbeat.Enum(), To: new(uint64(2)), Term: new(uint64(5))},
				app(2, 5, 11, 5, 9, ent(12, 5, 1))}},
		{"merging stops at maxSizePerMsg bytes of entries",
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, big)), app(2, 5, 11, 5, 9, ent(12, 5, big)), app(2, 5, 12, 5, 9, ent(13, 5, 1))},
			[]*pb.Message{app(2, 5, 10, 5, 9, ent(11, 5, big), ent(12, 5, big)), app(2, 5, 12, 5, 9, ent(13, 5, 1))}},
		{"accepting answers keep the highest index, in the first one's place",
			[]*pb.Message{resp(1, 5, 11, false), {Type: pb.MsgVoteResp.Enum(), To: new(uint64(3)), Term: new(uint64(5))},
				resp(1, 5, 13, false), resp(1, 5, 12, false)},
			[]*pb.Message{resp(1, 5, 13, false), {Type: pb.MsgVoteResp.Enum(), To: new(uint64(3)), Term: new(uint64(5))}}},
		{"rejections and other terms are kept",
			[]*pb.Message{resp(1, 5, 11, false), resp(1, 5, 12, true), resp(1, 5, 13, false), resp(1, 6, 14, false)},
			[]*pb.Message{resp(1, 5, 11, false), resp(1, 5, 12, true), resp(1, 5, 13, false), resp(1, 6, 14, false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := show(coalesce(tc.in)), show(tc.want); got != want {
				t.Fatalf("coalesce:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestCoalesceKeepsRaftsSlices: a merged run gets an entry slice of its
// own; the first append's slice (which may be raft's unstable log) is
// not written past its length.
func TestCoalesceKeepsRaftsSlices(t *testing.T) {
	backing := []*pb.Entry{ent(11, 5, 1), ent(12, 5, 1), ent(99, 5, 1)}
	orig := slices.Clone(backing)
	first := app(2, 5, 10, 5, 9)
	first.Entries = backing[:1:3] // room to append in place
	out := coalesce([]*pb.Message{first, app(2, 5, 11, 5, 9, ent(12, 5, 1))})
	if len(out) != 1 || len(out[0].Entries) != 2 {
		t.Fatalf("got %s", show(out))
	}
	if !slices.Equal(backing, orig) {
		t.Fatal("coalesce wrote into the first append's backing array")
	}
	if &out[0].Entries[0] == &backing[0] {
		t.Fatal("the merged append shares the first append's slice")
	}
}

// TestCoalesceRaftEquivalence runs two identical three-node raft groups
// (raft.MemoryStorage, messages delivered in order after each Ready, a
// random number of proposals between Readys) from one seed, one with
// every Ready's messages coalesced: both must end with the same logs,
// commits and leader progress, and the coalesced one must have sent
// fewer messages.
func TestCoalesceRaftEquivalence(t *testing.T) {
	for seed := range uint64(20) {
		plain, merged := runGroup(t, seed, false), runGroup(t, seed, true)
		if plain.state != merged.state {
			t.Fatalf("seed %d: state differs\nplain:  %s\nmerged: %s", seed, plain.state, merged.state)
		}
		if merged.sent >= plain.sent {
			t.Fatalf("seed %d: coalesced %d messages, plain %d", seed, merged.sent, plain.sent)
		}
		if seed == 0 {
			t.Logf("seed 0: %d messages coalesced, %d plain", merged.sent, plain.sent)
		}
	}
}

type groupRun struct {
	state string
	sent  int
}

func runGroup(t *testing.T, seed uint64, merge bool) groupRun {
	t.Helper()
	// props picks the proposals (the same in both runs), rng the
	// schedule: whose Ready, how many deliveries, which are lost.
	props, rng := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 2))
	ids := []uint64{1, 2, 3}
	nodes := map[uint64]*raft.RawNode{}
	stores := map[uint64]*raft.MemoryStorage{}
	for _, id := range ids {
		st := raft.NewMemoryStorage()
		if err := st.ApplySnapshot(&pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(uint64(1)), Term: new(uint64(1)),
			ConfState: &pb.ConfState{Voters: ids}}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
			MaxSizePerMsg: maxSizePerMsg, MaxInflightMsgs: 256, Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[id], stores[id] = rn, st
	}
	var queue []*pb.Message
	sent := 0
	step := func(m *pb.Message) {
		if err := nodes[m.GetTo()].Step(m); err != nil {
			t.Fatal(err)
		}
	}
	// ready persists one Ready of node id and queues its messages.
	ready := func(id uint64) {
		rn := nodes[id]
		rd := rn.Ready()
		if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
			if err := stores[id].SetHardState(rd.HardState); err != nil {
				t.Fatal(err)
			}
		}
		if err := stores[id].Append(rd.Entries); err != nil {
			t.Fatal(err)
		}
		msgs := rd.Messages
		if merge {
			msgs = coalesce(msgs)
		}
		sent += len(msgs)
		queue = append(queue, msgs...)
		rn.Advance(rd)
	}
	drain := func() {
		for progress := true; progress; {
			progress = false
			for _, id := range ids {
				rn := nodes[id]
				if !rn.HasReady() {
					continue
				}
				progress = true
				ready(id)
			}
			for len(queue) > 0 {
				step(queue[0])
				queue = queue[1:]
				progress = true
			}
		}
	}
	if err := nodes[1].Campaign(); err != nil {
		t.Fatal(err)
	}
	drain()
	for range 150 {
		for range props.IntN(20) {
			if err := nodes[1].Propose([]byte{byte(props.IntN(256))}); err != nil {
				t.Fatal(err)
			}
		}
		// Readys of the leader interleave with deliveries: take one
		// Ready of a random node and deliver part of the queue.
		id := ids[rng.IntN(3)]
		if nodes[id].HasReady() {
			ready(id)
		}
		for k := rng.IntN(len(queue) + 1); k > 0; k-- {
			m := queue[0]
			queue = queue[1:]
			if rng.IntN(10) != 0 { // else lost: the leader's probes and heartbeats recover
				step(m)
			}
		}
	}
	// The leader's heartbeats bring the followers' logs and commits back
	// after losses.
	for range 100 {
		drain()
		if caughtUp(nodes) {
			break
		}
		nodes[1].Tick()
	}
	if !caughtUp(nodes) {
		t.Fatalf("seed %d (coalesce %v): the group did not converge", seed, merge)
	}
	state := ""
	for _, id := range ids {
		st := stores[id]
		first, _ := st.FirstIndex()
		last, _ := st.LastIndex()
		ents, err := st.Entries(first, last+1, 1<<62)
		if err != nil {
			t.Fatal(err)
		}
		var data []byte
		for _, e := range ents {
			data = append(data, e.Data...)
		}
		s := nodes[id].Status()
		state += fmt.Sprintf("node %d: %s commit %d last %d data crc %08x; ", id, s.RaftState, s.GetCommit(), last, crc32.ChecksumIEEE(data))
		if id == 1 {
			for _, k := range slices.Sorted(maps.Keys(s.Progress)) {
				state += fmt.Sprintf("match[%d]=%d ", k, s.Progress[k].Match)
			}
		}
	}
	return groupRun{state: state, sent: sent}
}

// caughtUp: every member has the leader's last entry and commits it.
func caughtUp(nodes map[uint64]*raft.RawNode) bool {
	l := nodes[1].Status()
	last := l.Progress[1].Match
	for _, pr := range l.Progress {
		if pr.Match != last {
			return false
		}
	}
	for _, rn := range nodes {
		if rn.Status().GetCommit() != last {
			return false
		}
	}
	return true
}
