package storage

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/dedup"
)

func uniq(id string) Property { return Property{Key: PropertyUniqKey, Value: id} }

// putOK puts m and fails the test unless it is PUT_OK.
func putOK(t *testing.T, s *Store, m *Message) AppendResult {
	t.Helper()
	res, err := s.PutMessage(context.Background(), m)
	if err != nil || res.Status != PutOK {
		t.Fatalf("put %q: %v, %v", m.Body, res.Status, err)
	}
	return res.Append
}

// sameAppend reports whether two answers name the same stored message.
func sameAppend(a, b AppendResult) bool {
	return a.WroteOffset == b.WroteOffset && a.WroteBytes == b.WroteBytes && a.QueueOffset == b.QueueOffset &&
		a.QueueID == b.QueueID && a.Topic == b.Topic && a.StoreTimestamp == b.StoreTimestamp && a.MsgNum == b.MsgNum &&
		a.MsgID() == b.MsgID() && fmt.Sprint(a.Offsets) == fmt.Sprint(b.Offsets)
}

// queueLen is the max offset of a queue (0 when it does not exist).
func queueLen(t *testing.T, s *Store, topic string, qid int32) int64 {
	t.Helper()
	_, n, err := s.QueueInfo(topic, qid)
	if errors.Is(err, ErrQueueNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPutIdempotent: in both flush modes, a put repeated with the same
// UNIQ_KEY on the same topic is answered with the first put's result and
// stores nothing; the same key on another topic, a delayed put, and puts
// without a key are puts of their own.
func TestPutIdempotent(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, _ := openTest(t, func(o *Options) { o.FlushMode = mode })
			first := putOK(t, s, msg("T", "one", uniq("k1")))
			end := s.log.MaxOffset()
			for range 3 {
				if again := putOK(t, s, msg("T", "one", uniq("k1"))); !sameAppend(again, first) {
					t.Fatalf("retry answered %+v, first %+v", again, first)
				}
			}
			if s.log.MaxOffset() != end || queueLen(t, s, "T", 0) != 1 {
				t.Fatalf("a retry stored something: log end %d -> %d, queue %d", end, s.log.MaxOffset(), queueLen(t, s, "T", 0))
			}
			// Another topic, or a delayed put, with the same key: stored.
			if other := putOK(t, s, msg("U", "one", uniq("k1"))); other.Topic != "U" || other.WroteOffset == first.WroteOffset {
				t.Fatalf("same key on another topic: %+v", other)
			}
			delayed := putOK(t, s, msg("T", "later", uniq("k1"), Property{Key: PropertyDelayLevel, Value: "2"}))
			if delayed.Topic != ScheduleTopic || delayed.QueueID != 1 {
				t.Fatalf("delayed: %+v", delayed)
			}
			if again := putOK(t, s, msg("T", "later", uniq("k1"), Property{Key: PropertyDelayLevel, Value: "2"})); !sameAppend(again, delayed) {
				t.Fatalf("delayed retry answered %+v, first %+v", again, delayed)
			}
			// No key: every put is stored.
			putOK(t, s, msg("T", "plain"))
			putOK(t, s, msg("T", "plain"))
			if n := queueLen(t, s, "T", 0); n != 3 {
				t.Fatalf("queue T has %d messages, want 3 (one keyed, two plain)", n)
			}
			st := s.Stats()
			if st.Dedup.Hits != 4 || st.Dedup.Keys != 3 || st.Puts["PUT_OK"] != 5 {
				t.Errorf("stats: dedup %+v, puts %v; want 4 hits, 3 keys, 5 puts stored", st.Dedup, st.Puts)
			}
		})
	}
}

