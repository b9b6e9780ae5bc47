package storage

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/vfs"
)

// Transient write faults.
//
// Only a failed commitlog msync/fdatasync is sticky (Store.fail): after it
// the kernel may have dropped the pages, so nothing can be acknowledged
// again (fsyncgate). Every other background write of the store (the
// checkpoint, a consume-queue entry, the delay progress) can be written
// again from what the store still holds in memory and in the commitlog, so
// its failure is transient: another process filling the disk
// for a moment (ENOSPC) or idle connections using up the fd limit (EMFILE)
// must not make the store refuse writes until a restart.
//
// A failing source is retried by its own goroutine with a capped backoff
// (faultRetryMin doubling to faultRetryMax), counted (Stats.Faults, the
// storaged_store_write_faults_total metric), logged through one throttle
// (the first failure at once, then at most one line per interval with the
// suppressed count), and while any source is failing the store refuses
// puts with an error wrapping ErrNotWritable and ErrWriteRetrying (and
// ErrDiskFull for ENOSPC), so Writable is false and the health service
// says NOT_SERVING. The topic config is not a background write: a failed
// write refuses the call that needed it (ErrTopicConfig, retriable) and
// the next call tries again; it is only counted here (noted). Refusing is
// RocketMQ's choice for a full disk: a
// message accepted now could not be indexed or checkpointed, and a client
// told to retry elsewhere loses nothing. Reads keep working. The first
// retry that succeeds clears the source and writes resume by themselves.

// faultSource names a background write the store retries when it fails.
type faultSource int

const (
	faultCheckpoint    faultSource = iota // config/checkpoint: the dispatcher goroutine
	faultConsumeQueue                     // a consume-queue entry or file: the dispatcher goroutine
	faultDelayProgress                    // config/delayOffset.json: the scheduler goroutine
	faultTopicConfig                      // config/topics.json: per call, never failing (faults.noted)
	numFaultSources
)

var faultSourceNames = [numFaultSources]string{"checkpoint", "consume_queue", "delay_progress", "topic_config"}

func (f faultSource) String() string { return faultSourceNames[f] }

// Backoff of a failing source's retries: the first retry after
// faultRetryMin, each later one after twice the previous delay, never more
// than faultRetryMax, so writes resume at most faultRetryMax after the
// cause clears.
const (
	faultRetryMin = 10 * time.Millisecond
	faultRetryMax = time.Second
)

// faults records which background writes are failing. It has its own lock
// and knows nothing of the components: they report each attempt's outcome
// (failed, cleared) and run their own retries, asking retryIn for the
// delay.
type faults struct {
	log      *zerolog.Logger
	throttle *logthrottle.Throttle

	active atomic.Uint32 // bit i: source i is failing; read on every put

	mu      sync.Mutex
	state   [numFaultSources]faultState // guarded by mu
	changed chan struct{}               // closed and replaced when a source starts or stops failing; guarded by mu
}

type faultState struct {
	err        error     // the last failure while failing; nil when healthy
	since      time.Time // when the current failing spell began
	streak     int       // consecutive failures in the current spell
	backoff    time.Duration
	failures   uint64 // every failed attempt since Open
	recoveries uint64 // failing spells that ended
}

func newFaults(log *zerolog.Logger, throttle *logthrottle.Throttle) *faults {
	return &faults{log: log, throttle: throttle, changed: make(chan struct{})}
}

// failed records a failed attempt of src and returns how long the source
// should wait before it tries again.
func (f *faults) failed(src faultSource, err error) time.Duration {
	f.mu.Lock()
	st := &f.state[src]
	st.failures++
	st.streak++
	first := st.err == nil
	if first {
		st.since = time.Now()
		st.backoff = faultRetryMin
		f.active.Or(1 << src)
		f.notifyLocked()
	} else {
		st.backoff = min(2*st.backoff, faultRetryMax)
	}
	st.err = err
	backoff, streak := st.backoff, st.streak
	f.mu.Unlock()
	f.throttle.Event("storage: write fault: "+src.String(), f.log.Error()).Err(err).Str("source", src.String()).
		Int("attempt", streak).Stringer("retry_in", backoff).
		Msg("storage: a background write failed; retrying with backoff; puts are refused until it succeeds")
	return backoff
}

