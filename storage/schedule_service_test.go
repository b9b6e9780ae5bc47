package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/schedule"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/vfs"
)

// alarmClock is the fake TimerClock of storagetest: Set and Advance fire
// the waits they pass, so background goroutines follow the test's time.
type alarmClock = storagetest.Clock

var _ TimerClock = (*alarmClock)(nil)

var newAlarmClock = storagetest.NewClock

// schedT0 is the tests' start time: 01:00 local, away from the default
// DeleteWhen hour.
var schedT0 = time.Date(2026, 11, 29, 1, 0, 0, 0, time.Local)

// fakeDisk is an Options.StatDisk that reports a settable usage.
type fakeDisk struct {
	mu  sync.Mutex
	pct float64
	err error
}

func (d *fakeDisk) set(pct float64) { d.mu.Lock(); d.pct, d.err = pct, nil; d.mu.Unlock() }

func (d *fakeDisk) stat(string) (DiskUsage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return DiskUsage{}, d.err
	}
	// A 1 TiB disk, so that the allocator's room check (prepareRoom) sees
	// bytes as a real one would.
	const size = 1 << 40
	used := uint64(d.pct / 100 * size)
	return DiskUsage{Size: size, Used: used, Avail: size - used}, nil
}

// openSched opens a store on the alarm clock with retention off and disk
// usage faked at 10%.
func openSched(t *testing.T, mode FlushMode, mod func(*Options)) (*Store, Options, *alarmClock) {
	t.Helper()
	clock := newAlarmClock(schedT0)
	disk := &fakeDisk{pct: 10}
	s, o := openTest(t, func(o *Options) {
		o.FlushMode, o.Clock, o.FileReservedTime, o.StatDisk = mode, clock, -1, disk.stat
		if mod != nil {
			mod(o)
		}
	})
	return s, o, clock
}

// haltScheduler stops the delivery goroutine so that a test drives rounds
// itself; Close still persists.
func haltScheduler(s *Store) {
	s.sched.Halt()
}

// runRounds runs rounds until one delivers nothing more.
func runRounds(s *Store) {
	for {
		before := s.sched.Skipped()
		for i := range s.sched.Levels() {
			before += s.sched.Delivered(i)
		}
		s.sched.RoundOnce()
		after := s.sched.Skipped()
		for i := range s.sched.Levels() {
			after += s.sched.Delivered(i)
		}
		if after == before {
			return
		}
	}
}

// settle waits until everything written is dispatched (visible).
func settle(t testing.TB, s *Store) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		arrived, release := s.index.NextRelease()
		if s.index.Dispatched() >= s.log.MaxOffset() {
			release()
			return
		}
		s.flusher.Wake()
		s.index.Wake()
		select {
		case <-arrived:
			release()
		case <-deadline.C:
			t.Fatalf("dispatch stuck at %d, log ends at %d", s.index.Dispatched(), s.log.MaxOffset())
		}
	}
}

func putDelayed(t testing.TB, s *Store, topic string, qid int32, level int, body string, props ...Property) AppendResult {
	t.Helper()
	m := msg(topic, body, append([]Property{{Key: PropertyDelayLevel, Value: strconv.Itoa(level)}}, props...)...)
	m.QueueID = qid
	res, err := s.PutMessage(context.Background(), m)
	if err != nil || res.Append.Topic != ScheduleTopic {
		t.Fatalf("delayed put: %+v %v", res.Append, err)
	}
	return res.Append
}

func pullAll(t testing.TB, s *Store, topic string, qid int32) []*Record {
	t.Helper()
	var out []*Record
	off := int64(0)
	for {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: qid, Offset: off, MaxMessages: 1000})
		if errors.Is(err, ErrQueueNotFound) {
			return nil
		}
		if err != nil {
			t.Fatalf("pull %s/%d at %d: %v", topic, qid, off, err)
		}
		out = append(out, res.Messages...)
		if res.NextOffset >= res.MaxOffset {
			return out
		}
		off = res.NextOffset
	}
}

func modes(t *testing.T, f func(t *testing.T, mode FlushMode)) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) { f(t, mode) })
	}
}

