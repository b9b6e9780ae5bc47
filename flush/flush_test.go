package flush

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSyncer stands in for the commitlog: the test "appends" by advancing
// written; Sync makes everything written so far durable. It can block or
// fail on demand and records every call.
type fakeSyncer struct {
	mu      sync.Mutex
	written int64
	durable atomic.Int64
	calls   []int // minPages of each call
	times   []time.Duration
	start   time.Time
	block   chan struct{} // if non-nil, Sync waits for it
	delay   time.Duration // each Sync takes this long (fake time in a bubble)
	failOn  int           // 1-based call number that fails; 0 = never
}

var errEIO = errors.New("input/output error")

func (f *fakeSyncer) append(n int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written += n
	return f.written
}

func (f *fakeSyncer) Sync(minPages int) (int64, error) {
	f.mu.Lock()
	f.calls = append(f.calls, minPages)
	f.times = append(f.times, time.Since(f.start))
	n := len(f.calls)
	w := f.written
	block := f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if f.failOn != 0 && n >= f.failOn {
		return f.durable.Load(), errEIO
	}
	f.durable.Store(w)
	return w, nil
}

func (f *fakeSyncer) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func TestGroupCommitAckNeverPrecedesSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), delay: 100 * time.Microsecond}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Second})
		defer g.Close()
		const waiters = 64
		var wg sync.WaitGroup
		for i := 0; i < waiters; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 10; j++ {
					end := fs.append(100)
					if err := g.Wait(context.Background(), end); err != nil {
						t.Errorf("wait: %v", err)
						return
					}
					if d := fs.durable.Load(); d < end {
						t.Errorf("acked offset %d while only %d was synced", end, d)
					}
				}
			}()
		}
		wg.Wait()
		if n := fs.numCalls(); n >= waiters*10 {
			t.Fatalf("%d syncs for %d waits: no grouping", n, waiters*10)
		}
		t.Logf("%d waits answered by %d syncs", waiters*10, fs.numCalls())
	})
}

// TestGroupCommitGathersReturningWaiters: with a sync that takes time, the
// waiters a sync releases and those that queued meanwhile share the next
// sync, instead of splitting into two cohorts that each pay one.
func TestGroupCommitGathersReturningWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), delay: time.Millisecond}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Second})
		defer g.Close()
		const writers, rounds = 32, 20
		var wg sync.WaitGroup
		for i := 0; i < writers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < rounds; j++ {
					end := fs.append(1)
					if err := g.Wait(context.Background(), end); err != nil {
						t.Errorf("wait: %v", err)
						return
					}
					if fs.durable.Load() < end {
						t.Errorf("acked before durable")
					}
				}
			}()
		}
		wg.Wait()
		// Perfect grouping needs `rounds` syncs; two alternating cohorts
		// would need about twice that.
		if n := fs.numCalls(); n > rounds+rounds/4 {
			t.Fatalf("%d syncs for %d writers x %d rounds: waiters are not gathered", n, writers, rounds)
		}
	})
}

func TestGroupCommitTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), block: make(chan struct{})}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: 5 * time.Second})
		start := time.Now()
		err := g.Wait(context.Background(), fs.append(10))
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Fatalf("timed out after %v, want exactly 5s", el)
		}
		close(fs.block)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGroupCommitTimeoutWhileSyncHangs: while a sync hangs, each waiter
// gets ErrTimeout at its own deadline, both the one the hung sync covers and
// the one queued behind it, and a waiter that left (ctx cancelled) does not
// stall the watcher. Once the sync returns, later waiters are answered as
// usual, on recycled waiters that carry no stale answer.
func TestGroupCommitTimeoutWhileSyncHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), block: make(chan struct{})}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: 5 * time.Second})
		type result struct {
			err error
			at  time.Duration
		}
		wait := func(ctx context.Context) <-chan result {
			c := make(chan result, 1)
			go func() {
				err := g.Wait(ctx, fs.append(1))
				c <- result{err, time.Since(fs.start)}
			}()
			synctest.Wait() // queued (or, for the first, in the hung sync)
			return c
		}
		inSync := wait(context.Background())
		time.Sleep(time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		gone := wait(ctx)
		cancel()
		if r := <-gone; !errors.Is(r.err, context.Canceled) || r.at != time.Second {
			t.Fatalf("cancelled waiter: %v at %v", r.err, r.at)
		}
		time.Sleep(time.Second)
		queued := wait(context.Background())

		for _, c := range []struct {
			name string
			ch   <-chan result
			want time.Duration
		}{{"waiter in the hung sync", inSync, 5 * time.Second}, {"waiter queued behind it", queued, 7 * time.Second}} {
			r := <-c.ch
			if !errors.Is(r.err, ErrTimeout) || r.at != c.want {
				t.Fatalf("%s: %v at %v, want ErrTimeout at %v", c.name, r.err, r.at, c.want)
			}
		}
		if n := fs.numCalls(); n != 1 {
			t.Fatalf("%d syncs, want the one that hangs", n)
		}

		close(fs.block)
		for i := 0; i < 100; i++ {
			end := fs.append(1)
			if err := g.Wait(context.Background(), end); err != nil {
				t.Fatalf("wait %d after the timeouts: %v", i, err)
			}
			if d := fs.durable.Load(); d < end {
				t.Fatalf("acked offset %d while only %d was synced", end, d)
			}
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestGroupCommitContextCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), block: make(chan struct{})}
		g := NewGroupCommit(fs, GroupCommitOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := g.Wait(ctx, fs.append(1)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		close(fs.block)
		g.Close()
	})
}

