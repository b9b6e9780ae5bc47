package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const minute = int64(time.Minute / time.Millisecond)

func newWindow(t testing.TB, window time.Duration, maxMessages int) *Window[string] {
	t.Helper()
	w, err := New[string](Options{Window: window, MaxMessages: maxMessages})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// begin is Begin that must not wait.
func begin(t *testing.T, w *Window[string], k Key, now int64) (string, *Ticket[string]) {
	t.Helper()
	v, tk, err := w.Begin(context.Background(), k, now)
	if err != nil {
		t.Fatalf("Begin(%v): %v", k, err)
	}
	return v, tk
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{{}, {Window: time.Minute}, {MaxMessages: 1}, {Window: -time.Second, MaxMessages: 1}} {
		if _, err := New[int](o); !errors.Is(err, ErrOptions) {
			t.Errorf("New(%+v) = %v, want ErrOptions", o, err)
		}
	}
}

// TestFirstThenDuplicate: the first put of a key gets a ticket; once it
// commits, a put of the same key gets its value; other topics, kinds and
// keys are other puts.
func TestFirstThenDuplicate(t *testing.T) {
	w := newWindow(t, 10*time.Minute, 100)
	k := Key{Topic: "T", Kind: Single, ID: "u1"}
	if _, tk := begin(t, w, k, 0); tk == nil {
		t.Fatal("first put got no ticket")
	} else {
		tk.Commit("result-1", 0, 1)
		tk.Abort() // after Commit: nothing
	}
	if v, tk := begin(t, w, k, minute); tk != nil || v != "result-1" {
		t.Fatalf("duplicate: %q, ticket %v; want result-1 and no ticket", v, tk)
	}
	for _, other := range []Key{{"U", Single, "u1"}, {"T", Delayed, "u1"}, {"T", Batch, "u1"}, {"T", Single, "u2"}} {
		if _, tk := begin(t, w, other, minute); tk == nil {
			t.Errorf("%v answered from %v", other, k)
		} else {
			tk.Abort()
		}
	}
	if st := w.Stats(minute); st.Keys != 1 || st.Hits != 1 || st.Pending != 0 || st.Oldest != time.Minute {
		t.Errorf("stats %+v", st)
	}
}

// TestAbortFreesKey: a first put that stored nothing leaves no trace: the
// next put of the key is a first put again.
func TestAbortFreesKey(t *testing.T) {
	w := newWindow(t, time.Minute, 10)
	k := Key{Topic: "T", ID: "k"}
	_, tk := begin(t, w, k, 0)
	tk.Abort()
	tk.Commit("late", 0, 1) // after Abort: nothing
	_, tk = begin(t, w, k, 0)
	if tk == nil {
		t.Fatal("an aborted key answered a later put")
	}
	tk.Commit("second", 0, 1)
	if v, _ := begin(t, w, k, 0); v != "second" {
		t.Errorf("got %q, want second", v)
	}
	if len(w.topics) != 1 {
		t.Errorf("%d topics held", len(w.topics))
	}
}

// TestConcurrentDuplicateWaits: a duplicate arriving while the first is
// under way waits for it: it gets the first's value when that commits,
// and becomes the first itself when that aborts. Its context ends the
// wait. Run in a synctest bubble: the waits are seen, never slept on.
func TestConcurrentDuplicateWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWindow(t, time.Minute, 10)
		k := Key{Topic: "T", ID: "k"}
		_, first := begin(t, w, k, 0)

		type got struct {
			v  string
			tk *Ticket[string]
		}
		res := make(chan got, 2)
		for range 2 {
			go func() {
				v, tk, err := w.Begin(context.Background(), k, 0)
				if err != nil {
					t.Error(err)
				}
				res <- got{v, tk}
			}()
		}
		synctest.Wait() // both wait on the first
		if st := w.Stats(0); st.Waits != 2 || st.Pending != 1 {
			t.Fatalf("stats %+v, want 2 waits and 1 pending", st)
		}
		first.Abort()
		synctest.Wait()
		// One became the first put; the other waits on it.
		a := <-res
		if a.tk == nil {
			t.Fatalf("after the abort the woken put got %q and no ticket", a.v)
		}
		select {
		case b := <-res:
			t.Fatalf("two first puts at once: second got %+v", b)
		default:
		}
		a.tk.Commit("from-the-second", 0, 1)
		if b := <-res; b.tk != nil || b.v != "from-the-second" {
			t.Fatalf("the last waiter got %+v", b)
		}

		// A waiter whose context ends gives up with its error.
		k2 := Key{Topic: "T", ID: "k2"}
		_, held := begin(t, w, k2, 0)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, _, err := w.Begin(ctx, k2, 0)
			errc <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
		held.Commit("x", 0, 1)
	})
}

