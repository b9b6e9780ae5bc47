package flush

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// GroupCommitOptions configure GroupCommit.
type GroupCommitOptions struct {
	// Timeout bounds each Wait; past it Wait returns ErrTimeout. Default 5 s.
	Timeout time.Duration
	// OnError is called once, from the flush goroutine, when a sync fails,
	// before any waiter is answered with the error, so that whatever the
	// owner records (the store turning read-only) is in place when a waiter
	// hears of the failure.
	OnError func(error)
	// OnSync, if set, is called from the flush goroutine after each
	// successful sync with the durable offset, before waiters are answered.
	// It must not block.
	OnSync func(durable int64)
}

// GroupCommit acknowledges a write only after a sync that covers it has
// returned (RocketMQ GroupCommitService + FlushDiskWatcher). Waiters are
// queued; the goroutine swaps the queue for an empty one, syncs once and
// answers every waiter whose offset the sync covered, across file
// boundaries, so one sync answers many puts.
//
// Timeouts cost no timer per waiter: each waiter carries its deadline, and
// one watcher goroutine (FlushDiskWatcher) sleeps until the earliest
// deadline among the queued waiters, answers ErrTimeout to those past it
// and takes them out of the queues. A waiter is answered exactly once, by
// whoever takes it out of the queues under mu: the loop after its sync, the
// watcher, or Close.
type GroupCommit struct {
	s       Syncer
	timeout time.Duration
	onError func(error)
	onSync  func(int64)

	durable atomic.Int64 // highest durable offset seen

	mu      sync.Mutex
	pending []*waiter // queued for the next sync; guarded by mu
	syncing []*waiter // covered by the sync in progress; guarded by mu
	spare   []*waiter // guarded by mu
	// watching is set while the watcher is bound to look at the queues
	// again no later than the earliest deadline in them: its timer is set
	// for that deadline, or it has been kicked. Guarded by mu.
	watching bool
	err      error // sticky; guarded by mu
	closed   bool  // guarded by mu

	// waiters recycles answered waiters, so a sync put costs no allocation
	// for them. Per instance: a channel belongs to the goroutine group
	// (synctest bubble) that made it.
	waiters sync.Pool

	// Counters for Stats.
	syncs, released, atOnce, gathers, gaveUp, short, gatherNanos atomic.Int64

	kick      chan struct{} // cap 1: wakes the loop
	done      chan struct{} // closed by Close: the loop ends
	wg        sync.WaitGroup
	watchKick chan struct{} // cap 1: wakes the watcher
	stopWatch chan struct{} // closed by Close after the last answer: the watcher ends
	watcher   sync.WaitGroup
}

type waiter struct {
	offset   int64
	deadline time.Time  // past it, the watcher answers ErrTimeout
	ch       chan error // cap 1: answering never blocks on a waiter that left
}

// NewGroupCommit starts the group-commit goroutine and its timeout
// watcher. Close stops them.
func NewGroupCommit(s Syncer, opts GroupCommitOptions) *GroupCommit {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	g := &GroupCommit{s: s, timeout: opts.Timeout, onError: opts.OnError, onSync: opts.OnSync,
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		watchKick: make(chan struct{}, 1), stopWatch: make(chan struct{})}
	g.waiters.New = func() any { return &waiter{ch: make(chan error, 1)} }
	g.wg.Add(1)
	go g.loop()
	g.watcher.Add(1)
	go g.watch()
	return g
}

// Wait blocks until a sync has covered every byte below offset, then
// returns nil. It returns ErrTimeout after the timeout, ctx.Err() when ctx
// ends first, the sticky sync error (wrapping ErrSyncFailed) when a sync
// failed, and ErrClosed when the group commit closed without covering
// offset. Only nil means durable.
func (g *GroupCommit) Wait(ctx context.Context, offset int64) error {
	if g.durable.Load() >= offset {
		g.atOnce.Add(1)
		return nil
	}
	w := g.waiters.Get().(*waiter)
	w.offset = offset
	w.deadline = time.Now().Add(g.timeout)
	g.mu.Lock()
	switch {
	case g.err != nil:
		err := g.err
		g.mu.Unlock()
		g.waiters.Put(w)
		return err
	case g.closed:
		g.mu.Unlock()
		g.waiters.Put(w)
		return ErrClosed
	}
	g.pending = append(g.pending, w)
	if !g.watching {
		g.watching = true
		g.kickWatcher()
	}
	g.mu.Unlock()
	g.Wake()

	select {
	case err := <-w.ch:
		// Answered (nil, ErrTimeout or another error): whoever answered
		// took w out of the queues first, so nothing refers to it.
		g.waiters.Put(w)
		return err
	case <-ctx.Done():
		return ctx.Err() // w stays queued and is answered later; not pooled
	}
}

// Wake asks for a sync now without waiting for it (RocketMQ: a put with
// WAIT=false). It never blocks.
func (g *GroupCommit) Wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Durable returns the highest offset known durable.
func (g *GroupCommit) Durable() int64 { return g.durable.Load() }