func TestGroupCommitFailedSyncIsSticky(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), failOn: 2}
		var reported []error
		g := NewGroupCommit(fs, GroupCommitOptions{OnError: func(err error) { reported = append(reported, err) }})
		if err := g.Wait(context.Background(), fs.append(1)); err != nil {
			t.Fatalf("first wait: %v", err)
		}
		err := g.Wait(context.Background(), fs.append(1))
		if !errors.Is(err, ErrSyncFailed) || !errors.Is(err, errEIO) {
			t.Fatalf("wait after failed sync: %v", err)
		}
		calls := fs.numCalls()
		// Every later wait fails at once; no further sync is attempted.
		for i := 0; i < 3; i++ {
			if err := g.Wait(context.Background(), fs.append(1)); !errors.Is(err, ErrSyncFailed) {
				t.Fatalf("later wait: %v", err)
			}
		}
		g.Wake()
		synctest.Wait()
		if fs.numCalls() != calls {
			t.Fatalf("sync retried after a failure: %d calls, then %d", calls, fs.numCalls())
		}
		if err := g.Close(); !errors.Is(err, ErrSyncFailed) {
			t.Fatalf("close: %v", err)
		}
		if len(reported) != 1 {
			t.Fatalf("OnError called %d times", len(reported))
		}
		if fs.numCalls() != calls {
			t.Fatal("Close synced after a failure")
		}
	})
}

func TestGroupCommitCloseAnswersWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), block: make(chan struct{})}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Hour})
		errc := make(chan error, 1)
		go func() { errc <- g.Wait(context.Background(), fs.append(5)) }()
		synctest.Wait() // the waiter is queued and the loop is blocked in Sync
		close(fs.block)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("waiter after close: %v (the final sync covered it)", err)
		}
		if err := g.Wait(context.Background(), fs.append(5)); !errors.Is(err, ErrClosed) {
			t.Fatalf("wait after close: %v", err)
		}
	})
}

func TestAsyncIntervals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now()}
		a := NewAsync(fs, AsyncOptions{Interval: 500 * time.Millisecond, LeastPages: 4, ThoroughInterval: 10 * time.Second})
		time.Sleep(10*time.Second + 250*time.Millisecond) // fake time inside the bubble
		synctest.Wait()
		fs.mu.Lock()
		calls, times := append([]int(nil), fs.calls...), append([]time.Duration(nil), fs.times...)
		fs.mu.Unlock()
		if len(calls) != 20 {
			t.Fatalf("%d flushes in 10.25 s at 500 ms, want 20", len(calls))
		}
		for i, c := range calls {
			want := 4
			if times[i] == 10*time.Second {
				want = 0 // the thorough flush
			}
			if c != want || times[i] != time.Duration(i+1)*500*time.Millisecond {
				t.Fatalf("flush %d at %v with minPages %d", i, times[i], c)
			}
		}
		a.Wake()
		synctest.Wait()
		if fs.numCalls() != 21 {
			t.Fatal("Wake did not flush")
		}
		fs.append(7)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if fs.durable.Load() != 7 {
			t.Fatal("Close did not flush everything")
		}
		if err := a.Wait(context.Background(), 7); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAsyncFailedSyncIsSticky(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), failOn: 1}
		var reported atomic.Int32
		a := NewAsync(fs, AsyncOptions{Interval: time.Second, OnError: func(error) { reported.Add(1) }})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if fs.numCalls() != 1 || reported.Load() != 1 {
			t.Fatalf("calls %d reports %d: the loop must stop after a failure", fs.numCalls(), reported.Load())
		}
		if err := a.Wait(context.Background(), 0); !errors.Is(err, ErrSyncFailed) {
			t.Fatalf("Wait: %v", err)
		}
		if err := a.Close(); !errors.Is(err, ErrSyncFailed) || fs.numCalls() != 1 {
			t.Fatalf("Close: %v after %d calls", err, fs.numCalls())
		}
	})
}

func BenchmarkGroupCommitWaiters(b *testing.B) {
	fs := &fakeSyncer{start: time.Now()}
	g := NewGroupCommit(fs, GroupCommitOptions{})
	defer g.Close()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := g.Wait(context.Background(), fs.append(1)); err != nil {
				b.Error(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/float64(fs.numCalls()), "waits/sync")
}