// TestScheduleEveryLevelOnTime puts one message per default delay level and
// walks the clock to 1 ms before, then to, each delivery time.
func TestScheduleEveryLevelOnTime(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		s, _, clock := openSched(t, mode, nil)
		haltScheduler(s)
		levels := s.resolved.delayLevels
		for l := 1; l <= len(levels); l++ {
			putDelayed(t, s, "Real", int32(l%3), l, "level-"+strconv.Itoa(l),
				Property{Key: PropertyTags, Value: "t" + strconv.Itoa(l)}, Property{Key: PropertyKeys, Value: "k" + strconv.Itoa(l)})
		}
		settle(t, s)
		for _, l := range s.Stats().Schedule.Levels {
			if l.Pending != 1 || l.Lag != 0 || l.Delay != levels[l.Level-1] {
				t.Fatalf("before delivery: %+v", l)
			}
		}
		for l := 1; l <= len(levels); l++ {
			due := schedT0.Add(levels[l-1])
			clock.Set(due.Add(-time.Millisecond))
			runRounds(s)
			if got := s.sched.Delivered(l - 1); got != 0 {
				t.Fatalf("level %d (%v) delivered 1 ms early", l, levels[l-1])
			}
			clock.Set(due)
			runRounds(s)
			if got := s.sched.Delivered(l - 1); got != 1 {
				t.Fatalf("level %d (%v) not delivered at its time (%d)", l, levels[l-1], got)
			}
		}
		settle(t, s)
		seen := 0
		for qid := int32(0); qid < 3; qid++ {
			for _, rec := range pullAll(t, s, "Real", qid) {
				seen++
				l, _ := strconv.Atoi(strings.TrimPrefix(string(rec.Body), "level-"))
				due := schedT0.Add(levels[l-1]).UnixMilli()
				if rec.QueueID != int32(l%3) || rec.StoreTimestamp != due {
					t.Fatalf("level %d: queue %d, store time %d, want %d", l, rec.QueueID, rec.StoreTimestamp, due)
				}
				for _, k := range []string{PropertyDelayLevel, PropertyRealTopic, PropertyRealQueueID} {
					if v, ok := rec.Property(k); ok {
						t.Fatalf("level %d: delivered with %s=%s", l, k, v)
					}
				}
				tag, _ := rec.Property(PropertyTags)
				key, _ := rec.Property(PropertyKeys)
				wait, _ := rec.Property(PropertyWaitStoreOK)
				if tag != "t"+strconv.Itoa(l) || key != "k"+strconv.Itoa(l) || wait != "false" {
					t.Fatalf("level %d: properties %v", l, rec.Properties)
				}
			}
		}
		if seen != len(levels) {
			t.Fatalf("%d messages delivered, want %d", seen, len(levels))
		}
		for _, l := range s.Stats().Schedule.Levels {
			if l.Pending != 0 || l.Delivered != 1 || l.Offset != 1 {
				t.Fatalf("after delivery: %+v", l)
			}
		}
	})
}

// TestScheduleGoroutineFollowsClock lets the goroutine deliver: it wakes
// at the delivery time on the fake clock, and on a new message when idle.
func TestScheduleGoroutineFollowsClock(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		s, _, clock := openSched(t, mode, nil)
		putDelayed(t, s, "Real", 0, 2, "five seconds")
		settle(t, s)
		clock.Advance(5 * time.Second)
		waitVisible(t, s, "Real", 0, 1)
		// Idle now: a new message wakes it through the dispatch.
		putDelayed(t, s, "Real", 0, 1, "one second")
		settle(t, s)
		clock.Advance(time.Second)
		waitVisible(t, s, "Real", 0, 2)
		recs := pullAll(t, s, "Real", 0)
		if string(recs[0].Body) != "five seconds" || string(recs[1].Body) != "one second" {
			t.Fatalf("delivered %q, %q", recs[0].Body, recs[1].Body)
		}
	})
}

// TestScheduleOrderWithinLevel interleaves two levels into one real queue
// with more messages than a pass delivers.
func TestScheduleOrderWithinLevel(t *testing.T) {
	s, _, clock := openSched(t, FlushAsync, func(o *Options) { o.FileSize = 1 << 20 })
	haltScheduler(s)
	const n1, n2 = 3*schedule.BatchSize + 7, schedule.BatchSize + 3
	for i := 0; i < max(n1, n2); i++ {
		if i < n1 {
			putDelayed(t, s, "Real", 0, 1, fmt.Sprintf("a-%04d", i))
		}
		if i < n2 {
			putDelayed(t, s, "Real", 0, 2, fmt.Sprintf("b-%04d", i))
		}
		clock.Advance(time.Millisecond)
	}
	settle(t, s)
	clock.Advance(time.Hour)
	runRounds(s)
	settle(t, s)
	next := map[byte]int{}
	for _, rec := range pullAll(t, s, "Real", 0) {
		var i int
		fmt.Sscanf(string(rec.Body[2:]), "%d", &i)
		if i != next[rec.Body[0]] {
			t.Fatalf("level %c: got message %d, want %d", rec.Body[0], i, next[rec.Body[0]])
		}
		next[rec.Body[0]]++
	}
	if next['a'] != n1 || next['b'] != n2 {
		t.Fatalf("delivered %v", next)
	}
}

