package storage

import "github.com/storaged/storaged/storage/internal/base"

// Clock gives the store its time. Tests inject a fake one; the store never
// calls time.Now directly for what it stamps or schedules.
type Clock = base.Clock

// TimerClock is a Clock that can also wake a waiter when it reaches a
// point in its time. The store's background work that waits on the clock
// (the delay scheduler until the next delivery time, the retention and
// disk checks) uses At when Options.Clock implements TimerClock, so a test
// clock fires those waits the moment the test moves it: no real sleeping.
// With any other clock, SystemClock included, the store waits on real
// timers and reads the clock again at least every second, so a wall-clock
// jump delays a wake-up by at most that.
type TimerClock = base.TimerClock

// SystemClock is the wall clock.
var SystemClock = base.SystemClock
