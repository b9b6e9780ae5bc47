package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/vfs"
)

func mustCommit(t testing.TB, s *Store, group, topic string, q int32, off int64) {
	t.Helper()
	if err := s.CommitOffset(context.Background(), group, topic, q, off); err != nil {
		t.Fatalf("commit %s %s/%d=%d: %v", group, topic, q, off, err)
	}
}

func wantOffset(t testing.TB, s *Store, group, topic string, q int32, want int64) {
	t.Helper()
	got, err := s.GetOffset(group, topic, q)
	if err != nil || got != want {
		t.Fatalf("GetOffset %s %s/%d = %d, %v; want %d", group, topic, q, got, err, want)
	}
}

func TestConsumerOffsetsRoundTrip(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, o := openTest(t, func(o *Options) { o.FlushMode = mode })
			for i := 0; i < 10; i++ {
				if _, err := s.PutMessage(context.Background(), msg("T", fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.GetOffset("g1", "T", 0); !errors.Is(err, ErrOffsetNotFound) {
				t.Fatalf("before any commit: %v", err)
			}
			mustCommit(t, s, "g1", "T", 0, 5)
			mustCommit(t, s, "g1", "T", 0, 7)
			mustCommit(t, s, "g2", "T", 0, 10) // max: consumed everything
			mustCommit(t, s, "g2", "T", 3, 0)  // a queue never written: [0, 0]
			wantOffset(t, s, "g1", "T", 0, 7)
			wantOffset(t, s, "g2", "T", 0, 10)
			wantOffset(t, s, "g2", "T", 3, 0)
			if _, err := s.GetOffset("g1", "T", 1); !errors.Is(err, ErrOffsetNotFound) {
				t.Fatalf("other queue: %v", err)
			}
			// The records are the store's: not listed, not pullable, not
			// readable by offset, not writable.
			for _, q := range s.Queues() {
				if q.Topic == OffsetTopic {
					t.Fatalf("Queues lists %s", OffsetTopic)
				}
			}
			if _, err := s.PullMessages(context.Background(), PullRequest{Topic: OffsetTopic}); !errors.Is(err, ErrQueueNotFound) {
				t.Fatalf("pull of the offset topic: %v", err)
			}
			if _, _, err := s.QueueInfo(OffsetTopic, 0); !errors.Is(err, ErrQueueNotFound) {
				t.Fatalf("queue info of the offset topic: %v", err)
			}
			q := s.index.Queue(OffsetTopic, 0)
			if q == nil || q.Count() != 4 {
				t.Fatalf("offset topic queue: %v", q)
			}
			phys, _, _, _ := q.Get(0)
			if _, err := s.GetMessage(phys); !errors.Is(err, ErrNoRecord) {
				t.Fatalf("GetMessage of an offset record: %v", err)
			}
			res, err := s.PutMessage(context.Background(), msg(OffsetTopic, "forged"))
			if err == nil || res.Status != MessageIllegal {
				t.Fatalf("put to the offset topic: %v %v", res.Status, err)
			}

			s.Close()
			s2, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			wantOffset(t, s2, "g1", "T", 0, 7)
			wantOffset(t, s2, "g2", "T", 0, 10)
			wantOffset(t, s2, "g2", "T", 3, 0)
			if _, err := s2.PutMessage(context.Background(), msg("T", "more")); err != nil {
				t.Fatal(err)
			}
			mustCommit(t, s2, "g1", "T", 0, 11)
			wantOffset(t, s2, "g1", "T", 0, 11)
		})
	}
}

