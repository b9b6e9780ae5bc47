package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/storaged/storaged/storage"
)

// ReplicaCollector exports a group member's view of its replication group
// (ReplicaInfo) as Prometheus gauges: what an operator alerts on (no
// leader, a follower falling behind) and what a dashboard plots. It reads
// info at every scrape, so the values are never staler than the scrape.
type ReplicaCollector struct {
	info func() ReplicaInfo

	hasLeader, isLeader, ready, term, commit, applied, commitEnd *prometheus.Desc
	peerMatch, peerActive                                        *prometheus.Desc
	entries, readahead, readaheads                               *prometheus.Desc
	forgotten, earlyCampaigns                                    *prometheus.Desc
	readyHandling, logSync                                       *prometheus.Desc
	tick, electionTicks                                          *prometheus.Desc
}

// NewReplicaCollector returns the collector of info (the binary registers
// it in group mode only).
func NewReplicaCollector(info func() ReplicaInfo) *ReplicaCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("storaged_raft_"+name, help, labels, nil)
	}
	return &ReplicaCollector{
		info:       info,
		hasLeader:  d("has_leader", "1 while this member knows a leader of its group, 0 while none is elected or it is cut off."),
		isLeader:   d("is_leader", "1 while this member is the group's leader."),
		ready:      d("ready", "1 while this member is the leader and takes puts (past its term's first entry)."),
		term:       d("term", "This member's raft term."),
		commit:     d("commit_index", "The highest raft index this member knows committed."),
		applied:    d("applied_index", "The highest raft index this member applied (indexed for reads)."),
		commitEnd:  d("commit_end_offset", "The commitlog offset past the last committed entry: readers see nothing past it."),
		peerMatch:  d("peer_match_index", "On the leader: the highest raft index known replicated on each member.", "peer"),
		peerActive: d("peer_recent_active", "On the leader: 1 when the member was heard from within an election timeout.", "peer"),
		entries: d("storage_entries_seconds", "Time raft waited for each read of this member's log (entries to send a follower, "+
			"entries to apply), under the lock every put takes."),
		readahead:  d("catchup_readahead_bytes_total", "Commitlog bytes this member, leading, asked the kernel to read ahead of followers catching up."),
		readaheads: d("catchup_readaheads_total", "Readahead requests this member made for followers catching up."),
		forgotten: d("leaders_forgotten_total", "Leaders this member forgot because the peer transport found their process gone "+
			"(its stream ended, the next attempts failed, nothing heard from it), so that the group elects another at once."),
		earlyCampaigns: d("early_campaigns_total", "Elections this member started after its leader's process was found gone, "+
			"before raft's election timeout."),
		readyHandling: d("ready_seconds", "Time of each round of the raft loop (a Ready: its writes, log sync, sends and applies); "+
			"puts proposed meanwhile wait for the next round."),
		logSync: d("log_sync_seconds", "Time of each sync of the raft log (commitlog bytes and index units of a Ready made durable); "+
			"every put's commit waits for one on the leader and on a majority."),
		tick:          d("tick_seconds", "Raft's tick this member's replica runs with (--raft-tick); the leader sends a heartbeat every tick."),
		electionTicks: d("election_ticks", "Raft's election timeout this member's replica runs with, in ticks (--raft-election-timeout / --raft-tick)."),
	}
}

// Describe implements prometheus.Collector.
func (c *ReplicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hasLeader, c.isLeader, c.ready, c.term, c.commit, c.applied, c.commitEnd,
		c.peerMatch, c.peerActive, c.entries, c.readahead, c.readaheads, c.forgotten, c.earlyCampaigns, c.readyHandling, c.logSync,
		c.tick, c.electionTicks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ReplicaCollector) Collect(ch chan<- prometheus.Metric) {
	ri := c.info()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(c.hasLeader, boolValue(ri.LeaderID != 0))
	g(c.isLeader, boolValue(ri.Role == RoleLeader))
	g(c.ready, boolValue(ri.Ready))
	g(c.term, float64(ri.Term))
	g(c.commit, float64(ri.Commit))
	g(c.applied, float64(ri.Applied))
	g(c.commitEnd, float64(ri.CommitEnd))
	// Absent while unknown (the store is opening), rather than a 0 that
	// reads as a setting.
	if ri.TickInterval > 0 {
		g(c.tick, ri.TickInterval.Seconds())
	}
	if ri.ElectionTicks > 0 {
		g(c.electionTicks, float64(ri.ElectionTicks))
	}
	ch <- prometheus.MustNewConstMetric(c.readahead, prometheus.CounterValue, float64(ri.ReadaheadBytes))
	ch <- prometheus.MustNewConstMetric(c.readaheads, prometheus.CounterValue, float64(ri.Readaheads))
	ch <- prometheus.MustNewConstMetric(c.forgotten, prometheus.CounterValue, float64(ri.LeadersForgotten))
	ch <- prometheus.MustNewConstMetric(c.earlyCampaigns, prometheus.CounterValue, float64(ri.EarlyCampaigns))
	for _, h := range []struct {
		d *prometheus.Desc
		s storage.HistogramSnapshot
	}{{c.entries, ri.StorageEntries}, {c.readyHandling, ri.ReadyHandling}, {c.logSync, ri.LogSync}} {
		if h.s.Counts != nil {
			ch <- constHistogram(h.d, h.s)
		}
	}
	for _, p := range ri.Peers {
		id := strconv.FormatUint(p.ID, 10)
		g(c.peerMatch, float64(p.Match), id)
		g(c.peerActive, boolValue(p.RecentActive), id)
	}
}
