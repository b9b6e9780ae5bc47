package base

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// TestRounds: the loop waits from each round's own clock reading for the
// earliest of the poll, the retry (after a round that says so), the
// round's Wake and its PersistIn; Stop ends it, and its final func runs
// once, after the last round, however often Stop is called.
func TestRounds(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		const poll, retry = 100 * time.Millisecond, time.Second
		start := time.Now()
		// Each round returns the next of these, measured from the time
		// the round ran, and then waits; the want column is when each
		// round runs (the previous one's time plus the wait it asked for).
		steps := []struct {
			wake, persist time.Duration // 0: none
			retry         bool
		}{
			{},                             // 0: poll
			{wake: 30 * time.Millisecond},  // 100 ms: the wake, before the poll
			{wake: 500 * time.Millisecond}, // 130 ms: the poll, before the wake
			{retry: true, wake: 10 * time.Millisecond},                    // 230 ms: a retry, the wake ignored
			{persist: 20 * time.Millisecond},                              // 1230 ms: the persist, before the poll
			{wake: 50 * time.Millisecond, persist: 40 * time.Millisecond}, // 1250 ms: the persist
			{}, // 1290 ms
		}
		want := []int64{0, 100, 130, 230, 1230, 1250, 1290}
		var ran []int64
		stopped := make(chan struct{})
		l := NewRounds()
		final := 0
		l.Start(SystemClock, poll, retry, func() Round {
			now := time.Now()
			n := len(ran)
			ran = append(ran, now.Sub(start).Milliseconds())
			if n == len(steps)-1 {
				close(stopped)
			}
			if n >= len(steps) {
				t.Errorf("round %d ran after its last step", n)
				return Round{At: now}
			}
			s := steps[n]
			r := Round{At: now, Retry: s.retry, PersistIn: s.persist}
			if s.wake > 0 {
				r.Wake = now.Add(s.wake)
			}
			return r
		})
		<-stopped
		l.Stop(func() {
			final++
			if !l.Stopping() {
				t.Error("final ran before Stopping was true")
			}
		})
		l.Stop(func() { final++ })
		if final != 1 {
			t.Errorf("final ran %d times, want once", final)
		}
		if !slices.Equal(ran, want) {
			t.Errorf("rounds ran at %v ms, want %v", ran, want)
		}
	})
}

// TestRoundsStopWithoutStart: Stop (and Halt) of a loop never started
// returns, and still runs final once.
func TestRoundsStopWithoutStart(t *testing.T) {
	l := NewRounds()
	l.Halt()
	final := 0
	l.Stop(func() { final++ })
	l.Stop(func() { final++ })
	if final != 1 {
		t.Errorf("final ran %d times, want once", final)
	}
}