// noted counts a failed write of src that is not retried in the
// background: the call that needed it is refused (retriable) and the next
// call tries again, so the source never enters a failing spell (puts and
// health are unaffected). The topic config is written so.
func (f *faults) noted(src faultSource, err error) {
	f.mu.Lock()
	f.state[src].failures++
	f.mu.Unlock()
	f.throttle.Event("storage: write fault: "+src.String(), f.log.Warn()).Err(err).Str("source", src.String()).
		Msg("storage: a write failed; the call that needed it was refused and the next one tries again")
}

// cleared records a successful attempt of src, ending its failing spell.
func (f *faults) cleared(src faultSource) {
	if f.active.Load()&(1<<src) == 0 {
		return
	}
	f.mu.Lock()
	st := &f.state[src]
	if st.err == nil {
		f.mu.Unlock()
		return
	}
	took, attempts := time.Since(st.since), st.streak
	st.err, st.streak, st.backoff = nil, 0, 0
	st.recoveries++
	f.active.And(^uint32(1 << src))
	f.notifyLocked()
	f.mu.Unlock()
	f.log.Info().Str("source", src.String()).Int("failed_attempts", attempts).Stringer("after", took.Round(time.Millisecond)).
		Msg("storage: a background write succeeded again; puts resume")
}

// failing reports whether src is in a failing spell.
func (f *faults) failing(src faultSource) bool { return f.active.Load()&(1<<src) != 0 }

// retryIn returns the backoff of the failing source among srcs that should
// retry first, or false if none is failing.
func (f *faults) retryIn(srcs ...faultSource) (time.Duration, bool) {
	if f.active.Load() == 0 {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	ok := false
	for _, src := range srcs {
		if st := f.state[src]; st.err != nil && (!ok || st.backoff < d) {
			d, ok = st.backoff, true
		}
	}
	return d, ok
}

// err is the refusal of a put while some source is failing, nil otherwise.
// It costs one atomic load when nothing fails.
func (f *faults) err() error {
	if f.active.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for src := range numFaultSources {
		if cause := f.state[src].err; cause != nil {
			if isNoSpace(cause) {
				return fmt.Errorf("%w: %w: %w: %s: %w", ErrNotWritable, ErrWriteRetrying, ErrDiskFull, src, cause)
			}
			return fmt.Errorf("%w: %w: %s: %w", ErrNotWritable, ErrWriteRetrying, src, cause)
		}
	}
	return nil
}

// notify closes the change channel: the store turned read-only (Store.fail).
func (f *faults) notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notifyLocked()
}

// change returns a channel closed the next time a source starts or stops
// failing or the store turns read-only (tests wait on it instead of
// polling).
func (f *faults) change() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// REQUIRES: f.mu held.
func (f *faults) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// FaultStats describe one kind of background write the store retries
// when it fails (see Store.Stats).
type FaultStats struct {
	// Source names the write: "checkpoint", "consume_queue",
	// "delay_progress" or "topic_config".
	Source string
	// Failing is set while the last attempt failed: puts are refused and
	// the write is retried with backoff. Error is that attempt's error and
	// Since when the failing spell began.
	Failing bool
	Error   string
	Since   time.Time
	// Failures counts failed attempts since Open; Recoveries counts failing
	// spells that ended with a successful retry.
	Failures, Recoveries uint64
}

func (f *faults) stats() []FaultStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FaultStats, numFaultSources)
	for src := range numFaultSources {
		st := f.state[src]
		out[src] = FaultStats{Source: src.String(), Failing: st.err != nil, Failures: st.failures, Recoveries: st.recoveries}
		if st.err != nil {
			out[src].Error, out[src].Since = st.err.Error(), st.since
		}
	}
	return out
}

// isNoSpace reports whether err is a full disk: ENOSPC from a write, or
// vfs.ErrNoSpace from a preallocation.
func isNoSpace(err error) bool {
	return errors.Is(err, vfs.ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrDiskFull)
}
