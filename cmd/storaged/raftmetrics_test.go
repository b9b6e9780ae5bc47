package main

import (
	"testing"

	"github.com/storaged/storaged/internal/metricstest"
)

// TestRaftMetrics: a group member's /metrics has the raft loop's
// histograms, fed from its replica: the rounds of the loop
// (storaged_raft_ready_seconds) and the raft log's syncs
// (storaged_raft_log_sync_seconds), each counting at least the syncs of
// its election and first entry, and raft's reads of the log; and the peer
// transport's counters.
func TestRaftMetrics(t *testing.T) {
	l := startLeader1(t, nil, "--metrics-listen", "127.0.0.1:0")
	defer l.stop(t)
	mfs, body := metricstest.Scrape(t, l.metricsAddr)
	count := func(name string) uint64 {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetHistogram() == nil {
			t.Fatalf("%s: not one histogram in\n%s", name, body)
		}
		return mf.GetMetric()[0].GetHistogram().GetSampleCount()
	}
	// At most one sync a round; a round that synced may not be counted
	// yet when the scrape reads it (as TestSingleVoter allows).
	syncs, rounds := count("storaged_raft_log_sync_seconds"), count("storaged_raft_ready_seconds")
	if syncs < 1 || rounds+1 < syncs {
		t.Errorf("storaged_raft_log_sync_seconds_count %d, storaged_raft_ready_seconds_count %d", syncs, rounds)
	}
	count("storaged_raft_storage_entries_seconds")

	// The peer links: one series per peer, for learner 2, which never
	// runs: no stream opened to it, nothing written, nothing received.
	for _, name := range []string{"storaged_raft_peer_messages_sent_total", "storaged_raft_peer_messages_dropped_total",
		"storaged_raft_peer_streams_opened_total"} {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 1 ||
			mf.GetMetric()[0].GetLabel()[0].GetValue() != "2" {
			t.Fatalf("%s: not one series for peer 2 in\n%s", name, body)
		}
		if v := mf.GetMetric()[0].GetCounter().GetValue(); name != "storaged_raft_peer_messages_dropped_total" && v != 0 {
			t.Errorf("%s{peer=2} = %v, want 0: member 2 never ran", name, v)
		}
	}
	if mf := mfs["storaged_raft_peer_messages_received_total"]; mf == nil || mf.GetMetric()[0].GetCounter().GetValue() != 0 {
		t.Errorf("storaged_raft_peer_messages_received_total: %v, want 0", mf)
	}
}
