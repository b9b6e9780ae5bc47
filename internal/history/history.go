// Package history records what clients of a storaged (or a group of them)
// did during a fault scenario and checks it afterwards, after Jepsen and
// the replication design §5.4: every operation is logged as invoke, then
// ok, fail or unknown, with monotonic times; every message carries
// (producer, seq) in its body, so a stored record names the put that wrote
// it. The checkers find lost acks, stored bytes that differ from what was
// acked or between replicas, duplicates nobody can explain,
// non-linearizable reads (porcupine) and runs too idle to mean anything.
package history

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kind is what an operation does.
type Kind uint8

const (
	// Put appends Value to Queue; an ok put learns its queue offset.
	Put Kind = iota + 1
	// Read asks for the message at (Queue, Offset); an ok read learns
	// whether one is there and its value.
	Read
)

func (k Kind) String() string {
	switch k {
	case Put:
		return "put"
	case Read:
		return "read"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Outcome is how an operation ended.
type Outcome uint8

const (
	// Pending: invoked, not finished yet (treated as Unknown by checkers).
	Pending Outcome = iota
	// OK: the server answered success; a put is then acked.
	OK
	// Fail: the server said definitely nothing happened (a put is not
	// stored, and must never be found).
	Fail
	// Unknown: a timeout, a cut connection, a crash: the put may or may
	// not be stored.
	Unknown
)

func (o Outcome) String() string {
	return [...]string{"pending", "ok", "fail", "unknown"}[o]
}

// Op is one operation of the history.
type Op struct {
	ID     int
	Client int // the goroutine that issued it; one op at a time per client
	Kind   Kind
	Queue  int32
	// Value is the message's identity, "producer:seq" (Value of a Put;
	// of a Read, what it found).
	Value string
	// Offset is the queue offset: a Read's request, an ok Put's result.
	Offset int64
	// Found: an ok Read found a message at Offset.
	Found bool
	// Weak marks a Read served by any replica up to its own commit point
	// (a follower read, no ReadIndex): it may be stale, so it is left out
	// of the linearizability check and held to WeakReads' rule instead.
	Weak bool
	// CommitLogOffset is where an ok put's record starts in the commitlog.
	CommitLogOffset int64
	// Attempt counts the sends of the same Value (0 for the first);
	// a retry may store a message twice.
	Attempt int
	Outcome Outcome
	Err     string
	// Call and Return are monotonic nanoseconds since the recorder was
	// made. A Pending op has Return 0.
	Call, Return int64
}

func (o Op) String() string {
	s := fmt.Sprintf("#%d c%d %s q%d", o.ID, o.Client, o.Kind, o.Queue)
	switch o.Kind {
	case Put:
		s += " " + o.Value
		if o.Outcome == OK {
			s += fmt.Sprintf(" -> %d (commitlog %d)", o.Offset, o.CommitLogOffset)
		}
	case Read:
		s += fmt.Sprintf(" @%d", o.Offset)
		if o.Outcome == OK {
			if o.Weak {
				s += " (weak)"
			}
			if o.Found {
				s += " -> " + o.Value
			} else {
				s += " -> absent"
			}
		}
	}
	s += " " + o.Outcome.String()
	if o.Err != "" {
		s += " (" + o.Err + ")"
	}
	return s
}

// Value makes the identity of a producer's seq-th message.
func Value(producer, seq int) string { return strconv.Itoa(producer) + ":" + strconv.Itoa(seq) }

// Body is a message body carrying value, padded to about size bytes so
// that records have realistic sizes; ValueOf gets the value back.
func Body(value string, size int) []byte {
	b := make([]byte, 0, max(size, len(value)+1))
	b = append(b, value...)
	b = append(b, '|')
	for len(b) < size {
		b = append(b, 'x')
	}
	return b
}

// ValueOf is the value a Body carries ("" if body is not one).
func ValueOf(body []byte) string {
	s, _, ok := strings.Cut(string(body), "|")
	if !ok {
		return ""
	}
	return s
}

// Recorder collects a history from concurrent clients.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder starts the clock of a history.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the monotonic time of the history.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Invoke logs the start of op (its ID, Call and Outcome are set here) and
// returns its ID for Finish.
func (r *Recorder) Invoke(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	op.Call = r.Now()
	op.Outcome, op.Return = Pending, 0
	r.ops = append(r.ops, op)
	return op.ID
}

// Finish logs the end of operation id; update fills in what was learned
// (Outcome, Offset, Value, Found, Err) on the recorded copy.
func (r *Recorder) Finish(id int, update func(*Op)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[id]
	update(op)
	op.Return = r.Now()
}

// Ops returns a copy of the history so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}
