package storage

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/txn"
	"github.com/storaged/storaged/storage/vfs"
)

// txnStateAfterOpen opens o and returns its transaction table (pending
// halves with their checks, the ends remembered in order, the records
// last applied), what Open did, and the store.
func txnStateAfterOpen(t *testing.T, o Options) (txn.Snapshot, bool, int, *Store) {
	t.Helper()
	return stateAfterOpen(t, o, func(s *Store) *tableSnapshot { return &s.txnSnap }, func(s *Store) txn.Snapshot {
		s.txn.Mu.Lock()
		st, _ := s.txn.Cut()
		s.txn.Mu.Unlock()
		st.Sort()
		return st
	})
}

func wantSameTxn(t *testing.T, what string, got, want txn.Snapshot) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: transactions\n%+v\nwant (the whole log replayed)\n%+v", what, got, want)
	}
}

func txnSnapshotOptions(fs vfs.FS, clk *storagetest.Clock) Options {
	o := powerLossOptions(fs, FlushSync)
	o.Clock, o.txnManual, o.TransactionCheckMax, o.TransactionCheckInterval = clk, true, 3, 10*time.Second
	return o
}

// txnRecordsPast is how many half and op records the log holds past the
// snapshot file of o's store (its two records): what Open must replay.
func txnRecordsPast(t *testing.T, s *Store) int {
	t.Helper()
	b, err := s.opts.FS.ReadFile(filepath.Join(s.opts.Dir, "config", txnSnapshotName))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := txn.DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	n := s.index.Queue(TransHalfTopic, 0).Count() - snap.Half.QueueOffset - 1
	if q := s.index.Queue(TransOpTopic, 0); q != nil {
		n += q.Count()
		if snap.Op.At >= 0 {
			n -= snap.Op.QueueOffset + 1
		}
	}
	return int(n)
}

