package storage

import (
	"context"
	"testing"
)

// TestPutResultTimings: a put hands out the append's lock hold and, in sync
// mode, its flush wait, which the server turns into trace spans: set for
// what the put did, zero for what it did not, and in the order they
// happened.
func TestPutResultTimings(t *testing.T) {
	t.Run("sync", func(t *testing.T) {
		s, _ := openTest(t, func(o *Options) { o.FlushMode = FlushSync })
		res, err := s.PutMessage(context.Background(), msg("T", "x"))
		if err != nil || res.Status != PutOK {
			t.Fatal(res.Status, err)
		}
		a := res.Append
		if a.LockedAt.IsZero() || res.FlushWaitStart.IsZero() {
			t.Fatalf("LockedAt %v, FlushWaitStart %v: want both set", a.LockedAt, res.FlushWaitStart)
		}
		if end := a.LockedAt.Add(a.LockHeld); res.FlushWaitStart.Before(end) {
			t.Errorf("flush wait starts at %v, before the append ended (%v)", res.FlushWaitStart, end)
		}
		if a.LockHeld < 0 || res.FlushWait < 0 {
			t.Errorf("LockHeld %v, FlushWait %v: negative", a.LockHeld, res.FlushWait)
		}

		// WAIT=false: appended, no flush wait.
		res, err = s.PutMessage(context.Background(), msg("T", "x", Property{Key: PropertyWaitStoreOK, Value: "false"}))
		if err != nil || res.Status != PutOK {
			t.Fatal(res.Status, err)
		}
		if res.Append.LockedAt.IsZero() || !res.FlushWaitStart.IsZero() || res.FlushWait != 0 {
			t.Errorf("WAIT=false: LockedAt %v, FlushWaitStart %v, FlushWait %v; want only LockedAt",
				res.Append.LockedAt, res.FlushWaitStart, res.FlushWait)
		}
	})
	t.Run("async batch", func(t *testing.T) {
		s, _ := openTest(t, nil)
		res, err := s.PutMessages(context.Background(), &Batch{Topic: "T", Messages: []BatchMessage{{Body: []byte("a")}, {Body: []byte("b")}}})
		if err != nil || res.Status != PutOK {
			t.Fatal(res.Status, err)
		}
		if res.Append.LockedAt.IsZero() || !res.FlushWaitStart.IsZero() {
			t.Errorf("LockedAt %v, FlushWaitStart %v: want only LockedAt", res.Append.LockedAt, res.FlushWaitStart)
		}
	})
	t.Run("refused", func(t *testing.T) {
		s, _ := openTest(t, nil)
		res, err := s.PutMessage(context.Background(), msg("bad topic!", "x"))
		if err == nil {
			t.Fatal("put to an invalid topic succeeded")
		}
		if !res.Append.LockedAt.IsZero() || res.Append.LockHeld != 0 {
			t.Errorf("refused put: LockedAt %v, LockHeld %v; want zero", res.Append.LockedAt, res.Append.LockHeld)
		}
	})
}
