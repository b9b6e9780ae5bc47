package peer

import (
	"bytes"
	"fmt"
	"io"
	"maps"
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
	f := &frameTap{got: map[[2]int]*bytes.Buffer{}}
	trs, recs := group(t, 2, func(o *Options) {
		o.Keepalive = time.Hour
		if o.ID != 1 {
			return
		}
		// Member 1 reaches member 2 through the proxy, which is closed
		// after both transports (cleanups run last registered first).
		p, err := nemesis.New(nemesis.Options{Target: o.Peers[2], Tap: f.tap})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		o.Peers = maps.Clone(o.Peers)
		o.Peers[2] = p.Addr()
	})
	const n = 100
	for k := range n {
		trs[0].Send(2, fmt.Appendf(nil, "m%d", k))
		waitFor(t, fmt.Sprintf("message %d", k), 10*time.Second, func() bool { return recs[1].count() > k })
	}
	if c, s := f.pings(t); c+s != 0 {
		t.Fatalf("%d messages, one at a time: %d PINGs from the sender, %d from the receiver; want none", n, c, s)
	}
}
