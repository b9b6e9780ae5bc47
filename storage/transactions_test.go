package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/txn"
)

// Transactional messages (transactions.go): half messages, their ends, the
// check loop and crash safety, on real mmapped files with a fake clock.
// The check loop is halted and its rounds run by hand (txnRound), except
// in TestTransactionCheckLoop.

var txnEpoch = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// recChecker records the checks the store asks for.
type recChecker struct {
	mu     sync.Mutex
	checks []TransactionCheck
	ch     chan TransactionCheck
}

func (c *recChecker) CheckTransaction(tc TransactionCheck) {
	c.mu.Lock()
	c.checks = append(c.checks, tc)
	c.mu.Unlock()
	if c.ch != nil {
		select {
		case c.ch <- tc:
		default:
		}
	}
}

func (c *recChecker) count(phys int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, tc := range c.checks {
		if tc.Half.PhysicalOffset == phys {
			n++
		}
	}
	return n
}

// putHalf puts a transactional half message for topic/qid and returns its
// append (on the half topic).
func putHalf(t testing.TB, s *Store, topic string, qid int32, body string, props ...Property) AppendResult {
	t.Helper()
	m := msg(topic, body, append([]Property{{Key: PropertyUniqKey, Value: "K" + body}, {Key: PropertyTags, Value: "tx"}}, props...)...)
	m.QueueID = qid
	m.SysFlag = TransactionPreparedType
	res, err := s.PutMessage(context.Background(), m)
	if err != nil || res.Status != PutOK {
		t.Fatalf("half put %s: %+v %v", body, res, err)
	}
	if res.Append.Topic != TransHalfTopic || res.Append.QueueID != 0 {
		t.Fatalf("half put %s stored on %s/%d, want %s/0", body, res.Append.Topic, res.Append.QueueID, TransHalfTopic)
	}
	return res.Append
}

func realBodies(t testing.TB, s *Store, topic string, qid int32) []string {
	t.Helper()
	var out []string
	for _, rec := range pullAll(t, s, topic, qid) {
		out = append(out, string(rec.Body))
	}
	return out
}

func openTxnTest(t testing.TB, dir string, clk *storagetest.Clock, mode FlushMode, mod func(*Options)) *Store {
	t.Helper()
	s := openPopTest(t, dir, clk, func(o *Options) {
		o.FlushMode = mode
		o.txnManual = true
		if mod != nil {
			mod(o)
		}
	})
	return s
}