func TestConsumerOffsetsRefuseHostileInput(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.NoAutoCreateTopics = true })
	if _, err := s.CreateTopic("T", 4); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := s.PutMessage(context.Background(), msg("T", "m")); err != nil {
			t.Fatal(err)
		}
	}
	var verr *ValidationError
	var rerr *RangeError
	isField := func(f string) func(error) bool {
		return func(err error) bool { return errors.As(err, &verr) && verr.Field == f }
	}
	isRange := func(err error) bool { return errors.As(err, &rerr) && errors.Is(err, ErrOutOfRange) }
	for _, c := range []struct {
		name         string
		group, topic string
		queue        int32
		offset       int64
		want         func(error) bool
	}{
		{"empty group", "", "T", 0, 0, isField("consumer_group")},
		{"huge group", strings.Repeat("g", 256), "T", 0, 0, isField("consumer_group")},
		{"group charset", "g/../x", "T", 0, 0, isField("consumer_group")},
		{"group newline", "g\n", "T", 0, 0, isField("consumer_group")},
		{"bad topic", "g", "a b", 0, 0, isField("topic")},
		{"unknown topic", "g", "U", 0, 0, func(err error) bool { return errors.Is(err, ErrTopicNotFound) }},
		{"reserved topic", "g", ScheduleTopic, 0, 0, func(err error) bool { return errors.Is(err, ErrTopicNotFound) }},
		{"offset topic", "g", OffsetTopic, 0, 0, func(err error) bool { return errors.Is(err, ErrTopicNotFound) }},
		{"negative queue", "g", "T", -1, 0, isField("queue_id")},
		{"queue past the topic", "g", "T", 4, 0, isField("queue_id")},
		{"negative offset", "g", "T", 0, -1, isRange},
		{"offset past max", "g", "T", 0, 4, isRange},
		{"offset on an empty queue", "g", "T", 1, 1, isRange},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := s.log.MaxOffset()
			err := s.CommitOffset(context.Background(), c.group, c.topic, c.queue, c.offset)
			if err == nil || !c.want(err) {
				t.Fatalf("CommitOffset: %v", err)
			}
			if s.log.MaxOffset() != before || s.offsets.Len() != 0 {
				t.Fatalf("a refused commit stored something")
			}
			if c.offset == 0 { // the same key checks on reads
				if _, err := s.GetOffset(c.group, c.topic, c.queue); err == nil || !c.want(err) {
					t.Fatalf("GetOffset: %v", err)
				}
			}
		})
	}
	if len(strings.Repeat("g", 255)) == MaxGroupLength {
		mustCommit(t, s, strings.Repeat("g", 255), "T", 0, 3) // the longest group name is fine
	}
}

func TestConsumerOffsetsLimit(t *testing.T) {
	s, o := openTest(t, func(o *Options) { o.MaxConsumerOffsets = 2 })
	if _, err := s.PutMessage(context.Background(), msg("T", "m")); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, "a", "T", 0, 0)
	mustCommit(t, s, "b", "T", 0, 1)
	before := s.log.MaxOffset()
	if err := s.CommitOffset(context.Background(), "c", "T", 0, 1); !errors.Is(err, ErrTooManyOffsets) {
		t.Fatalf("third key: %v", err)
	}
	if s.log.MaxOffset() != before {
		t.Fatal("refused commit stored a record")
	}
	mustCommit(t, s, "a", "T", 0, 1) // an existing key may move
	s.Close()
	o.MaxConsumerOffsets = 1 // lowered: what exists stays, nothing new
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	wantOffset(t, s2, "a", "T", 0, 1)
	wantOffset(t, s2, "b", "T", 0, 1)
	if err := s2.CommitOffset(context.Background(), "c", "T", 0, 1); !errors.Is(err, ErrTooManyOffsets) {
		t.Fatalf("after lowering: %v", err)
	}
}

func TestGetOffsetByTime(t *testing.T) {
	clock := newFakeClock()
	t0 := time.UnixMilli(1_800_000_000_000)
	clock.Set(t0)
	s, _ := openTest(t, func(o *Options) { o.Clock = clock })
	// Store times (ms after t0) of queue offsets 0..6: equal ones included.
	times := []int64{0, 10, 10, 10, 20, 35, 35}
	for i, d := range times {
		clock.Set(t0.Add(time.Duration(d) * time.Millisecond))
		res, err := s.PutMessage(context.Background(), msg("T", fmt.Sprint(i)))
		if err != nil || res.Append.StoreTimestamp != t0.UnixMilli()+d {
			t.Fatalf("put %d: %v, store time %d", i, err, res.Append.StoreTimestamp)
		}
	}
	for _, c := range []struct {
		at   int64 // ms after t0
		want int64
	}{
		{-1000, 0}, {0, 0}, {1, 1}, {10, 1}, {11, 4}, {19, 4}, {20, 4}, {21, 5}, {35, 5}, {36, 7}, {1 << 40, 7},
	} {
		got, err := s.GetOffsetByTime("T", 0, t0.Add(time.Duration(c.at)*time.Millisecond))
		if err != nil || got != c.want {
			t.Errorf("at +%d ms: %d, %v; want %d", c.at, got, err, c.want)
		}
	}
	if _, err := s.GetOffsetByTime("T", 1, t0); !errors.Is(err, ErrQueueNotFound) {
		t.Errorf("empty queue: %v", err)
	}
	if _, err := s.GetOffsetByTime("U", 0, t0); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("unknown topic: %v", err)
	}
	if _, err := s.GetOffsetByTime("T", -1, t0); err == nil {
		t.Errorf("negative queue: no error")
	}
}

