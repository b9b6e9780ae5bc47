package consumequeue

import (
	"sync"
	"sync/atomic"
)

// queueNotifier wakes the long polls waiting on a topic-queue when a
// dispatch round advances that queue, and no other poll (RocketMQ's
// PullRequestHoldService keys its held requests by topic@queueId the same
// way). A poll registers before it looks at the queue, so an entry
// dispatched between its look and its wait still wakes it.
//
// It has its own lock and is keyed by topic-queue, not by consume queue:
// a poll may wait on a queue that does not exist yet, and nothing is
// created for it but the registration, which lives only while the poll
// waits (so the number of entries is bounded by the number of waiting
// polls, whatever queue ids requests name).
//
// When nobody waits it costs the dispatcher one atomic load per round.
type queueNotifier struct {
	// waiting counts registered waits; the dispatcher collects the queues
	// a round advanced only when it is not zero.
	waiting atomic.Int64
	// woken counts the polls a signal woke (tests read it).
	woken atomic.Uint64

	mu    sync.Mutex
	waits map[Key]*queueWait // guarded by mu
}

// queueWait is one channel shared by the polls waiting on a queue: closed
// and forgotten at the queue's next advance.
type queueWait struct {
	ch chan struct{}
	n  int // polls registered on ch; guarded by queueNotifier.mu
}

func newQueueNotifier() *queueNotifier {
	return &queueNotifier{waits: map[Key]*queueWait{}}
}

// wait registers a wait on k and returns a channel closed at k's next
// advance, and a func that ends the registration (call it once, whether
// or not the channel closed).
func (n *queueNotifier) wait(k Key) (<-chan struct{}, func()) {
	n.mu.Lock()
	w := n.waits[k]
	if w == nil {
		w = &queueWait{ch: make(chan struct{})}
		n.waits[k] = w
	}
	w.n++
	n.waiting.Add(1)
	n.mu.Unlock()
	return w.ch, func() {
		n.mu.Lock()
		w.n--
		if w.n == 0 && n.waits[k] == w {
			delete(n.waits, k)
		}
		n.waiting.Add(-1)
		n.mu.Unlock()
	}
}

// active reports whether any poll waits: the dispatcher collects the
// queues a round advances only then.
func (n *queueNotifier) active() bool { return n.waiting.Load() > 0 }

// signal wakes the polls waiting on each of keys. REQUIRES: the entries
// the keys stand for are published (their queue's count stored).
func (n *queueNotifier) signal(keys []Key) {
	if len(keys) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range keys {
		if w := n.waits[k]; w != nil {
			close(w.ch)
			delete(n.waits, k)
			n.woken.Add(uint64(w.n))
		}
	}
}

// signalAll wakes every waiting poll (a round advanced more queues than
// it kept track of).
func (n *queueNotifier) signalAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, w := range n.waits {
		close(w.ch)
		delete(n.waits, k)
		n.woken.Add(uint64(w.n))
	}
}