// Err returns the sticky sync error, or nil.
func (g *GroupCommit) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *GroupCommit) loop() {
	defer g.wg.Done()
	var expect int             // waiters expected in the next round
	var lastSync time.Duration // how long the last sync took
	// After a group that did not come back within a sync, the next skip
	// rounds wait only half a sync for it; backoff is the last skip,
	// reset after a run of maxGatherBackoff complete gathers.
	var skip, backoff, complete int
	for {
		select {
		case <-g.kick:
		case <-g.done:
			return
		}
		switch {
		case skip > 0:
			skip--
			g.gather(expect, lastSync/2, false)
		case g.gather(expect, lastSync, true):
			if complete++; complete >= maxGatherBackoff {
				backoff = 0
			}
		default:
			// Waiting a whole sync for the group only delayed those
			// already here. Wait half a sync for 1, 2, 4 …
			// maxGatherBackoff rounds, then try a whole one again: the
			// load may have changed.
			backoff = min(max(1, 2*backoff), maxGatherBackoff)
			skip, complete = backoff, 0
		}
		select {
		case <-g.done:
			return // Close runs the last sync
		default:
		}
		start := time.Now()
		released, early := g.commit()
		lastSync = time.Since(start)
		// The waiters just released usually put again at once; those that
		// queued during the sync are already here: together they are the
		// next group.
		expect = released + early
	}
}

// gather lets the pending queue fill up to expect waiters (the group the
// last sync released plus those that queued during it) before the next
// sync, for at most budget (capped at maxGather), and reports whether the
// group was complete in time (or there was nothing to wait for). full
// says which kind of wait this is, for Stats.
//
// Why wait, and how long. A caller acked by a sync sends its next put
// within a round trip plus the CPU time of its call; on a busy machine the
// group comes back over a spread of time R, since the returns queue for the
// same cores. Starting the next sync at the first arrival splits the group
// into cohorts that alternate, each paying a whole sync S plus the
// other's: about 2S of flush wait per put (issue 16 measured 8.6 puts per
// sync of 16 in flight, flush wait two syncs). Waiting for the whole group
// costs R and one sync: a win when R < S, a loss when R > S. So the loop
// waits up to one sync (budget = the last sync's duration: what a
// straggler saves by making it; MySQL's binlog_group_commit_sync_delay and
// PostgreSQL's commit_delay are fixed delays instead), ends the wait as soon
// as the group is complete (MySQL's binlog_group_commit_sync_no_delay_count),
// and after a group that did not come back within a sync falls back for a
// few rounds to waiting half a sync (the policy before, which keeps part of
// a slow group together), then tries a whole sync again.
//
// In the closed-loop model of gather_test.go (writers that queue for one
// core after their ack, with jitter, fake time), waiting up to a whole sync
// gains 13 % over half a sync where the group comes back within one (16
// writers: 13.2 k/s against 11.7 k; 64 writers: 33.4 k against 29.4 k),
// and with the fallback equals half a sync where the group needs longer.
// The model prefers no wait at all in that case (up to 1.25x), but on the
// 2-core build machine under a load average of ~20 (syncs of ~10 ms) the
// no-wait fallback lost 0.83x at 64 in flight (the groups fragmented)
// while gaining 1.29x at 16, so the fallback is the policy before. With
// one writer, or none coming, it does not wait at all.
func (g *GroupCommit) gather(expect int, budget time.Duration, full bool) bool {
	wait := min(budget, maxGather)
	if expect <= 1 || wait <= 0 {
		return true
	}
	start := time.Now()
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		g.mu.Lock()
		n := len(g.pending)
		g.mu.Unlock()
		if n >= expect {
			if full {
				g.gathers.Add(1)
			}
			g.gatherNanos.Add(int64(time.Since(start)))
			return true
		}
		select {
		case <-g.kick:
		case <-t.C:
			if full {
				g.gaveUp.Add(1)
			} else {
				g.short.Add(1)
			}
			g.gatherNanos.Add(int64(time.Since(start)))
			return false
		case <-g.done:
			return true
		}
	}
}

const (
	// maxGather bounds how long gather waits for the group.
	maxGather = 4 * time.Millisecond
	// maxGatherBackoff bounds how many rounds the loop waits only half a
	// sync after a group that did not come back within one.
	maxGatherBackoff = 16
)

// GroupCommitStats counts what the group commit did since it started.
type GroupCommitStats struct {
	Syncs    int64         // successful syncs
	Released int64         // waiters answered nil by them
	AtOnce   int64         // Waits answered nil at once: a sync had covered the offset already
	Gathered int64         // waits of up to a sync that saw their whole group arrive
	GaveUp   int64         // waits of up to a sync that ran out without it
	Short    int64         // waits of half a sync (after a GaveUp) that ran out
	Gather   time.Duration // total time spent waiting for groups
}