// TestTransactionCommitRollback: a half message is stored on the half
// topic and on no real queue; a commit puts it to its topic and queue
// once (body, properties without the half's own, TRAN_PREPARED_QUEUE_OFFSET,
// the COMMIT type and the half's offset in PREPARED TX OFF); a repeated
// commit puts nothing; a rollback is refused after a commit; a rolled-back
// half is never delivered and refuses a commit; unknown ids and another
// topic are not found; all of it the same after a restart.
func TestTransactionCommitRollback(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		dir := t.TempDir()
		clk := storagetest.NewClock(txnEpoch)
		s := openTxnTest(t, dir, clk, mode, nil)
		ctx := context.Background()
		a := putHalf(t, s, "T", 1, "a", Property{Key: "color", Value: "red"})
		b := putHalf(t, s, "T", 2, "b")
		if got := realBodies(t, s, "T", 1); len(got) != 0 {
			t.Fatalf("half visible on its queue: %v", got)
		}
		if _, err := s.PullMessages(ctx, PullRequest{Topic: TransHalfTopic, QueueID: 0, MaxMessages: 10}); err == nil {
			t.Fatalf("the half topic is readable")
		}
		if n := s.PendingTransactions(); n != 2 {
			t.Fatalf("pending %d, want 2", n)
		}
		res, err := s.EndTransaction(ctx, "T", a.WroteOffset, true)
		if err != nil || res.Repeated || res.MsgID == "" {
			t.Fatalf("commit: %+v %v", res, err)
		}
		recs := pullAll(t, s, "T", 1)
		if len(recs) != 1 {
			t.Fatalf("after commit %d messages on T/1, want 1", len(recs))
		}
		r := recs[0]
		if string(r.Body) != "a" || r.SysFlag&record.TransactionMask != TransactionCommitType || r.PreparedTxOffset != a.WroteOffset ||
			r.MsgID() != res.MsgID {
			t.Fatalf("committed record %+v (msgId %s, commit said %s)", r, r.MsgID(), res.MsgID)
		}
		for k, want := range map[string]string{"color": "red", PropertyUniqKey: "Ka", PropertyTags: "tx",
			PropertyPreparedQueueOffset: strconv.FormatInt(a.QueueOffset, 10)} {
			if v, _ := r.Property(k); v != want {
				t.Errorf("committed %s = %q, want %q", k, v, want)
			}
		}
		for _, k := range []string{PropertyRealTopic, PropertyRealQueueID, PropertyTransactionPrepared} {
			if v, ok := r.Property(k); ok {
				t.Errorf("committed message keeps %s=%q", k, v)
			}
		}
		check := func(stage string) {
			t.Helper()
			if res, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); err != nil || !res.Repeated {
				t.Fatalf("%s: repeated commit: %+v %v", stage, res, err)
			}
			if _, err := s.EndTransaction(ctx, "T", a.WroteOffset, false); !errors.Is(err, ErrTransactionEnded) {
				t.Fatalf("%s: rollback of a committed transaction: %v", stage, err)
			}
			if got := realBodies(t, s, "T", 1); len(got) != 1 {
				t.Fatalf("%s: T/1 holds %v, want [a]", stage, got)
			}
			if _, err := s.EndTransaction(ctx, "T", b.WroteOffset+1, true); !errors.Is(err, ErrTransactionNotFound) {
				t.Fatalf("%s: unknown id: %v", stage, err)
			}
		}
		check("live")
		if _, err := s.EndTransaction(ctx, "Other", b.WroteOffset, true); !errors.Is(err, ErrTransactionNotFound) {
			t.Fatalf("other topic: %v", err)
		}
		if res, err := s.EndTransaction(ctx, "T", b.WroteOffset, false); err != nil || res.Repeated {
			t.Fatalf("rollback: %+v %v", res, err)
		}
		checkB := func(stage string) {
			t.Helper()
			if _, err := s.EndTransaction(ctx, "T", b.WroteOffset, true); !errors.Is(err, ErrTransactionEnded) {
				t.Fatalf("%s: commit of a rolled-back transaction: %v", stage, err)
			}
			if res, err := s.EndTransaction(ctx, "T", b.WroteOffset, false); err != nil || !res.Repeated {
				t.Fatalf("%s: repeated rollback: %+v %v", stage, res, err)
			}
			if got := realBodies(t, s, "T", 2); len(got) != 0 {
				t.Fatalf("%s: rolled back message delivered: %v", stage, got)
			}
			if n := s.PendingTransactions(); n != 0 {
				t.Fatalf("%s: pending %d", stage, n)
			}
		}
		checkB("live")
		if st := s.Stats().Transactions; st != (TransactionStats{Committed: 1, RolledBack: 1}) {
			t.Fatalf("stats %+v, want one commit and one rollback, nothing pending", st)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openTxnTest(t, dir, clk, mode, nil)
		check("reopened")
		checkB("reopened")
		s.crash()
		s = openTxnTest(t, dir, clk, mode, nil)
		check("crashed")
		checkB("crashed")
	})
}