// TestTxnSnapshotRestart: a clean Close writes the transaction table's
// snapshot and the next Open replays no half or op record; after more
// halves, ends and checks and a power cut, Open restores the snapshot
// and replays exactly the records after it; each time the table equals
// the one a replay of the whole log builds (pending halves with their
// check counts, the ends remembered and their order), and an end from
// before the restart is answered as before.
func TestTxnSnapshotRestart(t *testing.T) {
	fs := vfs.NewMem()
	clk := storagetest.NewClock(txnEpoch)
	o := txnSnapshotOptions(fs, clk)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	s.SetTransactionChecker(&recChecker{})
	ctx := context.Background()
	var halves []AppendResult
	for _, b := range []string{"a", "b", "c", "d", "e", "f"} {
		halves = append(halves, putHalf(t, s, "T", 0, b))
	}
	end := func(s *Store, i int, commit bool) {
		t.Helper()
		if _, err := s.EndTransaction(ctx, "T", halves[i].WroteOffset, commit); err != nil {
			t.Fatalf("end of %d: %v", i, err)
		}
	}
	end(s, 0, true)
	end(s, 1, false)
	clk.Advance(DefaultTransactionTimeout)
	s.txnRound() // checks c, d, e, f
	end(s, 2, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	withSnap, without := crashImages(t, fs, o, txnSnapshotName)
	full, fullRestored, fullReplayed, _ := txnStateAfterOpen(t, without)
	st, restored, replayed, s2 := txnStateAfterOpen(t, withSnap)
	if fullRestored || fullReplayed == 0 || !restored || replayed != 0 {
		t.Fatalf("after a clean close: restored %v, replayed %d (without the snapshot: %v, %d)", restored, replayed,
			fullRestored, fullReplayed)
	}
	wantSameTxn(t, "after a clean close", st, full)
	if len(st.Pending) != 3 || len(st.Done) != 3 || st.Pending[0].Checks != 1 {
		t.Fatalf("%d pending (first checked %d times), %d ended; want d, e, f checked once, and a, b, c ended",
			len(st.Pending), st.Pending[0].Checks, len(st.Done))
	}
	// A repeated end is answered from the remembered ends.
	if _, err := s2.EndTransaction(ctx, "T", halves[1].WroteOffset, true); !errors.Is(err, ErrTransactionEnded) {
		t.Fatalf("commit of a half rolled back before the restart: %v", err)
	}
	s2.Close()

	// More past the snapshot, then a power cut.
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if !s.txnSnap.restored {
		t.Fatal("the snapshot was not used")
	}
	s.SetTransactionChecker(&recChecker{})
	halves = append(halves, putHalf(t, s, "T", 0, "g"))
	end(s, 3, false)
	clk.Advance(10 * time.Second)
	s.txnRound() // checks e and f again, g once
	end(s, 6, true)
	want := txnRecordsPast(t, s) // the loop writes no snapshot of so few records: the images hold this one
	withSnap, without = closeOnImages(t, s, fs, o, txnSnapshotName)
	full, _, _, _ = txnStateAfterOpen(t, without)
	st, restored, replayed, _ = txnStateAfterOpen(t, withSnap)
	if !restored || replayed != want || want < 4 {
		t.Fatalf("after a power cut: restored %v, replayed %d; want the snapshot and the %d records after it", restored, replayed, want)
	}
	wantSameTxn(t, "after a power cut", st, full)
	if len(st.Pending) != 2 || st.Pending[0].Checks != 2 || len(st.Done) != 5 {
		t.Fatalf("pending %+v, %d ended; want e and f checked twice, 5 ended", st.Pending, len(st.Done))
	}
}

// TestTxnSnapshotHalvesOnly: a snapshot taken before any op record names
// none, and Open replays the whole op topic past it, ends of halves
// from before the snapshot included.
func TestTxnSnapshotHalvesOnly(t *testing.T) {
	fs := vfs.NewMem()
	clk := storagetest.NewClock(txnEpoch)
	o := txnSnapshotOptions(fs, clk)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	a := putHalf(t, s, "T", 0, "a")
	putHalf(t, s, "T", 0, "b")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	s.txn.Mu.Lock()
	cut, _ := s.txn.Cut()
	s.txn.Mu.Unlock()
	if !s.txnSnap.restored || cut.Op.At != -1 || len(cut.Pending) != 2 {
		t.Fatalf("restored %v, op record %d, %d pending; want the snapshot, none, 2", s.txnSnap.restored, cut.Op.At, len(cut.Pending))
	}
	if _, err := s.EndTransaction(context.Background(), "T", a.WroteOffset, true); err != nil {
		t.Fatal(err)
	}
	withSnap, without := closeOnImages(t, s, fs, o, txnSnapshotName)
	full, _, _, _ := txnStateAfterOpen(t, without)
	st, restored, replayed, _ := txnStateAfterOpen(t, withSnap)
	if !restored || replayed != 1 {
		t.Fatalf("restored %v, replayed %d; want the snapshot and the one op record", restored, replayed)
	}
	wantSameTxn(t, "after a power cut", st, full)
	if len(st.Pending) != 1 || len(st.Done) != 1 {
		t.Fatalf("%d pending, %d ended; want 1 and 1", len(st.Pending), len(st.Done))
	}
}

// TestTxnSnapshotNotUsed: Open replays both topics whole, and builds the
// table the log holds, when the snapshot is damaged or names an op or a
// half record the log no longer holds (cut by a repair).
func TestTxnSnapshotNotUsed(t *testing.T) {
	for _, tc := range []string{"damaged", "op cut", "half cut"} {
		t.Run(tc, func(t *testing.T) {
			clk := storagetest.NewClock(txnEpoch)
			dir := t.TempDir()
			s := openTxnTest(t, dir, clk, FlushSync, nil)
			a := putHalf(t, s, "T", 0, "a")
			b := putHalf(t, s, "T", 0, "b")
			if _, err := s.EndTransaction(context.Background(), "T", a.WroteOffset, false); err != nil {
				t.Fatal(err)
			}
			op, _, _, _ := s.index.Queue(TransOpTopic, 0).Get(0)
			o := s.opts
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "config", txnSnapshotName)
			want := map[string][2]int{"damaged": {3, 1}, "op cut": {2, 2}, "half cut": {1, 1}}[tc] // replayed, pending
			switch tc {
			case "damaged":
				flipMiddleByte(t, o.FS, path)
			case "op cut":
				if err := Repair(o, op); err != nil {
					t.Fatal(err)
				}
			case "half cut":
				if err := Repair(o, b.WroteOffset); err != nil {
					t.Fatal(err)
				}
			}
			st, restored, replayed, _ := txnStateAfterOpen(t, o)
			if restored || replayed != want[0] || len(st.Pending) != want[1] {
				t.Fatalf("restored %v, replayed %d, %d pending; want the whole topics (%d records), %d pending",
					restored, replayed, len(st.Pending), want[0], want[1])
			}
		})
	}
}

