package storage

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/pop"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/vfs"
)

// stateAfterOpen opens o (closed by the test's cleanup) and returns what
// cut takes of a table of the store, what Open did with that table's
// snapshot (sn), and the store.
func stateAfterOpen[T any](t *testing.T, o Options, sn func(*Store) *tableSnapshot, cut func(*Store) T) (T, bool, int, *Store) {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return cut(s), sn(s).restored, sn(s).replayed, s
}

// popStateAfterOpen opens o and returns its POP cursors and messages in
// flight (with the records they lie at), what Open did, and the store.
func popStateAfterOpen(t *testing.T, o Options) (pop.Snapshot, bool, int, *Store) {
	t.Helper()
	return stateAfterOpen(t, o, func(s *Store) *tableSnapshot { return &s.popSnap }, func(s *Store) pop.Snapshot {
		s.pop.Mu.Lock()
		st, _ := s.pop.Cut()
		s.pop.Mu.Unlock()
		st.Sort()
		return st
	})
}

// flipMiddleByte damages the file at path: one bit of its middle byte.
func flipMiddleByte(t *testing.T, fs vfs.FS, path string) {
	t.Helper()
	b, err := fs.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := fs.WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
}

func wantSamePop(t *testing.T, what string, got, want pop.Snapshot) {
	t.Helper()
	if !reflect.DeepEqual(got.Cursors, want.Cursors) || !reflect.DeepEqual(got.Inflight, want.Inflight) {
		t.Fatalf("%s: POP state\n%+v\n%+v\nwant (the whole log replayed)\n%+v\n%+v", what, got.Cursors, got.Inflight,
			want.Cursors, want.Inflight)
	}
}

