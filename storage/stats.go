package storage

import (
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/flush"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/internal/hist"
	"github.com/storaged/storaged/storage/retention"
	"github.com/storaged/storaged/storage/schedule"
)

// HistogramSnapshot is a copy of a latency histogram (power-of-two
// microsecond buckets).
type HistogramSnapshot = hist.Snapshot

// FaultStats describe one kind of background write the store retries when
// it fails.
type FaultStats = fault.Stats

// ScheduleStats and ScheduleLevelStats describe the delay scheduler.
type (
	ScheduleStats      = schedule.Stats
	ScheduleLevelStats = schedule.LevelStats
)

// GroupCommitStats count what the sync-mode group commit did
// (flush.GroupCommit.Stats).
type GroupCommitStats = flush.GroupCommitStats

// RetentionStats count what retention deleted; DiskStats describe the data
// dir's file system; DiskUsage is what Options.StatDisk reports.
type (
	RetentionStats = retention.Stats
	DiskStats      = retention.DiskStats
	DiskUsage      = retention.DiskUsage
)

// StatDisk is the default Options.StatDisk: statfs(2) of dir.
func StatDisk(dir string) (DiskUsage, error) { return retention.StatDisk(dir) }

// stats are the store's counters (RocketMQ StoreStatsService): puts and
// bytes by status, latencies, the longest time the put lock was held.
// The commitlog keeps its own (append and sync latency, lock hold, rolls,
// torn tails: commitlog.Stats).
type stats struct {
	puts       [numStatuses]atomic.Uint64
	msgs       [numStatuses]atomic.Uint64
	bytes      [numStatuses]atomic.Uint64
	putLatency hist.Histogram // sync mode: the wait for the flush
}

func (s *stats) record(st PutStatus, msgs int, n int) {
	s.puts[st].Add(1)
	s.msgs[st].Add(uint64(msgs))
	s.bytes[st].Add(uint64(n))
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	// Puts, Messages and Bytes count put calls, messages and record bytes by
	// status name.
	Puts, Messages, Bytes map[string]uint64
	// AppendLatency is the time spent inside the put lock per put.
	AppendLatency HistogramSnapshot
	// PutLatency is the time sync-mode puts waited for their flush.
	PutLatency HistogramSnapshot
	// SyncLatency is the duration of each msync round.
	SyncLatency HistogramSnapshot
	// MaxLockHold is the longest time a put held the put lock.
	MaxLockHold time.Duration
	// Rolls counts new commitlog files taken.
	Rolls uint64
	// TornTails and TornBytes count torn tails cut by recovery.
	TornTails, TornBytes uint64
	// DispatchedOffset is the commitlog offset up to which consume queues
	// are written (what consumers can read); DispatchLag is MaxOffset minus
	// it.
	DispatchedOffset, DispatchLag int64
	// Queues is the number of consume queues.
	Queues int
	// Files is the number of commitlog files.
	Files int
	// MinOffset, MaxOffset and FlushedOffset are commitlog offsets: the
	// first byte on disk, the next append position, and the durable end.
	MinOffset, MaxOffset, FlushedOffset int64
	// WriteError is the sticky write/sync error, or "".
	WriteError string
	// Faults has one entry per write source: the background writes the
	// store retries when they fail (checkpoint, consume queue, delay
	// progress), whether one is failing now (puts refused) and how often it
	// failed, and the topic config, whose failed writes are only counted
	// (the call that needed one is refused).
	Faults []FaultStats
	// Schedule describes the delay scheduler: pending messages and lag per
	// level.
	Schedule ScheduleStats
	// Timers describes the timer store: pending timer messages, the
	// index's bound, lag, deliveries and recalls.
	Timers TimerStats
	// Transactions describes transactional half messages
	// (transactions.go).
	Transactions TransactionStats
	// Retention counts what retention deleted; Disk is the data dir's file
	// system at the last check (Disk.Full: puts refused).
	Retention RetentionStats
	Disk      DiskStats
	// Dedup describes the idempotent-put window (idempotent.go).
	Dedup DedupStats
	// GroupCommit counts the group commit's syncs, the waiters they
	// answered and its waits for the group; nil in async mode.
	GroupCommit *GroupCommitStats
}

// Stats returns a snapshot of the store's counters.
func (s *Store) Stats() Stats {
	ls := s.log.Stats()
	st := Stats{
		Puts: map[string]uint64{}, Messages: map[string]uint64{}, Bytes: map[string]uint64{},
		AppendLatency: ls.AppendLatency,
		PutLatency:    s.stats.putLatency.Snapshot(),
		SyncLatency:   ls.SyncLatency,
		MaxLockHold:   ls.MaxLockHold,
		Rolls:         ls.Rolls,
		Files:         ls.Files,
		MinOffset:     ls.MinOffset,
		MaxOffset:     ls.MaxOffset,
		FlushedOffset: ls.FlushedOffset,
		TornTails:     ls.TornTails,
		TornBytes:     ls.TornBytes,
	}
	st.DispatchedOffset = s.index.Dispatched()
	st.DispatchLag = st.MaxOffset - st.DispatchedOffset
	st.Queues = s.index.Len()
	for i := 1; i < numStatuses; i++ {
		name := PutStatus(i).String()
		if n := s.stats.puts[i].Load(); n > 0 {
			st.Puts[name] = n
			st.Messages[name] = s.stats.msgs[i].Load()
			st.Bytes[name] = s.stats.bytes[i].Load()
		}
	}
	if err := s.WriteErr(); err != nil {
		st.WriteError = err.Error()
	}
	st.Faults = s.faults.Stats()
	st.Schedule = s.sched.Stats()
	st.Timers = s.timers.Stats()
	st.Transactions = s.transactionStats()
	st.Retention, st.Disk = s.ret.Stats()
	st.Dedup = s.dedupStats()
	if gc, ok := s.flusher.(*flush.GroupCommit); ok {
		g := gc.Stats()
		st.GroupCommit = &g
	}
	return st
}
