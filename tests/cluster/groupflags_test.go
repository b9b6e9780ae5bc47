package cluster

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/metricstest"
	"github.com/storaged/storaged/internal/proctest"
)

// TestGroupRaftFlags: the group flags of cmd/storaged on real processes.
// A group of 3 started with --raft-tick 20ms, --raft-election-timeout
// 300ms and --raft-group orders-eu runs raft with them: every member's
// storaged_raft_tick_seconds is 0.02 and storaged_raft_election_ticks 15,
// read from the running replica (the defaults are 0.1 and 10, so a flag
// that did not reach raft shows). It elects a leader, takes puts, and
// survives three kill -9 failovers of its leader (each killed member
// restarted, with the same timing). (How fast a failover is no longer
// tells the timing apart: a survivor whose transport finds the leader's
// process gone campaigns at once, whatever the election timeout.) A
// member restarted with --raft-group orders-us on its data dir refuses to
// start, exit status non-zero, naming both groups, and starts again with
// its own name and catches up. --raft-tick without --raft-peers is
// refused before anything is opened.
func TestGroupRaftFlags(t *testing.T) {
	metrics := freePorts(t, 3)
	flags := []string{"--raft-tick", "20ms", "--raft-election-timeout", "300ms", "--raft-group", "orders-eu"}
	g := newGroupWith(t, 3, 1, func(id int) []string { return []string{"--metrics-listen", metrics[id-1]} }, flags...)
	leader := g.Leader(t)
	// checkTiming: every member's replica runs with the flags' timing.
	checkTiming := func() {
		t.Helper()
		for i, p := range g.Nodes() {
			if v := gauge(t, metrics[i], "storaged_raft_tick_seconds"); v != 0.02 {
				t.Errorf("%s: storaged_raft_tick_seconds %v, want 0.02 (--raft-tick 20ms)", g.Name(p), v)
			}
			if v := gauge(t, metrics[i], "storaged_raft_election_ticks"); v != 15 {
				t.Errorf("%s: storaged_raft_election_ticks %v, want 15 (--raft-election-timeout 300ms of 20 ms ticks)", g.Name(p), v)
			}
		}
	}
	checkTiming()
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

	// Failovers: after kill -9 of the leader the two left elect another,
	// which takes puts; the killed member comes back.
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
		old.Kill(t)
		next := g.Leader(t)
		t.Logf("failover from %s to %s", g.Name(old), g.Name(next))
		put(next, fmt.Sprint("after-failover-", len(acked)))
		old.Restart(t)
	}
	checkTiming() // the restarted members too (Restart waits for SERVING: the store is open)

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

// gauge is the value of the unlabelled gauge name on the /metrics of the
// member listening on addr (--metrics-listen).
func gauge(t *testing.T, addr, name string) float64 {
	t.Helper()
	mfs, body := metricstest.Scrape(t, addr)
	mf := mfs[name]
	if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge() == nil {
		t.Fatalf("%s: not one gauge on %s:\n%s", name, addr, body)
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}