// TestTransactionCrashBetweenPutAndOp: a commit cut between its message
// and its op record (a kill -9) leaves the half pending with its message
// delivered; after the restart the commit, repeated by the producer or
// resolved by the check round, writes the op without delivering again,
// asks no producer, and a rollback is refused.
func TestTransactionCrashBetweenPutAndOp(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		for _, how := range []string{"end", "check", "rollback"} {
			t.Run(how, func(t *testing.T) {
				dir := t.TempDir()
				clk := storagetest.NewClock(txnEpoch)
				s := openTxnTest(t, dir, clk, mode, nil)
				ctx := context.Background()
				putHalf(t, s, "T", 0, "before") // a half that stays pending: reconcile skips other halves' records
				a := putHalf(t, s, "T", 0, "a")
				putBodies(t, s, "T", "x", "y", "z") // other messages after it
				cut := errors.New("killed")
				s.txnSvc.afterRealPut = func() error { return cut }
				if _, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); !errors.Is(err, cut) {
					t.Fatalf("cut commit: %v", err)
				}
				s.crash()
				s = openTxnTest(t, dir, clk, mode, nil)
				chk := &recChecker{}
				s.SetTransactionChecker(chk)
				if n := s.PendingTransactions(); n != 2 {
					t.Fatalf("pending after the crash %d, want 2", n)
				}
				switch how {
				case "end":
					if res, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); err != nil || res.MsgID != "" {
						t.Fatalf("commit after the crash: %+v %v (a message id means it was put again)", res, err)
					}
				case "check":
					clk.Advance(DefaultTransactionTimeout)
					s.txnRound()
					if chk.count(a.WroteOffset) != 0 {
						t.Fatalf("the producer was asked about a half whose message is delivered")
					}
				case "rollback":
					if _, err := s.EndTransaction(ctx, "T", a.WroteOffset, false); !errors.Is(err, ErrTransactionEnded) {
						t.Fatalf("rollback of a delivered half: %v", err)
					}
					if _, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); err != nil {
						t.Fatalf("commit: %v", err)
					}
				}
				if n := s.PendingTransactions(); n != 1 {
					t.Fatalf("pending %d, want 1 (the other half)", n)
				}
				n := 0
				for _, b := range realBodies(t, s, "T", 0) {
					if b == "a" {
						n++
					}
				}
				if n != 1 {
					t.Fatalf("a delivered %d times", n)
				}
				if res, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); err != nil || !res.Repeated {
					t.Fatalf("repeated commit: %+v %v", res, err)
				}
			})
		}
	})
}

// TestTransactionChecks: a half is checked once older than its immunity
// (the default timeout, or its CHECK_IMMUNITY_TIME_IN_SECONDS), again
// only a check interval after, with the count kept across a crash, and
// discarded as a rollback after its last check; an ended half is never
// checked.
func TestTransactionChecks(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		dir := t.TempDir()
		clk := storagetest.NewClock(txnEpoch)
		mod := func(o *Options) { o.TransactionCheckMax = 2; o.TransactionCheckInterval = 10 * time.Second }
		s := openTxnTest(t, dir, clk, mode, mod)
		chk := &recChecker{}
		s.SetTransactionChecker(chk)
		ctx := context.Background()
		a := putHalf(t, s, "T", 0, "a")
		late := putHalf(t, s, "T", 0, "late", Property{Key: PropertyCheckImmunity, Value: "60"})
		ended := putHalf(t, s, "T", 0, "ended")
		if _, err := s.EndTransaction(ctx, "T", ended.WroteOffset, true); err != nil {
			t.Fatal(err)
		}
		counts := func(stage string, wa, wl int) {
			t.Helper()
			if ga, gl, ge := chk.count(a.WroteOffset), chk.count(late.WroteOffset), chk.count(ended.WroteOffset); ga != wa || gl != wl || ge != 0 {
				t.Fatalf("%s: checks a=%d late=%d ended=%d, want %d %d 0", stage, ga, gl, ge, wa, wl)
			}
		}
		s.txnRound()
		clk.Advance(DefaultTransactionTimeout - time.Millisecond)
		s.txnRound()
		counts("before the timeout", 0, 0)
		clk.Advance(time.Millisecond)
		s.txnRound()
		counts("at the timeout", 1, 0)
		c := chk.checks[0]
		if c.Topic != "T" || c.Queue != 0 || string(c.Half.Body) != "a" || c.Half.Topic != TransHalfTopic {
			t.Fatalf("check %+v", c)
		}
		s.txnRound()
		counts("again at once", 1, 0)
		s.crash()
		s = openTxnTest(t, dir, clk, mode, mod)
		s.SetTransactionChecker(chk)
		s.txnRound()
		counts("after the crash", 1, 0)
		clk.Advance(10 * time.Second)
		s.txnRound()
		counts("an interval later", 2, 0)
		clk.Advance(10 * time.Second)
		s.txnRound() // a's checks are spent: discarded
		counts("after the last check", 2, 0)
		if _, err := s.EndTransaction(ctx, "T", a.WroteOffset, true); !errors.Is(err, ErrTransactionEnded) {
			t.Fatalf("commit of a discarded half: %v", err)
		}
		clk.Advance(40 * time.Second)
		s.txnRound()
		counts("past the immunity", 2, 1)
		if got := realBodies(t, s, "T", 0); len(got) != 1 || got[0] != "ended" {
			t.Fatalf("T/0 holds %v, want [ended]", got)
		}
		// This process (since the crash): a's second check and discard,
		// late's first check.
		if st := s.Stats().Transactions; st != (TransactionStats{Pending: 1, Checked: 2, Discarded: 1}) {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestTransactionCheckLoop: the loop started by Open checks a half once
// the clock passes its timeout, with nothing but the clock moving.
func TestTransactionCheckLoop(t *testing.T) {
	clk := storagetest.NewClock(txnEpoch)
	s := openPopTest(t, t.TempDir(), clk, nil)
	chk := &recChecker{ch: make(chan TransactionCheck, 1)}
	s.SetTransactionChecker(chk)
	a := putHalf(t, s, "T", 0, "a")
	clk.Advance(DefaultTransactionTimeout)
	select {
	case c := <-chk.ch:
		if c.Half.PhysicalOffset != a.WroteOffset {
			t.Fatalf("checked %d, want %d", c.Half.PhysicalOffset, a.WroteOffset)
		}
	case <-time.After(time.Minute):
		t.Fatal("no check within a minute of real time")
	}
}

// TestTransactionPendingBound: a half beyond MaxPendingTransactions is
// refused with nothing stored; an end makes room.
func TestTransactionPendingBound(t *testing.T) {
	clk := storagetest.NewClock(txnEpoch)
	s := openTxnTest(t, t.TempDir(), clk, FlushSync, func(o *Options) { o.MaxPendingTransactions = 2 })
	a := putHalf(t, s, "T", 0, "a")
	putHalf(t, s, "T", 0, "b")
	m := msg("T", "c")
	m.SysFlag = TransactionPreparedType
	res, err := s.PutMessage(context.Background(), m)
	if !errors.Is(err, ErrTransactionsFull) || res.Appended() {
		t.Fatalf("third half: %+v %v", res, err)
	}
	if _, err := s.EndTransaction(context.Background(), "T", a.WroteOffset, false); err != nil {
		t.Fatal(err)
	}
	putHalf(t, s, "T", 0, "c")
}

// TestTransactionOptions: the options are validated.
func TestTransactionOptions(t *testing.T) {
	for _, o := range []Options{
		{TransactionTimeout: time.Millisecond}, {TransactionCheckInterval: 48 * time.Hour},
		{TransactionCheckMax: -1}, {TransactionCheckMax: 1001}, {MaxPendingTransactions: -5},
	} {
		o.Dir = t.TempDir()
		if err := o.withDefaults().Validate(); err == nil {
			t.Errorf("%+v: valid", o)
		}
	}
}

// TestTransactionModel drives random sends, commits, rollbacks, cut
// commits, check rounds, clock moves, crashes and restarts against a model:
// every committed half is delivered exactly once, no other ever is, a half
// is checked at most TransactionCheckMax times in all, and the pending
// count is the model's.
func TestTransactionModel(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				txnModelRun(t, mode, seed, 250)
			}
		})
	}
}

