package server

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/rs/zerolog"
)

// pipeListener is a net.Listener over net.Pipe, so that a test inside a
// synctest bubble knows when every goroutine is blocked.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// dial queues a connection for Accept without waiting for it to be
// accepted (as a client's connect completes in the kernel's backlog), and
// returns the client end and a flag set once the server has sent its
// first bytes (the HTTP/2 settings): the connection is being served.
func (l *pipeListener) dial(t *testing.T) (net.Conn, *atomic.Bool) {
	client, srv := net.Pipe()
	go func() {
		select {
		case l.conns <- srv:
		case <-l.done:
		}
	}()
	served := new(atomic.Bool)
	go func() {
		buf := make([]byte, 1)
		if _, err := client.Read(buf); err == nil {
			served.Store(true)
		}
	}()
	return client, served
}

// TestMaxConnections: with MaxConnections 2, a third connection waits,
// unserved, while two are open, and is served as soon as one of them
// closes: the server holds at most two connections (and their
// descriptors) whatever the clients do. Before, every connection was
// accepted at once.
func TestMaxConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gs, err := NewGRPCServer(New(&fakeStore{}, zerolog.Nop()), GRPCConfig{MaxConnections: 2})
		if err != nil {
			t.Fatal(err)
		}
		lis := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- gs.Serve(lis) }()

		// One at a time, so that the first two are the ones accepted.
		c1, s1 := lis.dial(t)
		synctest.Wait()
		_, s2 := lis.dial(t)
		synctest.Wait()
		c3, s3 := lis.dial(t)
		synctest.Wait()
		if !s1.Load() || !s2.Load() {
			t.Fatalf("first two connections served: %v %v, want both", s1.Load(), s2.Load())
		}
		if s3.Load() {
			t.Fatal("third connection served while two were open (MaxConnections 2)")
		}
		c1.Close()
		synctest.Wait()
		if !s3.Load() {
			t.Fatal("third connection not served after one of the two closed")
		}

		c3.Close()
		lis.Close()
		gs.srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Fatalf("serve: %v", err)
		}
	})
}
