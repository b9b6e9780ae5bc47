package client

import (
	"maps"
	"slices"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// leaderCheckEvery is how often a leader check asks the members again
// while a keyed send still waits: a round is a GetReplicaInfo to each
// other member (cheap; a paused one's is bounded by ProbeTimeout and not
// waited for once another member answers that it leads), and the rounds
// stop when no send waits.
const leaderCheckEvery = 100 * time.Millisecond

// stallWatch is a keyed send to addr, watched from LeaderCheckAfter on:
// cut ends it (once) if a check finds another member leading in a later
// term.
type stallWatch struct {
	addr string
	cut  func(movedTo string)
	// Guarded by LeaderTracker.mu (it is in t.watches[addr] once its send
	// has waited LeaderCheckAfter, until a check cuts it or stop runs):
	done    bool   // its send ended (stop ran)
	movedTo string // the leader a check found when it cut the send
}

// watchSend arms the leader check for a keyed send to addr (see
// Options.LeaderCheckAfter): once the send has waited LeaderCheckAfter, the
// tracker asks the other members, every leaderCheckEvery while it waits,
// whether one of them is the ready leader in a term later than the one
// addr last said it led in. The first that is becomes the leader puts go
// to, and cut is called with its address for every send waiting at addr
// (in a goroutine of the tracker's, at most once per send). Cutting a keyed
// send risks nothing: it is sent again, and the group stores its key once.
// stop disarms the watch when the send ends; it returns the address cut
// was called with, or "".
func (t *LeaderTracker) watchSend(addr string, cut func(movedTo string)) (stop func() string) {
	if t.opts.LeaderCheckAfter <= 0 {
		return func() string { return "" }
	}
	w := &stallWatch{addr: addr, cut: cut}
	timer := time.AfterFunc(t.opts.LeaderCheckAfter, func() { t.stalled(w) })
	return func() string {
		timer.Stop()
		t.mu.Lock()
		defer t.mu.Unlock()
		w.done = true
		if ws := t.watches[w.addr]; ws != nil { // a check that cut w took it out already
			delete(ws, w)
			if len(ws) == 0 {
				delete(t.watches, w.addr)
			}
		}
		return w.movedTo
	}
}

// stalled registers w (its send has waited LeaderCheckAfter) and starts
// the check loop if none runs.
func (t *LeaderTracker) stalled(w *stallWatch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.done || t.closed {
		return
	}
	if t.watches[w.addr] == nil {
		t.watches[w.addr] = map[*stallWatch]struct{}{}
	}
	t.watches[w.addr][w] = struct{}{}
	if !t.checking {
		t.checking = true
		t.wg.Add(1)
		go t.checkLoop()
	}
}

// checkLoop checks, every leaderCheckEvery, each address sends wait at,
// until none does or the tracker closes.
func (t *LeaderTracker) checkLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(leaderCheckEvery)
	defer tick.Stop()
	for {
		t.mu.Lock()
		if len(t.watches) == 0 || t.closed {
			t.checking = false
			t.mu.Unlock()
			return
		}
		stalled := slices.Sorted(maps.Keys(t.watches))
		t.mu.Unlock()
		for _, a := range stalled {
			t.checkLeader(a)
		}
		select {
		case <-tick.C:
		case <-t.ctx.Done():
		}
	}
}

// checkLeader asks every address but stalled for its replica info; the
// first that says it is the ready leader in a term later than the one
// stalled last said it led in deposes stalled.
func (t *LeaderTracker) checkLeader(stalled string) {
	t.mu.Lock()
	addrs := slices.DeleteFunc(t.addrsLocked(), func(a string) bool { return a == stalled })
	term := t.terms[stalled]
	t.mu.Unlock()
	found := false
	t.probeAll(addrs, func(addr string, ri *storagedv1.GetReplicaInfoResponse) bool {
		if !found && isReadyLeader(ri) && ri.GetTerm() > term {
			found = true
			t.depose(stalled, addr)
		}
		return found
	})
}

// depose makes leader the address puts go to in stalled's place and cuts
// the sends waiting at stalled.
func (t *LeaderTracker) depose(stalled, leader string) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	if _, ok := t.conns[leader]; ok && (t.leader == stalled || t.leader == "") {
		t.leader = leader
	}
	ws := t.watches[stalled]
	delete(t.watches, stalled)
	for w := range ws {
		w.movedTo = leader
	}
	t.mu.Unlock()
	for w := range ws {
		w.cut(leader)
	}
}
