package server

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/storaged/storaged/storage"
)

// StatsSource is what StoreCollector reads on every scrape; *storage.Store
// implements it.
type StatsSource interface {
	Stats() storage.Stats
	Writable() bool
}

var _ StatsSource = (*storage.Store)(nil)

// StoreCollector is a prometheus.Collector that reads the store's counters
// on every scrape (storage.Stats), so the store needs no Prometheus
// dependency and the numbers are never stale.
type StoreCollector struct {
	src     StatsSource
	dataDir string

	puts, messages, bytes                 *prometheus.Desc
	appendLatency, flushWait, syncLatency *prometheus.Desc
	maxLockHold                           *prometheus.Desc
	flushLag, files, rolls                *prometheus.Desc
	minOffset, maxOffset, flushedOffset   *prometheus.Desc
	diskFree, diskTotal, writable         *prometheus.Desc
}

var _ prometheus.Collector = (*StoreCollector)(nil)

// NewStoreCollector returns a collector for src, whose data lives in dataDir
// (for the free-disk gauges).
func NewStoreCollector(src StatsSource, dataDir string) *StoreCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &StoreCollector{
		src:     src,
		dataDir: dataDir,

		puts:     d("storaged_store_puts_total", "Put calls (PutMessage and PutMessages) by RocketMQ put status.", "status"),
		messages: d("storaged_store_messages_total", "Messages put, by RocketMQ put status (a batch counts each entry).", "status"),
		bytes:    d("storaged_store_bytes_total", "Commitlog record bytes appended, by RocketMQ put status.", "status"),

		appendLatency: d("storaged_store_append_duration_seconds", "Time a put holds the commitlog append lock."),
		flushWait:     d("storaged_store_flush_wait_seconds", "Time sync-mode puts waited for the flush covering them (group commit)."),
		syncLatency:   d("storaged_store_sync_duration_seconds", "Duration of each msync round of the flusher."),
		maxLockHold:   d("storaged_store_max_lock_hold_seconds", "Longest time any put has held the append lock."),

		flushLag:      d("storaged_commitlog_flush_lag_bytes", "Bytes appended but not yet known durable (max offset - flushed offset)."),
		files:         d("storaged_commitlog_files", "Commitlog files on disk."),
		rolls:         d("storaged_commitlog_rolls_total", "New commitlog files taken since the store opened."),
		minOffset:     d("storaged_commitlog_min_offset_bytes", "Commitlog offset of the first byte on disk."),
		maxOffset:     d("storaged_commitlog_max_offset_bytes", "Commitlog offset of the next append."),
		flushedOffset: d("storaged_commitlog_flushed_offset_bytes", "Commitlog offset up to which data is durable."),

		diskFree:  d("storaged_store_disk_free_bytes", "Bytes available to the store on the data directory's file system."),
		diskTotal: d("storaged_store_disk_size_bytes", "Size of the data directory's file system."),
		writable:  d("storaged_store_writable", "1 when the store takes writes (open, master, no failed sync), else 0."),
	}
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.puts, c.messages, c.bytes, c.appendLatency, c.flushWait, c.syncLatency, c.maxLockHold,
		c.flushLag, c.files, c.rolls, c.minOffset, c.maxOffset, c.flushedOffset, c.diskFree, c.diskTotal, c.writable,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	// Every status gets a series, zero included, so rate() works from the
	// first put and alerts on rare statuses have something to look at.
	for s := storage.PutOK; s.String() != storage.PutStatus(0).String(); s++ {
		name := s.String()
		ch <- prometheus.MustNewConstMetric(c.puts, prometheus.CounterValue, float64(st.Puts[name]), name)
		ch <- prometheus.MustNewConstMetric(c.messages, prometheus.CounterValue, float64(st.Messages[name]), name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.Bytes[name]), name)
	}
	ch <- constHistogram(c.appendLatency, st.AppendLatency)
	ch <- constHistogram(c.flushWait, st.PutLatency)
	ch <- constHistogram(c.syncLatency, st.SyncLatency)
	ch <- prometheus.MustNewConstMetric(c.maxLockHold, prometheus.GaugeValue, st.MaxLockHold.Seconds())

	lag := st.MaxOffset - st.FlushedOffset
	if lag < 0 {
		lag = 0
	}
	ch <- prometheus.MustNewConstMetric(c.flushLag, prometheus.GaugeValue, float64(lag))
	ch <- prometheus.MustNewConstMetric(c.files, prometheus.GaugeValue, float64(st.Files))
	ch <- prometheus.MustNewConstMetric(c.rolls, prometheus.CounterValue, float64(st.Rolls))
	ch <- prometheus.MustNewConstMetric(c.minOffset, prometheus.GaugeValue, float64(st.MinOffset))
	ch <- prometheus.MustNewConstMetric(c.maxOffset, prometheus.GaugeValue, float64(st.MaxOffset))
	ch <- prometheus.MustNewConstMetric(c.flushedOffset, prometheus.GaugeValue, float64(st.FlushedOffset))

	if free, total, err := diskSpace(c.dataDir); err == nil {
		ch <- prometheus.MustNewConstMetric(c.diskFree, prometheus.GaugeValue, float64(free))
		ch <- prometheus.MustNewConstMetric(c.diskTotal, prometheus.GaugeValue, float64(total))
	}
	w := 0.0
	if c.src.Writable() {
		w = 1
	}
	ch <- prometheus.MustNewConstMetric(c.writable, prometheus.GaugeValue, w)
}

// constHistogram turns a storage latency snapshot into a Prometheus
// histogram. Bounds[i] is the exclusive upper bound of Counts[i], so it is a
// valid "le" bound; the last bucket is unbounded and becomes +Inf (the
// total count).
func constHistogram(desc *prometheus.Desc, s storage.HistogramSnapshot) prometheus.Metric {
	buckets := make(map[float64]uint64, len(s.Bounds))
	var cum uint64
	for i := range s.Counts {
		cum += s.Counts[i]
		if i < len(s.Bounds)-1 {
			buckets[s.Bounds[i].Seconds()] = cum
		}
	}
	return prometheus.MustNewConstHistogram(desc, cum, s.Sum.Seconds(), buckets)
}

// MetricsHandler serves /metrics from g and, when withPprof is set, the
// net/http/pprof handlers under /debug/pprof/. Serve it on its own port,
// never on the gRPC listener.
func MetricsHandler(g prometheus.Gatherer, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
