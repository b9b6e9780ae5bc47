package consumequeue

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a real commitlog on MemFS and an index over it whose
// watermark the test moves.
type fixture struct {
	fs        vfs.FS
	log       *commitlog.Log
	idx       *Index
	watermark atomic.Int64
	failed    atomic.Pointer[error]
	next      map[Key]int64
}

func newFixture(t *testing.T, fs vfs.FS, mods ...func(*Options)) *fixture {
	t.Helper()
	nop := zerolog.Nop()
	if err := fs.MkdirAll("/d/commitlog"); err != nil {
		t.Fatal(err)
	}
	f := &fixture{fs: fs, next: map[Key]int64{}}
	l, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: 1 << 16, RequireCRC: true,
		Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		t.Fatal(err)
	}
	cp, _, err := ReadCheckpoint(fs, "/d")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Recover(cp.Flushed, cp.Dispatched); err != nil {
		t.Fatal(err)
	}
	l.Start()
	f.log = l
	opts := Options{FS: fs, Dir: "/d", EntriesPerFile: 1000, MaxOpenFiles: 4, CheckpointInterval: time.Hour,
		RequireCRC: true, AwaitTimeout: time.Second, Watermark: f.watermark.Load,
		Tombstones: func() map[string]int64 { return nil }, Delay: func(int) time.Duration { return time.Second },
		LastStoreTime: func() int64 { return 0 }, Fail: func(err error) { f.failed.Store(&err) },
		Faults: fault.New(&nop, logthrottle.New(time.Second, nil)), Clock: base.SystemClock, Logger: &nop}
	for _, mod := range mods {
		mod(&opts)
	}
	f.idx = New(l, opts)
	if err := f.idx.Load(l.MaxOffset(), func(topic string, qid int32) int64 { return cp.Queues[QueueName(topic, qid)] }); err != nil {
		t.Fatal(err)
	}
	if err := f.idx.Rebuild(max(cp.Dispatched, l.MinOffset()), l.MaxOffset(), cp); err != nil {
		t.Fatal(err)
	}
	for _, k := range f.idx.Keys() {
		f.next[k] = f.idx.Queue(k.Topic, k.Queue).Count()
	}
	f.watermark.Store(l.MaxOffset())
	t.Cleanup(func() {
		f.idx.Close()
		l.Close()
	})
	return f
}

func (f *fixture) put(t *testing.T, topic string, qid int32, tag string) int64 {
	t.Helper()
	sp := record.Spec{Topic: topic, QueueID: qid, Body: []byte("m"), StoreHost: netip.MustParseAddrPort("127.0.0.1:1"),
		PropCRC: true, Props: []record.Property{{Key: record.PropertyTags, Value: tag}}}
	sp.BodyCRC = record.BodyCRC(sp.Body)
	if ferr := sp.Size(); ferr != nil {
		t.Fatal(ferr)
	}
	k := Key{topic, qid}
	p, err := f.log.Append(sp.Total, nil, func(dst []byte, at int64) { sp.Encode(dst, f.next[k], at, 1) })
	if err != nil {
		t.Fatal(err)
	}
	f.next[k]++
	return p.At
}