// TestScheduleStatsAndPersist checks pending, lag and the progress file.
func TestScheduleStatsAndPersist(t *testing.T) {
	s, o, clock := openSched(t, FlushSync, nil)
	haltScheduler(s)
	for i := 0; i < 3; i++ {
		putDelayed(t, s, "Real", 0, 1, "one")
	}
	putDelayed(t, s, "Real", 0, 2, "five")
	settle(t, s)
	clock.Advance(3 * time.Second)
	st := s.Stats().Schedule.Levels
	if st[0].Pending != 3 || st[0].Lag != 2*time.Second || st[1].Pending != 1 || st[1].Lag != 0 {
		t.Fatalf("stats before: %+v %+v", st[0], st[1])
	}
	runRounds(s)
	st = s.Stats().Schedule.Levels
	if st[0].Pending != 0 || st[0].Delivered != 3 || st[0].Offset != 3 || st[0].Persisted != 0 || st[1].Pending != 1 {
		t.Fatalf("stats after: %+v %+v", st[0], st[1])
	}
	if err := s.sched.Persist(); err != nil {
		t.Fatal(err)
	}
	if s.log.Flushed() < s.sched.Need() {
		t.Fatal("progress persisted before the re-puts were durable")
	}
	if st := s.Stats().Schedule.Levels; st[0].Persisted != 3 || st[1].Persisted != 0 {
		t.Fatalf("persisted: %+v %+v", st[0], st[1])
	}
	b, err := os.ReadFile(filepath.Join(o.Dir, "config", delayOffsetName))
	if err != nil || !strings.Contains(string(b), `"offsetTable":{`) || !strings.Contains(string(b), `"1":3`) {
		t.Fatalf("progress file %q: %v", b, err)
	}
	// A damaged progress file stops Open: guessing would lose or repeat
	// messages silently.
	s.Close()
	b[len(b)/2] ^= 0x20
	os.WriteFile(filepath.Join(o.Dir, "config", delayOffsetName), b, 0o644)
	if _, err := Open(o); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a damaged progress file: %v", err)
	}
}

// TestScheduleSkipsUndeliverable: a message on the schedule topic without
// REAL_TOPIC is skipped, and the ones after it are delivered.
func TestScheduleSkipsUndeliverable(t *testing.T) {
	s, _, clock := openSched(t, FlushAsync, nil)
	haltScheduler(s)
	putRaw(t, s, ScheduleTopic, 0, "stray") // below the API, which refuses the schedule topic
	putDelayed(t, s, "Real", 0, 1, "good")
	settle(t, s)
	clock.Advance(time.Second)
	runRounds(s)
	settle(t, s)
	if st := s.Stats().Schedule; st.Skipped != 1 || st.Levels[0].Delivered != 1 {
		t.Fatalf("stats %+v", st)
	}
	if recs := pullAll(t, s, "Real", 0); len(recs) != 1 || string(recs[0].Body) != "good" {
		t.Fatalf("delivered %v", recs)
	}
}

// TestScheduleRefusedRePutRetries: while the store refuses writes, nothing
// is delivered and the progress stays; once it takes them again the
// message goes through.
func TestScheduleRefusedRePutRetries(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, _, clock := openSched(t, FlushAsync, func(o *Options) { o.StatDisk = disk.stat })
	haltScheduler(s)
	putDelayed(t, s, "Real", 0, 1, "later")
	settle(t, s)
	disk.set(95)
	s.ret.Round()
	clock.Advance(time.Second)
	if retry := s.sched.RoundOnce(); !retry || s.sched.NextOffset(0) != 0 || s.Stats().Schedule.Refused != 1 {
		t.Fatalf("round while full: retry %v next %d", retry, s.sched.NextOffset(0))
	}
	disk.set(50)
	s.ret.Round()
	runRounds(s)
	if s.sched.Delivered(0) != 1 {
		t.Fatal("not delivered once writable again")
	}
}

