package flush

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// closedLoop models the callers of a sync-mode store: writers that each
// have one put in flight and, once acked, need `cpu` of a shared core
// (taken in turn: on a busy machine the returns of a group queue for the
// same cores) and then `rtt` before their next Wait. It runs rounds puts
// per writer inside a synctest bubble (fake time) and returns the group
// commit's stats. leave, if > 0, is how many writers stop after round
// leaveAfter.
type closedLoop struct {
	sync, cpu, rtt    time.Duration
	writers, rounds   int
	leave, leaveAfter int
}

func (c closedLoop) run(t *testing.T) (GroupCommitStats, time.Duration) {
	t.Helper()
	var st GroupCommitStats
	var elapsed time.Duration
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), delay: c.sync}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Minute})
		core := make(chan struct{}, 1)
		done := make(chan struct{})
		for i := range c.writers {
			go func() {
				defer func() { done <- struct{}{} }()
				for r := range c.rounds {
					if i < c.leave && r == c.leaveAfter {
						return
					}
					end := fs.append(1)
					if err := g.Wait(context.Background(), end); err != nil {
						t.Errorf("wait: %v", err)
						return
					}
					if d := fs.durable.Load(); d < end {
						t.Errorf("acked offset %d while only %d was synced", end, d)
						return
					}
					core <- struct{}{}
					time.Sleep(c.cpu)
					<-core
					time.Sleep(c.rtt)
				}
			}()
		}
		for range c.writers {
			<-done
		}
		elapsed = time.Since(fs.start)
		st = g.Stats()
		if calls := fs.numCalls(); st.Syncs != int64(calls) {
			t.Errorf("Stats().Syncs = %d, the syncer saw %d", st.Syncs, calls)
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	})
	return st, elapsed
}

// TestGroupCommitGatherKeepsReturningGroup: 16 writers whose group comes
// back within one sync (0.1 ms + 16 x 30 µs = 0.58 ms against a 0.6 ms
// sync) share every sync. Waiting only half a sync (the policy before)
// split them into two cohorts: 10.8 puts per sync, 74 syncs for these 50
// rounds.
func TestGroupCommitGatherKeepsReturningGroup(t *testing.T) {
	c := closedLoop{sync: 600 * time.Microsecond, cpu: 30 * time.Microsecond, rtt: 100 * time.Microsecond, writers: 16, rounds: 50}
	st, _ := c.run(t)
	if st.Released != int64(c.writers*c.rounds) {
		t.Fatalf("released %d, want %d", st.Released, c.writers*c.rounds)
	}
	if max := int64(c.rounds + c.rounds/10); st.Syncs > max {
		t.Fatalf("%d syncs for %d rounds of %d writers (%.1f puts per sync): the group split; stats %+v",
			st.Syncs, c.rounds, c.writers, float64(st.Released)/float64(st.Syncs), st)
	}
	if st.GaveUp > 2 {
		t.Fatalf("%d gathers gave up on a group that always comes back in time: %+v", st.GaveUp, st)
	}
}

// TestGroupCommitGatherBacksOffForSlowGroup: when the group needs longer
// than a sync to come back (16 x 60 µs + 0.1 ms = 1.06 ms against 0.6 ms),
// a whole-sync wait that runs out is not repeated every round: the loop
// waits only half a sync for 1, 2, 4 … 16 rounds before it tries again.
func TestGroupCommitGatherBacksOffForSlowGroup(t *testing.T) {
	c := closedLoop{sync: 600 * time.Microsecond, cpu: 60 * time.Microsecond, rtt: 100 * time.Microsecond, writers: 16, rounds: 100}
	st, _ := c.run(t)
	if st.GaveUp == 0 {
		t.Fatalf("no gather gave up on a group that cannot come back within a sync: %+v", st)
	}
	if st.GaveUp*6 > st.Syncs {
		t.Fatalf("%d of %d rounds paid a whole-sync wait that ran out: no backoff; %+v", st.GaveUp, st.Syncs, st)
	}
	if st.Short == 0 {
		t.Fatalf("no half-sync waits after the whole-sync ones ran out: %+v", st)
	}
}

// TestGroupCommitGatherShrinkingGroup: when half the writers stop, the
// next gather waits for them once, gives up, and the group after that is
// the half that is left, gathered whole again.
func TestGroupCommitGatherShrinkingGroup(t *testing.T) {
	c := closedLoop{sync: 600 * time.Microsecond, cpu: 20 * time.Microsecond, rtt: 100 * time.Microsecond,
		writers: 16, rounds: 40, leave: 8, leaveAfter: 10}
	st, _ := c.run(t)
	if st.GaveUp > 3 {
		t.Fatalf("%d gathers gave up; want about one, for the writers that left: %+v", st.GaveUp, st)
	}
	if st.Gathered < int64(c.rounds-15) {
		t.Fatalf("only %d gathers saw their whole group in %d rounds: %+v", st.Gathered, c.rounds, st)
	}
}

// TestGroupCommitCloseDuringGather: Close does not wait for a gather to
// run out; the final sync answers the waiter the gather was holding.
func TestGroupCommitCloseDuringGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeSyncer{start: time.Now(), delay: time.Second}
		g := NewGroupCommit(fs, GroupCommitOptions{Timeout: time.Hour})
		errc := make(chan error, 8)
		wait := func() error {
			err := g.Wait(context.Background(), fs.append(1))
			errc <- err
			return err
		}
		// Round 1 syncs a alone; b and c queue meanwhile, so round 2
		// expects a, b and c, and a comes back at once: round 2 has all
		// three, and round 3 expects three again.
		go func() {
			if wait() == nil {
				wait()
			}
		}()
		synctest.Wait()
		held := make(chan struct{})
		go func() {
			if wait() == nil {
				close(held)
				wait() // only b comes back: the gather holds it
			}
		}()
		go func() { wait() }()
		<-held
		synctest.Wait()
		for range 4 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		if n := fs.numCalls(); n != 2 {
			t.Fatalf("%d syncs before Close, want 2 (round 3 is gathering)", n)
		}
		start := time.Now()
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("waiter held by the gather: %v, want nil (the final sync covers it)", err)
		}
		// Close took the final sync's second, not the gather's wait too.
		if el := time.Since(start); el != time.Second {
			t.Fatalf("Close took %v, want the final sync's 1s", el)
		}
		if st := g.Stats(); st.Syncs != 3 || st.Gathered != 1 || st.GaveUp != 0 {
			t.Fatalf("stats %+v, want 3 syncs, 1 gather complete (round 2), none given up", st)
		}
		if err := g.Wait(context.Background(), fs.append(1)); !errors.Is(err, ErrClosed) {
			t.Fatalf("wait after close: %v", err)
		}
	})
}
