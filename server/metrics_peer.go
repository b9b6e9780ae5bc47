package server

import (
	"maps"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/storaged/storaged/server/peer"
)

// PeerLinks is what PeerCollector reads of the peer transport
// (peer.Transport): the peers it has links to, each link's outgoing
// counters, and the messages received.
type PeerLinks interface {
	Peers() map[uint64]string
	PeerStats(id uint64) peer.Stats
	Received() uint64
}

// PeerCollector exports the peer transport's counters: per peer, the raft
// messages written to its stream, those dropped (queue full, too large,
// or the stream broke with them in it) and the streams opened, and the
// messages received from all peers. A message dropped is one raft sends
// again (an append, a heartbeat) or an election decides without (a vote):
// drops and reconnects at a failover tell why it took longer than an
// election timeout.
type PeerCollector struct {
	links func() PeerLinks

	sent, dropped, connects, received *prometheus.Desc
}

// NewPeerCollector returns the collector of links (nil while the
// transport is not up; the binary registers it in group mode only).
func NewPeerCollector(links func() PeerLinks) *PeerCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("storaged_raft_peer_"+name, help, labels, nil)
	}
	return &PeerCollector{
		links:    links,
		sent:     d("messages_sent_total", "Raft messages this member wrote to its stream to each peer.", "peer"),
		dropped:  d("messages_dropped_total", "Raft messages to each peer dropped: the queue full, too large, or the stream broken with them in it.", "peer"),
		connects: d("streams_opened_total", "Streams this member opened to each peer (one at start, one more after each break).", "peer"),
		received: d("messages_received_total", "Raft messages this member received from its peers and handed to raft."),
	}
}

// Describe implements prometheus.Collector.
func (c *PeerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sent
	ch <- c.dropped
	ch <- c.connects
	ch <- c.received
}

// Collect implements prometheus.Collector.
func (c *PeerCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.links()
	if l == nil {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(l.Peers())) {
		st, p := l.PeerStats(id), strconv.FormatUint(id, 10)
		ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(st.Sent), p)
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped), p)
		ch <- prometheus.MustNewConstMetric(c.connects, prometheus.CounterValue, float64(st.Connects), p)
	}
	ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(l.Received()))
}