// copyDir copies a data dir as a process crash leaves it: every byte in
// the page cache, abort marker included.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkDelivered checks that bodies 0..n-1 of real queue Real/0 are each
// there at least once, first occurrences in order, and returns how many
// were delivered twice.
func checkDelivered(t *testing.T, recs []*Record, n int) (dups int) {
	t.Helper()
	seen := map[int]int{}
	next := 0
	for _, rec := range recs {
		i, _ := strconv.Atoi(string(rec.Body))
		if seen[i] == 0 {
			if i != next {
				t.Fatalf("first delivery of %d after %d: order broken", i, next-1)
			}
			next++
		} else {
			dups++
		}
		seen[i]++
	}
	if next != n {
		t.Fatalf("%d of %d delayed messages delivered: lost ones", next, n)
	}
	return dups
}

// TestScheduleRestartMidDelivery crashes the process in the middle of
// delivery (the data dir copied while the store is open, progress
// persisted for 15 of 30 delivered) and checks the restart delivers every
// message at least once, in order, the unpersisted ones again.
func TestScheduleRestartMidDelivery(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		s, o, clock := openSched(t, mode, func(o *Options) { o.CheckpointInterval = time.Hour })
		haltScheduler(s)
		const n = 40
		for i := 0; i < n; i++ {
			putDelayed(t, s, "Real", 0, 1, strconv.Itoa(i))
			clock.Advance(10 * time.Millisecond)
		}
		settle(t, s)
		clock.Set(schedT0.Add(time.Second + 149*time.Millisecond)) // 0..14 due
		runRounds(s)
		if err := s.sched.Persist(); err != nil {
			t.Fatal(err)
		}
		clock.Set(schedT0.Add(time.Second + 299*time.Millisecond)) // 15..29 due
		runRounds(s)
		settle(t, s)
		if got := s.sched.NextOffset(0); got != 30 || s.sched.PersistedOffset(0) != 15 {
			t.Fatalf("before the crash: next %d persisted %d", got, s.sched.PersistedOffset(0))
		}
		crashed := t.TempDir()
		release := s.sched.Hold() // nothing moves while the image is taken
		copyDir(t, o.Dir, crashed)
		release()
		s.Close()

		o.Dir = crashed
		o.Clock = newAlarmClock(clock.Now())
		s2, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		haltScheduler(s2)
		// (Its goroutine may already be delivering: look at what it loaded.)
		if got := s2.sched.PersistedOffset(0); got != 15 {
			t.Fatalf("restart resumes at %d, want the persisted 15", got)
		}
		runRounds(s2)
		o.Clock.(*alarmClock).Advance(time.Hour)
		runRounds(s2)
		settle(t, s2)
		if dups := checkDelivered(t, pullAll(t, s2, "Real", 0), n); dups != 15 {
			t.Fatalf("%d delivered twice, want the 15 delivered after the last persist", dups)
		}
	})
}

// TestScheduleRestartAfterPowerCut takes power-cut images (MemFS.Crash)
// right after a persist and after more unpersisted deliveries: in every
// image every delayed message is delivered at least once. The persisted
// progress never covers a re-put a power cut could take back.
func TestScheduleRestartAfterPowerCut(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		fs := vfs.NewMem()
		clock := newAlarmClock(schedT0)
		disk := &fakeDisk{pct: 10}
		o := Options{Dir: "/data", FS: fs, FileSize: 16 << 10, MaxMessageSize: 4096, FlushMode: mode, Clock: clock,
			FileReservedTime: -1, StatDisk: disk.stat, CheckpointInterval: time.Hour, ConsumeQueueEntries: 64}
		s, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		haltScheduler(s)
		const n = 60
		for i := 0; i < n; i++ {
			putDelayed(t, s, "Real", 0, 1, strconv.Itoa(i))
			clock.Advance(10 * time.Millisecond)
		}
		// The originals are acknowledged; make them durable in async mode
		// too, so that every one of them must be delivered.
		if err := s.durableTo(s.log.MaxOffset()); err != nil {
			t.Fatal(err)
		}
		settle(t, s)
		images := func(name string, persisted int64) {
			for seed := uint64(1); seed <= 8; seed++ {
				resume := s.pause()
				img := fs.Crash(rand.New(rand.NewPCG(seed, 7)))
				resume()
				o2 := o
				o2.FS, o2.Clock = img, newAlarmClock(clock.Now())
				s2, err := Open(o2)
				if err != nil {
					t.Fatalf("%s seed %d: open: %v", name, seed, err)
				}
				haltScheduler(s2)
				if got := s2.sched.PersistedOffset(0); got != persisted {
					t.Fatalf("%s seed %d: resumes at %d, want %d", name, seed, got, persisted)
				}
				o2.Clock.(*alarmClock).Advance(time.Hour)
				runRounds(s2)
				settle(t, s2)
				checkDelivered(t, pullAll(t, s2, "Real", 0), n)
				if err := s2.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
		clock.Set(schedT0.Add(time.Second + 199*time.Millisecond)) // 0..19 due
		runRounds(s)
		if err := s.sched.Persist(); err != nil {
			t.Fatal(err)
		}
		settle(t, s)
		images("after persist", 20)
		clock.Set(schedT0.Add(time.Second + 399*time.Millisecond)) // 20..39 due, not persisted
		runRounds(s)
		settle(t, s)
		images("after unpersisted deliveries", 20)
	})
}