// TestPopSnapshotRestart: a clean Close writes the POP table's snapshot
// and the next Open replays no POP record, its receipt handles still
// good; after more receives and acks and a power cut, Open restores the
// snapshot and replays exactly the records after it, and the state
// equals the one a replay of the whole log builds; a topic deleted after
// the snapshot keeps none of its state.
func TestPopSnapshotRestart(t *testing.T) {
	fs := vfs.NewMem()
	clk := storagetest.NewClock(popEpoch)
	o := powerLossOptions(fs, FlushSync)
	o.Clock, o.DefaultQueues = clk, 3
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	putBodies(t, s, "T", "a", "b", "c", "d", "e", "f")
	putBodies(t, s, "U", "u1", "u2", "u3")
	got := mustPop(t, s, popReq("g", "T", 4))
	if errs, err := s.PopAck(ctx, "g", "T", []string{got[0].Handle, got[1].Handle}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	mustPop(t, s, popReq("h", "T", 2))
	gotU := mustPop(t, s, popReq("g", "U", 2))
	if len(got) != 4 || len(gotU) != 2 {
		t.Fatalf("received %d and %d, want 4 and 2", len(got), len(gotU))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	withSnap, without := crashImages(t, fs, o, popSnapshotName)
	full, fullRestored, fullReplayed, _ := popStateAfterOpen(t, without)
	st, restored, replayed, s2 := popStateAfterOpen(t, withSnap)
	if fullRestored || fullReplayed == 0 || !restored || replayed != 0 {
		t.Fatalf("after a clean close: restored %v, replayed %d (without the snapshot: %v, %d)", restored, replayed,
			fullRestored, fullReplayed)
	}
	wantSamePop(t, "after a clean close", st, full)
	if len(st.Inflight) != 6 || len(st.Cursors) < 3 {
		t.Fatalf("%d in flight, %d cursors; want 6 (g: 2 of T and 2 of U, h: 2), and a cursor for each queue popped",
			len(st.Inflight), len(st.Cursors))
	}
	// The handles given before the restart are good after it.
	if errs, err := s2.PopAck(ctx, "g", "T", []string{got[2].Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack of a handle from before the restart: %v %v", errs, err)
	}
	s2.Close()

	// More changes past the snapshot, a topic delete among them, then a
	// power cut.
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if !s.popSnap.restored {
		t.Fatal("the snapshot was not used")
	}
	before := s.popSnap.replayed
	if errs, err := s.PopAck(ctx, "g", "T", []string{got[3].Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	mustPop(t, s, popReq("h", "T", 1))
	if _, err := s.DeleteTopic("U"); err != nil {
		t.Fatal(err)
	}
	withSnap, without = closeOnImages(t, s, fs, o, popSnapshotName)
	full, _, _, _ = popStateAfterOpen(t, without)
	st, restored, replayed, _ = popStateAfterOpen(t, withSnap)
	if !restored || replayed != before+2 {
		t.Fatalf("after a power cut: restored %v, replayed %d; want the snapshot and the %d records after it", restored, replayed,
			before+2)
	}
	wantSamePop(t, "after a power cut", st, full)
	for _, it := range st.Inflight {
		if it.Key.Topic == "U" {
			t.Fatalf("a message of the deleted topic U is in flight: %+v", it)
		}
	}
}

// TestPopSnapshotNotUsed: Open replays every POP record, and builds the
// state the log holds, when the snapshot is damaged or names a record the
// log no longer holds (cut by a repair).
func TestPopSnapshotNotUsed(t *testing.T) {
	for _, tc := range []string{"damaged", "cut"} {
		t.Run(tc, func(t *testing.T) {
			clk := storagetest.NewClock(popEpoch)
			dir := t.TempDir()
			s := openPopTest(t, dir, clk, nil)
			putBodies(t, s, "T", "a", "b", "c")
			mustPop(t, s, popReq("g", "T", 1))
			mustPop(t, s, popReq("g", "T", 1))
			q := s.index.Queue(PopTopic, 0)
			last, _, _, _ := q.Get(q.Count() - 1)
			o := s.opts
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "config", popSnapshotName)
			switch tc {
			case "damaged":
				flipMiddleByte(t, o.FS, path)
			case "cut":
				if err := Repair(o, last); err != nil {
					t.Fatal(err)
				}
			}
			st, restored, replayed, _ := popStateAfterOpen(t, o)
			want := map[string]int{"damaged": 2, "cut": 1}[tc]
			if restored || replayed != want {
				t.Fatalf("restored %v, replayed %d; want the whole topic (%d)", restored, replayed, want)
			}
			if len(st.Inflight) != want {
				t.Fatalf("%d in flight, want %d", len(st.Inflight), want)
			}
		})
	}
}

// TestPopSnapshotWhileRunning: the running loop's round writes the POP
// snapshot once max(every, the table's size) ops were applied since the
// last one, and only naming a synced record.
func TestPopSnapshotWhileRunning(t *testing.T) {
	fs := vfs.NewMem()
	o := unsyncedOptions(powerLossOptions(fs, FlushAsync))
	o.Clock, o.DefaultQueues = storagetest.NewClock(popEpoch), 1
	s, exists := openSnapshotRounds(t, o, 3, popSnapshotName)
	for _, b := range []string{"a", "b", "c", "d"} {
		if _, err := s.PutMessage(context.Background(), msg("T", b)); err != nil {
			t.Fatal(err)
		}
	}
	m1 := mustPop(t, s, popReq("g", "T", 1)) // a Set op: the cursor and a message in flight, size 2
	mustPop(t, s, popReq("g", "T", 1))       // size 3
	if _, err := s.log.Sync(0); err != nil {
		t.Fatal(err)
	}
	s.stateSnapshotRound()
	if exists() {
		t.Fatal("a snapshot after 2 ops, fewer than max(every, size) = 3")
	}
	if errs, err := s.PopAck(context.Background(), "g", "T", []string{m1[0].Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err) // a Drop op: 3 ops, size 2
	}
	snap, err := pop.DecodeSnapshot(snapshotOnSync(t, s, popSnapshotName))
	if err != nil {
		t.Fatal(err)
	}
	q := s.index.Queue(PopTopic, 0)
	last, _, _, _ := q.Get(q.Count() - 1)
	if snap.At != last || snap.QueueOffset != q.Count()-1 || len(snap.Inflight) != 1 {
		t.Fatalf("snapshot at %d (queue offset %d) with %d in flight; want %d (%d) with 1", snap.At, snap.QueueOffset,
			len(snap.Inflight), last, q.Count()-1)
	}
}

// BenchmarkOpenPopState: Open (and Close) of a store whose log holds
// 100,000 messages each received and acknowledged by a POP consumer, in
// receives of 32 (about 103,000 POP records; the dedup window off), from
// the snapshot a clean close writes and, with the snapshot removed before
// each Open, by replaying every POP record. records/op is what Open
// replayed.
func BenchmarkOpenPopState(b *testing.B) {
	const messages, batch = 100_000, 32
	o := Options{Dir: b.TempDir(), FileSize: 256 << 20, DedupWindow: -1, DefaultQueues: 8}
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < messages; i += 100 {
		if _, err := s.PutMessages(ctx, &Batch{Topic: "T", QueueID: int32(i / 100 % 8), Messages: manySmall(100, 8)}); err != nil {
			b.Fatal(err)
		}
	}
	for acked := 0; acked < messages; {
		ms, err := s.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: batch, Invisible: time.Minute})
		if err != nil || len(ms) == 0 {
			b.Fatalf("receive after %d: %d, %v", acked, len(ms), err)
		}
		for _, m := range ms {
			if errs, err := s.PopAck(ctx, "g", "T", []string{m.Handle}); err != nil || errs[0] != nil {
				b.Fatalf("ack: %v %v", errs, err)
			}
		}
		acked += len(ms)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	benchmarkOpenState(b, o, popSnapshotName, func(s *Store) int {
		if n := s.PopInflight("g"); n != 0 {
			b.Fatalf("%d in flight, want 0", n)
		}
		return s.popSnap.replayed
	})
}