// TestExactlyOneFirst: many goroutines putting the same keys, each first
// put committing or aborting at random: at no time do two first puts of a
// key run, and every put that saw a value saw the one committed.
func TestExactlyOneFirst(t *testing.T) {
	w := newWindow(t, time.Minute, 1000)
	const keys, workers, rounds = 8, 16, 200
	var running [keys]atomic.Int32
	var committed [keys]atomic.Pointer[string]
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range rounds {
				n := (g + i) % keys
				k := Key{Topic: "T", ID: fmt.Sprint(n)}
				v, tk, err := w.Begin(context.Background(), k, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if tk == nil {
					if c := committed[n].Load(); c == nil || *c != v {
						t.Errorf("key %d: duplicate got %q, committed %v", n, v, c)
					}
					continue
				}
				if r := running[n].Add(1); r != 1 {
					t.Errorf("key %d: %d first puts at once", n, r)
				}
				runtime.Gosched()
				running[n].Add(-1)
				if (g+i)%3 == 0 {
					tk.Abort()
					continue
				}
				val := fmt.Sprintf("%d/%d", g, i)
				committed[n].Store(&val)
				tk.Commit(val, 0, 1)
			}
		})
	}
	wg.Wait()
	if st := w.Stats(0); st.Pending != 0 || st.Keys > keys {
		t.Errorf("stats %+v", st)
	}
}

// TestExpiry: a key is remembered until its store time is Window old.
func TestExpiry(t *testing.T) {
	w := newWindow(t, 10*time.Minute, 100)
	k := Key{Topic: "T", ID: "k"}
	_, tk := begin(t, w, k, 0)
	tk.Commit("v", 5*minute, 1) // stored at minute 5
	if v, tk := begin(t, w, k, 15*minute); tk != nil || v != "v" {
		t.Fatalf("at the window's edge: %q, %v", v, tk)
	}
	if _, tk := begin(t, w, k, 15*minute+1); tk == nil {
		t.Fatal("remembered past the window")
	} else {
		tk.Abort()
	}
	if st := w.Stats(15*minute + 1); st.Keys != 0 || st.Messages != 0 || len(w.topics) != 0 {
		t.Errorf("after expiry: %+v, %d topics", st, len(w.topics))
	}
}

// TestBound: past MaxMessages the oldest entries are forgotten, counted
// as evicted; a batch weighs its message count. A client sending fresh
// keys forever holds at most the bound.
func TestBound(t *testing.T) {
	const bound = 100
	w := newWindow(t, time.Hour, bound)
	for i := range 10 * bound {
		_, tk := begin(t, w, Key{Topic: fmt.Sprint("T", i%7), ID: fmt.Sprint(i)}, int64(i))
		if tk == nil {
			t.Fatalf("fresh key %d answered", i)
		}
		tk.Commit("v", int64(i), 1)
		if st := w.Stats(int64(i)); st.Messages > bound {
			t.Fatalf("after %d keys: %d messages held, bound %d", i+1, st.Messages, bound)
		}
	}
	st := w.Stats(10 * bound)
	if st.Keys != bound || st.Evicted != 9*bound || st.Oldest != time.Duration(bound)*time.Millisecond {
		t.Errorf("stats %+v", st)
	}
	if w.fifo.size != bound {
		t.Errorf("queue holds %d, want %d", w.fifo.size, bound)
	}
	// The newest are kept, the oldest gone.
	if v, tk := begin(t, w, Key{Topic: "T" + fmt.Sprint((10*bound-1)%7), ID: fmt.Sprint(10*bound - 1)}, 10*bound); tk != nil || v != "v" {
		t.Error("the newest key was forgotten")
	}
	if _, tk := begin(t, w, Key{Topic: "T0", ID: "0"}, 10*bound); tk == nil {
		t.Error("the oldest key was kept past the bound")
	} else {
		tk.Abort()
	}
	// A batch of 60 pushes out 60 messages' worth.
	_, tk := begin(t, w, Key{Topic: "B", Kind: Batch, ID: "b"}, 10*bound)
	tk.Commit("batch", 10*bound, 60)
	if st := w.Stats(10 * bound); st.Messages > bound || st.Keys != bound-60+1 {
		t.Errorf("after a batch of 60: %+v", st)
	}
}