// TestConsumerOffsetsSurviveRetention: offsets committed into files that
// retention deletes are written again first, so they survive the deletion
// and a restart after it.
func TestConsumerOffsetsSurviveRetention(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, nil)
	fill(t, s, "T", 6)
	mustCommit(t, s, "g", "T", 0, 3)
	mustCommit(t, s, "h", "T", 0, 6)
	oldQ := s.index.Queue(OffsetTopic, 0)
	firstRec, _, _, _ := oldQ.Get(0)
	fill(t, s, "T", 30) // more files at T0
	clock.Advance(80 * time.Hour)
	fill(t, s, "T", 12)
	mustCommit(t, s, "h", "T", 0, 40) // h's latest value is in a new file
	settle(t, s)
	clock.Set(time.Date(2026, 12, 2, 4, 0, 0, 0, time.Local))
	s.ret.Round()
	if s.log.MinOffset() <= firstRec {
		t.Fatalf("retention kept the file of the first offset record (min %d, record at %d): %+v", s.log.MinOffset(), firstRec, s.Stats().Retention)
	}
	wantOffset(t, s, "g", "T", 0, 3)
	wantOffset(t, s, "h", "T", 0, 40)
	// GetOffsetByTime on a trimmed queue: before the first kept message is
	// the new min; the later burst starts after the 80 h jump.
	lo, hi, err := s.QueueInfo("T", 0)
	if err != nil || lo == 0 {
		t.Fatalf("queue T/0 [%d, %d) %v: retention trimmed nothing", lo, hi, err)
	}
	if got, err := s.GetOffsetByTime("T", 0, schedT0.Add(-time.Hour)); err != nil || got != lo {
		t.Fatalf("GetOffsetByTime before the first kept = %d, %v; want %d", got, err, lo)
	}
	if got, err := s.GetOffsetByTime("T", 0, schedT0.Add(time.Hour)); err != nil || got != 36 {
		t.Fatalf("GetOffsetByTime at T0+1h = %d, %v; want 36 (the first of the later burst)", got, err)
	}
	s.Close()
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	haltScheduler(s2)
	wantOffset(t, s2, "g", "T", 0, 3)
	wantOffset(t, s2, "h", "T", 0, 40)
	// Again, with everything but the last file expired.
	clock.Set(time.Date(2026, 12, 6, 4, 0, 0, 0, time.Local))
	fill(t, s2, "T", 12)
	for i := 0; i < 3; i++ {
		s2.ret.Round()
	}
	wantOffset(t, s2, "g", "T", 0, 3)
	s2.Close()
	s3, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	haltScheduler(s3)
	wantOffset(t, s3, "g", "T", 0, 3)
	wantOffset(t, s3, "h", "T", 0, 40)
}

// TestConsumerOffsetsRetentionKeepsWhatItCannotRewrite: on a slave (no
// writes) the files holding latest offsets stay.
func TestConsumerOffsetsRetentionKeepsWhatItCannotRewrite(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, _, clock := openRetention(t, disk, nil)
	fill(t, s, "T", 6)
	mustCommit(t, s, "g", "T", 0, 3)
	rec, _, _, _ := s.index.Queue(OffsetTopic, 0).Get(0)
	fill(t, s, "T", 30)
	clock.Advance(80 * time.Hour)
	fill(t, s, "T", 12)
	settle(t, s)
	s.SetRole(RoleSlave)
	clock.Set(time.Date(2026, 12, 2, 4, 0, 0, 0, time.Local))
	s.ret.Round()
	if min := s.log.MinOffset(); min > rec {
		t.Fatalf("the file of the only offset record was deleted: min %d, record at %d", min, rec)
	}
	wantOffset(t, s, "g", "T", 0, 3)
}

