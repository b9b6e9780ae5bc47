// Package nemesis injects network faults between processes on loopback,
// without root: a Proxy forwards one TCP link (a client to a server, or one
// directed peer link of a replicated group) and can blackhole, delay or
// pause each direction and reset its connections. It follows the design of
// etcd's pkg/proxy (server.go: BlackholeTx/Rx, DelayTx/Rx, PauseTx/Rx,
// ResetListener), written here because importing etcd's pkg module pulls
// zap, cobra and OpenTelemetry (replication design §0, E8).
//
// Tx is the direction from the dialling side to the target (requests),
// Rx the way back (responses). Faults apply to live connections at once and
// to new ones, until they are cleared.
package nemesis

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Options configures a Proxy.
type Options struct {
	// Listen is the loopback address the proxy accepts on. Default
	// "127.0.0.1:0" (a free port).
	Listen string
	// Target is the loopback host:port it forwards to. Required.
	Target string
	// Seed seeds the delay jitter, so a scenario replays its timings.
	Seed uint64
	// Tap, if set, is shown every chunk the proxy writes, in order for
	// each connection and direction, just before it writes it: conn
	// numbers the accepted connections from 0, toTarget says the
	// direction. b is valid during the call only. Tap runs on the pumps'
	// goroutines, two per connection: it must be safe for concurrent use,
	// and quick (the pump waits for it). A test reads the protocol
	// through it (the HTTP/2 frames between two peers, say).
	Tap func(conn int, toTarget bool, b []byte)
}

func (o *Options) defaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
}

// Validate refuses a missing target and any address that is not loopback:
// the proxy is a test tool and must never forward off the machine.
func (o Options) Validate() error {
	for _, a := range []string{o.Listen, o.Target} {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("nemesis: address %q: %w", a, err)
		}
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("nemesis: address %q is not a loopback IP", a)
		}
	}
	return nil
}

// direction holds the fault state of one direction. Its fields are guarded
// by Proxy.mu; changed is closed and replaced whenever they change, which
// wakes paused pumps.
type direction struct {
	blackhole bool
	paused    bool
	delay     time.Duration
	jitter    time.Duration
}

// Proxy forwards TCP connections from Listen to Target.
type Proxy struct {
	opts Options
	ln   net.Listener
	done chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	tx, rx   direction
	changed  chan struct{}
	rng      *rand.Rand
	conns    map[net.Conn]struct{}
	closed   bool
	dropped  int64 // bytes discarded by a blackhole
	held     int   // chunks waiting in a pause
	accepted int   // connections accepted (Options.Tap's conn)
}

// New listens and starts the accept loop; Close stops it and every pump.
func New(opts Options) (*Proxy, error) {
	opts.defaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("nemesis: listen: %w", err)
	}
	p := &Proxy{opts: opts, ln: ln, done: make(chan struct{}), changed: make(chan struct{}),
		rng: rand.New(rand.NewPCG(opts.Seed, 0x6e656d)), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial instead of Target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.opts.Target }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		t, err := net.DialTimeout("tcp", p.opts.Target, 5*time.Second)
		if err != nil {
			c.Close() // the target is down: the client sees a reset, as it would
			continue
		}
		conn, ok := p.track(c, t)
		if !ok {
			return
		}
		p.wg.Add(2)
		go p.pump(c, t, &p.tx, conn, true)
		go p.pump(t, c, &p.rx, conn, false)
	}
}

// track registers an accepted connection's two sides and numbers it;
// false once the proxy is closed (both closed then).
func (p *Proxy) track(cs ...net.Conn) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return 0, false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	p.accepted++
	return p.accepted - 1, true
}

