package peer

import (
	"context"
	"testing"
	"time"
)

// idleLink is a link from member 1 to a member 2 whose port refuses, not
// started: the test drives its pause itself.
func idleLink(t *testing.T) *link {
	t.Helper()
	lis, peers := listeners(t, 2)
	if err := lis[1].Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := New(lis[0], &recorder{}, testOptions(1, peers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	l, err := tr.newLink(2, peers[2])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.cancel()
		l.conn.Close()
		l.fwd.Close()
	})
	return l
}

// TestPause: between two attempts the link waits out its backoff, unless
// the peer is heard from (a restarted member's hello): then it tries
// again MinBackoff after the last attempt began, however long the backoff.
func TestPause(t *testing.T) {
	for _, tc := range []struct {
		name          string
		backoff       time.Duration
		heardBefore   bool // a batch came between the attempt's end and the pause
		heardWhile    bool // a batch comes while it waits
		cancel        bool
		wantOK, wantB bool
	}{
		{name: "backoff over", backoff: 20 * time.Millisecond, wantOK: true},
		{name: "heard while waiting", backoff: time.Hour, heardWhile: true, wantOK: true, wantB: true},
		{name: "heard before waiting", backoff: time.Hour, heardBefore: true, wantOK: true, wantB: true},
		{name: "closed", backoff: time.Hour, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := idleLink(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			heard := l.heard.Load()
			if tc.heardBefore {
				l.heardFrom()
			}
			type result struct{ ok, back bool }
			done := make(chan result, 1)
			go func() {
				ok, back := l.pause(ctx, start, tc.backoff, heard)
				done <- result{ok, back}
			}()
			if tc.heardWhile || tc.cancel {
				waitFor(t, "the link waiting", 10*time.Second, l.waiting.Load)
			}
			if tc.heardWhile {
				l.heardFrom()
			}
			if tc.cancel {
				cancel()
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("pause did not end (backoff %v)", tc.backoff)
			}
			if r.ok != tc.wantOK || r.back != tc.wantB {
				t.Fatalf("pause = (ok %v, back %v), want (%v, %v)", r.ok, r.back, tc.wantOK, tc.wantB)
			}
			// Attempts stay MinBackoff apart however often the peer is heard.
			if tc.wantOK && time.Since(start) < l.t.opts.MinBackoff {
				t.Fatalf("pause ended %v after the attempt began, before MinBackoff (%v)", time.Since(start), l.t.opts.MinBackoff)
			}
			if l.waiting.Load() {
				t.Fatal("still marked waiting after pause")
			}
		})
	}
}

// TestHello: a member hears from a peer as soon as the peer's stream to
// it is up, before raft has anything for it (a follower sends nothing to
// another member until an election), so that a member that comes back is
// known to be up (and reached again, TestPause) at once.
func TestHello(t *testing.T) {
	trs, recs := group(t, 2, nil)
	t1, t2 := trs[0], trs[1]
	// Neither sends a message.
	waitFor(t, "1 hearing from 2", 10*time.Second, func() bool { return t1.peerLink(2).heard.Load() > 0 })
	waitFor(t, "2 hearing from 1", 10*time.Second, func() bool { return t2.peerLink(1).heard.Load() > 0 })
	if n := recs[0].count() + recs[1].count(); n != 0 {
		t.Fatalf("%d messages stepped: a hello carries none", n)
	}
}
