package storage

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/vfs"
)

// offsetsAfterOpen opens o, returns its whole offset table (values and
// the record each lies at) and what Open did, and closes it.
func offsetsAfterOpen(t *testing.T, o Options) (es []offsets.Entry, restored bool, replayed int) {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer s.Close()
	return s.offsets.Entries(), s.offSnap.restored, s.offSnap.replayed
}

func snapPath(o Options) string { return filepath.Join(o.Dir, "config", offsetsSnapshotName) }

// crashImages returns two identical power-loss images of fs (the same
// seed): one to open as it is, one to open without the snapshot file
// config/name, so that the table a start builds from the snapshot is
// compared with the one it builds from the whole log.
func crashImages(t *testing.T, fs *vfs.MemFS, o Options, name string) (withSnap, without Options) {
	t.Helper()
	withSnap, without = o, o
	withSnap.FS = fs.Crash(rand.New(rand.NewPCG(3, 5)))
	img := fs.Crash(rand.New(rand.NewPCG(3, 5)))
	if err := img.Remove(filepath.Join(o.Dir, "config", name)); err != nil {
		t.Fatalf("remove the snapshot from the second image: %v", err)
	}
	without.FS = img
	return withSnap, without
}

// closeOnImages takes crashImages of s's files while s is paused at a
// consistent point (a power cut there), then closes s.
func closeOnImages(t *testing.T, s *Store, fs *vfs.MemFS, o Options, name string) (withSnap, without Options) {
	t.Helper()
	resume := s.pause()
	withSnap, without = crashImages(t, fs, o, name)
	resume()
	s.Close()
	return withSnap, without
}

// unsyncedOptions is o in async mode with no flush or checkpoint while a
// test runs: nothing syncs but the test (and Close), so it decides which
// records a snapshot may name.
func unsyncedOptions(o Options) Options {
	o.FlushMode = FlushAsync
	o.FlushInterval, o.FlushLeastPages, o.FlushThoroughInterval, o.CheckpointInterval = time.Hour, 1<<20, time.Hour, time.Hour
	return o
}

// openSnapshotRounds opens o (closed by the test's cleanup) with the
// snapshot loop halted, so that the test runs its rounds
// (stateSnapshotRound), each writing a table's snapshot after every
// records; exists says whether config/name is there.
func openSnapshotRounds(t *testing.T, o Options, every uint64, name string) (s *Store, exists func() bool) {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.haltStateSnapshots()
	s.snaps.every = every
	return s, func() bool {
		_, err := o.FS.ReadFile(filepath.Join(o.Dir, "config", name))
		return err == nil
	}
}

// snapshotOnSync runs a round of the halted loop before and after a sync
// of the log: the first must write nothing (the last record applied is
// not synced), the second must; it returns the file config/name.
func snapshotOnSync(t *testing.T, s *Store, name string) []byte {
	t.Helper()
	path := filepath.Join(s.opts.Dir, "config", name)
	s.stateSnapshotRound()
	if _, err := s.opts.FS.ReadFile(path); err == nil {
		t.Fatal("a snapshot naming a record not yet synced")
	}
	if _, err := s.log.Sync(0); err != nil {
		t.Fatal(err)
	}
	s.stateSnapshotRound()
	b, err := s.opts.FS.ReadFile(path)
	if err != nil {
		t.Fatalf("no snapshot once the records were synced: %v", err)
	}
	return b
}

func wantSameOffsets(t *testing.T, what string, got, want []offsets.Entry) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: offsets\n%+v\nwant (the whole log replayed)\n%+v", what, got, want)
	}
}