func txnModelRun(t *testing.T, mode FlushMode, seed uint64, steps int) {
	const checkMax = 3
	rng := rand.New(rand.NewPCG(seed, 17))
	clk := storagetest.NewClock(txnEpoch)
	dir := t.TempDir()
	mod := func(o *Options) { o.TransactionCheckMax = checkMax; o.TransactionCheckInterval = 2 * time.Second }
	s := openTxnTest(t, dir, clk, mode, mod)
	chk := &recChecker{}
	s.SetTransactionChecker(chk)
	type half struct {
		phys  int64
		state txn.Kind // 0 pending
		// cut: its message is delivered, its op not written.
		cut bool
	}
	var halves []*half
	byBody := map[string]*half{}
	ctx := context.Background()
	stats := map[string]int{}
	for step := 0; step < steps && !t.Failed(); step++ {
		switch op := rng.IntN(100); {
		case op < 25:
			b := fmt.Sprintf("h%d", len(halves))
			a := putHalf(t, s, "T", int32(rng.IntN(2)), b)
			h := &half{phys: a.WroteOffset}
			halves = append(halves, h)
			byBody[b] = h
			stats["half"]++
		case op < 55 && len(halves) > 0:
			h := halves[rng.IntN(len(halves))]
			commit := rng.IntN(3) > 0
			cut := commit && h.state == 0 && !h.cut && rng.IntN(4) == 0
			if cut {
				s.txnSvc.afterRealPut = func() error { return errors.New("cut") }
			}
			res, err := s.EndTransaction(ctx, "T", h.phys, commit)
			s.txnSvc.afterRealPut = nil
			switch {
			case cut:
				if err == nil {
					t.Fatalf("seed %d step %d: cut commit succeeded", seed, step)
				}
				h.cut = true
				stats["cut"]++
			case h.state == 0 && !h.cut:
				if err != nil {
					t.Fatalf("seed %d step %d: end of a pending half: %v", seed, step, err)
				}
				h.state = txn.Rollback
				if commit {
					h.state = txn.Commit
				}
				stats["end"]++
			case h.state == 0 && h.cut: // delivered, op missing
				if commit != (err == nil) {
					t.Fatalf("seed %d step %d: end (commit %v) of a cut half: %v", seed, step, commit, err)
				}
				if commit {
					h.state = txn.Commit
				}
			default:
				same := commit == (h.state == txn.Commit)
				if same != (err == nil) || (err == nil && !res.Repeated) {
					t.Fatalf("seed %d step %d: end (commit %v) of a half ended %v: %+v %v", seed, step, commit, h.state, res, err)
				}
			}
		case op < 70:
			clk.Advance(time.Duration(rng.IntN(4000)) * time.Millisecond)
		case op < 85:
			s.txnRound()
			stats["round"]++
		case op < 93:
			s.crash()
			s = openTxnTest(t, dir, clk, mode, mod)
			s.SetTransactionChecker(chk)
			stats["crash"]++
		default:
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openTxnTest(t, dir, clk, mode, mod)
			s.SetTransactionChecker(chk)
			stats["reopen"]++
		}
		// What the store resolved by itself: a cut half's commit op (a
		// round), a discard after the last check.
		s.txn.Mu.Lock()
		for _, h := range halves {
			if h.state != 0 {
				continue
			}
			if k, ok := s.txn.Ended(h.phys); ok {
				if h.cut && k != txn.Commit || !h.cut && k != txn.Discard {
					t.Errorf("seed %d step %d: half %d (cut %v) ended %v by the store", seed, step, h.phys, h.cut, k)
				}
				h.state = k
			}
		}
		s.txn.Mu.Unlock()
		pending := 0
		for _, h := range halves {
			if h.state == 0 {
				pending++
			}
			if n := chk.count(h.phys); n > checkMax {
				t.Fatalf("seed %d step %d: half %d checked %d times", seed, step, h.phys, n)
			}
		}
		if n := s.PendingTransactions(); n != pending {
			t.Fatalf("seed %d step %d: pending %d, model %d", seed, step, n, pending)
		}
	}
	seen := map[string]int{}
	for q := int32(0); q < 2; q++ {
		for _, b := range realBodies(t, s, "T", q) {
			seen[b]++
		}
	}
	for b, h := range byBody {
		want := 0
		if h.state == txn.Commit || h.cut {
			want = 1
		}
		if seen[b] != want {
			t.Fatalf("seed %d: %s (state %v, cut %v) delivered %d times, want %d", seed, b, h.state, h.cut, seen[b], want)
		}
	}
	t.Logf("seed %d %s: %v", seed, mode, stats)
	s.Close()
}

