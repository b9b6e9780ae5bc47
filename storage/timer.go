package storage

import "time"

// TimerClock is a Clock that can also wake a waiter when it reaches a
// point in its time. The store's background work that waits on the clock
// (the delay scheduler until the next delivery time, the retention and
// disk checks) uses At when Options.Clock implements TimerClock, so a test
// clock fires those waits the moment the test moves it: no real sleeping.
// With any other clock, SystemClock included, the store waits on real
// timers and reads the clock again at least every clockPoll, so a wall-clock
// jump delays a wake-up by at most that.
type TimerClock interface {
	Clock
	// At returns a channel that is closed once Now() is at or after t (at
	// once if it already is).
	At(t time.Time) <-chan struct{}
}

// clockPoll bounds a real-timer wait on a clock that is not a TimerClock.
const clockPoll = time.Second

// clockWait returns a channel that is closed when clock c reaches t, and a
// func that releases the wait. For a clock that is not a TimerClock the
// channel may close early (after at most clockPoll): the caller re-reads
// the clock and decides again.
func clockWait(c Clock, t time.Time) (<-chan struct{}, func()) {
	if tc, ok := c.(TimerClock); ok {
		return tc.At(t), func() {}
	}
	d := min(max(t.Sub(c.Now()), 0), clockPoll)
	ch := make(chan struct{})
	tm := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { tm.Stop() }
}