// TestIndexFollowsWatermark: a round indexes exactly the records below
// the watermark, with their offsets and tags codes; AwaitDispatched
// covers a record once it is visible and gives up (not hangs) otherwise.
func TestIndexFollowsWatermark(t *testing.T) {
	f := newFixture(t, vfs.NewMem())
	a0 := f.put(t, "A", 0, "x")
	a1 := f.put(t, "A", 0, "y")
	f.watermark.Store(a1) // the second record is not visible yet
	f.idx.Run(f.watermark.Load())
	q := f.idx.Queue("A", 0)
	if q == nil || q.Count() != 1 {
		t.Fatalf("queue after a round to %d: %v", a1, q)
	}
	if phys, _, tags, ok := q.Get(0); !ok || phys != a0 || tags != record.TagsCode("x") {
		t.Fatalf("entry 0 = %d %d %v, want %d %d", phys, tags, ok, a0, record.TagsCode("x"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := f.idx.AwaitDispatched(ctx, f.log.MaxOffset()); err == nil {
		t.Fatal("AwaitDispatched returned nil for a record above the watermark")
	}
	f.watermark.Store(f.log.MaxOffset())
	if err := f.idx.AwaitDispatched(ctx, f.log.MaxOffset()); err != nil {
		t.Fatal(err)
	}
	if phys, _, _, ok := q.Get(1); !ok || phys != a1 || q.Count() != 2 {
		t.Fatalf("entry 1 = %d %v (count %d), want %d", phys, ok, q.Count(), a1)
	}
}

// TestCheckpointAndReload: a checkpoint records the dispatched offset and
// every queue's count, durably; an index reloaded from it serves the same
// entries and re-dispatches nothing below it.
func TestCheckpointAndReload(t *testing.T) {
	fs := vfs.NewMem()
	f := newFixture(t, fs)
	for i := range 30 {
		f.put(t, "B", int32(i%3), "t")
	}
	f.watermark.Store(f.log.MaxOffset())
	f.idx.Run(f.watermark.Load())
	if err := f.idx.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	cp, ok, err := ReadCheckpoint(fs, "/d")
	if err != nil || !ok || cp.Dispatched != f.log.MaxOffset() || cp.Queues["B/1"] != 10 {
		t.Fatalf("checkpoint %+v %v %v", cp, ok, err)
	}
	f.idx.Close()
	f.log.Close()
	g := newFixture(t, fs)
	for qid := range int32(3) {
		q := g.idx.Queue("B", qid)
		if q == nil || q.Count() != 10 {
			t.Fatalf("reloaded queue B/%d: %v", qid, q)
		}
	}
	if g.idx.Dispatched() != cp.Dispatched {
		t.Fatalf("reloaded dispatched %d, checkpoint %d", g.idx.Dispatched(), cp.Dispatched)
	}
}

// TestCorruptRecordIsSticky: a record the dispatcher cannot parse is
// damage no retry can fix: the round fails, Fail is told, nothing past it
// is indexed.
func TestCorruptRecordIsSticky(t *testing.T) {
	f := newFixture(t, vfs.NewMem())
	at := f.put(t, "C", 0, "t")
	f.put(t, "C", 0, "t")
	f.log.At(at)[record.PosMagic] ^= 0xff
	f.watermark.Store(f.log.MaxOffset())
	if err := f.idx.RunErr(f.watermark.Load()); !errors.Is(err, base.ErrCorrupt) {
		t.Fatalf("round over a damaged record: %v", err)
	}
	if p := f.failed.Load(); p == nil || !errors.Is(*p, base.ErrCorrupt) {
		t.Fatal("Fail was not told of the damage")
	}
	if q := f.idx.Queue("C", 0); q != nil && q.Count() != 0 {
		t.Fatalf("%d entries indexed past a damaged record", q.Count())
	}
}

// TestApplyHook: the system records' hook (Options.Apply) gets each
// record of a topic with an applier once, in log order, from the dispatch
// position StartApplyingPaused found on; not the records indexed before,
// not another topic's, and not a record indexed again (a round starting
// over from an earlier offset).
func TestApplyHook(t *testing.T) {
	var applied []int64
	f := newFixture(t, vfs.NewMem(), func(o *Options) {
		o.Apply = func(topic string) Applier {
			if topic != "SYS" {
				return nil
			}
			return func(phys int64, rec []byte) {
				h, err := record.Parse(rec)
				if err != nil || h.PhysOffset != phys || string(h.Topic) != "SYS" || int(h.Total) != len(rec) {
					t.Errorf("applier got %d bytes at %d: %v (physical offset %d, topic %s)", len(rec), phys, err, h.PhysOffset, h.Topic)
				}
				applied = append(applied, phys)
			}
		}
	})
	f.put(t, "SYS", 0, "s")
	f.watermark.Store(f.log.MaxOffset())
	f.idx.Run(f.watermark.Load())
	if len(applied) != 0 {
		t.Fatalf("applied %v before StartApplyingPaused", applied)
	}
	f.idx.Paused(f.idx.StartApplyingPaused)
	a := f.put(t, "A", 0, "x")
	s1 := f.put(t, "SYS", 0, "s")
	f.put(t, "A", 0, "y")
	s2 := f.put(t, "SYS", 0, "s")
	f.watermark.Store(f.log.MaxOffset())
	f.idx.Run(f.watermark.Load())
	if want := []int64{s1, s2}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	f.idx.SetNext(a) // index again from the first record after the start
	f.idx.Run(f.watermark.Load())
	s3 := f.put(t, "SYS", 0, "s")
	f.watermark.Store(f.log.MaxOffset())
	f.idx.Run(f.watermark.Load())
	if want := []int64{s1, s2, s3}; !slices.Equal(applied, want) {
		t.Fatalf("after indexing again: applied %v, want %v", applied, want)
	}
	if q := f.idx.Queue("SYS", 0); q == nil || q.Count() != 4 {
		t.Fatalf("the system topic's queue: %v", q)
	}
}
