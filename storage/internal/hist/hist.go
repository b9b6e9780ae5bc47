// Package hist is the store's lock-free latency histogram.
package hist

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram is a lock-free latency histogram with power-of-two microsecond
// buckets: bucket i counts durations in [2^(i-1), 2^i) µs, bucket 0 those
// under 1 µs. Observing never allocates.
type Histogram struct {
	counts [histBuckets]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

const histBuckets = 24 // up to 2^23 µs ≈ 8.4 s; larger values land in the last

func (h *Histogram) Observe(d time.Duration) {
	us := uint64(d / time.Microsecond)
	i := bits.Len64(us)
	if i >= histBuckets {
		i = histBuckets - 1
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Snapshot is a copy of a latency histogram. Bounds[i] is the
// exclusive upper bound of Counts[i]; the last bucket is unbounded.
type Snapshot struct {
	Bounds []time.Duration
	Counts []uint64
	Sum    time.Duration
}

func (h *Histogram) Snapshot() Snapshot {
	s := Snapshot{Bounds: make([]time.Duration, histBuckets), Counts: make([]uint64, histBuckets),
		Sum: time.Duration(h.sum.Load())}
	for i := range h.counts {
		s.Bounds[i] = time.Duration(uint64(1)<<i) * time.Microsecond
		s.Counts[i] = h.counts[i].Load()
	}
	return s
}

// Count is the number of observations.
func (s Snapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Quantile returns the upper bound of the bucket holding quantile q (0..1):
// an over-estimate by at most a factor of two.
func (s Snapshot) Quantile(q float64) time.Duration {
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
