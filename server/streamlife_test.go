package server

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proxytest"
	"github.com/storaged/storaged/storage/storagetest"
)

// TestStreamLifeSchedule: a stream's soft and hard ends come grace/2 and
// 3·grace/4 after the earliest GOAWAY grpc-go may send (0.9 of the age:
// it jitters the age by ±10%), or after the stream's start when it opened
// later (the GOAWAY had not been sent then); both before the earliest
// close, GOAWAY + grace.
func TestStreamLifeSchedule(t *testing.T) {
	born := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name             string
		age, grace       time.Duration
		start            time.Duration // after born
		wantSoft, wantHd time.Duration // after born
	}{
		{"defaults, stream at once", 10 * time.Minute, 30 * time.Second, 0, 9*time.Minute + 15*time.Second, 9*time.Minute + 22500*time.Millisecond},
		{"defaults, stream before the earliest GOAWAY", 10 * time.Minute, 30 * time.Second, 8 * time.Minute, 9*time.Minute + 15*time.Second, 9*time.Minute + 22500*time.Millisecond},
		{"defaults, stream after the earliest GOAWAY", 10 * time.Minute, 30 * time.Second, 10 * time.Minute, 10*time.Minute + 15*time.Second, 10*time.Minute + 22500*time.Millisecond},
		{"short", time.Second, 4 * time.Second, 0, 2900 * time.Millisecond, 3900 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := storagetest.NewClock(born)
			l := &streamLife{age: tc.age, grace: tc.grace, clock: c}
			l.conns = newConnTracker(l.now)
			local, remote := addr("127.0.0.1:9090"), addr("127.0.0.1:50000")
			l.conns.accept[connKey{local.String(), remote.String()}] = born
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: remote, LocalAddr: local})
			soft, hard, ok := l.schedule(ctx, born.Add(tc.start))
			if !ok || soft.Sub(born) != tc.wantSoft || hard.Sub(born) != tc.wantHd {
				t.Fatalf("schedule = %v, %v, %v; want %v, %v after born", soft.Sub(born), hard.Sub(born), ok, tc.wantSoft, tc.wantHd)
			}
			earliestClose := born.Add(tc.age - tc.age/10 + tc.grace)
			if from := born.Add(tc.start); from.After(born.Add(tc.age - tc.age/10)) {
				earliestClose = from.Add(tc.grace)
			}
			if !hard.Before(earliestClose) {
				t.Errorf("hard end %v is not before the earliest close %v", hard, earliestClose)
			}
			if _, _, ok := l.schedule(peer.NewContext(context.Background(), &peer.Peer{Addr: addr("127.0.0.1:1"), LocalAddr: local}), born); ok {
				t.Error("a connection the tracker does not know got a schedule")
			}
		})
	}
}

type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }

// TestPutMessageStreamEndsBeforeConnectionAge: on a test clock, a stream
// answers messages normally until its soft end, UNAVAILABLE
// (SERVICE_NOT_AVAILABLE, cause STREAM_ENDING, nothing stored) from
// then on, and at its hard end sends the answer of the put still under
// way and ends with OK although the client never half-closed.
func TestPutMessageStreamEndsBeforeConnectionAge(t *testing.T) {
	born := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := storagetest.NewClock(born)
	st, _ := openStore(t, nil)
	g := newGatedStore(st, 8)
	const age, grace = time.Hour, 40 * time.Second // grpc-go's real age limit never comes
	srv := startServer(t, New(g, zerolog.Nop()), GRPCConfig{Clock: clock, MaxConnectionAge: age, MaxConnectionAgeGrace: grace})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	msg := func(body string) *storagedv1.Message { return &storagedv1.Message{Topic: "life", Body: []byte(body)} }

	if err := stream.Send(streamMsg(1, msg("before"))); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	g.gate <- struct{}{}
	if ack, err := stream.Recv(); err != nil || ack.GetCode() != 0 || ack.GetRequestId() != 1 {
		t.Fatalf("before the soft end: %v, %v", ack, err)
	}
	soft := born.Add(age - age/10 + grace/2)
	clock.Set(soft.Add(-time.Millisecond))
	if err := stream.Send(streamMsg(3, msg("just before"))); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	g.gate <- struct{}{}
	if ack, err := stream.Recv(); err != nil || ack.GetCode() != 0 || ack.GetRequestId() != 3 {
		t.Fatalf("1 ms before the soft end: %v, %v", ack, err)
	}
	// Message 2 is under way in the store when the soft end comes.
	if err := stream.Send(streamMsg(2, msg("under way"))); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	clock.Set(soft)
	if err := stream.Send(streamMsg(4, msg("after the soft end"))); err != nil {
		t.Fatal(err)
	}
	ack, err := stream.Recv()
	if err != nil || ack.GetRequestId() != 4 || codes.Code(ack.GetCode()) != codes.Unavailable ||
		ack.GetReason() != ReasonUnavailable || ack.GetResult() != nil {
		t.Fatalf("after the soft end: %v, %v; want UNAVAILABLE, SERVICE_NOT_AVAILABLE, no result", ack, err)
	}
	clock.Set(soft.Add(grace / 4)) // the hard end: the stream ends once message 2 is answered
	g.gate <- struct{}{}
	if ack, err := stream.Recv(); err != nil || ack.GetCode() != 0 || ack.GetRequestId() != 2 {
		t.Fatalf("the put under way at the hard end: %v, %v", ack, err)
	}
	if ack, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the hard end: %v, %v; want the stream to end OK", ack, err)
	}
	waitDispatched(t, client, "life", 0, 2)
	info, err := client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "life"})
	if err != nil || info.GetMaxOffset() != 3 {
		t.Errorf("queue info %v, %v; want the 3 messages answered OK, not the refused one", info, err)
	}
	// The next stream on the same connection, opened after the earliest
	// GOAWAY, gets a life of its own.
	next, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Send(streamMsg(5, msg("next stream"))); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	g.gate <- struct{}{}
	if ack, err := next.Recv(); err != nil || ack.GetCode() != 0 {
		t.Fatalf("a new stream after the end: %v, %v", ack, err)
	}
	next.CloseSend()
	if _, err := next.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of the next stream: %v", err)
	}
}