// Stats returns the counters. Safe to call at any time.
func (g *GroupCommit) Stats() GroupCommitStats {
	return GroupCommitStats{Syncs: g.syncs.Load(), Released: g.released.Load(), AtOnce: g.atOnce.Load(), Gathered: g.gathers.Load(),
		GaveUp: g.gaveUp.Load(), Short: g.short.Load(), Gather: time.Duration(g.gatherNanos.Load())}
}

// commit runs one round: swap the queue, sync once, answer what is covered.
// It returns how many waiters it released and how many queued meanwhile.
func (g *GroupCommit) commit() (released, early int) {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return 0, 0
	}
	g.syncing = g.pending
	g.pending = g.spare[:0]
	g.mu.Unlock()

	durable, err := g.s.Sync(0)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrSyncFailed, err)
		// Tell the owner before any waiter learns of the failure: a put
		// answered with the error must find the store already read-only.
		if g.onError != nil {
			g.onError(err)
		}
	}

	// The watcher may have timed out some of the waiters meanwhile; take
	// the others. From here on only this goroutine refers to them.
	g.mu.Lock()
	batch := g.syncing
	g.syncing = nil
	if err != nil {
		g.err = err
		rest := g.pending
		g.pending = nil
		g.mu.Unlock()
		for _, w := range batch {
			w.ch <- err
		}
		for _, w := range rest {
			w.ch <- err
		}
		return 0, 0
	}
	g.mu.Unlock()
	if durable > g.durable.Load() {
		g.durable.Store(durable)
	}
	g.syncs.Add(1)
	if g.onSync != nil {
		g.onSync(durable)
	}
	// A waiter enqueues after its append, so Sync(0) always covers it; keep
	// any that it did not (a Syncer that syncs less) for the next round.
	// Counted before answering, so that a caller who has its answer finds
	// itself in Stats.
	var left []*waiter
	for _, w := range batch {
		if w.offset <= durable {
			batch[released] = w
			released++
		} else {
			left = append(left, w)
		}
	}
	g.released.Add(int64(released))
	for _, w := range batch[:released] {
		w.ch <- nil
	}
	g.mu.Lock()
	early = len(g.pending)
	g.pending = append(g.pending, left...)
	if len(left) > 0 {
		// The watcher may have looked while they were out of the queues:
		// make it look again, since their deadlines may be the earliest.
		g.watching = true
		g.kickWatcher()
	}
	g.spare = batch[:0]
	clear(batch[:cap(batch)])
	g.mu.Unlock()
	if len(left) > 0 || early > 0 {
		g.Wake()
	}
	return released, early
}

// watch is the timeout watcher (RocketMQ FlushDiskWatcher) with one timer
// for all waiters: it sleeps until the earliest deadline among the queued
// waiters, or until a waiter arrives while none was queued, and then
// answers ErrTimeout to every waiter whose deadline has passed.
func (g *GroupCommit) watch() {
	defer g.watcher.Done()
	t := time.NewTimer(g.timeout)
	t.Stop()
	for {
		select {
		case <-g.watchKick:
		case <-t.C:
		case <-g.stopWatch:
			t.Stop()
			return
		}
		if next, ok := g.expire(time.Now()); ok {
			t.Reset(time.Until(next))
		} else {
			t.Stop()
		}
	}
}

// expire answers ErrTimeout to every queued waiter whose deadline is not
// after now, and takes it out of the queues. It returns the earliest
// deadline among the waiters left, or false if none is queued.
func (g *GroupCommit) expire(now time.Time) (next time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	expired := func(w *waiter) bool {
		if !w.deadline.After(now) {
			w.ch <- ErrTimeout
			return true
		}
		if !ok || w.deadline.Before(next) {
			next, ok = w.deadline, true
		}
		return false
	}
	g.syncing = slices.DeleteFunc(g.syncing, expired)
	g.pending = slices.DeleteFunc(g.pending, expired)
	g.watching = ok
	return next, ok
}

// kickWatcher wakes the watcher without blocking.
func (g *GroupCommit) kickWatcher() {
	select {
	case g.watchKick <- struct{}{}:
	default:
	}
}

// Close stops the goroutine, runs a last sync and answers every waiter:
// nil if the last sync covered it, the sticky error or ErrClosed otherwise.
// Waiters whose deadline passes during the last sync get ErrTimeout.
func (g *GroupCommit) Close() error {
	g.mu.Lock()
	if g.closed {
		err := g.err
		g.mu.Unlock()
		return err
	}
	g.closed = true
	g.mu.Unlock()
	close(g.done)
	g.wg.Wait()
	g.commit()
	g.mu.Lock()
	for _, w := range g.pending {
		w.ch <- ErrClosed
	}
	g.pending = nil
	err := g.err
	g.mu.Unlock()
	close(g.stopWatch)
	g.watcher.Wait()
	return err
}
