package server

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// gauges gathers reg into name{peer} → value.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				out[name+"_count"] = float64(h.GetSampleCount())
				out[name+"_sum"] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					out[name+"{le="+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)+"}"] = float64(b.GetCumulativeCount())
				}
			default:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestReplicaCollector: the storaged_raft_* gauges say what ReplicaInfo
// says at scrape time, per peer on the leader.
func TestReplicaCollector(t *testing.T) {
	// Three reads of the log: 3 µs, 1.5 ms and 2 s (power-of-two µs buckets).
	entries := storage.HistogramSnapshot{Bounds: []time.Duration{time.Microsecond, 4 * time.Microsecond, 2048 * time.Microsecond, 4 * time.Second},
		Counts: []uint64{0, 1, 1, 1}, Sum: 2*time.Second + 1503*time.Microsecond}
	ri := ReplicaInfo{Role: RoleLeader, ID: 1, Term: 7, LeaderID: 1, Commit: 42, Applied: 41, CommitEnd: 9000, Ready: true,
		Peers:          []PeerProgress{{ID: 2, Match: 42, RecentActive: true}, {ID: 3, Match: 30}},
		ReadaheadBytes: 64 << 20, Readaheads: 3, StorageEntries: entries, LeadersForgotten: 2, EarlyCampaigns: 5,
		TickInterval: 20 * time.Millisecond, ElectionTicks: 15,
		// Two rounds of 700 µs and 3 ms; one sync of 300 µs.
		ReadyHandling: storage.HistogramSnapshot{Bounds: []time.Duration{1024 * time.Microsecond, 4096 * time.Microsecond, time.Second},
			Counts: []uint64{1, 1, 0}, Sum: 3700 * time.Microsecond},
		LogSync: storage.HistogramSnapshot{Bounds: []time.Duration{512 * time.Microsecond, time.Second},
			Counts: []uint64{1, 0}, Sum: 300 * time.Microsecond}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewReplicaCollector(func() ReplicaInfo { return ri }))
	want := map[string]float64{
		"storaged_raft_has_leader": 1, "storaged_raft_is_leader": 1, "storaged_raft_ready": 1, "storaged_raft_term": 7,
		"storaged_raft_commit_index": 42, "storaged_raft_applied_index": 41, "storaged_raft_commit_end_offset": 9000,
		"storaged_raft_peer_match_index{peer=2}": 42, "storaged_raft_peer_match_index{peer=3}": 30,
		"storaged_raft_peer_recent_active{peer=2}": 1, "storaged_raft_peer_recent_active{peer=3}": 0,
		"storaged_raft_catchup_readahead_bytes_total": 64 << 20, "storaged_raft_catchup_readaheads_total": 3,
		"storaged_raft_leaders_forgotten_total": 2, "storaged_raft_early_campaigns_total": 5,
		"storaged_raft_tick_seconds": 0.02, "storaged_raft_election_ticks": 15,
		// The last bucket is unbounded: the count, not an le series.
		"storaged_raft_storage_entries_seconds_count": 3, "storaged_raft_storage_entries_seconds_sum": 2.001503,
		"storaged_raft_storage_entries_seconds{le=1e-06}": 0, "storaged_raft_storage_entries_seconds{le=4e-06}": 1,
		"storaged_raft_storage_entries_seconds{le=0.002048}": 2,
		"storaged_raft_ready_seconds_count":                  2, "storaged_raft_ready_seconds_sum": 0.0037,
		"storaged_raft_ready_seconds{le=0.001024}": 1, "storaged_raft_ready_seconds{le=0.004096}": 2,
		"storaged_raft_log_sync_seconds_count": 1, "storaged_raft_log_sync_seconds_sum": 0.0003,
		"storaged_raft_log_sync_seconds{le=0.000512}": 1,
	}
	if got := gauges(t, reg); !maps.Equal(got, want) {
		t.Fatalf("leader:\n got %v\nwant %v", got, want)
	}
	// A follower that lost its leader: has_leader drops to 0, no peer
	// series; no timing in its info (as while the store opens), no timing
	// series.
	ri = ReplicaInfo{Role: RoleFollower, ID: 2, Term: 8, Commit: 42, Applied: 42, CommitEnd: 9000}
	want = map[string]float64{
		"storaged_raft_has_leader": 0, "storaged_raft_is_leader": 0, "storaged_raft_ready": 0, "storaged_raft_term": 8,
		"storaged_raft_commit_index": 42, "storaged_raft_applied_index": 42, "storaged_raft_commit_end_offset": 9000,
		"storaged_raft_catchup_readahead_bytes_total": 0, "storaged_raft_catchup_readaheads_total": 0,
		"storaged_raft_leaders_forgotten_total": 0, "storaged_raft_early_campaigns_total": 0,
	}
	if got := gauges(t, reg); !maps.Equal(got, want) {
		t.Fatalf("follower without a leader:\n got %v\nwant %v", slices.Sorted(maps.Keys(got)), want)
	}
}

// peerLinks is a PeerLinks with fixed counters.
type peerLinks struct {
	stats    map[uint64]peer.Stats
	received uint64
}

func (p peerLinks) Peers() map[uint64]string {
	out := map[uint64]string{}
	for id := range p.stats {
		out[id] = "127.0.0.1:" + strconv.FormatUint(9000+id, 10)
	}
	return out
}
func (p peerLinks) PeerStats(id uint64) peer.Stats { return p.stats[id] }
func (p peerLinks) Received() uint64               { return p.received }

// TestPeerCollector: the storaged_raft_peer_* counters say what the
// transport's links say at scrape time, one series per peer; nothing
// while the transport is not up.
func TestPeerCollector(t *testing.T) {
	var links PeerLinks
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewPeerCollector(func() PeerLinks { return links }))
	if got := gauges(t, reg); len(got) != 0 {
		t.Fatalf("no transport: %v", got)
	}
	links = peerLinks{stats: map[uint64]peer.Stats{2: {Sent: 10, Dropped: 1, Connects: 2}, 3: {Sent: 7, Connects: 1}}, received: 15}
	want := map[string]float64{
		"storaged_raft_peer_messages_sent_total{peer=2}": 10, "storaged_raft_peer_messages_sent_total{peer=3}": 7,
		"storaged_raft_peer_messages_dropped_total{peer=2}": 1, "storaged_raft_peer_messages_dropped_total{peer=3}": 0,
		"storaged_raft_peer_streams_opened_total{peer=2}": 2, "storaged_raft_peer_streams_opened_total{peer=3}": 1,
		"storaged_raft_peer_messages_received_total": 15,
	}
	if got := gauges(t, reg); !maps.Equal(got, want) {
		t.Fatalf("\n got %v\nwant %v", got, want)
	}
}