// TestOffsetsSnapshotRestart: a clean Close writes the snapshot and the
// next Open replays no offset record; after more commits and a power cut
// Open restores the snapshot and replays exactly the records after it,
// and the table equals the one a replay of the whole log builds (values
// and the records they lie at, which the rewrite rule reads).
func TestOffsetsSnapshotRestart(t *testing.T) {
	fs := vfs.NewMem()
	o := powerLossOptions(fs, FlushSync)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, topic := range []string{"A", "B"} {
		if _, err := s.PutMessages(ctx, &Batch{Topic: topic, Messages: manySmall(20, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 60 {
		mustCommit(t, s, fmt.Sprintf("g%d", i%3), []string{"A", "B"}[i%2], 0, int64(i%20))
	}
	before := s.offsets.Entries()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var logs logLines
	ol := o
	ol.Logger = logs.logger()
	es, restored, replayed := offsetsAfterOpen(t, ol)
	if !restored || replayed != 0 {
		t.Fatalf("after a clean close: restored %v, replayed %d; want the snapshot and no record", restored, replayed)
	}
	// The start says what it replayed.
	if logs.count(`"offset_records":0,"offsets_from_snapshot":true,"pop_records":0,"pop_from_snapshot":false`) != 1 {
		t.Fatalf("no line of the rebuild in the start's log:\n%s", logs.buf.String())
	}
	wantSameOffsets(t, "after a clean close", es, before)

	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	const more = 7
	for i := range more {
		mustCommit(t, s, "g9", "A", 0, int64(i))
	}
	withSnap, without := closeOnImages(t, s, fs, o, offsetsSnapshotName)
	full, fullRestored, fullReplayed := offsetsAfterOpen(t, without)
	if fullRestored || fullReplayed != 60+more {
		t.Fatalf("without the snapshot: restored %v, replayed %d; want %d records", fullRestored, fullReplayed, 60+more)
	}
	es, restored, replayed = offsetsAfterOpen(t, withSnap)
	if !restored || replayed != more {
		t.Fatalf("after a power cut: restored %v, replayed %d; want the snapshot and the %d records after it", restored, replayed, more)
	}
	wantSameOffsets(t, "after a power cut", es, full)
	if v := full[len(full)-1]; v.Key.Group != "g9" || v.Offset != more-1 {
		t.Fatalf("the commits after the snapshot are missing: last entry %+v", v)
	}
}

// TestOffsetsSnapshotNotUsed: Open replays the whole offset topic, and
// builds the table the log holds, when the snapshot is damaged or names a
// record the log no longer holds as it was: cut by a repair, or cut and
// written again with another value at the same place.
func TestOffsetsSnapshotNotUsed(t *testing.T) {
	setup := func(t *testing.T) (Options, int64) {
		s, o := openTest(t, nil)
		if _, err := s.PutMessages(context.Background(), &Batch{Topic: "T", Messages: manySmall(10, 8)}); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, s, "g", "T", 0, 3)
		mustCommit(t, s, "h", "T", 0, 4)
		mustCommit(t, s, "g", "T", 0, 5) // the snapshot's record
		q := s.index.Queue(OffsetTopic, 0)
		last, _, _, _ := q.Get(q.Count() - 1)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return o, last
	}
	t.Run("damaged", func(t *testing.T) {
		o, _ := setup(t)
		b, err := o.withDefaults().FS.ReadFile(snapPath(o))
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x10
		if err := o.withDefaults().FS.WriteFile(snapPath(o), b); err != nil {
			t.Fatal(err)
		}
		_, restored, replayed := offsetsAfterOpen(t, o)
		if restored || replayed != 3 {
			t.Fatalf("restored %v, replayed %d; want the whole topic (3)", restored, replayed)
		}
	})
	t.Run("cut", func(t *testing.T) {
		o, last := setup(t)
		if err := Repair(o, last); err != nil {
			t.Fatal(err)
		}
		s, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.offSnap.restored || s.offSnap.replayed != 2 {
			t.Fatalf("restored %v, replayed %d; want the 2 records left", s.offSnap.restored, s.offSnap.replayed)
		}
		wantOffset(t, s, "g", "T", 0, 3) // the cut commit of 5 is gone
		wantOffset(t, s, "h", "T", 0, 4)
	})
	t.Run("written again", func(t *testing.T) {
		o, last := setup(t)
		old, err := o.withDefaults().FS.ReadFile(snapPath(o))
		if err != nil {
			t.Fatal(err)
		}
		if err := Repair(o, last); err != nil {
			t.Fatal(err)
		}
		s, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		mustCommit(t, s, "g", "T", 0, 7) // the same place and queue offset, another body
		q := s.index.Queue(OffsetTopic, 0)
		if phys, _, _, _ := q.Get(q.Count() - 1); phys != last || q.Count() != 3 {
			t.Fatalf("the new commit is at %d (queue offset %d), not where the cut one was (%d, 2)", phys, q.Count()-1, last)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// The old snapshot, naming the cut record's place and queue offset.
		if err := o.withDefaults().FS.WriteFile(snapPath(o), old); err != nil {
			t.Fatal(err)
		}
		s, err = Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.offSnap.restored || s.offSnap.replayed != 3 {
			t.Fatalf("restored %v, replayed %d; want the whole topic (3)", s.offSnap.restored, s.offSnap.replayed)
		}
		wantOffset(t, s, "g", "T", 0, 7)
	})
}

// TestOffsetsSnapshotTopicDeleted: a topic deleted after the snapshot
// keeps none of its offsets at the next start (the tombstone rule a
// replay applies to records, applied to the restored entries), and the
// offsets of the topic created again after it stay.
func TestOffsetsSnapshotTopicDeleted(t *testing.T) {
	fs := vfs.NewMem()
	o := powerLossOptions(fs, FlushSync)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, topic := range []string{"X", "Y"} {
		if _, err := s.PutMessages(ctx, &Batch{Topic: topic, Messages: manySmall(5, 8)}); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, s, "g", topic, 0, 2)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if !s.offSnap.restored {
		t.Fatal("the snapshot was not used")
	}
	if _, err := s.DeleteTopic("X"); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, "g", "Y", 0, 3)
	if _, err := s.PutMessages(ctx, &Batch{Topic: "X", Messages: manySmall(3, 8)}); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, "h", "X", 0, 1)
	withSnap, without := closeOnImages(t, s, fs, o, offsetsSnapshotName)
	full, _, _ := offsetsAfterOpen(t, without)
	es, restored, replayed := offsetsAfterOpen(t, withSnap)
	if !restored || replayed != 2 {
		t.Fatalf("restored %v, replayed %d; want the snapshot and 2 records", restored, replayed)
	}
	wantSameOffsets(t, "after the delete", es, full)
	want := []offsets.Key{{Group: "g", Topic: "Y", Queue: 0}, {Group: "h", Topic: "X", Queue: 0}}
	var keys []offsets.Key
	for _, e := range es {
		keys = append(keys, e.Key)
	}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys %v, want %v (g's offset of the deleted X gone)", keys, want)
	}
}

// TestOffsetsSnapshotWhileRunning: the running loop's round writes a
// snapshot once max(every, keys) records were applied since the last one,
// only naming a record the log has synced, and writes nothing when
// nothing new was applied.
func TestOffsetsSnapshotWhileRunning(t *testing.T) {
	fs := vfs.NewMem()
	o := unsyncedOptions(powerLossOptions(fs, FlushAsync))
	s, exists := openSnapshotRounds(t, o, 10, offsetsSnapshotName)
	if _, err := s.PutMessages(context.Background(), &Batch{Topic: "T", Messages: manySmall(30, 8)}); err != nil {
		t.Fatal(err)
	}
	commit := func(from, to int) {
		for i := from; i < to; i++ {
			mustCommit(t, s, fmt.Sprintf("g%d", i%2), "T", 0, int64(i))
		}
	}
	commit(0, 9)
	if _, err := s.log.Sync(0); err != nil {
		t.Fatal(err)
	}
	s.stateSnapshotRound()
	if exists() {
		t.Fatal("a snapshot after 9 records, fewer than every (10)")
	}
	commit(9, 12)
	b := snapshotOnSync(t, s, offsetsSnapshotName)
	snap, err := offsets.DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	q := s.index.Queue(OffsetTopic, 0)
	last, _, _, _ := q.Get(q.Count() - 1)
	if snap.At != last || snap.QueueOffset != 11 || !reflect.DeepEqual(snap.Entries, s.offsets.Entries()) {
		t.Fatalf("snapshot at %d (queue offset %d) with %+v; want %d (11) with %+v", snap.At, snap.QueueOffset, snap.Entries,
			last, s.offsets.Entries())
	}
	s.stateSnapshotRound() // nothing applied since
	commit(12, 13)
	if _, err := s.log.Sync(0); err != nil {
		t.Fatal(err)
	}
	s.stateSnapshotRound() // 1 record since, synced: below every
	if b2, _ := fs.ReadFile(snapPath(o)); string(b2) != string(b) {
		t.Fatal("a snapshot was written again with fewer than every records applied since")
	}
}

// BenchmarkOpenConsumerOffsets: Open (and Close) of a store whose log
// holds a million offset commits over 1,000 keys (the dedup window off,
// so that Open's other work is small), from the snapshot a clean close
// writes and, with the snapshot removed before each Open, by replaying
// every commit. records/op is what Open replayed.
func BenchmarkOpenConsumerOffsets(b *testing.B) {
	const commits, keys = 1_000_000, 1000
	o := Options{Dir: b.TempDir(), FileSize: 256 << 20, DedupWindow: -1}
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for q := range 8 {
		if _, err := s.PutMessages(ctx, &Batch{Topic: "T", QueueID: int32(q), Messages: manySmall(10, 8)}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range commits {
		if err := s.CommitOffset(ctx, fmt.Sprintf("g%d", i%(keys/8)), "T", int32(i%8), int64(i%10)); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	benchmarkOpenState(b, o, offsetsSnapshotName, func(s *Store) int {
		if s.offsets.Len() != keys {
			b.Fatalf("%d keys, want %d", s.offsets.Len(), keys)
		}
		return s.offSnap.replayed
	})
}

// benchmarkOpenState times Open and Close of the data dir o names, as a
// clean close left it (sub-benchmark snapshot) and with the snapshot
// config/name removed before each Open (replay); check checks the store
// Open built and returns the records it replayed, reported as records/op.
func benchmarkOpenState(b *testing.B, o Options, name string, check func(*Store) int) {
	for _, tc := range []struct {
		name     string
		snapshot bool
	}{{"snapshot", true}, {"replay", false}} {
		b.Run(tc.name, func(b *testing.B) {
			replayed := 0
			for b.Loop() {
				if !tc.snapshot {
					b.StopTimer()
					if err := os.Remove(filepath.Join(o.Dir, "config", name)); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				s, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				replayed = check(s)
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(replayed), "records/op")
		})
	}
}