// TestTxnSnapshotWhileRunning: the running loop's round writes the
// transaction snapshot once max(every, the table's size) records were
// applied since the last one, and only naming synced records.
func TestTxnSnapshotWhileRunning(t *testing.T) {
	fs := vfs.NewMem()
	o := unsyncedOptions(txnSnapshotOptions(fs, storagetest.NewClock(txnEpoch)))
	s, exists := openSnapshotRounds(t, o, 3, txnSnapshotName)
	a := putHalf(t, s, "T", 0, "a")
	putHalf(t, s, "T", 0, "b") // 2 records, size 2
	if _, err := s.log.Sync(0); err != nil {
		t.Fatal(err)
	}
	s.stateSnapshotRound()
	if exists() {
		t.Fatal("a snapshot after 2 records, fewer than max(every, size) = 3")
	}
	// The op is put in async mode: answered before it is synced.
	if _, err := s.EndTransaction(context.Background(), "T", a.WroteOffset, false); err != nil {
		t.Fatal(err) // 3 records, size 2 (b pending, a ended)
	}
	snap, err := txn.DecodeSnapshot(snapshotOnSync(t, s, txnSnapshotName))
	if err != nil {
		t.Fatal(err)
	}
	half, _, _, _ := s.index.Queue(TransHalfTopic, 0).Get(1)
	op, _, _, _ := s.index.Queue(TransOpTopic, 0).Get(0)
	if snap.Half.At != half || snap.Half.QueueOffset != 1 || snap.Op.At != op || snap.Op.QueueOffset != 0 ||
		len(snap.Pending) != 1 || len(snap.Done) != 1 {
		t.Fatalf("snapshot %+v; want the half at %d (queue offset 1), the op at %d (0), 1 pending, 1 ended", snap, half, op)
	}
}

// BenchmarkOpenTransactions: Open (and Close) of a store whose log holds
// 100,000 transactional messages, each a half committed at once (a half
// record, the message, an op record; the dedup window off), from the
// snapshot a clean close writes and, with the snapshot removed before
// each Open, by replaying both topics whole. records/op is what Open
// replayed.
func BenchmarkOpenTransactions(b *testing.B) {
	const messages = 100_000
	o := Options{Dir: b.TempDir(), FileSize: 256 << 20, DedupWindow: -1, txnManual: true}
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range messages {
		m := msg("T", "x")
		m.SysFlag = TransactionPreparedType
		res, err := s.PutMessage(ctx, m)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.EndTransaction(ctx, "T", res.Append.WroteOffset, i%10 != 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	benchmarkOpenState(b, o, txnSnapshotName, func(s *Store) int {
		if n := s.PendingTransactions(); n != 0 {
			b.Fatalf("%d pending, want 0", n)
		}
		return s.txnSnap.replayed
	})
}
