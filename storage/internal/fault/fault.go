// Package fault records which background writes of the store are failing
// (transient write faults) and hands each its retry backoff.
package fault

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/internal/base"
)

// Transient write faults.
//
// Only a failed commitlog msync/fdatasync is sticky (the store's sticky failure): after it
// the kernel may have dropped the pages, so nothing can be acknowledged
// again (fsyncgate). Every other background write of the store (the
// checkpoint, a consume-queue entry, the delay progress) can be written
// again from what the store still holds in memory and in the commitlog, so
// its failure is transient: another process filling the disk
// for a moment (ENOSPC) or idle connections using up the fd limit (EMFILE)
// must not make the store refuse writes until a restart.
//
// A failing source is retried by its own goroutine with a capped backoff
// (RetryMin doubling to RetryMax), counted (Stats.Faults, the
// storaged_store_write_faults_total metric), logged through one throttle
// (the first failure at once, then at most one line per interval with the
// suppressed count), and while any source is failing the store refuses
// puts with an error wrapping base.ErrNotWritable and base.ErrWriteRetrying (and
// base.ErrDiskFull for ENOSPC), so Writable is false and the health service
// says NOT_SERVING. The topic config is not a background write: a failed
// write refuses the call that needed it (ErrTopicConfig, retriable) and
// the next call tries again; it is only counted here (noted). Refusing is
// RocketMQ's choice for a full disk: a
// message accepted now could not be indexed or checkpointed, and a client
// told to retry elsewhere loses nothing. Reads keep working. The first
// retry that succeeds clears the source and writes resume by themselves.

// Source names a background write the store retries when it fails.
type Source int

const (
	Checkpoint    Source = iota // config/checkpoint: the dispatcher goroutine
	ConsumeQueue                // a consume-queue entry or file: the dispatcher goroutine
	DelayProgress               // config/delayOffset.json: the scheduler goroutine
	TopicConfig                 // config/topics.json: per call, never failing (Set.Noted)
	TimerProgress               // config/timerProgress.json: the timer service goroutine
	NumSources
)

var SourceNames = [NumSources]string{"checkpoint", "consume_queue", "delay_progress", "topic_config", "timer_progress"}

func (f Source) String() string { return SourceNames[f] }

// Backoff of a failing source's retries: the first retry after
// RetryMin, each later one after twice the previous delay, never more
// than RetryMax, so writes resume at most RetryMax after the
// cause clears.
const (
	RetryMin = 10 * time.Millisecond
	RetryMax = time.Second
)

// Set records which background writes are failing. It has its own lock
// and knows nothing of the components: they report each attempt's outcome
// (failed, cleared) and run their own retries, asking retryIn for the
// delay.
type Set struct {
	log      *zerolog.Logger
	throttle *logthrottle.Throttle

	active atomic.Uint32 // bit i: source i is failing; read on every put

	mu      sync.Mutex
	state   [NumSources]faultState // guarded by mu
	changed chan struct{}          // closed and replaced when a source starts or stops failing; guarded by mu
}

type faultState struct {
	err        error     // the last failure while failing; nil when healthy
	since      time.Time // when the current failing spell began
	streak     int       // consecutive failures in the current spell
	backoff    time.Duration
	failures   uint64 // every failed attempt since Open
	recoveries uint64 // failing spells that ended
}

func New(log *zerolog.Logger, throttle *logthrottle.Throttle) *Set {
	return &Set{log: log, throttle: throttle, changed: make(chan struct{})}
}

// failed records a failed attempt of src and returns how long the source
// should wait before it tries again.
func (f *Set) Failed(src Source, err error) time.Duration {
	f.mu.Lock()
	st := &f.state[src]
	st.failures++
	st.streak++
	first := st.err == nil
	if first {
		st.since = time.Now()
		st.backoff = RetryMin
		f.active.Or(1 << src)
		f.notifyLocked()
	} else {
		st.backoff = min(2*st.backoff, RetryMax)
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
func (f *Set) Noted(src Source, err error) {
	f.mu.Lock()
	f.state[src].failures++
	f.mu.Unlock()
	f.throttle.Event("storage: write fault: "+src.String(), f.log.Warn()).Err(err).Str("source", src.String()).
		Msg("storage: a write failed; the call that needed it was refused and the next one tries again")
}

// cleared records a successful attempt of src, ending its failing spell.
func (f *Set) Cleared(src Source) {
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
func (f *Set) Failing(src Source) bool { return f.active.Load()&(1<<src) != 0 }

// retryIn returns the backoff of the failing source among srcs that should
// retry first, or false if none is failing.
func (f *Set) RetryIn(srcs ...Source) (time.Duration, bool) {
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
func (f *Set) Err() error {
	if f.active.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for src := range NumSources {
		if cause := f.state[src].err; cause != nil {
			if base.IsNoSpace(cause) {
				return fmt.Errorf("%w: %w: %w: %s: %w", base.ErrNotWritable, base.ErrWriteRetrying, base.ErrDiskFull, src, cause)
			}
			return fmt.Errorf("%w: %w: %s: %w", base.ErrNotWritable, base.ErrWriteRetrying, src, cause)
		}
	}
	return nil
}

// notify closes the change channel: the store turned read-only (the store's sticky failure).
func (f *Set) Notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notifyLocked()
}

// change returns a channel closed the next time a source starts or stops
// failing or the store turns read-only (tests wait on it instead of
// polling).
func (f *Set) Change() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// REQUIRES: f.mu held.
func (f *Set) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Stats describe one kind of background write the store retries
// when it fails (storage.Stats.Faults).
type Stats struct {
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

func (f *Set) Stats() []Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Stats, NumSources)
	for src := range NumSources {
		st := f.state[src]
		out[src] = Stats{Source: src.String(), Failing: st.err != nil, Failures: st.failures, Recoveries: st.recoveries}
		if st.err != nil {
			out[src].Error, out[src].Since = st.err.Error(), st.since
		}
	}
	return out
}
