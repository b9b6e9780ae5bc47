package peer

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/storaged/storaged/internal/nemesis"
)

// frameTap records, through a nemesis proxy's Tap, what each connection
// carried each way, and counts the HTTP/2 PING frames in it.
type frameTap struct {
	mu  sync.Mutex
	got map[[2]int]*bytes.Buffer // {conn, 1 client to server / 0 back}
}

func (f *frameTap) tap(conn int, toTarget bool, b []byte) {
	k := [2]int{conn, 0}
	if toTarget {
		k[1] = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.got[k] == nil {
		f.got[k] = &bytes.Buffer{}
	}
	f.got[k].Write(b)
}

// pings counts the PING frames that are not acks: from the clients (the
// dialling side) and from the servers, in the frames seen so far.
func (f *frameTap) pings(t *testing.T) (fromClients, fromServers int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, b := range f.got {
		r := bytes.NewReader(b.Bytes())
		if k[1] == 1 {
			preface := make([]byte, len(http2.ClientPreface))
			if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
				t.Fatalf("connection %d does not open with HTTP/2's client preface", k[0])
			}
		}
		fr := http2.NewFramer(nil, r)
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			fh, err := fr.ReadFrame()
			if err != nil {
				break // the end of what was seen (a frame may be cut short)
			}
			if p, ok := fh.(*http2.PingFrame); ok && !p.IsAck() {
				if k[1] == 1 {
					fromClients++
				} else {
					fromServers++
				}
			}
		}
	}
	return fromClients, fromServers
}

// TestFixedWindowsNoPings: a raft link's messages, each sent on its own,
// make neither end send a PING (the windows are fixed: Window,
// ConnWindow), where grpc-go's bandwidth estimator, on by default, has the
// receiver ping after each read of data (100 PINGs for 100 messages
// before). Keepalive pings are out of the test's reach (Keepalive an
// hour).
func TestFixedWindowsNoPings(t *testing.T) {
	lis, peers := listeners(t, 2)
	f := &frameTap{got: map[[2]int]*bytes.Buffer{}}
	p, err := nemesis.New(nemesis.Options{Target: peers[2], Tap: f.tap})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r2 := &recorder{}
	o1 := testOptions(1, map[uint64]string{1: peers[1], 2: p.Addr()})
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
	if c, s := f.pings(t); c+s != 0 {
		t.Fatalf("%d messages, one at a time: %d PINGs from the sender, %d from the receiver; want none", n, c, s)
	}
}
