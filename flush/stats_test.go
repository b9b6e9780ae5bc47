package flush

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestGroupCommitStatsCountBeforeAnswer: every successful Wait is counted
// in Stats (Released, or AtOnce when a sync had already covered it) before
// the waiter hears its answer, so a caller that has its answer always
// finds itself counted; the server's metrics test relies on it
// (storaged_group_commit_waiters_total + _already_durable_total = puts
// acked).
func TestGroupCommitStatsCountBeforeAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), delay: 100 * time.Microsecond}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Second})
		defer g.Close()
		if err := g.Wait(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		if st := g.Stats(); st.AtOnce != 1 || st.Released != 0 || st.Syncs != 0 {
			t.Fatalf("after a wait for offset 0: %+v, want AtOnce 1 and nothing else", st)
		}
		const waiters, each = 32, 10
		var done atomic.Int64
		done.Store(1)
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				for range each {
					end := fs.append(100)
					if err := g.Wait(context.Background(), end); err != nil {
						t.Errorf("wait: %v", err)
						return
					}
					n := done.Add(1)
					if st := g.Stats(); st.Released+st.AtOnce < n {
						t.Errorf("%d waits answered, Stats counts %d released + %d at once", n, st.Released, st.AtOnce)
					}
				}
			})
		}
		wg.Wait()
		st := g.Stats()
		if st.Released+st.AtOnce != waiters*each+1 {
			t.Errorf("Stats %+v: released + at once = %d, want %d", st, st.Released+st.AtOnce, waiters*each+1)
		}
		if st.Syncs < 1 || st.Syncs > int64(fs.numCalls()) {
			t.Errorf("Stats.Syncs %d, the syncer saw %d calls", st.Syncs, fs.numCalls())
		}
	})
}
