package cluster

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/proctest"
)

// TestGroupRaftFlags: the group flags of cmd/storaged on real processes.
// A group of 3 started with --raft-tick 20ms, --raft-election-timeout
// 200ms and --raft-group orders-eu elects a leader and takes puts, and
// after kill -9 of the leader elects the next one faster than the default
// election timeout (1 s, randomized up to 2 s) allows (the fastest of
// three failovers): the timing reached raft. A member restarted with --raft-group orders-us on its data dir
// refuses to start, exit status non-zero, naming both groups, and starts
// again with its own name and catches up. --raft-tick without
// --raft-peers is refused before anything is opened.
func TestGroupRaftFlags(t *testing.T) {
	flags := []string{"--raft-tick", "20ms", "--raft-election-timeout", "200ms", "--raft-group", "orders-eu"}
	g := newGroup(t, flags...)
	leader := g.Leader(t)
	acked := map[int64]string{}
	put := func(p *proctest.Process, body string) {
		t.Helper()
		off, err := putTo(p, body)
		if err != nil {
			t.Fatalf("put %s to %s: %v", body, g.Name(p), err)
		}
		acked[off] = body
	}
	for _, b := range []string{"a", "b", "c"} {
		put(leader, b)
	}

	// Failovers within the configured timing: the two left hear no
	// leader for 200-400 ms (20 ms ticks), then elect. With the defaults
	// (100 ms ticks, 1 s) nobody starts an election before 0.9 s after
	// the kill (1 s after the last heartbeat), so the fastest of three
	// failovers tells the two apart whatever the machine's load (a slow
	// one, a split vote, only ever makes a failover slower).
	best := time.Hour
	for i := range 3 {
		// Every member caught up first: a member bootstrapped empty votes
		// for no candidate with a log before it heard from a leader
		// (replica.go's joining), so with the leader gone before that the
		// other two could not elect at all.
		for _, p := range g.Nodes() {
			waitAcked(t, g.Name(p), p, acked)
		}
		old := g.Leader(t)
		t.Logf("failover %d: killing the leader %s", i, g.Name(old))
		killed := time.Now()
		old.Kill(t)
		next := g.Leader(t)
		took := time.Since(killed)
		best = min(best, took)
		t.Logf("failover from %s to %s took %v", g.Name(old), g.Name(next), took)
		put(next, fmt.Sprint("after-failover-", len(acked)))
		old.Restart(t)
	}
	if best >= 800*time.Millisecond {
		t.Fatalf("the fastest of three failovers took %v: not the 200 ms election timeout (the flags did not reach raft)", best)
	}

	// A follower restarted under another group name refuses its data dir.
	var follower *proctest.Process
	leader = g.Leader(t)
	for _, p := range g.Nodes() {
		if p != leader {
			follower = p
			break
		}
	}
	follower.Kill(t)
	own := follower.Flags()
	other := slices.Clone(own)
	other[slices.Index(other, "orders-eu")] = "orders-us"
	follower.SetFlags(t, other)
	stderr, err := follower.StartRefused(t, 60*time.Second)
	if err == nil {
		t.Fatal("a member under another --raft-group started")
	}
	if !strings.Contains(stderr, `group \"orders-eu\", not \"orders-us\"`) && !strings.Contains(stderr, `group "orders-eu", not "orders-us"`) {
		t.Fatalf("the refusal does not name the data dir's group and the flag's:\n%s", stderr)
	}
	follower.SetFlags(t, own)
	follower.Restart(t)
	put(g.Leader(t), "e")
	for _, p := range g.Nodes() {
		waitAcked(t, g.Name(p), p, acked)
	}

	// Timing flags without a group are refused at the flag check.
	solo := proctest.New(t, proctest.Options{Binary: binary, Name: "solo", DataDir: filepath.Join(t.TempDir(), "solo"),
		Flags: []string{"--raft-tick", "20ms"}})
	stderr, err = solo.StartRefused(t, 30*time.Second)
	if err == nil || !strings.Contains(stderr, "--raft-tick need --raft-peers") {
		t.Fatalf("--raft-tick without --raft-peers: %v\n%s", err, stderr)
	}
}
