// Package dedup remembers, for a bounded time and a bounded number of
// messages, what each put carrying a client key (RocketMQ's UNIQ_KEY
// property) was answered, so that a put re-sent by a retrying client or
// proxy gets the first put's answer instead of being stored twice.
//
// A Window is keyed by topic, kind and key: the same key on two topics
// names two messages. The first put of a key takes a Ticket (Begin) and
// resolves it: Commit once the message is in the log, with what the put
// answered; Abort when nothing was stored, so a failed put never poisons
// the key. A put of the same key while the first is still running waits
// for its outcome. A key is remembered until its store time is Window old,
// or until the newest MaxMessages messages no longer include it (the bound
// on memory: a client sending fresh keys forever pushes the oldest out),
// whichever comes first.
//
// The window holds no state of its own that the log lacks: at start the
// store rebuilds it from the records of the log within the window (Add),
// so a put answered before a crash is still recognised after it.
//
// The package knows nothing of records or of gRPC: V is whatever the
// caller answers a duplicate with.
package dedup

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// Kind separates puts whose answers differ in shape, so that one key used
// for two kinds never answers one with the other's result.
type Kind uint8

const (
	// Single is a single message stored on its topic (PutMessage, a
	// PutMessageStream message, a one-message batch).
	Single Kind = iota
	// Delayed is a single message with a delay level, stored on the
	// schedule topic; its Key.Topic is the topic it is delivered to.
	Delayed
	// Batch is a batch of two or more messages, keyed by its first
	// message's key.
	Batch
	// Timer is a single message with a timer property (a delivery time)
	// and no delay level; its Key.Topic is the topic it is delivered to.
	Timer

	numKinds
)

// Key identifies a put.
type Key struct {
	Topic string
	Kind  Kind
	ID    string // the client's key (UNIQ_KEY)
}

// Options bound a Window.
type Options struct {
	// Window is how long after its store time a key is remembered.
	Window time.Duration
	// MaxMessages bounds the messages remembered: an entry weighs its
	// message count (a batch of n weighs n). Past the bound the oldest
	// entries are forgotten first.
	MaxMessages int
}

// ErrOptions is returned by New for a non-positive window or bound.
var ErrOptions = errors.New("dedup: window and bound must be positive")

// Stats is a snapshot of a Window.
type Stats struct {
	Keys     int // entries remembered (committed)
	Messages int // their summed weight
	Pending  int // first puts under way
	// Hits counts puts answered from the window; Waits those that waited
	// for a first put still under way (each also a hit or, after an
	// abort, a first put itself).
	Hits, Waits uint64
	// Evicted counts entries forgotten for the bound before their window
	// had passed: while it grows, the effective window is shorter than
	// Options.Window (see Oldest).
	Evicted uint64
	// Oldest is the age of the oldest entry remembered (0 when empty): the
	// effective window.
	Oldest time.Duration
}

// Window is the set of remembered puts. It is safe for concurrent use.
type Window[V any] struct {
	window int64 // ms
	max    int

	mu      sync.Mutex
	topics  map[string]*topicKeys[V] // guarded by mu
	fifo    ring[V]                  // committed entries in commit order; guarded by mu
	keys    int                      // committed entries; guarded by mu
	weight  int                      // their summed weight; guarded by mu
	pending int                      // guarded by mu
	hits    uint64                   // guarded by mu
	waits   uint64                   // guarded by mu
	evicted uint64                   // guarded by mu
}

// topicKeys holds one topic's entries, a map per kind (string keys hash
// fastest); it is dropped with its last entry, so the topics a window
// holds are the topics of its entries.
type topicKeys[V any] struct {
	name    string
	keys    [numKinds]map[string]*entry[V]
	n       int  // entries in keys
	dropped bool // taken out of Window.topics
}

func (tk *topicKeys[V]) get(kind Kind, id string) *entry[V] { return tk.keys[kind][id] }

func (tk *topicKeys[V]) put(e *entry[V]) {
	if tk.keys[e.kind] == nil {
		tk.keys[e.kind] = map[string]*entry[V]{}
	}
	tk.keys[e.kind][e.id] = e
	tk.n++
}

type state uint8

const (
	pending state = iota
	committed
	removed
)

