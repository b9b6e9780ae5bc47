package nemesis

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a loopback TCP echo server that counts the bytes it received.
type echo struct {
	ln   net.Listener
	got  atomic.Int64
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn []net.Conn
}

func newEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conn = append(e.conn, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					e.got.Add(int64(n))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conn {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func setup(t *testing.T) (*echo, *Proxy, net.Conn) {
	t.Helper()
	e := newEcho(t)
	p, err := New(Options{Target: e.ln.Addr().String(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang fails instead of blocking the package
	return e, p, c
}

// until polls cond until it holds or 30 s pass.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func roundTrip(t *testing.T, c net.Conn, msg []byte) {
	t.Helper()
	go func() { c.Write(msg) }()
	back := make([]byte, len(msg))
	if _, err := io.ReadFull(c, back); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if !bytes.Equal(back, msg) {
		t.Fatal("bytes changed on the way through the proxy")
	}
}

func TestBytesPass(t *testing.T) {
	_, _, c := setup(t)
	msg := make([]byte, 1<<20)
	rand.Read(msg)
	roundTrip(t, c, msg)
}

func TestBlackholeDrops(t *testing.T) {
	for _, tx := range []bool{true, false} {
		name := map[bool]string{true: "tx", false: "rx"}[tx]
		t.Run(name, func(t *testing.T) {
			e, p, c := setup(t)
			if tx {
				p.BlackholeTx()
			} else {
				p.BlackholeRx()
			}
			if _, err := c.Write([]byte("lost")); err != nil {
				t.Fatal(err)
			}
			until(t, "the blackhole to drop 4 bytes", func() bool { d, _ := p.Stats(); return d == 4 })
			if tx && e.got.Load() != 0 {
				t.Fatalf("target got %d bytes through a tx blackhole", e.got.Load())
			}
			if !tx && e.got.Load() != 4 {
				t.Fatalf("target got %d bytes through an rx blackhole, want 4", e.got.Load())
			}
			if tx {
				p.UnblackholeTx()
			} else {
				p.UnblackholeRx()
			}
			roundTrip(t, c, []byte("kept")) // the first bytes back are these: "lost" is gone
		})
	}
}

func TestDelayDelays(t *testing.T) {
	for _, tx := range []bool{true, false} {
		name := map[bool]string{true: "tx", false: "rx"}[tx]
		t.Run(name, func(t *testing.T) {
			_, p, c := setup(t)
			const d = 50 * time.Millisecond
			if tx {
				p.DelayTx(d, 20*time.Millisecond)
			} else {
				p.DelayRx(d, 20*time.Millisecond)
			}
			began := time.Now()
			roundTrip(t, c, []byte("slow"))
			if took := time.Since(began); took < d {
				t.Fatalf("round trip took %v through a %v delay", took, d)
			}
			p.Heal()
			roundTrip(t, c, []byte("fast"))
		})
	}
}

func TestPauseHolds(t *testing.T) {
	e, p, c := setup(t)
	p.PauseTx()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	until(t, "the pause to hold a chunk", func() bool { _, h := p.Stats(); return h == 1 })
	if n := e.got.Load(); n != 0 {
		t.Fatalf("target got %d bytes through a pause", n)
	}
	p.UnpauseTx()
	back := make([]byte, 4)
	if _, err := io.ReadFull(c, back); err != nil || string(back) != "held" {
		t.Fatalf("after unpause read %q, %v; want the held bytes", back, err)
	}
}

func TestResetCloses(t *testing.T) {
	_, p, c := setup(t)
	roundTrip(t, c, []byte("before"))
	p.ResetConns()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a reset connection succeeded")
	}
	until(t, "the proxy to drop its connections", func() bool { return p.Conns() == 0 })
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(30 * time.Second))
	roundTrip(t, c2, []byte("after")) // the listener survives a reset
}

func TestOnlyLoopback(t *testing.T) {
	for _, o := range []Options{
		{Target: "10.0.0.1:80"},
		{Target: "example.com:80"},
		{Listen: "0.0.0.0:0", Target: "127.0.0.1:1"},
		{Target: "127.0.0.1"},
	} {
		if p, err := New(o); err == nil {
			p.Close()
			t.Errorf("New(%+v) accepted a non-loopback or bad address", o)
		}
	}
}

// TestTap: the tap sees what each connection carries, each direction in
// order and whole (1 MiB each way, two connections told apart), and not
// what a blackhole drops.
func TestTap(t *testing.T) {
	e := newEcho(t)
	var mu sync.Mutex
	seen := map[[2]int]*bytes.Buffer{} // {conn, 1 to the target / 0 back}
	p, err := New(Options{Target: e.ln.Addr().String(), Tap: func(conn int, toTarget bool, b []byte) {
		k := [2]int{conn, 0}
		if toTarget {
			k[1] = 1
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[k] == nil {
			seen[k] = &bytes.Buffer{}
		}
		seen[k].Write(b)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var sent [][]byte
	for range 2 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		msg := make([]byte, 1<<20)
		rand.Read(msg)
		roundTrip(t, c, msg)
		sent = append(sent, msg)
	}
	p.BlackholeTx()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("dropped")); err != nil {
		t.Fatal(err)
	}
	until(t, "the blackhole's drop", func() bool { d, _ := p.Stats(); return d == int64(len("dropped")) })
	mu.Lock()
	defer mu.Unlock()
	for i, msg := range sent {
		for dir := range 2 {
			if b := seen[[2]int{i, dir}]; b == nil || !bytes.Equal(b.Bytes(), msg) {
				t.Errorf("connection %d, direction %d: the tap saw other bytes than were sent", i, dir)
			}
		}
	}
	if len(seen) != 4 {
		t.Errorf("the tap saw %d connection directions, want 4 (the blackholed bytes unseen)", len(seen))
	}
}
