package server

import (
	"net/http"
	"net/http/pprof"
	"strconv"

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
	src       StatsSource
	exemplars *PutExemplars // nil: none

	puts, messages, bytes                 *prometheus.Desc
	appendLatency, flushWait, syncLatency *prometheus.Desc
	maxLockHold                           *prometheus.Desc
	dispatchLag, tornTails,
	flushLag, files, rolls *prometheus.Desc
	minOffset, maxOffset, flushedOffset *prometheus.Desc
	writable                            *prometheus.Desc
	writeFaults, writeFaulting          *prometheus.Desc

	schedPending, schedLag, schedDelivered *prometheus.Desc
	schedSkipped, schedRefused             *prometheus.Desc
	timerPending, timerNotRead, timerLag   *prometheus.Desc
	timerDelivered, timerRecalled          *prometheus.Desc
	timerSkipped, timerRefused             *prometheus.Desc
	txnPending, txnEnded, txnChecked       *prometheus.Desc

	retDeletedFiles, retDeletedBytes, retTrimmedFiles *prometheus.Desc

	diskSize, diskAvail, diskUsed, diskUsedPercent, diskFull *prometheus.Desc

	dedupKeys, dedupMessages, dedupHits, dedupEvicted, dedupOldest *prometheus.Desc

	gcSyncs, gcWaiters, gcAtOnce, gcGathers, gcGather *prometheus.Desc
}

var _ prometheus.Collector = (*StoreCollector)(nil)

// CollectorOption configures a StoreCollector.
type CollectorOption func(*StoreCollector)

// WithPutExemplars attaches the trace ids of sampled puts (see
// Service.Exemplars) to the append and flush-wait histograms as exemplars.
func WithPutExemplars(e *PutExemplars) CollectorOption {
	return func(c *StoreCollector) { c.exemplars = e }
}