type entry[V any] struct {
	tk        *topicKeys[V]
	id        string
	kind      Kind
	state     state
	weight    int32
	storeTime int64 // Unix ms; committed only
	val       V     // committed only
	// done is made by the first put that waits on a pending entry and
	// closed when the entry is resolved; nil while nobody waits.
	done chan struct{}
}

// New returns an empty window.
func New[V any](o Options) (*Window[V], error) {
	if o.Window <= 0 || o.MaxMessages <= 0 {
		return nil, ErrOptions
	}
	return &Window[V]{window: o.Window.Milliseconds(), max: o.MaxMessages, topics: map[string]*topicKeys[V]{}}, nil
}

// Ticket is the right and duty to resolve a first put: Commit or Abort,
// exactly once (later calls do nothing, so `defer t.Abort()` after the
// put is safe).
type Ticket[V any] struct {
	w *Window[V]
	e *entry[V]
}

// Begin looks k up at time now (Unix ms). If a put of k was committed
// within the window, it returns that put's value and a nil Ticket: answer
// it. If none is remembered, it returns a Ticket: the caller is the first
// put and must resolve it. If a first put of k is under way, Begin waits
// for its outcome (or for ctx, whose error it returns).
func (w *Window[V]) Begin(ctx context.Context, k Key, now int64) (V, *Ticket[V], error) {
	return w.BeginWithin(ctx, k, now, 0)
}

// ErrWaitTimeout: BeginWithin waited maxWait for a first put still under
// way.
var ErrWaitTimeout = errors.New("dedup: the first put of this key is still under way")

// BeginWithin is Begin that waits at most maxWait (0: no bound but ctx)
// for a first put under way, then returns ErrWaitTimeout. The timer is
// made only when it waits: a put that does not wait allocates nothing
// for the bound.
func (w *Window[V]) BeginWithin(ctx context.Context, k Key, now int64, maxWait time.Duration) (V, *Ticket[V], error) {
	var zero V
	var bound <-chan time.Time
	if k.Kind >= numKinds {
		k.Kind = Single
	}
	for {
		w.mu.Lock()
		w.expireLocked(now)
		tk := w.topics[k.Topic]
		var e *entry[V]
		if tk != nil {
			e = tk.get(k.Kind, k.ID)
		}
		if e != nil && e.state == committed && e.storeTime < now-w.window {
			w.removeLocked(e) // expired, not yet at the front of the queue
			e = nil
		}
		switch {
		case e == nil:
			if tk == nil {
				tk = &topicKeys[V]{name: strings.Clone(k.Topic)}
				w.topics[tk.name] = tk
			}
			e = &entry[V]{tk: tk, id: strings.Clone(k.ID), kind: k.Kind}
			tk.put(e)
			w.pending++
			w.mu.Unlock()
			return zero, &Ticket[V]{w: w, e: e}, nil
		case e.state == committed:
			w.hits++
			v := e.val
			w.mu.Unlock()
			return v, nil, nil
		}
		if e.done == nil {
			e.done = make(chan struct{})
		}
		done := e.done
		w.waits++
		w.mu.Unlock()
		if bound == nil && maxWait > 0 {
			t := time.NewTimer(maxWait)
			defer t.Stop()
			bound = t.C
		}
		select {
		case <-done: // committed (a hit next round) or aborted (first next round)
		case <-ctx.Done():
			return zero, nil, ctx.Err()
		case <-bound:
			return zero, nil, ErrWaitTimeout
		}
	}
}

// Commit resolves the first put: v is what it answered, storeTime (Unix
// ms) when the log stamped it, weight its message count. Puts waiting on
// it, and later ones within the window, get v.
func (t *Ticket[V]) Commit(v V, storeTime int64, weight int) {
	w, e := t.w, t.e
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.state != pending {
		return
	}
	w.pending--
	e.state, e.val, e.storeTime, e.weight = committed, v, storeTime, int32(max(weight, 1))
	w.fifo.push(e)
	w.keys++
	w.weight += int(e.weight)
	w.evictLocked()
	if e.done != nil {
		close(e.done)
	}
}

// Abort resolves the first put as "nothing stored": the key is free again,
// and one of the puts waiting on it becomes the first.
func (t *Ticket[V]) Abort() {
	w, e := t.w, t.e
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.state != pending {
		return
	}
	w.pending--
	w.removeLocked(e)
	if e.done != nil {
		close(e.done)
	}
}

