package storage

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram is a lock-free latency histogram with power-of-two microsecond
// buckets: bucket i counts durations in [2^(i-1), 2^i) µs, bucket 0 those
// under 1 µs. Observing never allocates.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

const histBuckets = 24 // up to 2^23 µs ≈ 8.4 s; larger values land in the last

func (h *histogram) observe(d time.Duration) {
	us := uint64(d / time.Microsecond)
	i := bits.Len64(us)
	if i >= histBuckets {
		i = histBuckets - 1
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// HistogramSnapshot is a copy of a latency histogram. Bounds[i] is the
// exclusive upper bound of Counts[i]; the last bucket is unbounded.
type HistogramSnapshot struct {
	Bounds []time.Duration
	Counts []uint64
	Sum    time.Duration
}

func (h *histogram) snapshot() HistogramSnapshot {
	s := HistogramSnapshot{Bounds: make([]time.Duration, histBuckets), Counts: make([]uint64, histBuckets),
		Sum: time.Duration(h.sum.Load())}
	for i := range h.counts {
		s.Bounds[i] = time.Duration(uint64(1)<<i) * time.Microsecond
		s.Counts[i] = h.counts[i].Load()
	}
	return s
}

// Count is the number of observations.
func (s HistogramSnapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Quantile returns the upper bound of the bucket holding quantile q (0..1):
// an over-estimate by at most a factor of two.
func (s HistogramSnapshot) Quantile(q float64) time.Duration {
	total := s.Count()
	if total == 0 {
		return 0
	}
	rank := uint64(q * float64(total))
	if rank >= total {
		rank = total - 1
	}
	var seen uint64
	for i, c := range s.Counts {
		seen += c
		if seen > rank {
			return s.Bounds[i]
		}
	}
	return s.Bounds[len(s.Bounds)-1]
}

// stats are the store's counters (RocketMQ StoreStatsService): puts and
// bytes by status, latencies, the longest time the put lock was held.
type stats struct {
	puts          [numStatuses]atomic.Uint64
	msgs          [numStatuses]atomic.Uint64
	bytes         [numStatuses]atomic.Uint64
	appendLatency histogram // time in the put lock per put
	putLatency    histogram // sync mode: the wait for the flush
	syncLatency   histogram // each msync round
	maxLockHold   atomic.Int64
	rolls         atomic.Uint64
	tornTails     atomic.Uint64
	tornBytes     atomic.Uint64
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
	// Retention counts what retention deleted; Disk is the data dir's file
	// system at the last check (Disk.Full: puts refused).
	Retention RetentionStats
	Disk      DiskStats
}