// TestConsumerOffsetsPowerLoss: after a power cut at random points of a
// stream of sync-mode commits, every acknowledged commit is there: each
// key's recovered offset is its last acknowledged one or a later one that
// was sent.
func TestConsumerOffsetsPowerLoss(t *testing.T) {
	fs := vfs.NewMem()
	opts := powerLossOptions(fs, FlushSync)
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const keys, perKey = 4, 40
	if _, err := s.PutMessages(context.Background(), &Batch{Topic: "PL", Messages: manySmall(perKey+1, 8)}); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked [keys]int64
		wg    sync.WaitGroup
	)
	for k := range acked {
		acked[k] = -1
	}
	progress := make(chan struct{}, keys*perKey)
	for k := 0; k < keys; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(1); i <= perKey; i++ {
				if err := s.CommitOffset(context.Background(), fmt.Sprintf("g%d", k), "PL", 0, i); err != nil {
					t.Errorf("commit: %v", err)
					return
				}
				mu.Lock()
				acked[k] = i
				mu.Unlock()
				progress <- struct{}{}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(7, 11))
	seen := 0
	for c := 0; c < 8 && !t.Failed(); c++ {
		for n := 1 + rng.IntN(2*keys*perKey/8); n > 0 && seen < keys*perKey; n-- {
			<-progress
			seen++
		}
		resume := s.pause()
		mu.Lock()
		snap := acked
		mu.Unlock()
		img := fs.Crash(rand.New(rand.NewPCG(7, uint64(c))))
		resume()
		o := opts
		o.FS = img
		s2, err := Open(o)
		if err != nil {
			t.Fatalf("crash image %d: %v", c, err)
		}
		for k, want := range snap {
			got, err := s2.GetOffset(fmt.Sprintf("g%d", k), "PL", 0)
			switch {
			case want < 0 && errors.Is(err, ErrOffsetNotFound):
			case err != nil:
				t.Errorf("image %d key %d: %v (acked %d)", c, k, err, want)
			case got < want || got > perKey:
				t.Errorf("image %d key %d: %d, acked %d", c, k, got, want)
			}
		}
		s2.Close()
	}
	wg.Wait()
}

// TestConsumerOffsetsStaleRewrite: a rewrite whose source a newer commit
// superseded (a commit that reached the log between the rewrite's read of
// the table and its record) changes nothing, live and after a restart
// (offsets.Table.Apply's rule, the same at Open as when indexing).
func TestConsumerOffsetsStaleRewrite(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, o := openTest(t, func(o *Options) { o.FlushMode = mode })
			fill(t, s, "T", 6)
			ctx := context.Background()
			first, err := s.commitOffset(ctx, "g", "T", 0, 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.commitOffset(ctx, "g", "T", 0, 5); err != nil {
				t.Fatal(err)
			}
			k := offsets.Key{Group: "g", Topic: "T", Queue: 0}
			stale := offsets.Encode([]offsets.Entry{{Key: k, Offset: 2, Rewrite: true, From: first.WroteOffset}})
			if out, err := s.putSystem(ctx, OffsetTopic, stale, true); err != nil || out.Status != PutOK {
				t.Fatalf("stale rewrite: %v %v", out.Status, err)
			}
			wantOffset(t, s, "g", "T", 0, 5)
			// A rewrite of the latest value applies: the key moves to it.
			fresh, err := s.commitOffset(ctx, "g", "T", 0, 6)
			if err != nil {
				t.Fatal(err)
			}
			cur := offsets.Encode([]offsets.Entry{{Key: k, Offset: 6, Rewrite: true, From: fresh.WroteOffset}})
			out, err := s.putSystem(ctx, OffsetTopic, cur, true)
			if err != nil || out.Status != PutOK {
				t.Fatalf("rewrite: %v %v", out.Status, err)
			}
			if at, _ := s.offsets.OldestAt(); at != out.Append.WroteOffset {
				t.Fatalf("after a rewrite of the latest value the key's record is at %d, want the rewrite's %d", at, out.Append.WroteOffset)
			}
			s.Close()
			s2, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			wantOffset(t, s2, "g", "T", 0, 6)
			if at, _ := s2.offsets.OldestAt(); at != out.Append.WroteOffset {
				t.Fatalf("after a restart the key's record is at %d, want the rewrite's %d", at, out.Append.WroteOffset)
			}
		})
	}
}
