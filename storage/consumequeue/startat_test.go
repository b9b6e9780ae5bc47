package consumequeue

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// TestStartAt: queues started at k > 0 (inside a file, at a file start,
// and one that never gets an entry) take their first entry at k, never
// serve an offset below it, keep RocketMQ's blank entries before k in
// their first file, and come back the same after a checkpoint, a power
// cut (MemFS crash image) and a reload; a second StartAt of a queue is
// refused, and a queue not started so still refuses a first entry past 0.
func TestStartAt(t *testing.T) {
	fs := vfs.NewMem()
	f := newFixture(t, fs) // 1,000 entries a file
	starts := map[string]int64{"A": 1234, "B": 2000, "C": 5}
	for topic, k := range starts {
		if err := f.idx.StartAt(topic, 0, k); err != nil {
			t.Fatal(err)
		}
		f.next[Key{topic, 0}] = k
	}
	if err := f.idx.StartAt("A", 0, 7); err == nil {
		t.Fatal("a second StartAt of A/0 was accepted")
	}
	var aPhys, bPhys []int64
	for range 3 {
		aPhys = append(aPhys, f.put(t, "A", 0, "a"))
	}
	for range 2 {
		bPhys = append(bPhys, f.put(t, "B", 0, "b"))
	}
	f.watermark.Store(f.log.MaxOffset())
	f.idx.Run(f.watermark.Load())
	check := func(idx *Index, when string) {
		t.Helper()
		for _, tc := range []struct {
			topic string
			phys  []int64
		}{{"A", aPhys}, {"B", bPhys}, {"C", nil}} {
			q := idx.Queue(tc.topic, 0)
			k := starts[tc.topic]
			if q == nil || q.Min() != k || q.Count() != k+int64(len(tc.phys)) {
				t.Fatalf("%s: queue %s/0: %v, want [%d, %d)", when, tc.topic, q, k, k+int64(len(tc.phys)))
			}
			if _, _, _, ok := q.Get(k - 1); ok {
				t.Fatalf("%s: %s/0 serves offset %d below its start", when, tc.topic, k-1)
			}
			for i, p := range tc.phys {
				if phys, _, _, ok := q.Get(k + int64(i)); !ok || phys != p {
					t.Fatalf("%s: %s/0 entry %d = %d %v, want %d", when, tc.topic, k+int64(i), phys, ok, p)
				}
			}
		}
	}
	check(f.idx, "after dispatch")
	if err := f.idx.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// The blank before A's start, as RocketMQ writes it.
	b, err := fs.ReadFile(filepath.Join("/d", "consumequeue", "A", "0", segment.FileName(1000*cqEntrySize)))
	if err != nil {
		t.Fatal(err)
	}
	if e := b[233*cqEntrySize:]; binary.BigEndian.Uint64(e) != 0 || binary.BigEndian.Uint32(e[8:]) != 1<<31-1 {
		t.Fatalf("entry 1233 of A/0 is %x, want a blank", e[:cqEntrySize])
	}
	img := fs.Crash(nil) // everything was synced by the checkpoint
	f.idx.Close()
	f.log.Close()
	check(newFixture(t, fs).idx, "after a reload")
	check(newFixture(t, img).idx, "after a power cut")

	// A queue that was not started so still refuses a first entry past 0.
	g := newFixture(t, vfs.NewMem())
	g.next[Key{"D", 0}] = 3
	g.put(t, "D", 0, "d")
	g.watermark.Store(g.log.MaxOffset())
	if err := g.idx.RunErr(g.watermark.Load()); err == nil {
		t.Fatal("a first entry at 3 of a queue not started there was indexed")
	}
}