// TestPutIdempotentConcurrent: puts of one key racing each other store it
// once; every one of them is answered with that put's result.
func TestPutIdempotentConcurrent(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, _ := openTest(t, func(o *Options) { o.FlushMode = mode })
			const keys, tries = 20, 8
			results := make([][]AppendResult, keys)
			var wg sync.WaitGroup
			var mu sync.Mutex
			for k := range keys {
				for range tries {
					wg.Go(func() {
						res, err := s.PutMessage(context.Background(), msg("C", "m"+strconv.Itoa(k), uniq("key-"+strconv.Itoa(k))))
						if err != nil || res.Status != PutOK {
							t.Errorf("key %d: %v, %v", k, res.Status, err)
							return
						}
						mu.Lock()
						results[k] = append(results[k], res.Append)
						mu.Unlock()
					})
				}
			}
			wg.Wait()
			if n := queueLen(t, s, "C", 0); n != keys {
				t.Fatalf("%d messages stored for %d keys", n, keys)
			}
			for k, rs := range results {
				for _, r := range rs[1:] {
					if !sameAppend(r, rs[0]) {
						t.Errorf("key %d answered %+v and %+v", k, rs[0], r)
					}
				}
			}
		})
	}
}

// TestPutIdempotentFailedFirst: a first put that stored nothing does not
// poison its key: the next put of the key is stored. A key longer than
// MaxUniqKeyLength is MESSAGE_ILLEGAL.
func TestPutIdempotentFailedFirst(t *testing.T) {
	s, o := openTest(t, nil)
	res, err := s.PutMessage(context.Background(), msg("F", strings.Repeat("x", o.MaxMessageSize+1), uniq("k")))
	if res.Status != MessageIllegal || err == nil {
		t.Fatalf("oversized first put: %v, %v", res.Status, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := s.PutMessage(ctx, msg("F", "cancelled", uniq("k"))); !errors.Is(err, context.Canceled) || res.Appended() {
		t.Fatalf("cancelled first put: %v, %v", res, err)
	}
	a := putOK(t, s, msg("F", "good", uniq("k")))
	if rec := readAt(t, o.Dir, o.FileSize, a.WroteOffset); string(rec.Body) != "good" {
		t.Fatalf("stored %q", rec.Body)
	}
	if st := s.Stats().Dedup; st.Keys != 1 || st.Pending != 0 || st.Hits != 0 {
		t.Errorf("dedup stats %+v", st)
	}
	res, err = s.PutMessage(context.Background(), msg("F", "long", uniq(strings.Repeat("k", MaxUniqKeyLength+1))))
	if res.Status != MessageIllegal || !errors.Is(err, ErrIllegal) {
		t.Fatalf("key of %d bytes: %v, %v", MaxUniqKeyLength+1, res.Status, err)
	}
	putOK(t, s, msg("F", "longest", uniq(strings.Repeat("k", MaxUniqKeyLength))))
}

// TestPutIdempotentBatch: a batch is deduplicated as a whole by its first
// message's key (the retry gets every offset of the first); a
// one-message batch is the same put as a single message with that key.
func TestPutIdempotentBatch(t *testing.T) {
	s, _ := openTest(t, nil)
	batch := func(first string, n int) *Batch {
		b := &Batch{Topic: "B", QueueID: 1}
		for i := range n {
			b.Messages = append(b.Messages, BatchMessage{Body: []byte("b" + strconv.Itoa(i)),
				Properties: []Property{uniq(first + "-" + strconv.Itoa(i))}})
		}
		b.Messages[0].Properties = []Property{uniq(first)}
		return b
	}
	put := func(b *Batch) AppendResult {
		t.Helper()
		res, err := s.PutMessages(context.Background(), b)
		if err != nil || res.Status != PutOK {
			t.Fatalf("batch: %v, %v", res.Status, err)
		}
		return res.Append
	}
	first := put(batch("b1", 4))
	if again := put(batch("b1", 4)); !sameAppend(again, first) {
		t.Fatalf("batch retry answered %+v, first %+v", again, first)
	}
	if n := queueLen(t, s, "B", 1); n != 4 {
		t.Fatalf("queue holds %d, want 4", n)
	}
	// One message: a batch and a single put of the same key are one put.
	single := putOK(t, s, &Message{Topic: "B", QueueID: 1, Body: []byte("s"), Properties: []Property{uniq("one")}})
	if one := put(batch("one", 1)); one.WroteOffset != single.WroteOffset || fmt.Sprint(one.Offsets) != fmt.Sprint([]int64{single.WroteOffset}) {
		t.Fatalf("one-message batch after a single put of its key: %+v, single %+v", one, single)
	}
	if n := queueLen(t, s, "B", 1); n != 5 {
		t.Fatalf("queue holds %d, want 5", n)
	}
	if st := s.Stats().Dedup; st.Messages != 5 {
		t.Errorf("the window weighs %d messages, want 5 (a batch weighs its count)", st.Messages)
	}
}

// TestDedupWindowExpires: a key is remembered for DedupWindow after its
// store time, not longer.
func TestDedupWindowExpires(t *testing.T) {
	clock := newFakeClock()
	s, _ := openTest(t, func(o *Options) { o.Clock = clock; o.DedupWindow = time.Minute })
	first := putOK(t, s, msg("E", "x", uniq("k")))
	clock.Advance(time.Minute)
	if again := putOK(t, s, msg("E", "x", uniq("k"))); !sameAppend(again, first) {
		t.Fatal("forgotten within the window")
	}
	clock.Advance(time.Millisecond)
	if later := putOK(t, s, msg("E", "x", uniq("k"))); later.WroteOffset == first.WroteOffset {
		t.Fatal("remembered past the window")
	}
}

// TestDedupOff: with a negative window, every put is stored.
func TestDedupOff(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.DedupWindow = -1 })
	putOK(t, s, msg("O", "x", uniq("k")))
	putOK(t, s, msg("O", "x", uniq("k")))
	if n := queueLen(t, s, "O", 0); n != 2 {
		t.Fatalf("%d stored, want 2", n)
	}
}

