package peer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// frameProxy forwards one TCP connection to target and counts the HTTP/2
// PING frames (not their acks) each way: toServer in the frames the
// client sent, toClient in the server's.
type frameProxy struct {
	lis                net.Listener
	toServer, toClient atomic.Int64
	wg                 sync.WaitGroup
	mu                 sync.Mutex
	conns              []net.Conn
}

func newFrameProxy(t *testing.T, target string) *frameProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frameProxy{lis: lis}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(s, c, len(http2.ClientPreface), &p.toServer)
			go p.pipe(c, s, 0, &p.toClient)
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// pipe copies src to dst, parsing what passes (after a preface of skip
// bytes) as HTTP/2 frames and counting the PINGs that are not acks.
func (p *frameProxy) pipe(dst, src net.Conn, skip int, pings *atomic.Int64) {
	defer p.wg.Done()
	defer dst.Close()
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := bufio.NewReader(pr)
		if _, err := r.Discard(skip); err != nil {
			return
		}
		fr := http2.NewFramer(nil, r)
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				var se http2.StreamError
				if errors.As(err, &se) {
					continue
				}
				io.Copy(io.Discard, r)
				return
			}
			if pf, ok := f.(*http2.PingFrame); ok && !pf.IsAck() {
				pings.Add(1)
			}
		}
	}()
	_, _ = io.Copy(io.MultiWriter(dst, pw), src)
	pw.Close()
	<-done
}

// TestFixedWindowsNoPings: a raft link's messages, each sent on its own,
// make neither end send a PING (the windows are fixed: Window,
// ConnWindow), where grpc-go's bandwidth estimator, on by default, has the
// receiver ping after each read of data. Keepalive pings are out of
// reach of the test's duration (Options.Keepalive).
func TestFixedWindowsNoPings(t *testing.T) {
	lis, peers := listeners(t, 2)
	p := newFrameProxy(t, peers[2])
	via := map[uint64]string{1: peers[1], 2: p.lis.Addr().String()}
	r2 := &recorder{}
	o1 := testOptions(1, via)
	o1.Keepalive = time.Hour
	t1, err := New(lis[0], &recorder{}, o1)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	o2 := testOptions(2, peers)
	o2.Keepalive = time.Hour
	t2, err := New(lis[1], r2, o2)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	const n = 100
	for k := range n {
		t1.Send(2, fmt.Appendf(nil, "m%d", k))
		waitFor(t, fmt.Sprintf("message %d", k), 10*time.Second, func() bool { return r2.count() > k })
	}
	if s, c := p.toServer.Load(), p.toClient.Load(); s+c != 0 {
		t.Fatalf("%d messages, one at a time: %d PINGs from the sender, %d from the receiver; want none", n, s, c)
	}
}
