package cluster

import (
	"fmt"
	"testing"

	"github.com/storaged/storaged/internal/metricstest"
	"github.com/storaged/storaged/internal/proctest"
)

// TestGroupLeaderGone: kill -9 of the leader of three real processes whose
// election timeout is 5 s. The survivors' peer transports find its
// process gone (their streams to it end, and the proxy in front of it
// refuses the next, its target refusing), both forget it
// (storaged_raft_leaders_forgotten_total) and one of them wins an early
// election (storaged_raft_early_campaigns_total) in a later term. Raft's
// own timeout would have elected someone too, 5-10 s later, without
// either counter moving, so what is checked is not time. The new leader
// takes puts and serves the old leader's.
func TestGroupLeaderGone(t *testing.T) {
	metrics := freePorts(t, 3)
	g := newGroupWith(t, 3, 1, func(id int) []string { return []string{"--metrics-listen", metrics[id-1]} },
		"--raft-election-timeout", "5s")
	leader := g.Leader(t)
	acked := map[int64]string{}
	for k := range 10 {
		body := fmt.Sprintf("before-%d", k)
		off, err := putTo(leader, body)
		if err != nil {
			t.Fatalf("put %d to leader %s: %v", k, g.Name(leader), err)
		}
		acked[off] = body
	}
	term := mustReplicaInfo(t, leader).GetTerm()
	var survivors []*proctest.Process
	for i, p := range g.nodes {
		if p != leader {
			survivors = append(survivors, p)
			if n := counter(t, metrics[i], "storaged_raft_leaders_forgotten_total"); n != 0 {
				t.Fatalf("%s forgot %v leaders before any died", g.Name(p), n)
			}
		}
	}

	leader.Kill(t)
	newLeader := g.Leader(t)
	// A later term, not necessarily the next: a first candidate that
	// stalls (a slow sync of its vote, a lost vote) lets the other campaign
	// in the term after. The counters below say the election was an early
	// one rather than raft's timeout.
	if ri := mustReplicaInfo(t, newLeader); ri.GetTerm() <= term {
		t.Errorf("new leader %s in term %d, want above %d: elected after the kill", g.Name(newLeader), ri.GetTerm(), term)
	}
	for _, p := range survivors {
		m := metrics[g.index(g.Name(p))]
		if n := counter(t, m, "storaged_raft_leaders_forgotten_total"); n != 1 {
			t.Errorf("%s: storaged_raft_leaders_forgotten_total %v, want 1 (its transport found the leader gone)", g.Name(p), n)
		}
		if n := counter(t, m, "storaged_raft_early_campaigns_total"); p == newLeader && n < 1 {
			t.Errorf("new leader %s: storaged_raft_early_campaigns_total %v, want at least 1", g.Name(p), n)
		}
	}
	for k := range 10 {
		body := fmt.Sprintf("after-%d", k)
		off, err := putTo(newLeader, body)
		if err != nil {
			t.Fatalf("put %d to new leader %s: %v", k, g.Name(newLeader), err)
		}
		acked[off] = body
	}
	checkAcked(t, g.Name(newLeader), newLeader, acked)
}

// counter is the value of the unlabelled counter name on the /metrics of
// the member listening on addr (--metrics-listen).
func counter(t *testing.T, addr, name string) float64 {
	t.Helper()
	mfs, body := metricstest.Scrape(t, addr)
	mf := mfs[name]
	if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetCounter() == nil {
		t.Fatalf("%s: not one counter on %s:\n%s", name, addr, body)
	}
	return mf.GetMetric()[0].GetCounter().GetValue()
}