// TestDedupRebuiltAtOpen: after a restart (a clean one, or a crash: the
// window is rebuilt from the log either way) a retry of any keyed put
// stored within the window gets the same answer as before, and nothing
// is stored; keys older than the window are forgotten.
func TestDedupRebuiltAtOpen(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := newFakeClock()
			o := Options{Dir: t.TempDir(), FileSize: 8 << 10, MaxMessageSize: 2 << 10, FlushMode: mode, Clock: clock, DedupWindow: 10 * time.Minute}
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			old := putOK(t, s, msg("R", "old", uniq("old")))
			clock.Advance(5 * time.Minute)
			var singles []AppendResult
			for i := range 40 { // several files
				singles = append(singles, putOK(t, s, msg("R", strings.Repeat("s", 300)+strconv.Itoa(i), uniq("s"+strconv.Itoa(i)))))
			}
			// Level 18 (2 h): not due within the test, so no delivery
			// appends to the log meanwhile.
			delayed := putOK(t, s, msg("R", "d", uniq("d"), Property{Key: PropertyDelayLevel, Value: "18"}))
			b := &Batch{Topic: "R", QueueID: 2, Messages: []BatchMessage{{Body: []byte("b0"), Properties: []Property{uniq("b")}},
				{Body: []byte("b1"), Properties: []Property{uniq("b-1")}}, {Body: []byte("b2")}}}
			bres, err := s.PutMessages(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			putOK(t, s, msg("R", "unkeyed"))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			clock.Advance(5*time.Minute + time.Millisecond) // "old" is now 10 min + 1 ms old, the rest 5 min + 1 ms

			s, err = Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if st := s.Stats().Dedup; st.Keys != 40+1+1 {
				t.Errorf("rebuilt %d keys, want 42 (40 singles, the delayed one, the batch)", st.Keys)
			}
			end := s.log.MaxOffset()
			for i, want := range singles {
				if got := putOK(t, s, msg("R", "retry", uniq("s"+strconv.Itoa(i)))); !sameAppend(got, want) {
					t.Fatalf("single %d after the restart: %+v, before %+v", i, got, want)
				}
			}
			if got := putOK(t, s, msg("R", "retry", uniq("d"), Property{Key: PropertyDelayLevel, Value: "18"})); !sameAppend(got, delayed) {
				t.Fatalf("delayed after the restart: %+v, before %+v", got, delayed)
			}
			if got, err := s.PutMessages(context.Background(), b); err != nil || !sameAppend(got.Append, bres.Append) {
				t.Fatalf("batch after the restart: %+v, %v; before %+v", got.Append, err, bres.Append)
			}
			if s.log.MaxOffset() != end {
				t.Fatalf("retries after the restart stored something: %d -> %d", end, s.log.MaxOffset())
			}
			if got := putOK(t, s, msg("R", "old again", uniq("old"))); got.WroteOffset == old.WroteOffset {
				t.Fatal("a key older than the window was remembered across the restart")
			}
		})
	}
}

