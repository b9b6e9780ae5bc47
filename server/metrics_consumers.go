package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/storaged/storaged/storage"
)

// ConsumerLagSource is what ConsumerCollector reads on every scrape;
// *storage.Store implements it.
type ConsumerLagSource interface {
	ConsumerLag() []storage.ConsumerGroupInfo
}

var _ ConsumerLagSource = (*storage.Store)(nil)

// DefaultLagMetricGroups bounds the groups ConsumerCollector labels.
const DefaultLagMetricGroups = 100

// ConsumerCollector exports consumer-group lag (issue 17, point 5):
// storaged_consumer_lag_messages{group} for the groups with the largest lag
// (at most maxGroups of them), the sum over all other groups in
// storaged_consumer_lag_other_messages, and the number of groups (with
// committed offsets or POP progress: storage/consumer_groups.go). The
// labelled series are bounded because any client may create groups (up to
// --max-consumer-offsets keys, each possibly its own group) and every label
// value is a series Prometheus keeps; the most lagging groups are the ones
// an alert needs. Computed at every scrape from the offset table, the POP
// table's per-queue progress and the queues' max offsets: O(keys) a scrape.
type ConsumerCollector struct {
	src       ConsumerLagSource
	maxGroups int

	lag, lagOther, groups *prometheus.Desc
}

var _ prometheus.Collector = (*ConsumerCollector)(nil)

// NewConsumerCollector returns the collector of src's consumer lag,
// labelling at most maxGroups groups (<= 0: DefaultLagMetricGroups).
func NewConsumerCollector(src ConsumerLagSource, maxGroups int) *ConsumerCollector {
	if maxGroups <= 0 {
		maxGroups = DefaultLagMetricGroups
	}
	return &ConsumerCollector{
		src:       src,
		maxGroups: maxGroups,
		lag: prometheus.NewDesc("storaged_consumer_lag_messages",
			"Messages not yet consumed by a consumer group, summed over its queues: max offset minus committed offset, or on a queue it consumes by POP the messages not yet acknowledged (not yet received plus in flight). Only the most lagging groups are labelled (see storaged_consumer_lag_other_messages).",
			[]string{"group"}, nil),
		lagOther: prometheus.NewDesc("storaged_consumer_lag_other_messages",
			"The summed lag of the consumer groups beyond the labelled ones.", nil, nil),
		groups: prometheus.NewDesc("storaged_consumer_groups",
			"Consumer groups with at least one committed offset or POP receive.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ConsumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.lagOther
	ch <- c.groups
}

// Collect implements prometheus.Collector.
func (c *ConsumerCollector) Collect(ch chan<- prometheus.Metric) {
	gs := c.src.ConsumerLag() // the largest lag first
	var other int64
	for i, g := range gs {
		if i < c.maxGroups {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(g.Lag), g.Name)
		} else {
			other += g.Lag
		}
	}
	ch <- prometheus.MustNewConstMetric(c.lagOther, prometheus.GaugeValue, float64(other))
	ch <- prometheus.MustNewConstMetric(c.groups, prometheus.GaugeValue, float64(len(gs)))
}