// BenchmarkScheduleDelivery measures delivery throughput: b.N delayed
// messages of 200 bytes, all due, delivered by rounds and persisted.
func BenchmarkScheduleDelivery(b *testing.B) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		b.Run(mode.String(), func(b *testing.B) {
			clock := newAlarmClock(schedT0)
			disk := &fakeDisk{pct: 10}
			s, err := Open(Options{Dir: b.TempDir(), FileSize: 64 << 20, FlushMode: mode, Clock: clock,
				FileReservedTime: -1, StatDisk: disk.stat})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			haltScheduler(s)
			body := strings.Repeat("d", 200)
			for i := 0; i < b.N; i++ {
				m := msg("Real", body, Property{Key: PropertyDelayLevel, Value: "1"})
				m.Properties = append(m.Properties, Property{Key: PropertyWaitStoreOK, Value: "false"})
				if _, err := s.PutMessage(context.Background(), m); err != nil {
					b.Fatal(err)
				}
			}
			settle(b, s)
			clock.Advance(time.Second)
			b.ResetTimer()
			runRounds(s)
			if err := s.sched.Persist(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if got := s.sched.Delivered(0); got != uint64(b.N) {
				b.Fatalf("delivered %d of %d", got, b.N)
			}
		})
	}
}

// TestScheduleClockSetBack: the clock ran an hour ahead and was set back.
// A 1 s message put afterwards is delivered 1 s later on the clock, not an
// hour later (its store time is held at the last one stamped, an hour
// ahead); one put while the clock was ahead waits at most its level's
// delay from when the scheduler sees it; neither is delivered before its
// delay has passed on the clock. Before, both waited the whole hour.
func TestScheduleClockSetBack(t *testing.T) {
	tests := []struct {
		name     string
		putAhead int // delayed messages also put while the clock was ahead
	}{
		{"put after the set-back", 0},
		{"put while ahead, then one after", 1},
		{"a backlog put while ahead is released together", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, clock := openSched(t, FlushAsync, nil)
			haltScheduler(s)
			clock.Set(schedT0.Add(time.Hour)) // ahead
			if _, err := s.PutMessage(context.Background(), msg("Other", "stamped an hour ahead")); err != nil {
				t.Fatal(err)
			}
			want := 1 + tt.putAhead
			for i := range tt.putAhead {
				putDelayed(t, s, "Real", 0, 1, fmt.Sprintf("while-ahead-%d", i))
			}
			settle(t, s)
			clock.Set(schedT0) // set back
			a := putDelayed(t, s, "Real", 0, 1, "after-set-back")
			if a.StoreTimestamp != schedT0.Add(time.Hour).UnixMilli() {
				t.Fatalf("store time %d: want it held at the last one stamped", a.StoreTimestamp)
			}
			settle(t, s)
			runRounds(s) // the scheduler sees the level at T0
			clock.Set(schedT0.Add(time.Second - time.Millisecond))
			runRounds(s)
			if n := s.sched.Delivered(0); n != 0 {
				t.Fatalf("%d delivered before their 1 s delay passed on the clock", n)
			}
			clock.Set(schedT0.Add(time.Second))
			runRounds(s)
			if n := s.sched.Delivered(0); n != uint64(want) {
				t.Fatalf("%d delivered 1 s after the set-back, want %d", n, want)
			}
			settle(t, s)
			if got := len(pullAll(t, s, "Real", 0)); got != want {
				t.Fatalf("%d readable, want %d", got, want)
			}
		})
	}
}
