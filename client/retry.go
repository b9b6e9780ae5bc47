package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// putRetry is one put's retry state across its sends, shared by
// LeaderTracker.do (a call per send) and Stream.Put (a stream message per
// send): the attempts made, the backoff and the member that refused last,
// the bound on waiting for a ready leader, and the unknown outcome a keyed
// put was sent again after.
type putRetry struct {
	t       *LeaderTracker
	began   time.Time
	attempt int // sends made
	backoff time.Duration
	// refusedBy refused the last send (or answered it with an unknown
	// outcome) and is not asked again before notBefore.
	refusedBy string
	notBefore time.Time
	// leaderDeadline is set at the first lookup that finds no ready leader.
	leaderDeadline time.Time
	// last is the last send's error; unknown the last one whose outcome
	// is unknown, of a keyed put sent again after it: whatever ends the
	// put later, the message may be stored, and the error returned must
	// say so (unknown first, where Classify and status.Code look).
	last, unknown error
}

func (t *LeaderTracker) newRetry() *putRetry {
	return &putRetry{t: t, began: time.Now(), backoff: t.opts.InitialBackoff}
}

// fail is the put's final error for err: err itself, or, once a send's
// outcome was unknown, that outcome first, then err.
func (r *putRetry) fail(err error) error {
	if r.unknown != nil && err != r.unknown {
		return fmt.Errorf("%w; then: %w", r.unknown, err)
	}
	return err
}

// noLeader: a lookup found no ready leader (err). It returns the wait
// before the next lookup, or the put's final error once LeaderWait has
// passed since the first such lookup. Lookups are polled at a short,
// fixed interval: the group takes puts as soon as a leader is ready, and
// a backoff grown during the election would only add to the time without
// writes.
func (r *putRetry) noLeader(err error) (time.Duration, error) {
	now := time.Now()
	if r.leaderDeadline.IsZero() {
		r.leaderDeadline = now.Add(r.t.opts.LeaderWait)
	}
	if now.After(r.leaderDeadline) {
		return 0, r.fail(errors.Join(fmt.Errorf("client: no ready leader within %v", r.t.opts.LeaderWait), err, r.last))
	}
	return jitter(r.t.opts.LookupInterval), nil
}

// hold is how long to wait before sending to addr: the rest of its
// RetryInfo or backoff when it refused the last send; 0 to send now.
func (r *putRetry) hold(addr string) time.Duration {
	if addr != r.refusedBy {
		return 0
	}
	return max(time.Until(r.notBefore), 0)
}

// uncovered: a send's outcome was unknown and addr would not recognise
// the message if that send stored it (deduplication off there, or its
// window too short for the time since the put began): the put must end
// with the unknown outcome, for the caller to decide.
func (r *putRetry) uncovered(addr string) bool {
	return r.unknown != nil && !r.t.dedupCovers(addr, time.Since(r.began))
}

// sent counts a send; false once it was the last one MaxAttempts allows.
func (r *putRetry) sent() (more bool) {
	r.attempt++
	return r.attempt < r.t.opts.MaxAttempts
}

// refused records that addr refused the send with nothing stored (err,
// already wrapped): addr is asked again only after delay (a server's
// RetryInfo, capped at MaxRetryDelay) or, when hasDelay is false, after
// the backoff, which then doubles up to MaxBackoff; both jittered.
func (r *putRetry) refused(addr string, err error, delay time.Duration, hasDelay bool) {
	r.last = err
	wait := r.backoff
	if hasDelay {
		wait = min(delay, r.t.opts.MaxRetryDelay)
	} else {
		r.backoff = min(2*r.backoff, r.t.opts.MaxBackoff)
	}
	r.refusedBy, r.notBefore = addr, time.Now().Add(jitter(wait))
}

// unknownOutcome records that a keyed put's send to addr has an unknown
// outcome (err, already wrapped) and is to be sent again. held: addr
// answered (it is alive, and waits there for the first send's entry to be
// decided), so it is asked again only after the backoff.
func (r *putRetry) unknownOutcome(addr string, err error, held bool) {
	r.unknown, r.last = err, err
	if held {
		r.refusedBy, r.notBefore = addr, time.Now().Add(jitter(r.backoff))
		r.backoff = min(2*r.backoff, r.t.opts.MaxBackoff)
	}
}

// wait waits d; when ctx ends first, or closed (the tracker's or the
// Stream's), it returns the put's final error: ErrClosed or ctx's error,
// joined with the last send's.
func (r *putRetry) wait(ctx, closed context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	if r.t.retryWait != nil {
		r.t.retryWait()
	}
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
	case <-closed.Done():
	}
	if closed.Err() != nil {
		return r.fail(errors.Join(ErrClosed, r.last))
	}
	return r.fail(errors.Join(ctx.Err(), r.last))
}
