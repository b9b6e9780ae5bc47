package peer

import (
	"context"
	"fmt"
	"io"
	"log"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// raftNode is a real etcd-raft RawNode over MemoryStorage (the transport is
// under test here, not the log), run by one goroutine with the classic
// Ready loop, its messages carried by a Transport.
type raftNode struct {
	id       uint64
	rn       *raft.RawNode
	ms       *raft.MemoryStorage
	tr       *Transport
	inbox    chan *pb.Message
	unreach  chan uint64
	proposeC chan []byte

	mu      sync.Mutex
	applied []string
	leader  bool
}

// StepPeer decodes on the transport's goroutine and hands the message to
// the raft goroutine; a full inbox drops it (raft tolerates loss).
func (n *raftNode) StepPeer(b []byte) error {
	m := &pb.Message{}
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	select {
	case n.inbox <- m:
		return nil
	default:
		return fmt.Errorf("inbox full")
	}
}

func (n *raftNode) ReportUnreachable(id uint64) {
	select {
	case n.unreach <- id:
	default:
	}
}

func (n *raftNode) PeerGone(uint64) {}

func (n *raftNode) run(ctx context.Context, t *testing.T) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			n.rn.Tick()
		case m := <-n.inbox:
			_ = n.rn.Step(m) // stale or foreign-term messages are refused; raft ignores them
		case id := <-n.unreach:
			n.rn.ReportUnreachable(id)
		case p := <-n.proposeC:
			_ = n.rn.Propose(p) // ErrProposalDropped on a follower: the test offers it again
		}
		for n.rn.HasReady() {
			rd := n.rn.Ready()
			if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
				if err := n.ms.SetHardState(rd.HardState); err != nil {
					t.Error(err)
					return
				}
			}
			if err := n.ms.Append(rd.Entries); err != nil {
				t.Error(err)
				return
			}
			for _, m := range rd.Messages {
				b, err := proto.Marshal(m)
				if err != nil {
					t.Error(err)
					return
				}
				n.tr.Send(m.GetTo(), b)
			}
			n.mu.Lock()
			if rd.SoftState != nil {
				n.leader = rd.SoftState.RaftState == raft.StateLeader
			}
			for _, e := range rd.CommittedEntries {
				if e.GetType() == pb.EntryType_EntryNormal && len(e.GetData()) > 0 {
					n.applied = append(n.applied, string(e.GetData()))
				}
			}
			n.mu.Unlock()
			n.rn.Advance(rd)
		}
	}
}

func (n *raftNode) state() (applied []string, leader bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.applied...), n.leader
}

// Three RawNodes, each with its own Transport on loopback, elect a leader
// and commit proposals: every node applies the same entries in the same
// order. Then the leader's transport is closed (its node stops), and the
// other two elect a new leader and commit more.
func TestRaftOverTransport(t *testing.T) {
	lis, peers := listeners(t, 3)
	nodes := make([]*raftNode, 3)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stopped := make([]context.CancelFunc, 3)
	defer func() {
		cancel()
		wg.Wait()
		for i, n := range nodes {
			if stopped[i] != nil {
				if err := n.tr.Close(); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	for i := range nodes {
		id := uint64(i + 1)
		ms := raft.NewMemoryStorage()
		if err := ms.ApplySnapshot(&pb.Snapshot{Metadata: &pb.SnapshotMetadata{
			ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}, Index: proto.Uint64(1), Term: proto.Uint64(1)}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: ms,
			MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true, DisableProposalForwarding: true,
			Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}})
		if err != nil {
			t.Fatal(err)
		}
		n := &raftNode{id: id, rn: rn, ms: ms, inbox: make(chan *pb.Message, 4096), unreach: make(chan uint64, 16), proposeC: make(chan []byte, 16)}
		tr, err := New(lis[i], n, testOptions(id, peers))
		if err != nil {
			t.Fatal(err)
		}
		n.tr = tr
		nodes[i] = n
	}
	for i, n := range nodes {
		nctx, ncancel := context.WithCancel(ctx)
		stopped[i] = ncancel
		wg.Add(1)
		go func() { defer wg.Done(); n.run(nctx, t) }()
	}

	// commit offers p to every live node until all of them applied it.
	commit := func(live []*raftNode, p string) {
		t.Helper()
		waitFor(t, "commit of "+p, 30*time.Second, func() bool {
			all := true
			for _, n := range live {
				a, _ := n.state()
				if !contains(a, p) {
					all = false
				}
			}
			if !all {
				for _, n := range live {
					select {
					case n.proposeC <- []byte(p):
					default:
					}
				}
			}
			return all
		})
	}
	for k := range 30 {
		commit(nodes, fmt.Sprintf("p%d", k))
	}
	checkSame(t, nodes)

	// Stop the leader's node and transport; the other two carry on.
	lead := -1
	waitFor(t, "a leader", 30*time.Second, func() bool {
		for i, n := range nodes {
			if _, l := n.state(); l {
				lead = i
				return true
			}
		}
		return false
	})
	stopped[lead]()
	if err := nodes[lead].tr.Close(); err != nil {
		t.Fatal(err)
	}
	stopped[lead] = nil
	var live []*raftNode
	for i, n := range nodes {
		if i != lead {
			live = append(live, n)
		}
	}
	for k := range 10 {
		commit(live, fmt.Sprintf("q%d", k))
	}
	checkSame(t, live)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checkSame: every node applied the same sequence (a prefix of the
// longest, since the last entries may still be on their way).
func checkSame(t *testing.T, nodes []*raftNode) {
	t.Helper()
	var longest []string
	for _, n := range nodes {
		if a, _ := n.state(); len(a) > len(longest) {
			longest = a
		}
	}
	for _, n := range nodes {
		a, _ := n.state()
		for i := range a {
			if a[i] != longest[i] {
				t.Fatalf("node %d applied %q at %d, another %q", n.id, a[i], i, longest[i])
			}
		}
	}
}
