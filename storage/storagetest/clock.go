// Package storagetest holds helpers for tests of code built on the storage
// package.
package storagetest

import (
	"sync"
	"testing"
	"time"
)

// Clock is a fake storage.TimerClock: Set and Advance move its time and
// close the channel of every At they pass, so the store's background waits
// (delayed delivery, retention) follow the test's time without sleeping.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	alarms  []alarm
	changed chan struct{} // closed and replaced when a wait is added
}

type alarm struct {
	at time.Time
	ch chan struct{}
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t, changed: make(chan struct{})} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// At returns a channel closed once the clock reaches t.
func (c *Clock) At(t time.Time) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if !c.now.Before(t) {
		close(ch)
		return ch
	}
	c.alarms = append(c.alarms, alarm{t, ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Set moves the clock to t and fires the waits it reaches.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	keep := c.alarms[:0]
	for _, a := range c.alarms {
		if !t.Before(a.at) {
			close(a.ch)
		} else {
			keep = append(keep, a)
		}
	}
	c.alarms = keep
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Pending is the number of waits not yet fired.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.alarms)
}

// AdvanceUntil moves the clock forward by d, again each time a wait is
// added, until done is closed (at most 10 s, then the test fails). One
// Advance after WaitPending can be missed when another goroutine's wait
// was the pending one: the goroutine the test waits for then arms its
// wait after the Advance, and nothing fires it.
func (c *Clock) AdvanceUntil(t testing.TB, d time.Duration, done <-chan struct{}, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		added := c.changed
		c.mu.Unlock()
		c.Advance(d)
		select {
		case <-done:
			return
		case <-added:
		case <-deadline.C:
			t.Fatalf("%s: not after 10s of advancing the fake clock", what)
		}
	}
}

// WaitPending returns once at least n waits are pending: the background
// goroutines have gone back to waiting on the clock.
func (c *Clock) WaitPending(t testing.TB, n int) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got, ch := len(c.alarms), c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%d waits pending on the fake clock after 10s, want %d", c.Pending(), n)
		}
	}
}
