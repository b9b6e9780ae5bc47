package consumequeue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/internal/base"
)

// Read your writes. A put answered PUT_OK (with WAIT, the default) is
// already indexed: GetQueueInfo covers it and a pull returns it. The
// putter, once its record is appended (async) or durable (sync), waits
// until the dispatcher has indexed the commitlog up to the record's end.
// Waking the dispatcher goroutine and letting it work in rounds would make
// every put pay a futex wake-up and up to dispatchPause; instead the
// putter dispatches itself when no round is running (TryLock on runMu),
// up to the visible end, so one putter's round also covers every record
// appended before it. Only when a round is running does it wait, on
// progress, for that round to end, and then looks again. In sync mode it
// dispatches only up to the durable offset, as the dispatcher does: never
// is anything readable before it is durable.

// Why a put is answered before its record is indexed (see awaitDispatched).
var (
	// errIndexStalled: a dispatch round failed; the record is stored and
	// is indexed once a round succeeds.
	errIndexStalled = errors.New("storage: indexing failed; the message is stored and becomes readable once indexing resumes")
	// errIndexSlow: no round covered the record within the wait bound.
	errIndexSlow = errors.New("storage: indexing did not cover the message in time")
)

// progress wakes the puts waiting for a dispatch round to end. It costs a
// round one atomic load when nobody waits.
type progress struct {
	waiting atomic.Int32 // registered waits
	mu      sync.Mutex
	ch      chan struct{} // closed when runMu is next released; nil when nobody waits
}

// wait registers a wait and returns a channel closed at the next release
// of runMu. Call done once after.
func (p *progress) wait() <-chan struct{} {
	p.mu.Lock()
	if p.ch == nil {
		p.ch = make(chan struct{})
	}
	ch := p.ch
	p.waiting.Add(1)
	p.mu.Unlock()
	return ch
}

func (p *progress) done() { p.waiting.Add(-1) }

// publish wakes every registered wait. It runs after runMu is released: a
// waiter registers, then tries the lock, so either its TryLock sees the
// lock free or this publish sees its registration.
func (p *progress) publish() {
	if p.waiting.Load() == 0 {
		return
	}
	p.mu.Lock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
	p.mu.Unlock()
}

// unlockRun releases runMu and wakes the puts waiting for it.
func (d *Index) unlockRun() {
	d.runMu.Unlock()
	d.progress.publish()
}

// AwaitDispatched returns nil once the commitlog is indexed up to end,
// which must be at or below the visible end (the caller's record is
// appended, and durable in sync mode). It dispatches itself when no round
// runs. It gives up, with an error, when ctx ends, when the store closes
// (base.ErrClosed), when a round fails (errIndexStalled: the record stays
// stored and is indexed when a later round succeeds) or after
// SyncFlushTimeout without a round that covers end (errIndexSlow): a put
// never hangs on the index.
func (d *Index) AwaitDispatched(ctx context.Context, end int64) error {
	var timeout <-chan time.Time
	for {
		if d.dispatched.Load() >= end {
			return nil
		}
		if err := d.tryDispatch(end); err != errRunBusy {
			return err
		}
		// A round is running. Register, then try again: the round's
		// release either finds the registration or leaves the lock free
		// for the second try.
		ch := d.progress.wait()
		if err := d.tryDispatch(end); err != errRunBusy {
			d.progress.done()
			return err
		}
		if d.stalled.Load() {
			d.progress.done()
			return errIndexStalled
		}
		if timeout == nil {
			t := time.NewTimer(d.opts.AwaitTimeout)
			defer t.Stop()
			timeout = t.C
		}
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-d.done:
			err = base.ErrClosed
		case <-timeout:
			err = errIndexSlow
		}
		d.progress.done()
		if err != nil {
			return err
		}
	}
}

// errRunBusy: another round holds runMu.
var errRunBusy = errors.New("storage: dispatch round running")

// tryDispatch runs a round up to the visible end if runMu is free, and
// reports whether end is now indexed (nil), busy (errRunBusy) or why not.
func (d *Index) tryDispatch(end int64) error {
	if !d.runMu.TryLock() {
		return errRunBusy
	}
	var err error
	if d.dispatched.Load() < end {
		_, err = d.runLocked(d.opts.Watermark())
	}
	closed := d.closed
	d.unlockRun()
	switch {
	case d.dispatched.Load() >= end:
		return nil
	case closed:
		return base.ErrClosed
	case err != nil:
		return fmt.Errorf("%w: %w", errIndexStalled, err)
	}
	// The visible end is below end: the caller did not wait for its
	// record to become visible. Not a wait that can end.
	return fmt.Errorf("%w: commitlog offset %d is not visible yet", errIndexSlow, end)
}
