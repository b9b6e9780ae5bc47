package flush

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// AsyncOptions configure Async. Zero values take RocketMQ's defaults.
type AsyncOptions struct {
	// Interval between flush attempts. Default 500 ms.
	Interval time.Duration
	// LeastPages is how many dirty pages a flush waits for. Default 4;
	// negative means 0.
	LeastPages int
	// ThoroughInterval: at least this often, flush whatever is dirty.
	// Default 10 s.
	ThoroughInterval time.Duration
	// OnError is called once, from the flush goroutine, when a sync fails,
	// before Wait or Err report the error.
	OnError func(error)
	// OnSync, if set, is called from the flush goroutine after each
	// successful sync with the durable offset. It must not block.
	OnSync func(durable int64)
}

// Async flushes on a ticker (RocketMQ FlushRealTimeService). Puts do not
// wait for it.
type Async struct {
	s    Syncer
	opts AsyncOptions

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	err error // sticky
}

// NewAsync starts the flush goroutine. Close stops it.
func NewAsync(s Syncer, opts AsyncOptions) *Async {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.LeastPages == 0 {
		opts.LeastPages = DefaultLeastPages
	} else if opts.LeastPages < 0 {
		opts.LeastPages = 0
	}
	if opts.ThoroughInterval <= 0 {
		opts.ThoroughInterval = DefaultThoroughInterval
	}
	a := &Async{s: s, opts: opts, kick: make(chan struct{}, 1), done: make(chan struct{})}
	a.wg.Add(1)
	go a.loop()
	return a
}

func (a *Async) loop() {
	defer a.wg.Done()
	t := time.NewTicker(a.opts.Interval)
	defer t.Stop()
	lastThorough := time.Now()
	for {
		select {
		case <-t.C:
		case <-a.kick:
		case <-a.done:
			return
		}
		pages := a.opts.LeastPages
		if now := time.Now(); now.Sub(lastThorough) >= a.opts.ThoroughInterval {
			pages = 0
			lastThorough = now
		}
		if a.sync(pages) != nil {
			return
		}
	}
}

func (a *Async) sync(pages int) error {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return a.err
	}
	a.mu.Unlock()
	durable, err := a.s.Sync(pages)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrSyncFailed, err)
		// The owner first, then Wait and Err: whoever sees the error here
		// finds the owner's state (the store read-only) already set.
		if a.opts.OnError != nil {
			a.opts.OnError(err)
		}
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		return err
	}
	if a.opts.OnSync != nil {
		a.opts.OnSync(durable)
	}
	return nil
}

// Wait returns at once: async puts do not wait for the disk. It reports the
// sticky error, if any.
func (a *Async) Wait(context.Context, int64) error { return a.Err() }

// Wake asks for a flush attempt now (RocketMQ wakeFlushWhenPutMessage). It
// never blocks.
func (a *Async) Wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Err returns the sticky sync error, or nil.
func (a *Async) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Close stops the goroutine and syncs everything written so far, unless a
// sync already failed. It returns the sticky error, if any.
func (a *Async) Close() error {
	select {
	case <-a.done:
		return a.Err()
	default:
	}
	close(a.done)
	a.wg.Wait()
	return a.sync(0)
}