// TestAddKeepsFirst: rebuilding from the log keeps the first record of a
// key and skips records older than the window; a rebuilt key answers a
// duplicate like a committed one.
func TestAddKeepsFirst(t *testing.T) {
	w := newWindow(t, 10*time.Minute, 100)
	now := 20 * minute
	k := Key{Topic: "T", ID: "k"}
	w.Add(Key{Topic: "T", ID: "old"}, "too old", now-10*minute-1, 1, now)
	w.Add(k, "first", now-time.Minute.Milliseconds(), 1, now)
	w.Add(k, "second", now-1, 1, now)
	if v, tk := begin(t, w, k, now); tk != nil || v != "first" {
		t.Errorf("rebuilt key: %q, %v; want first", v, tk)
	}
	if _, tk := begin(t, w, Key{Topic: "T", ID: "old"}, now); tk == nil {
		t.Error("a record older than the window was remembered")
	} else {
		tk.Abort()
	}
}

// BenchmarkBeginCommit: one fresh key per put, the window at its bound
// (the cost a keyed put pays).
func BenchmarkBeginCommit(b *testing.B) {
	w, _ := New[[6]int64](Options{Window: time.Hour, MaxMessages: 1 << 15})
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = fmt.Sprintf("%032X", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_, tk, _ := w.Begin(context.Background(), Key{Topic: "Topic", ID: ids[i%len(ids)]}, int64(i))
		if tk != nil {
			tk.Commit([6]int64{1, 2, 3}, int64(i), 1)
		}
	}
}

// TestHorizon: the window while nothing was pushed out before its time;
// once the bound pushed entries out, the age of the oldest entry kept (a
// put older than that may be forgotten); the window again once it is
// empty.
func TestHorizon(t *testing.T) {
	const bound = 10
	w := newWindow(t, time.Minute, bound)
	if h := w.Horizon(0); h != time.Minute {
		t.Fatalf("empty: horizon %v, want the window", h)
	}
	for i := range bound {
		_, tk := begin(t, w, Key{Topic: "T", ID: fmt.Sprint(i)}, int64(i))
		tk.Commit("v", int64(i)*1000, 1) // one a second
	}
	if h := w.Horizon(20_000); h != time.Minute {
		t.Fatalf("full, nothing pushed out: horizon %v, want the window", h)
	}
	_, tk := begin(t, w, Key{Topic: "T", ID: "pushes"}, 20_000)
	tk.Commit("v", 20_000, 1) // pushes key 0 (stored at 0 s) out
	if h := w.Horizon(30_000); h != 29*time.Second {
		t.Fatalf("after an eviction: horizon %v, want 29s (key 1, stored at 1 s, is the oldest kept)", h)
	}
	if _, tk := begin(t, w, Key{Topic: "T", ID: "0"}, 30_000); tk == nil {
		t.Fatal("the key pushed out is remembered")
	} else {
		tk.Abort()
	}
	if h := w.Horizon(10 * minute); h != time.Minute {
		t.Fatalf("everything expired: horizon %v, want the window", h)
	}
}

// TestBeginWithin: a put of a key whose first put is under way waits at
// most maxWait (ErrWaitTimeout, nothing taken), and gets the first put's
// value when it commits within it.
func TestBeginWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWindow(t, time.Minute, 10)
		k := Key{Topic: "T", ID: "k"}
		_, first := begin(t, w, k, 0)
		if _, tk, err := w.BeginWithin(context.Background(), k, 0, time.Second); !errors.Is(err, ErrWaitTimeout) || tk != nil {
			t.Fatalf("a wait past maxWait: %v, ticket %v", err, tk)
		}
		got := make(chan string, 1)
		go func() {
			v, _, err := w.BeginWithin(context.Background(), k, 0, time.Second)
			if err != nil {
				v = err.Error()
			}
			got <- v
		}()
		synctest.Wait() // the second put waits
		first.Commit("v", 0, 1)
		if v := <-got; v != "v" {
			t.Fatalf("a wait within maxWait: %q, want the first put's value", v)
		}
	})
}