// pump copies src to dst through the fault state d. When either side ends,
// both are closed, so the peer pump ends too.
func (p *Proxy) pump(src, dst net.Conn, d *direction, conn int, toTarget bool) {
	defer p.wg.Done()
	defer p.forget(src, dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.forward(dst, buf[:n], d, conn, toTarget) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forward applies pause, blackhole and delay to one chunk, then writes it.
// It reports false when the proxy closed or the write failed.
func (p *Proxy) forward(dst net.Conn, b []byte, d *direction, conn int, toTarget bool) bool {
	for {
		p.mu.Lock()
		paused, blackhole, changed := d.paused, d.blackhole, p.changed
		wait := d.delay
		if d.jitter > 0 {
			wait += time.Duration(p.rng.Int64N(int64(d.jitter)))
		}
		p.mu.Unlock()
		if paused {
			p.mu.Lock()
			p.held++
			p.mu.Unlock()
			stop := false
			select {
			case <-changed:
			case <-p.done:
				stop = true
			}
			p.mu.Lock()
			p.held--
			p.mu.Unlock()
			if stop {
				return false
			}
			continue
		}
		if blackhole {
			p.mu.Lock()
			p.dropped += int64(len(b))
			p.mu.Unlock()
			return true // read and dropped, as etcd's proxy does
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return false
			}
		}
		if p.opts.Tap != nil {
			p.opts.Tap(conn, toTarget, b)
		}
		_, err := dst.Write(b)
		return err == nil
	}
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) set(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// BlackholeTx drops everything sent towards the target; connections stay
// open, so callers see timeouts, not errors.
func (p *Proxy) BlackholeTx() { p.set(func() { p.tx.blackhole = true }) }

// BlackholeRx drops everything the target sends back.
func (p *Proxy) BlackholeRx() { p.set(func() { p.rx.blackhole = true }) }

// UnblackholeTx forwards requests again (what was dropped stays lost).
func (p *Proxy) UnblackholeTx() { p.set(func() { p.tx.blackhole = false }) }

// UnblackholeRx forwards responses again.
func (p *Proxy) UnblackholeRx() { p.set(func() { p.rx.blackhole = false }) }

// DelayTx holds each chunk towards the target for d plus a uniform random
// [0, jitter) before writing it.
func (p *Proxy) DelayTx(d, jitter time.Duration) {
	p.set(func() { p.tx.delay, p.tx.jitter = d, jitter })
}

// DelayRx is DelayTx for the way back.
func (p *Proxy) DelayRx(d, jitter time.Duration) {
	p.set(func() { p.rx.delay, p.rx.jitter = d, jitter })
}

// UndelayTx removes the delay towards the target.
func (p *Proxy) UndelayTx() { p.DelayTx(0, 0) }

// UndelayRx removes the delay on the way back.
func (p *Proxy) UndelayRx() { p.DelayRx(0, 0) }

// PauseTx stops forwarding towards the target without dropping: what is
// read is held until UnpauseTx (TCP backpressure then stops the sender).
func (p *Proxy) PauseTx() { p.set(func() { p.tx.paused = true }) }

// PauseRx is PauseTx for the way back.
func (p *Proxy) PauseRx() { p.set(func() { p.rx.paused = true }) }

// UnpauseTx resumes forwarding towards the target.
func (p *Proxy) UnpauseTx() { p.set(func() { p.tx.paused = false }) }

// UnpauseRx resumes forwarding on the way back.
func (p *Proxy) UnpauseRx() { p.set(func() { p.rx.paused = false }) }

// Heal clears every fault in both directions.
func (p *Proxy) Heal() {
	p.set(func() { p.tx, p.rx = direction{}, direction{} })
}

// ResetConns closes every live connection with a TCP RST (linger 0), as a
// crashed middlebox would; the listener keeps accepting new ones.
func (p *Proxy) ResetConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// Conns is the number of live connections (both legs count).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Stats reports the bytes a blackhole dropped so far and the chunks held
// by a pause right now, so tests can tell that a fault has acted without
// waiting for a time.
func (p *Proxy) Stats() (dropped int64, held int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped, p.held
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetConns()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

var _ io.Closer = (*Proxy)(nil)
