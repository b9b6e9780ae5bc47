package server

import (
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/storaged/storaged/storage"
)

// A PutMessageStream ends itself before its connection's age limit does.
//
// grpc-go enforces keepalive.ServerParameters.MaxConnectionAge (GRPCConfig)
// per connection: at the age, plus a random jitter of up to ±10%, it sends
// GOAWAY, and MaxConnectionAgeGrace later it closes the connection with
// whatever streams are still open. A client connected directly sees the
// GOAWAY and opens its next stream on a new connection. A client behind an
// L7 proxy (a mesh sidecar) never sees it: the proxy holds the connection
// to storaged and the client's stream dies with the connection, every
// unanswered message of unknown outcome.
//
// So the service ends each stream first, on a schedule derived from when
// its connection was accepted (connTracker) and the age limits:
//
//   - the connection closes at the earliest at born + 0.9·age + grace; a
//     stream opened later than born + 0.9·age shows that the GOAWAY had not
//     been sent yet, so for it the close is at the earliest start + grace;
//   - from soft = max(born + 0.9·age, start) + grace/2 on, every message
//     read is answered UNAVAILABLE (ErrStreamEnding: nothing stored,
//     retry on a new stream), while puts already under way complete;
//   - at hard = soft + grace/4 the service stops reading, sends the
//     answers of the puts under way and ends the stream with OK, grace/4
//     before the earliest close. A client that half-closes meanwhile ends
//     it at once, as always.
//
// Every message without an answer on a stream that ended OK was never
// read, hence not stored. Unary calls need nothing of this: grpc-go lets
// them finish within the grace (long polls are capped well below it).
type streamLife struct {
	conns      *connTracker
	age, grace time.Duration
	clock      storage.TimerClock // nil: real timers
}

// schedule returns the soft and hard end of a stream started at start on
// the connection of ctx; ok is false when the connection is unknown (a
// listener not served by GRPCServer.Serve).
func (l *streamLife) schedule(ctx context.Context, start time.Time) (soft, hard time.Time, ok bool) {
	if l == nil {
		return time.Time{}, time.Time{}, false
	}
	born, ok := l.conns.born(ctx)
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	from := born.Add(l.age - l.age/10) // the earliest GOAWAY
	if start.After(from) {
		from = start
	}
	soft = from.Add(l.grace / 2)
	return soft, soft.Add(l.grace / 4), true
}

func (l *streamLife) now() time.Time {
	if l.clock != nil {
		return l.clock.Now()
	}
	return time.Now()
}

// at returns a channel closed once the clock reaches t, and the func that
// releases the wait.
func (l *streamLife) at(t time.Time) (<-chan struct{}, func()) {
	if l.clock != nil {
		return l.clock.At(t), func() {}
	}
	ch := make(chan struct{})
	tm := time.AfterFunc(time.Until(t), func() { close(ch) })
	return ch, func() { tm.Stop() }
}

// connTracker is a listener that notes when each connection was accepted,
// so that a stream handler can tell its connection's age: grpc-go does not
// expose it, but it gives each call its connection's addresses (peer).
type connTracker struct {
	now func() time.Time

	mu     sync.Mutex
	accept map[connKey]time.Time // guarded by mu; an entry lives as long as its connection
}

type connKey struct{ local, remote string }

func newConnTracker(now func() time.Time) *connTracker {
	return &connTracker{now: now, accept: map[connKey]time.Time{}}
}

// listen wraps lis so that its connections are tracked.
func (t *connTracker) listen(lis net.Listener) net.Listener {
	return &trackedListener{Listener: lis, t: t}
}

// born returns when the connection a call came in on was accepted.
func (t *connTracker) born(ctx context.Context) (time.Time, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil || p.LocalAddr == nil {
		return time.Time{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.accept[connKey{p.LocalAddr.String(), p.Addr.String()}]
	return b, ok
}

// tracked is the number of connections tracked (tests).
func (t *connTracker) tracked() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.accept)
}

type trackedListener struct {
	net.Listener
	t *connTracker
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	k := connKey{c.LocalAddr().String(), c.RemoteAddr().String()}
	l.t.mu.Lock()
	l.t.accept[k] = l.t.now()
	l.t.mu.Unlock()
	return &trackedConn{Conn: c, t: l.t, key: k}, nil
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	key  connKey
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.accept, c.key)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
