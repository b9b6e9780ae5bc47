package replica

import (
	"sync"
	"testing"
	"time"
)

// memNet carries the messages of a few nodes in one process: each node's
// inbox is drained by a goroutine of its own into StepPeer (Send runs
// under the sender's lock, StepPeer takes the receiver's), and a member
// that is cut has every message to or from it dropped, as a dead process
// or a partition would.
type memNet struct {
	mu    sync.Mutex
	nodes map[uint64]*Node
	inbox map[uint64]chan []byte
	cut   map[uint64]bool
	wg    sync.WaitGroup
}

type netEnd struct {
	net  *memNet
	from uint64
}

func (e netEnd) Send(to uint64, b []byte) {
	e.net.mu.Lock()
	defer e.net.mu.Unlock()
	if e.net.cut[e.from] || e.net.cut[to] {
		return
	}
	select {
	case e.net.inbox[to] <- append([]byte(nil), b...):
	default: // full: raft tolerates the loss
	}
}

func (m *memNet) setCut(id uint64, cut bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut[id] = cut
}

// group3 starts voters 1, 2 and 3 on memNet, each ticked only by the
// test (ticks[id]), and elects 1 with a put committed on all three, so
// that none is joining any more.
func group3(t *testing.T) (*memNet, map[uint64]*Node, map[uint64]chan time.Time) {
	t.Helper()
	net := &memNet{nodes: map[uint64]*Node{}, inbox: map[uint64]chan []byte{}, cut: map[uint64]bool{}}
	ticks := map[uint64]chan time.Time{}
	voters := []uint64{1, 2, 3}
	for _, id := range voters {
		_, rl := open(t, id, voters)
		ticks[id] = make(chan time.Time)
		n, err := New(Options{ID: id, Log: rl, FileSize: fileSize, Transport: netEnd{net, id}, Host: &fakeHost{}, Ticks: ticks[id]}, 0)
		if err != nil {
			t.Fatal(err)
		}
		net.nodes[id] = n
		net.inbox[id] = make(chan []byte, 1024)
	}
	for id, n := range net.nodes {
		in := net.inbox[id]
		net.wg.Go(func() {
			for b := range in {
				_ = n.StepPeer(b) // a message raft refuses is dropped, as the transport does
			}
		})
	}
	t.Cleanup(func() {
		for _, n := range net.nodes {
			n.Close()
		}
		net.mu.Lock()
		for _, in := range net.inbox {
			close(in)
		}
		net.inbox = nil // Send after Close would panic on a closed inbox; nothing sends any more
		net.mu.Unlock()
		net.wg.Wait()
	})
	if err := net.nodes[1].Campaign(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "1 ready", net.nodes[1].Ready)
	put(t, net.nodes[1], "first")
	waitFor(t, "all caught up", func() bool {
		for _, n := range net.nodes {
			if in := n.Info(); in.Joining || in.LeaderID != 1 || in.Applied != net.nodes[1].Info().Applied {
				return false
			}
		}
		return true
	})
	return net, net.nodes, ticks
}

// put proposes body on n and waits until it commits.
func put(t *testing.T, n *Node, body string) {
	t.Helper()
	w, _, err := n.Propose(putOf(body))
	if err != nil {
		t.Fatalf("put %s: %v", body, err)
	}
	<-w.Done()
	if err := w.Err(); err != nil {
		t.Fatalf("put %s: %v", body, err)
	}
}

// TestPeerGoneElectsAtOnce: leader 1 dies (every message to or from it
// dropped); told so, followers 2 and 3 forget it, and 2, the first in
// line, wins an election on its next tick: far inside raft's election
// timeout (10 ticks), and although 3 heard from the leader within it
// (CheckQuorum's lease would have 3 ignore 2's pre-vote). The new leader
// commits a put with 3.
func TestPeerGoneElectsAtOnce(t *testing.T) {
	net, n, ticks := group3(t)
	term := n[2].Info().Term
	net.setCut(1, true)
	n[2].PeerGone(1)
	n[3].PeerGone(1)
	for _, id := range []uint64{2, 3} {
		if in := n[id].Info(); in.LeadersForgotten != 1 || in.LeaderID != 0 {
			t.Fatalf("member %d after PeerGone(leader): %+v, want the leader forgotten once", id, in)
		}
	}
	ticks[2] <- time.Time{}
	ticks[3] <- time.Time{}
	waitFor(t, "2 leads", n[2].Ready)
	if in := n[2].Info(); in.Term != term+1 || in.EarlyCampaigns != 1 {
		t.Fatalf("new leader 2: %+v, want term %d after one early campaign", in, term+1)
	}
	if in := n[3].Info(); in.EarlyCampaigns != 0 {
		t.Fatalf("member 3 campaigned (%d) although 2 was first in line", in.EarlyCampaigns)
	}
	put(t, n[2], "after")
}

// TestPeerGoneSecondInLine: the first in line (2) cannot win, its log
// being behind 3's (it was cut off while a put committed on 1 and 3);
// 3 campaigns a tick later and wins, with 2's vote.
func TestPeerGoneSecondInLine(t *testing.T) {
	net, n, ticks := group3(t)
	net.setCut(2, true)
	put(t, n[1], "without 2")
	waitFor(t, "3 applied it", func() bool { return n[3].Info().Applied == n[1].Info().Applied })
	net.setCut(1, true)
	net.setCut(2, false)
	n[2].PeerGone(1)
	n[3].PeerGone(1)
	for range 2 {
		ticks[2] <- time.Time{}
		ticks[3] <- time.Time{}
	}
	waitFor(t, "3 leads", n[3].Ready)
	if in := n[3].Info(); in.EarlyCampaigns != 1 {
		t.Fatalf("new leader 3: %+v, want one early campaign", in)
	}
	put(t, n[3], "after")
	waitFor(t, "2 follows 3", func() bool { return n[2].Info().LeaderID == 3 })
}

// TestPeerGoneWrong: a follower told wrongly that its leader is gone
// (its own connection broke; the leader lives and 3 still hears it)
// campaigns and disrupts nothing: 1 and 3 ignore its pre-votes, no term
// changes, and it follows 1 again at 1's next heartbeat. Reports of a
// member that is not the leader, or to the leader, change nothing.
func TestPeerGoneWrong(t *testing.T) {
	_, n, ticks := group3(t)
	term := n[1].Info().Term
	n[1].PeerGone(2)
	n[3].PeerGone(2)
	for id := range n {
		if in := n[id].Info(); in.LeadersForgotten != 0 || in.LeaderID != 1 {
			t.Fatalf("member %d after a report of a member that does not lead: %+v", id, in)
		}
	}
	n[2].PeerGone(1)
	ticks[2] <- time.Time{}
	ticks[2] <- time.Time{} // the first campaign is on the first tick; this one answers nothing new
	if in := n[2].Info(); in.EarlyCampaigns != 1 || in.Term != term {
		t.Fatalf("member 2 after a wrong report: %+v, want one pre-vote campaign at term %d", in, term)
	}
	ticks[1] <- time.Time{} // a heartbeat
	waitFor(t, "2 follows 1 again", func() bool { return n[2].Info().LeaderID == 1 })
	for id := range n {
		if in := n[id].Info(); in.Term != term || in.LeaderID != 1 {
			t.Fatalf("member %d after the wrong report: term %d leader %d, want term %d leader 1", id, in.Term, in.LeaderID, term)
		}
	}
	if !n[1].Ready() {
		t.Fatal("leader 1 is no longer ready")
	}
	put(t, n[1], "after")
}