// TestRetentionKeepsPendingHalves: retention keeps the file of a pending
// half message however old it is, and deletes it once the half ended; a
// restart after that opens with nothing pending.
func TestRetentionKeepsPendingHalves(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, func(o *Options) { o.DeleteWhen = "*"; o.txnManual = true })
	fill(t, s, "T", 7) // file 0 and the start of file 1
	half := putHalf(t, s, "Real", 0, "pending")
	fill(t, s, "T", 30)
	settle(t, s)
	protect := half.WroteOffset - half.WroteOffset%o.FileSize
	if protect == 0 {
		t.Fatal("the half is in the first file: nothing to tell apart")
	}
	clock.Advance(80 * time.Hour)
	s.ret.Round()
	if got := s.log.MinOffset(); got != protect {
		t.Fatalf("min offset %d, want %d: the file with the pending half must stay", got, protect)
	}
	if _, err := s.EndTransaction(context.Background(), "Real", half.WroteOffset, false); err != nil {
		t.Fatal(err)
	}
	settle(t, s)
	for range 3 {
		s.ret.Round()
	}
	if got := s.log.MinOffset(); got <= protect {
		t.Fatalf("min offset %d after the rollback (protected %d)", got, protect)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	o.Clock = clock
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if n := s2.PendingTransactions(); n != 0 {
		t.Fatalf("pending %d after the restart", n)
	}
}