// TestDedupRebuildBound: the rebuild reads whole files from the end back
// to DedupRebuildBytes: keys in older files are forgotten, newer ones
// remembered.
func TestDedupRebuildBound(t *testing.T) {
	const fileSize = 8 << 10
	o := Options{Dir: t.TempDir(), FileSize: fileSize, MaxMessageSize: 2 << 10, DedupRebuildBytes: 2 * fileSize}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var all []AppendResult
	for i := range 100 { // ~ 500 bytes each: 16 a file, 7 files
		all = append(all, putOK(t, s, msg("RB", strings.Repeat("x", 400), uniq("k"+strconv.Itoa(i)))))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	last := s.log.Files().Last().From()
	for i, a := range all {
		inScan := a.WroteOffset >= last-fileSize
		got := putOK(t, s, msg("RB", "retry", uniq("k"+strconv.Itoa(i))))
		if remembered := sameAppend(got, a); remembered != inScan {
			t.Fatalf("key %d at %d (last file at %d): remembered %v, want %v", i, a.WroteOffset, last, remembered, inScan)
		}
	}
}

// TestDedupDelayedDelivery: the delivery of a keyed delayed message is
// stored on its topic (it is not taken for a retry of the delayed put),
// and a retry of the delayed put still gets the schedule queue answer.
func TestDedupDelayedDelivery(t *testing.T) {
	s, _, clock := openSched(t, FlushAsync, nil)
	haltScheduler(s)
	m := msg("DD", "later", uniq("k"), Property{Key: PropertyDelayLevel, Value: "1"})
	first := putOK(t, s, m)
	clock.Advance(2 * time.Second)
	runRounds(s)
	settle(t, s)
	if n := queueLen(t, s, "DD", 0); n != 1 {
		t.Fatalf("delivered %d, want 1", n)
	}
	if again := putOK(t, s, m); !sameAppend(again, first) {
		t.Fatalf("retry of the delayed put after delivery: %+v, first %+v", again, first)
	}
	if n := queueLen(t, s, "DD", 0); n != 1 {
		t.Fatalf("%d on the topic after the retry, want 1", n)
	}
}

// TestDedupBytesPerKey measures what the window holds per remembered
// single-message put (packed AppendResults, 32-character keys as
// RocketMQ's clients write them) and keeps the README's figure honest.
func TestDedupBytesPerKey(t *testing.T) {
	const n = 50_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w, err := dedup.New[dedupValue](dedup.Options{Window: time.Hour, MaxMessages: n})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		w.Add(dedup.Key{Topic: "OrderEvents", ID: fmt.Sprintf("%032X", i)},
			packDedup(AppendResult{Status: AppendOK, WroteOffset: int64(i) * 200, WroteBytes: 200, QueueOffset: int64(i), MsgNum: 1,
				StoreHost: DefaultStoreHost}), int64(i), 1, int64(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per remembered key (%d keys)", per, n)
	if per > 260 {
		t.Errorf("%.0f bytes per key: more than the ~205 the README promises, with room for the runtime's maps", per)
	}
	runtime.KeepAlive(w)
}

// BenchmarkOpenDedupRebuild: Open (and Close) of a store whose log holds
// 100,000 keyed 1 KiB messages (~110 MiB), with the dedup window on (it
// is rebuilt from the log: every message is within the window) and off.
// The difference is the rebuild's cost; keys/op counts what it rebuilt.
func BenchmarkOpenDedupRebuild(b *testing.B) {
	const n = 100_000
	dir := b.TempDir()
	o := Options{Dir: dir, FileSize: 64 << 20}
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	for i := range n {
		m := &Message{Topic: "Rebuild", QueueID: int32(i % 8), Body: body,
			Properties: []Property{{Key: PropertyUniqKey, Value: fmt.Sprintf("%032X", i)}}}
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		window time.Duration
	}{{"dedup=on", 0}, {"dedup=off", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			o.DedupWindow = tc.window
			keys := 0
			for b.Loop() {
				s, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				keys = s.Stats().Dedup.Keys
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(keys), "keys/op")
		})
	}
}

// TestDedupValuePacking: what the window keeps answers a duplicate as
// the first put was answered: every field of its append result but the
// lock timing, for a single message, a batch and a timer message due
// when it was put (kept on TimerTopic).
func TestDedupValuePacking(t *testing.T) {
	base := AppendResult{Status: AppendOK, WroteOffset: 1 << 40, WroteBytes: 1234, StoreTimestamp: 1_700_000_000_123,
		QueueID: 7, QueueOffset: 1 << 33, MsgNum: 1, StoreHost: netip.MustParseAddrPort("[2001:db8::1]:10911")}
	batch := base
	batch.MsgNum, batch.Offsets = 3, []int64{1 << 40, 1<<40 + 400, 1<<40 + 800}
	timer := base
	timer.Topic = TimerTopic
	for name, a := range map[string]AppendResult{"single": base, "batch": batch, "timer": timer} {
		t.Run(name, func(t *testing.T) {
			in := a
			in.LockedAt, in.LockHeld = time.Unix(1, 0), time.Millisecond
			if got := packDedup(in).result(); !reflect.DeepEqual(got, a) {
				t.Fatalf("packed and unpacked:\n%+v\nwant\n%+v", got, a)
			}
		})
	}
	if packDedup(base).rare != nil {
		t.Error("a single message's value points to rare fields")
	}
}

// TestScanDedupYields: a scan with a stop channel (a group member's window
// read, groupdedup.go) lets the log's read guard go every 4,096 records, so
// that retention's unmap, and every reader queued behind it, need not wait
// for the whole scan. A file retention took off and unmapped meanwhile is
// left from there (its keys are past what retention keeps); the files
// after it are read as before.
func TestScanDedupYields(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FileSize = 2 << 20 })
	body := strings.Repeat("b", 100)
	var inFirst, total int64
	for i := 0; ; i++ {
		a := putOK(t, s, msg("T", body, uniq(fmt.Sprintf("k%d", i))))
		total++
		if a.WroteOffset < 2<<20 {
			inFirst++
		}
		if a.WroteOffset >= 2<<20 && total-inFirst > 5000 {
			break
		}
	}
	end := s.log.MaxOffset()
	s.index.Run(end) // nothing left for the dispatcher to read in the file taken off below
	if _, added := s.scanDedup(s.newDedup(), 0, end, false, make(chan struct{})); added != total {
		t.Fatalf("a whole scan added %d keys, want %d", added, total)
	}
	yields := 0
	s.scanYield = func() {
		yields++
		if yields == 1 { // as retention does: off the list, then unmapped
			if err := s.log.Files().Unmap(s.log.Files().RemoveFirst(1)); err != nil {
				t.Error(err)
			}
		}
	}
	_, added := s.scanDedup(s.newDedup(), 0, end, false, make(chan struct{}))
	s.scanYield = nil
	if want := 4096 + total - inFirst; added != want || yields < 2 {
		t.Fatalf("with the first file unmapped at the first yield: %d keys added, want %d (4,096 of the first file's %d, all %d of the second); %d yields",
			added, want, inFirst, total-inFirst, yields)
	}
}
