package client

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPutRetry: the retry state both put paths share: a refusal holds
// its member for the RetryInfo (capped) or the doubling backoff (capped),
// jittered ±25 %; lookups without a leader end after LeaderWait; the
// final error puts an unknown outcome first; a wait ends with the ctx or
// the close.
func TestPutRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &LeaderTracker{opts: Options{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
			MaxRetryDelay: time.Second, LookupInterval: 20 * time.Millisecond, LeaderWait: time.Second}, windows: map[string]time.Duration{}}
		r := tr.newRetry()
		within := func(what string, got, want time.Duration) {
			t.Helper()
			if got < want*3/4 || got > want*5/4 {
				t.Fatalf("%s: held %v, want %v ±25 %%", what, got, want)
			}
		}
		refusal := status.Error(codes.Unavailable, "not the leader")
		for i, want := range []time.Duration{100, 200, 300, 300} {
			r.refused("a", refusal, 0, false)
			within("backoff", r.hold("a"), want*time.Millisecond)
			if i == 0 && r.hold("b") != 0 {
				t.Fatalf("another member is held too: %v", r.hold("b"))
			}
		}
		r.refused("a", refusal, 5*time.Second, true)
		within("RetryInfo past MaxRetryDelay", r.hold("a"), time.Second)
		r.refused("a", refusal, 50*time.Millisecond, true)
		within("RetryInfo", r.hold("a"), 50*time.Millisecond)
		time.Sleep(time.Second) // the fake clock: holds lapse
		if r.hold("a") != 0 {
			t.Fatalf("held past its time: %v", r.hold("a"))
		}

		// Each sent() counts a send: with MaxAttempts 3 the first two
		// leave more, the third is the last.
		if first, second, third := r.sent(), r.sent(), r.sent(); !first || !second || third {
			t.Fatalf("MaxAttempts 3: more after sends 1-3 = %v %v %v, want true true false", first, second, third)
		}

		// No leader: polled every LookupInterval until LeaderWait.
		noLeader := errors.Join(ErrNoLeader)
		d, err := r.noLeader(noLeader)
		if err != nil {
			t.Fatal(err)
		}
		within("lookup interval", d, 20*time.Millisecond)
		time.Sleep(time.Second + time.Millisecond)
		if _, err := r.noLeader(noLeader); !errors.Is(err, ErrNoLeader) || !errors.Is(err, refusal) {
			t.Fatalf("after LeaderWait: %v, want ErrNoLeader with the last refusal", err)
		}

		// An unknown outcome comes first in the final error, and only a
		// member whose window covers twice the put's age takes the retry.
		unknown := status.Error(codes.DeadlineExceeded, "replication timeout")
		if r.uncovered("a") {
			t.Fatal("uncovered before any unknown outcome")
		}
		r.unknownOutcome("a", unknown, false)
		if r.hold("a") != 0 {
			t.Fatal("a broken send held its member")
		}
		age := time.Since(r.began)
		tr.windows["a"], tr.windows["b"] = 2*age+time.Second, 2*age
		if r.uncovered("a") || !r.uncovered("b") || !r.uncovered("c") {
			t.Fatalf("covered: a %v, b %v, c %v; want a only", !r.uncovered("a"), !r.uncovered("b"), !r.uncovered("c"))
		}
		if got := r.fail(refusal); status.Code(got) != codes.DeadlineExceeded || !errors.Is(got, refusal) {
			t.Fatalf("final error %v: want the unknown outcome first, then the refusal", got)
		}
		if got := r.fail(unknown); got != unknown {
			t.Fatalf("final error %v, want the unknown outcome itself", got)
		}
		r.unknownOutcome("a", unknown, true)
		within("an answered unknown outcome", r.hold("a"), 300*time.Millisecond)

		// Waits end with the ctx, or the close.
		ctx, cancel := context.WithCancel(context.Background())
		closed, closeIt := context.WithCancel(context.Background())
		if err := r.wait(ctx, closed, 0); err != nil {
			t.Fatal(err)
		}
		if err := r.wait(ctx, closed, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := r.wait(ctx, closed, time.Hour); !errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) {
			t.Fatalf("ctx ended: %v", err)
		}
		closeIt()
		if err := r.wait(context.Background(), closed, time.Hour); !errors.Is(err, ErrClosed) {
			t.Fatalf("closed: %v", err)
		}
	})
}