// Add remembers a put found in the log, at time now (Unix ms): the store
// rebuilding the window at start, oldest record first. It keeps the entry
// already there for k (the first put of a key is the one retries get) and
// ignores a put older than the window. The window keeps k's strings (Begin
// copies them; Add's caller has just made them).
func (w *Window[V]) Add(k Key, v V, storeTime int64, weight int, now int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if storeTime < now-w.window {
		return
	}
	if k.Kind >= numKinds {
		k.Kind = Single
	}
	tk := w.topics[k.Topic]
	if tk != nil && tk.get(k.Kind, k.ID) != nil {
		return
	}
	if tk == nil {
		tk = &topicKeys[V]{name: k.Topic}
		w.topics[tk.name] = tk
	}
	e := &entry[V]{tk: tk, id: k.ID, kind: k.Kind, state: committed, weight: int32(max(weight, 1)),
		storeTime: storeTime, val: v}
	tk.put(e)
	w.fifo.push(e)
	w.keys++
	w.weight += int(e.weight)
	w.evictLocked()
}

// Stats returns a snapshot at time now (Unix ms).
func (w *Window[V]) Stats(now int64) Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(now)
	st := Stats{Keys: w.keys, Messages: w.weight, Pending: w.pending, Hits: w.hits, Waits: w.waits, Evicted: w.evicted}
	if e := w.fifo.front(); e != nil {
		st.Oldest = time.Duration(max(now-e.storeTime, 0)) * time.Millisecond
	}
	return st
}

// Horizon is how far back, at time now (Unix ms), a put is surely
// remembered: the window, or, once the bound has pushed entries out before
// their time, the age of the oldest entry kept (younger than the window:
// what was older may have been pushed out). A client may retry a put
// whose outcome it does not know within it.
func (w *Window[V]) Horizon(now int64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(now)
	h := w.window
	if e := w.fifo.front(); e != nil && w.evicted > 0 {
		h = min(h, max(now-e.storeTime, 0))
	}
	return time.Duration(h) * time.Millisecond
}

// expireLocked forgets the entries at the front of the queue that are
// older than the window. REQUIRES: w.mu held.
func (w *Window[V]) expireLocked(now int64) {
	for e := w.fifo.front(); e != nil && e.storeTime < now-w.window; e = w.fifo.front() {
		w.fifo.pop()
		w.removeLocked(e)
	}
}

// evictLocked forgets the oldest entries while the bound is exceeded.
// REQUIRES: w.mu held.
func (w *Window[V]) evictLocked() {
	for w.weight > w.max {
		e := w.fifo.pop()
		if e == nil {
			return
		}
		if e.state == committed {
			w.evicted++
		}
		w.removeLocked(e)
	}
}

// removeLocked takes e out of its topic's map (and drops the topic's map
// with its last entry). An entry still queued in the fifo is skipped when
// it reaches the front. REQUIRES: w.mu held.
func (w *Window[V]) removeLocked(e *entry[V]) {
	if e.state == removed {
		return
	}
	if e.state == committed {
		w.keys--
		w.weight -= int(e.weight)
	}
	e.state = removed
	tk := e.tk
	delete(tk.keys[e.kind], e.id)
	if tk.n--; tk.n == 0 && !tk.dropped {
		delete(w.topics, tk.name)
		tk.dropped = true
	}
	var zero V
	e.val = zero
}

// ring is a FIFO of entries on a growable circular buffer. Removed entries
// stay queued until they reach the front, where front and pop skip them.
type ring[V any] struct {
	buf        []*entry[V]
	head, size int
}

func (r *ring[V]) push(e *entry[V]) {
	if r.size == len(r.buf) {
		n := make([]*entry[V], max(2*len(r.buf), 64))
		for i := range r.size {
			n[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = n, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = e
	r.size++
}

// front returns the oldest entry still remembered, or nil.
func (r *ring[V]) front() *entry[V] {
	for r.size > 0 {
		if e := r.buf[r.head]; e.state == committed {
			return e
		}
		r.drop()
	}
	return nil
}

// pop removes and returns the oldest entry still remembered, or nil.
func (r *ring[V]) pop() *entry[V] {
	e := r.front()
	if e != nil {
		r.drop()
	}
	return e
}

func (r *ring[V]) drop() {
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	if r.size == 0 && len(r.buf) > 1024 {
		r.buf, r.head = nil, 0 // give a drained burst's buffer back
	}
}
