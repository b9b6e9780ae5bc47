package server

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
)

// DefaultMaxPullInflightBytes bounds the bytes of read answers (PullMessages
// and GetMessage) the server holds at once: read from the store and not yet
// written to the connection. 256 MiB is sixteen maximal pulls (MaxPullBytes,
// 16 MiB) or 256 default ones (DefaultPullBytes) at a time. An answer is
// held once (the records' bytes, copied out of the mapping; marshalling
// references them, see marshalRead), so the live heap of reads stays near
// the bound and, with Go's heap growth between collections, the process
// well inside the 2 GiB of deploy/kubernetes (GOMEMLIMIT 1536 MiB), where
// 32 unbounded maximal pulls took 4.7 GB.
const DefaultMaxPullInflightBytes = 256 << 20

// ErrReadBusy refuses a read while the answers in flight already hold the
// limit (WithMaxPullInflightBytes). Nothing was read; a retry after a short
// delay usually passes, since answers are released as they are sent.
var ErrReadBusy = errors.New("server: in-flight read bytes limit reached")

// busyError is ErrReadBusy with the figures the client is told.
type busyError struct {
	want, limit int64
}

func (e *busyError) Error() string {
	return fmt.Sprintf("server: a read of up to %d bytes does not fit the in-flight read limit of %d bytes", e.want, e.limit)
}

func (e *busyError) Unwrap() error { return ErrReadBusy }

// inflight counts the bytes of read answers in flight against a limit.
// A read reserves what its answer may take before it reads (a pull its
// max_bytes, GetMessage the largest record), shrinks the reservation to
// what it read, and the reservation is released once the answer's last
// byte has been handed to the connection: by the codec (see
// codec.Marshal) when the service runs behind NewGRPCServer, else
// when the handler returns.
type inflight struct {
	limit int64

	mu      sync.Mutex
	used    int64
	pending map[proto.Message]*reservation // answers returned by a handler, not yet marshalled
	watch   chan struct{}                  // closed at the next change of used, when someone waits (tests)

	// viaCodec is set by NewGRPCServer: its codec takes each answer's
	// reservation and releases it after the send. Without it the handler
	// releases on return.
	viaCodec bool
}

func newInflight(limit int64) *inflight {
	return &inflight{limit: limit, pending: map[proto.Message]*reservation{}}
}

// reservation is some bytes of the limit held by one read.
type reservation struct {
	in   *inflight
	n    int64
	once sync.Once
}

// reserve takes n bytes of the limit, or fails with a busyError when they
// do not fit. A read larger than the whole limit is admitted when nothing
// else is in flight, so that a limit below MaxPullBytes slows big pulls
// down instead of refusing them forever.
func (in *inflight) reserve(n int64) (*reservation, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.used+n > in.limit && in.used > 0 {
		return nil, &busyError{want: n, limit: in.limit}
	}
	in.used += n
	in.notifyLocked()
	return &reservation{in: in, n: n}, nil
}

// force takes n bytes whether or not they fit: for bytes already read.
func (in *inflight) force(n int64) *reservation {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.used += n
	in.notifyLocked()
	return &reservation{in: in, n: n}
}

// inUse returns the bytes reserved now.
func (in *inflight) inUse() int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.used
}

// changed returns the bytes reserved now and a channel closed when that
// changes.
func (in *inflight) changed() (int64, <-chan struct{}) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.watch == nil {
		in.watch = make(chan struct{})
	}
	return in.used, in.watch
}

// notifyLocked wakes the waiters of changed. REQUIRES: in.mu held.
func (in *inflight) notifyLocked() {
	if in.watch != nil {
		close(in.watch)
		in.watch = nil
	}
}

// shrink gives back what the read did not use: the reservation becomes n
// when n is smaller.
func (r *reservation) shrink(n int64) {
	r.in.mu.Lock()
	defer r.in.mu.Unlock()
	if n < r.n {
		r.in.used -= r.n - n
		r.n = n
		r.in.notifyLocked()
	}
}

// release gives the reservation back; later calls do nothing.
func (r *reservation) release() {
	r.once.Do(func() {
		r.in.mu.Lock()
		r.in.used -= r.n
		r.in.notifyLocked()
		r.in.mu.Unlock()
	})
}

// merge moves o's bytes into r: one reservation for one answer.
func (r *reservation) merge(o *reservation) {
	r.in.mu.Lock()
	defer r.in.mu.Unlock()
	r.n += o.n
	o.n = 0
}

// hold ties r to the answer resp: the codec releases it after sending
// resp. It returns what the handler must defer: nothing when the codec
// will see resp, r.release otherwise.
func (in *inflight) hold(resp proto.Message, r *reservation) func() {
	if !in.viaCodec {
		return r.release
	}
	in.mu.Lock()
	in.pending[resp] = r
	in.mu.Unlock()
	return func() {}
}

// take returns the reservation held for resp and forgets it, or nil.
func (in *inflight) take(resp proto.Message) *reservation {
	in.mu.Lock()
	defer in.mu.Unlock()
	r := in.pending[resp]
	if r != nil {
		delete(in.pending, resp)
	}
	return r
}