// NewStoreCollector returns a collector for src. Disk figures come from
// the store's own disk check (storage.Stats.Disk), so this package makes no
// system calls.
func NewStoreCollector(src StatsSource, opts ...CollectorOption) *StoreCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	c := &StoreCollector{
		src: src,

		puts:     d("storaged_store_puts_total", "Put calls (PutMessage and PutMessages) by RocketMQ put status.", "status"),
		messages: d("storaged_store_messages_total", "Messages put, by RocketMQ put status (a batch counts each entry).", "status"),
		bytes:    d("storaged_store_bytes_total", "Commitlog record bytes appended, by RocketMQ put status.", "status"),

		appendLatency: d("storaged_store_append_duration_seconds", "Time a put holds the commitlog append lock."),
		flushWait:     d("storaged_store_flush_wait_seconds", "Time sync-mode puts waited for the flush covering them (group commit)."),
		syncLatency:   d("storaged_store_sync_duration_seconds", "Duration of each msync round of the flusher."),
		maxLockHold:   d("storaged_store_max_lock_hold_seconds", "Longest time any put has held the append lock."),

		flushLag:      d("storaged_commitlog_flush_lag_bytes", "Bytes appended but not yet known durable (max offset - flushed offset)."),
		dispatchLag:   d("storaged_dispatch_lag_bytes", "Bytes appended but not yet indexed in the consume queues, so not yet readable."),
		tornTails:     d("storaged_recovery_torn_tails_total", "Torn tails cut by recovery since start (kept as .broken files)."),
		files:         d("storaged_commitlog_files", "Commitlog files on disk."),
		rolls:         d("storaged_commitlog_rolls_total", "New commitlog files taken since the store opened."),
		minOffset:     d("storaged_commitlog_min_offset_bytes", "Commitlog offset of the first byte on disk."),
		maxOffset:     d("storaged_commitlog_max_offset_bytes", "Commitlog offset of the next append."),
		flushedOffset: d("storaged_commitlog_flushed_offset_bytes", "Commitlog offset up to which data is durable."),

		writable: d("storaged_store_writable", "1 when the store takes writes (open, master, no failed sync, no background write failing, disk not above the warning watermark), else 0."),

		writeFaults: d("storaged_store_write_faults_total",
			"Failed writes by source: background writes the store retries (checkpoint, consume_queue, delay_progress, timer_progress) and topic-table writes, which refuse the call that needed them (topic_config): ENOSPC, EMFILE, I/O errors.", "source"),
		writeFaulting: d("storaged_store_write_fault_active",
			"1 while the background write is failing and retried (puts refused, health NOT_SERVING), else 0.", "source"),

		schedPending: d("storaged_schedule_pending_messages",
			"Delayed messages of the delay level not yet delivered to their topic, due or not.", "level"),
		schedLag: d("storaged_schedule_lag_seconds",
			"How long the oldest undelivered message of the delay level has been due; 0 when none is due.", "level"),
		schedDelivered: d("storaged_schedule_delivered_total",
			"Delayed messages of the delay level delivered to their topic since the store opened.", "level"),
		schedSkipped: d("storaged_schedule_skipped_total",
			"Delayed messages that could never be delivered and were passed over (logged at error level)."),
		schedRefused: d("storaged_schedule_refused_total",
			"Deliveries the store refused for a passing reason (not writable, busy); they are retried."),

		timerPending: d("storaged_timer_pending_messages",
			"Timer messages in the timer store's due index, waiting for their delivery time (at most --max-timer-messages)."),
		timerNotRead: d("storaged_timer_unread_entries",
			"Entries of the timer queue not read into the due index yet (the index full, or dispatched since the last round)."),
		timerLag: d("storaged_timer_lag_seconds",
			"How long the earliest pending timer message has been due; 0 when none is due."),
		timerDelivered: d("storaged_timer_delivered_total", "Timer messages delivered to their topic since the store opened."),
		timerRecalled:  d("storaged_timer_recalled_total", "Timer messages recalled (RecallMessage) since the store opened."),
		timerSkipped: d("storaged_timer_skipped_total",
			"Timer messages that could never be delivered and were passed over (logged at error level)."),
		timerRefused: d("storaged_timer_refused_total",
			"Timer deliveries the store refused for a passing reason (not writable, busy); they are retried."),

		txnPending: d("storaged_transaction_pending_messages",
			"Transactional half messages not yet committed or rolled back (at most --max-pending-transactions)."),
		txnEnded: d("storaged_transaction_ended_total",
			"Half messages this process ended since it opened, by resolution: commit, rollback, discard (rolled back after the last check).", "resolution"),
		txnChecked: d("storaged_transaction_checks_total",
			"Transaction checks this process made since it opened (a RecoverOrphanedTransactionCommand to a producer of the topic, if one is connected)."),

		retDeletedFiles: d("storaged_retention_deleted_files_total", "Expired commitlog files deleted by retention since the store opened."),
		retDeletedBytes: d("storaged_retention_deleted_bytes_total", "Bytes of the commitlog files deleted by retention since the store opened."),
		retTrimmedFiles: d("storaged_retention_trimmed_queue_files_total", "Consume-queue files deleted by retention since the store opened."),

		diskSize:        d("storaged_store_disk_size_bytes", "Size of the data directory's file system, at the last disk check."),
		diskAvail:       d("storaged_store_disk_free_bytes", "Bytes still available to the store on the data directory's file system (df's Avail), at the last disk check."),
		diskUsed:        d("storaged_store_disk_used_bytes", "Bytes in use on the data directory's file system, at the last disk check."),
		diskUsedPercent: d("storaged_store_disk_used_percent", "Use of the data directory's file system in percent (df's Use%), at the last disk check; compared with --disk-clean-percent and --disk-warning-percent."),
		diskFull: d("storaged_store_disk_full",
			"1 while puts are refused because the disk went above the warning watermark (until usage is back at the clean one), else 0."),

		dedupKeys:     d("storaged_dedup_keys", "UNIQ_KEYs of stored puts remembered by the idempotent-put window (--dedup-window)."),
		dedupMessages: d("storaged_dedup_messages", "Messages those keys stand for (a batch counts each); bounded by --dedup-max-messages."),
		dedupHits: d("storaged_dedup_hits_total",
			"Puts answered from the idempotent-put window: retries of a stored put, which stored nothing."),
		dedupEvicted: d("storaged_dedup_evicted_total",
			"Keys forgotten before their window passed because --dedup-max-messages newer messages came: while it grows, retries are recognised only for storaged_dedup_oldest_seconds."),
		dedupOldest: d("storaged_dedup_oldest_seconds", "Age of the oldest key remembered: the effective dedup window."),

		gcSyncs: d("storaged_group_commit_syncs_total", "Successful syncs of the sync-mode group commit (--flush-mode sync only)."),
		gcWaiters: d("storaged_group_commit_waiters_total",
			"Waits (sync-mode puts) answered by those syncs; divided by storaged_group_commit_syncs_total, the mean group size."),
		gcAtOnce: d("storaged_group_commit_already_durable_total",
			"Waits answered at once because a sync had already covered their bytes; with storaged_group_commit_waiters_total, every successful wait of a sync-mode put."),
		gcGathers: d("storaged_group_commit_gathers_total",
			"Waits before a sync for the group the last sync released: outcome complete (the whole group came within a sync), gave_up (it did not), short (a half-sync wait after a gave_up ran out).", "outcome"),
		gcGather: d("storaged_group_commit_gather_seconds_total", "Time the group commit spent waiting for groups before its syncs."),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.puts, c.messages, c.bytes, c.appendLatency, c.flushWait, c.syncLatency, c.maxLockHold,
		c.flushLag, c.dispatchLag, c.tornTails, c.files, c.rolls, c.minOffset, c.maxOffset, c.flushedOffset, c.writable,
		c.writeFaults, c.writeFaulting,
		c.schedPending, c.schedLag, c.schedDelivered, c.schedSkipped, c.schedRefused,
		c.timerPending, c.timerNotRead, c.timerLag, c.timerDelivered, c.timerRecalled, c.timerSkipped, c.timerRefused,
		c.txnPending, c.txnEnded, c.txnChecked,
		c.retDeletedFiles, c.retDeletedBytes, c.retTrimmedFiles,
		c.diskSize, c.diskAvail, c.diskUsed, c.diskUsedPercent, c.diskFull,
		c.dedupKeys, c.dedupMessages, c.dedupHits, c.dedupEvicted, c.dedupOldest,
		c.gcSyncs, c.gcWaiters, c.gcAtOnce, c.gcGathers, c.gcGather,
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
	appendLatency, flushWait := constHistogram(c.appendLatency, st.AppendLatency), constHistogram(c.flushWait, st.PutLatency)
	if c.exemplars != nil {
		appendLatency = withExemplars(appendLatency, &c.exemplars.append)
		flushWait = withExemplars(flushWait, &c.exemplars.flushWait)
	}
	ch <- appendLatency
	ch <- flushWait
	ch <- constHistogram(c.syncLatency, st.SyncLatency)
	ch <- prometheus.MustNewConstMetric(c.maxLockHold, prometheus.GaugeValue, st.MaxLockHold.Seconds())

	lag := st.MaxOffset - st.FlushedOffset
	if lag < 0 {
		lag = 0
	}
	ch <- prometheus.MustNewConstMetric(c.flushLag, prometheus.GaugeValue, float64(lag))
	ch <- prometheus.MustNewConstMetric(c.dispatchLag, prometheus.GaugeValue, float64(max(st.DispatchLag, 0)))
	ch <- prometheus.MustNewConstMetric(c.tornTails, prometheus.CounterValue, float64(st.TornTails))
	ch <- prometheus.MustNewConstMetric(c.files, prometheus.GaugeValue, float64(st.Files))
	ch <- prometheus.MustNewConstMetric(c.rolls, prometheus.CounterValue, float64(st.Rolls))
	ch <- prometheus.MustNewConstMetric(c.minOffset, prometheus.GaugeValue, float64(st.MinOffset))
	ch <- prometheus.MustNewConstMetric(c.maxOffset, prometheus.GaugeValue, float64(st.MaxOffset))
	ch <- prometheus.MustNewConstMetric(c.flushedOffset, prometheus.GaugeValue, float64(st.FlushedOffset))

	ch <- prometheus.MustNewConstMetric(c.writable, prometheus.GaugeValue, boolValue(c.src.Writable()))
	for _, f := range st.Faults {
		ch <- prometheus.MustNewConstMetric(c.writeFaults, prometheus.CounterValue, float64(f.Failures), f.Source)
		ch <- prometheus.MustNewConstMetric(c.writeFaulting, prometheus.GaugeValue, boolValue(f.Failing), f.Source)
	}

	for _, l := range st.Schedule.Levels {
		level := strconv.Itoa(l.Level)
		ch <- prometheus.MustNewConstMetric(c.schedPending, prometheus.GaugeValue, float64(l.Pending), level)
		ch <- prometheus.MustNewConstMetric(c.schedLag, prometheus.GaugeValue, l.Lag.Seconds(), level)
		ch <- prometheus.MustNewConstMetric(c.schedDelivered, prometheus.CounterValue, float64(l.Delivered), level)
	}
	ch <- prometheus.MustNewConstMetric(c.schedSkipped, prometheus.CounterValue, float64(st.Schedule.Skipped))
	ch <- prometheus.MustNewConstMetric(c.schedRefused, prometheus.CounterValue, float64(st.Schedule.Refused))
	tm := st.Timers
	ch <- prometheus.MustNewConstMetric(c.timerPending, prometheus.GaugeValue, float64(tm.Pending))
	ch <- prometheus.MustNewConstMetric(c.timerNotRead, prometheus.GaugeValue, float64(tm.NotRead))
	ch <- prometheus.MustNewConstMetric(c.timerLag, prometheus.GaugeValue, tm.Lag.Seconds())
	ch <- prometheus.MustNewConstMetric(c.timerDelivered, prometheus.CounterValue, float64(tm.Delivered))
	ch <- prometheus.MustNewConstMetric(c.timerRecalled, prometheus.CounterValue, float64(tm.Recalled))
	ch <- prometheus.MustNewConstMetric(c.timerSkipped, prometheus.CounterValue, float64(tm.Skipped))
	ch <- prometheus.MustNewConstMetric(c.timerRefused, prometheus.CounterValue, float64(tm.Refused))
	tx := st.Transactions
	ch <- prometheus.MustNewConstMetric(c.txnPending, prometheus.GaugeValue, float64(tx.Pending))
	ch <- prometheus.MustNewConstMetric(c.txnEnded, prometheus.CounterValue, float64(tx.Committed), "commit")
	ch <- prometheus.MustNewConstMetric(c.txnEnded, prometheus.CounterValue, float64(tx.RolledBack), "rollback")
	ch <- prometheus.MustNewConstMetric(c.txnEnded, prometheus.CounterValue, float64(tx.Discarded), "discard")
	ch <- prometheus.MustNewConstMetric(c.txnChecked, prometheus.CounterValue, float64(tx.Checked))

	ch <- prometheus.MustNewConstMetric(c.retDeletedFiles, prometheus.CounterValue, float64(st.Retention.DeletedFiles))
	ch <- prometheus.MustNewConstMetric(c.retDeletedBytes, prometheus.CounterValue, float64(st.Retention.DeletedBytes))
	ch <- prometheus.MustNewConstMetric(c.retTrimmedFiles, prometheus.CounterValue, float64(st.Retention.TrimmedQueueFiles))

	// Usage only once a check has read it, and not while the check fails
	// (the last figures would be stale); Full keeps its last value then,
	// as the store does.
	if disk := st.Disk; disk.Err == "" && disk.Size > 0 {
		ch <- prometheus.MustNewConstMetric(c.diskSize, prometheus.GaugeValue, float64(disk.Size))
		ch <- prometheus.MustNewConstMetric(c.diskAvail, prometheus.GaugeValue, float64(disk.Avail))
		ch <- prometheus.MustNewConstMetric(c.diskUsed, prometheus.GaugeValue, float64(disk.Used))
		ch <- prometheus.MustNewConstMetric(c.diskUsedPercent, prometheus.GaugeValue, disk.UsedPercent)
	}
	ch <- prometheus.MustNewConstMetric(c.diskFull, prometheus.GaugeValue, boolValue(st.Disk.Full))

	ch <- prometheus.MustNewConstMetric(c.dedupKeys, prometheus.GaugeValue, float64(st.Dedup.Keys))
	ch <- prometheus.MustNewConstMetric(c.dedupMessages, prometheus.GaugeValue, float64(st.Dedup.Messages))
	ch <- prometheus.MustNewConstMetric(c.dedupHits, prometheus.CounterValue, float64(st.Dedup.Hits))
	ch <- prometheus.MustNewConstMetric(c.dedupEvicted, prometheus.CounterValue, float64(st.Dedup.Evicted))
	ch <- prometheus.MustNewConstMetric(c.dedupOldest, prometheus.GaugeValue, st.Dedup.Oldest.Seconds())

	// Sync mode only: in async mode there is no group commit to count.
	if gc := st.GroupCommit; gc != nil {
		ch <- prometheus.MustNewConstMetric(c.gcSyncs, prometheus.CounterValue, float64(gc.Syncs))
		ch <- prometheus.MustNewConstMetric(c.gcWaiters, prometheus.CounterValue, float64(gc.Released))
		ch <- prometheus.MustNewConstMetric(c.gcAtOnce, prometheus.CounterValue, float64(gc.AtOnce))
		ch <- prometheus.MustNewConstMetric(c.gcGathers, prometheus.CounterValue, float64(gc.Gathered), "complete")
		ch <- prometheus.MustNewConstMetric(c.gcGathers, prometheus.CounterValue, float64(gc.GaveUp), "gave_up")
		ch <- prometheus.MustNewConstMetric(c.gcGathers, prometheus.CounterValue, float64(gc.Short), "short")
		ch <- prometheus.MustNewConstMetric(c.gcGather, prometheus.CounterValue, gc.Gather.Seconds())
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
// never on the gRPC listener. A scraper that asks for the OpenMetrics
// format (Prometheus does) gets it, with the exemplars (trace ids) that
// the classic text format cannot carry.
func MetricsHandler(g prometheus.Gatherer, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
