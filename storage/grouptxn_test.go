package storage

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/txn"
)

// sameTxn checks that every member of ids holds the same pending halves
// (offset, checks) as want, and remembers the ends named.
func (g *testGroup) sameTxn(want map[int64]int32, ended map[int64]txn.Kind, ids ...uint64) {
	g.t.Helper()
	for _, id := range ids {
		s := g.m[id].s
		s.txn.Mu.Lock()
		got := map[int64]int32{}
		for _, h := range s.txn.All() {
			got[h.Phys] = h.Checks
		}
		var bad []string
		for phys, k := range ended {
			if e, ok := s.txn.Ended(phys); !ok || e != k {
				bad = append(bad, e.String())
			}
		}
		s.txn.Mu.Unlock()
		if len(got) != len(want) || len(bad) > 0 {
			g.t.Fatalf("member %d: pending %v (want %v), ends wrong: %v", id, got, want, bad)
		}
		for p, c := range want {
			if got[p] != c {
				g.t.Fatalf("member %d: pending %v, want %v", id, got, want)
			}
		}
	}
}

func (g *testGroup) putHalf(id uint64, body string) AppendResult {
	g.t.Helper()
	m := msg("T", body)
	m.SysFlag = TransactionPreparedType
	res, err := g.m[id].s.PutMessage(context.Background(), m)
	if err != nil || res.Status != PutOK || res.Append.Topic != TransHalfTopic {
		g.t.Fatalf("half %s on %d: %+v %v", body, id, res, err)
	}
	return res.Append
}

// TestGroupTransactions: in a replication group the half messages and
// their ends are committed on the leader and applied by every member
// (same pending table, same ends, check counts included); a follower
// refuses an end and runs no checks; a commit cut between its message and
// its op on a leader that then goes is finished by the next leader
// without a second delivery and without asking the producer; a half the
// old leader checked is checked by the new one only an interval later;
// a restarted member rebuilds the same table, from its own snapshot.
func TestGroupTransactions(t *testing.T) {
	clk := storagetest.NewClock(txnEpoch)
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		o.Clock = clk
		o.txnManual = true
		o.TransactionCheckInterval = 10 * time.Second
	})
	all := g.ids
	g.elect(1)
	ctx := context.Background()
	a, b, c, d := g.putHalf(1, "a"), g.putHalf(1, "b"), g.putHalf(1, "c"), g.putHalf(1, "d")
	g.converge(1, all...)
	g.sameTxn(map[int64]int32{a.WroteOffset: 0, b.WroteOffset: 0, c.WroteOffset: 0, d.WroteOffset: 0}, nil, all...)

	end := g.m[2].s.log.MaxOffset()
	var nl *NotLeaderError
	if _, err := g.m[2].s.EndTransaction(ctx, "T", a.WroteOffset, true); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("EndTransaction on a follower: %v", err)
	}
	fchk := &recChecker{}
	g.m[2].s.SetTransactionChecker(fchk)
	clk.Advance(DefaultTransactionTimeout)
	g.m[2].s.txnRound()
	if g.m[2].s.log.MaxOffset() != end || len(fchk.checks) != 0 {
		t.Fatal("a follower wrote or checked")
	}

	if _, err := g.m[1].s.EndTransaction(ctx, "T", a.WroteOffset, true); err != nil {
		t.Fatal(err)
	}
	if _, err := g.m[1].s.EndTransaction(ctx, "T", b.WroteOffset, false); err != nil {
		t.Fatal(err)
	}
	chk := &recChecker{}
	g.m[1].s.SetTransactionChecker(chk)
	// The leader checks c and d; then c's commit is cut after its message.
	g.m[1].s.txnRound()
	if chk.count(c.WroteOffset) != 1 || chk.count(d.WroteOffset) != 1 {
		t.Fatalf("leader's checks %+v", chk.checks)
	}
	g.m[1].s.txnSvc.afterRealPut = func() error { return errors.New("cut") }
	if _, err := g.m[1].s.EndTransaction(ctx, "T", c.WroteOffset, true); err == nil {
		t.Fatal("cut commit succeeded")
	}
	g.converge(1, all...)
	ends := map[int64]txn.Kind{a.WroteOffset: txn.Commit, b.WroteOffset: txn.Rollback}
	g.sameTxn(map[int64]int32{c.WroteOffset: 1, d.WroteOffset: 1}, ends, all...)

	g.closeMember(1)
	ld := g.failover(2, 3)
	s := g.m[ld].s
	nchk := &recChecker{}
	s.SetTransactionChecker(nchk)
	s.txnRound() // c: its message is there, its op is written; d: checked an interval ago, not yet
	if len(nchk.checks) != 0 {
		t.Fatalf("the new leader asked %+v", nchk.checks)
	}
	others := slices.DeleteFunc([]uint64{2, 3}, func(id uint64) bool { return id == ld })
	g.converge(ld, others...)
	ends[c.WroteOffset] = txn.Commit
	g.sameTxn(map[int64]int32{d.WroteOffset: 1}, ends, 2, 3)
	clk.Advance(10 * time.Second)
	s.txnRound()
	if nchk.count(d.WroteOffset) != 1 {
		t.Fatalf("the new leader's checks %+v, want d once", nchk.checks)
	}
	got := map[string]int{}
	for _, r := range pullAll(t, s, "T", 0) {
		got[string(r.Body)]++
	}
	if len(got) != 2 || got["a"] != 1 || got["c"] != 1 {
		t.Fatalf("T/0 holds %v, want a and c once", got)
	}

	g.open(1)
	// It closed cleanly: its start restored its own snapshot and replayed
	// no half or op record; what it missed comes through the hook.
	if sn := &g.m[1].s.txnSnap; !sn.restored || sn.replayed != 0 {
		t.Fatalf("node 1 after a clean restart: restored %v, replayed %d", sn.restored, sn.replayed)
	}
	g.converge(ld, all...)
	g.sameTxn(map[int64]int32{d.WroteOffset: 2}, ends, all...)
}