// TestConnTrackerForgets: the tracker holds an entry per open connection
// only.
func TestConnTrackerForgets(t *testing.T) {
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{})
	conn := dial(t, srv.addr, nil)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	if _, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if n := srv.conns.tracked(); n != 1 {
		t.Fatalf("%d connections tracked, want 1", n)
	}
	conn.Close()
	waitFor(t, 10*time.Second, func() bool { return srv.conns.tracked() == 0 })
}

// TestPutMessageStreamEndsBehindProxy: behind haproxy, which never passes
// storaged's GOAWAY on to the client, a stream the client never
// half-closes still ends with OK, on the connection that got the GOAWAY,
// and the next stream works (haproxy opens a new connection to storaged).
// grpc-go's age limit is real (1 s, jittered ±10%) and the test waits for
// its GOAWAY; the stream's end comes on a test clock, and grpc-go's close,
// an hour of grace later, never comes. That the end comes before the close
// is TestStreamLifeSchedule's arithmetic: here the OK end does not race
// the close, however slow the machine.
func TestPutMessageStreamEndsBehindProxy(t *testing.T) {
	proxytest.Path(t)
	born := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := storagetest.NewClock(born)
	const age, grace = time.Second, time.Hour
	st, _ := openStore(t, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := &goawayListener{Listener: lis, goaway: make(chan struct{})}
	srv := serveOn(t, New(st, zerolog.Nop()), GRPCConfig{Clock: clock, MaxConnectionAge: age, MaxConnectionAgeGrace: grace}, gl)
	srv.SetServing(true)
	p := proxytest.Start(t, srv.addr, proxytest.Options{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, p.Addr, nil))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(streamMsg(1, &storagedv1.Message{Topic: "aged", Body: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	if ack, err := stream.Recv(); err != nil || ack.GetCode() != 0 {
		t.Fatalf("first message: %v, %v", ack, err)
	}
	if n := gl.accepted.Load(); n != 1 {
		t.Fatalf("haproxy opened %d connections to storaged, want 1 (the stream's)", n)
	}
	select {
	case <-gl.goaway:
	case <-ctx.Done():
		t.Fatal("no GOAWAY at the connection's age")
	}
	// The client sends nothing more and never half-closes: at its hard
	// end the server ends the stream.
	clock.Set(born.Add(age - age/10 + grace/2 + grace/4))
	if ack, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("behind the proxy the stream ended with %v, %v; want OK (io.EOF)", ack, err)
	}
	next, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Send(streamMsg(2, &storagedv1.Message{Topic: "aged", Body: []byte("y")})); err != nil {
		t.Fatal(err)
	}
	if ack, err := next.Recv(); err != nil || ack.GetCode() != 0 {
		t.Fatalf("a new stream through the proxy: %v, %v", ack, err)
	}
	next.CloseSend()
	if _, err := next.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of the new stream: %v", err)
	}
	if n := gl.accepted.Load(); n != 2 {
		t.Errorf("haproxy opened %d connections to storaged, want 2 (a new one after the GOAWAY)", n)
	}
}

// goawayListener counts the connections it accepts and closes goaway once
// the server has written an HTTP/2 GOAWAY on one (grpc-go does at the
// connection's age): grpc-go tells of neither.
type goawayListener struct {
	net.Listener
	goaway   chan struct{}
	once     sync.Once
	accepted atomic.Int32
}

func (l *goawayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &goawayConn{Conn: c, l: l}, nil
}

// h2GoAway is the HTTP/2 GOAWAY frame type (RFC 9113, 6.8).
const h2GoAway = 0x7

// goawayConn reads the frames the server writes for a GOAWAY. The
// connection is h2c, so the bytes written are the frames, from the first
// (the server's SETTINGS): 9 bytes of header (a 24-bit payload length,
// then the type), then the payload.
type goawayConn struct {
	net.Conn
	l    *goawayListener
	mu   sync.Mutex
	hdr  []byte // the header of the next frame, as far as written
	skip int    // payload bytes of the current frame not written yet
}

func (c *goawayConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.scan(b[:n])
	return n, err
}

func (c *goawayConn) scan(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(b) > 0 {
		if c.skip > 0 {
			n := min(c.skip, len(b))
			c.skip -= n
			b = b[n:]
			continue
		}
		n := min(9-len(c.hdr), len(b))
		c.hdr = append(c.hdr, b[:n]...)
		b = b[n:]
		if len(c.hdr) == 9 {
			c.skip = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
			if c.hdr[3] == h2GoAway {
				c.l.once.Do(func() { close(c.l.goaway) })
			}
			c.hdr = c.hdr[:0]
		}
	}
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond) // a poll interval, not a wait for the condition
	}
}
