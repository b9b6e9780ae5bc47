// Package logthrottle is the one rule for logging an error that repeats:
// the first occurrence of a key is logged at once, later ones at most once
// per interval, and the line that ends a quiet spell carries how many were
// left out ("suppressed"). A full disk refuses every put and fails every
// background write; logged line by line that was ≈ 26,700 error lines in
// 6 s, drowning the one line that said why.
//
// Keys name the condition, not the occurrence (a message or a source such
// as "checkpoint", never an offset), so the number of keys stays small;
// the table is still bounded (maxKeys): past it, the oldest quiet keys are
// dropped, which at worst logs a line that would have been suppressed.
package logthrottle

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultInterval is the least time between two lines of one key.
const DefaultInterval = 10 * time.Second

// maxKeys bounds the table: keys come from code, not from requests, but a
// key built from an error reason must still not grow it without limit.
const maxKeys = 1024

// SuppressedKey is the field of a logged line that counts the occurrences
// of its key left out since the previous line.
const SuppressedKey = "suppressed"

// Throttle decides which occurrences of a repeating condition are logged.
// The zero value is not usable; call New. Safe for concurrent use.
type Throttle struct {
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*entry // guarded by mu
}

type entry struct {
	last       time.Time // when the key was last logged
	suppressed uint64    // occurrences since then that were not
}

// New returns a Throttle that logs each key at most once per interval
// (DefaultInterval if interval <= 0), reading time from now (time.Now if
// nil; tests inject theirs).
func New(interval time.Duration, now func() time.Time) *Throttle {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if now == nil {
		now = time.Now
	}
	return &Throttle{interval: interval, now: now, keys: map[string]*entry{}}
}

// Allow records one occurrence of key. It reports whether to log it and,
// if so, how many occurrences since the last logged one were suppressed.
func (t *Throttle) Allow(key string) (ok bool, suppressed uint64) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.keys[key]
	if e == nil {
		if len(t.keys) >= maxKeys {
			t.pruneLocked(now)
		}
		t.keys[key] = &entry{last: now}
		return true, 0
	}
	if now.Sub(e.last) < t.interval && !now.Before(e.last) {
		e.suppressed++
		return false, 0
	}
	// The interval has passed (or the clock was set back: log rather than
	// stay silent until it catches up).
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return true, n
}

// Event passes ev through when key may be logged now, with the suppressed
// count added as a field when it is not zero; otherwise it discards ev and
// returns nil, on which every zerolog method is a no-op. Use it as
//
//	t.Event("checkpoint", log.Error()).Err(err).Msg("checkpoint write failed")
func (t *Throttle) Event(key string, ev *zerolog.Event) *zerolog.Event {
	if ev == nil { // level disabled: do not count what is not logged anyway
		return nil
	}
	ok, n := t.Allow(key)
	if !ok {
		return ev.Discard()
	}
	if n > 0 {
		ev = ev.Uint64(SuppressedKey, n)
	}
	return ev
}

// pruneLocked drops every key quiet for an interval or more, and if that
// frees nothing, the whole table. REQUIRES: t.mu held.
func (t *Throttle) pruneLocked(now time.Time) {
	for k, e := range t.keys {
		if now.Sub(e.last) >= t.interval {
			delete(t.keys, k)
		}
	}
	if len(t.keys) >= maxKeys {
		clear(t.keys)
	}
}
