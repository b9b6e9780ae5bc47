package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// Timer messages (timer_messages.go, storage/timers): the tests drive the
// service's rounds on the alarm clock, never sleeping.

func haltTimers(s *Store) { s.timers.Halt() }

// timerRounds runs rounds until one resolves nothing more.
func timerRounds(s *Store) {
	for {
		st := s.timers.Stats()
		before := st.Delivered + st.Skipped + st.Recalled
		s.timers.RoundOnce()
		st = s.timers.Stats()
		if st.Delivered+st.Skipped+st.Recalled == before {
			return
		}
	}
}

// putTimer puts body to topic/qid due at due (TIMER_DELIVER_MS) and
// returns the append (on the timer topic).
func putTimer(t testing.TB, s *Store, topic string, qid int32, body string, due time.Time, props ...Property) AppendResult {
	t.Helper()
	m := msg(topic, body, append([]Property{{Key: PropertyTimerDeliverMS, Value: strconv.FormatInt(due.UnixMilli(), 10)}}, props...)...)
	m.QueueID = qid
	res, err := s.PutMessage(context.Background(), m)
	if err != nil || res.Append.Topic != TimerTopic || res.Append.QueueID != 0 {
		t.Fatalf("timer put: %+v %v", res.Append, err)
	}
	return res.Append
}

// timerBodies returns the bodies readable on topic/qid.
func timerBodies(t testing.TB, s *Store, topic string, qid int32) []string {
	t.Helper()
	settle(t, s)
	var out []string
	for _, rec := range pullAll(t, s, topic, qid) {
		out = append(out, string(rec.Body))
	}
	return out
}

// TestTimerNeverEarly puts timer messages out of their due order (and
// through all three properties) and walks the clock to 1 ms before, then
// to, each delivery time: none is readable before its time, each is at
// its time, with its queue, body and properties, and the timer's own
// properties gone but TIMER_OUT_MS.
func TestTimerNeverEarly(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		s, _, clock := openSched(t, mode, nil)
		haltTimers(s)
		type put struct {
			body  string
			qid   int32
			after time.Duration
			prop  Property
		}
		puts := []put{
			{"c", 1, 5 * time.Second, Property{Key: PropertyTimerDeliverMS, Value: strconv.FormatInt(schedT0.Add(5*time.Second).UnixMilli(), 10)}},
			{"a", 0, 1500 * time.Millisecond, Property{Key: PropertyTimerDelayMS, Value: "1500"}},
			{"b", 2, 2 * time.Second, Property{Key: PropertyTimerDelaySec, Value: "2"}},
			{"a2", 0, 1500 * time.Millisecond, Property{Key: PropertyTimerDeliverMS, Value: strconv.FormatInt(schedT0.Add(1500*time.Millisecond).UnixMilli(), 10)}},
			{"d", 1, 72 * time.Hour, Property{Key: PropertyTimerDelaySec, Value: "259200"}},
		}
		for _, p := range puts {
			m := msg("Real", p.body, p.prop, Property{Key: PropertyTags, Value: "tag-" + p.body})
			m.QueueID = p.qid
			res, err := s.PutMessage(context.Background(), m)
			if err != nil || res.Append.Topic != TimerTopic {
				t.Fatalf("put %s: %+v %v", p.body, res.Append, err)
			}
		}
		settle(t, s)
		readable := func() int {
			n := 0
			for q := int32(0); q < 3; q++ {
				n += len(timerBodies(t, s, "Real", q))
			}
			return n
		}
		dues := []time.Duration{1500 * time.Millisecond, 2 * time.Second, 5 * time.Second, 72 * time.Hour}
		before := []int{0, 2, 3, 4} // readable 1 ms before each due time
		want := []int{2, 3, 4, 5}   // and at it
		for i, d := range dues {
			clock.Set(schedT0.Add(d - time.Millisecond))
			timerRounds(s)
			if got := readable(); got != before[i] {
				t.Fatalf("1 ms before %v: %d readable, want %d", d, got, before[i])
			}
			clock.Set(schedT0.Add(d))
			timerRounds(s)
			if got := readable(); got != want[i] {
				t.Fatalf("at %v: %d readable, want %d", d, got, want[i])
			}
		}
		for _, p := range puts {
			var rec *Record
			for _, r := range pullAll(t, s, "Real", p.qid) {
				if string(r.Body) == p.body {
					rec = r
				}
			}
			if rec == nil {
				t.Fatalf("%s not on Real/%d", p.body, p.qid)
			}
			due := schedT0.Add(p.after).UnixMilli()
			if rec.StoreTimestamp < due {
				t.Fatalf("%s stored at %d, due %d: early", p.body, rec.StoreTimestamp, due)
			}
			for _, k := range []string{PropertyRealTopic, PropertyRealQueueID, PropertyTimerDeliverMS, PropertyTimerDelaySec, PropertyTimerDelayMS} {
				if v, ok := rec.Property(k); ok {
					t.Fatalf("%s delivered with %s=%s", p.body, k, v)
				}
			}
			out, _ := rec.Property(PropertyTimerOutMS)
			tag, _ := rec.Property(PropertyTags)
			if out != strconv.FormatInt(due, 10) || tag != "tag-"+p.body {
				t.Fatalf("%s: TIMER_OUT_MS %q (want %d), TAGS %q", p.body, out, due, tag)
			}
		}
		if st := s.Stats().Timers; st.Pending != 0 || st.Delivered != uint64(len(puts)) || st.Skipped != 0 {
			t.Fatalf("stats after: %+v", st)
		}
	})
}

// TestTimerGoroutineFollowsClock lets the service's goroutine deliver: it
// wakes at the due time on the fake clock.
func TestTimerGoroutineFollowsClock(t *testing.T) {
	s, _, clock := openSched(t, FlushAsync, nil)
	putTimer(t, s, "Real", 0, "later", schedT0.Add(3*time.Second))
	settle(t, s)
	clock.Advance(3 * time.Second)
	waitVisible(t, s, "Real", 0, 1)
	putTimer(t, s, "Real", 0, "sooner", clock.Now().Add(time.Second))
	settle(t, s)
	clock.Advance(time.Second)
	waitVisible(t, s, "Real", 0, 2)
	if got := timerBodies(t, s, "Real", 0); !slices.Equal(got, []string{"later", "sooner"}) {
		t.Fatalf("delivered %q", got)
	}
}

// TestTimerHostileInputs: what a put may carry and what it gets.
func TestTimerHostileInputs(t *testing.T) {
	s, _, _ := openSched(t, FlushAsync, func(o *Options) { o.MaxTimerMessages = 3 })
	haltTimers(s)
	now := schedT0.UnixMilli()
	ms := func(v int64) string { return strconv.FormatInt(v, 10) }
	tests := []struct {
		name   string
		props  []Property
		status PutStatus // 0: stored
		topic  string    // where it is stored
	}{
		{"past time is immediate", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now - 1000)}}, 0, "Real"},
		{"now is immediate", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now)}}, 0, "Real"},
		{"negative delay is immediate", []Property{{Key: PropertyTimerDelaySec, Value: "-5"}}, 0, "Real"},
		{"zero time is immediate", []Property{{Key: PropertyTimerDeliverMS, Value: "0"}}, 0, "Real"},
		{"not a number", []Property{{Key: PropertyTimerDeliverMS, Value: "tomorrow"}}, WheelTimerMsgIllegal, ""},
		{"delay not a number", []Property{{Key: PropertyTimerDelaySec, Value: "1e3"}}, WheelTimerMsgIllegal, ""},
		{"overflowing number", []Property{{Key: PropertyTimerDelayMS, Value: "99999999999999999999"}}, WheelTimerMsgIllegal, ""},
		{"beyond the maximum delay", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now + 259200001)}}, WheelTimerMsgIllegal, ""},
		{"delay seconds beyond the maximum", []Property{{Key: PropertyTimerDelaySec, Value: "259201"}}, WheelTimerMsgIllegal, ""},
		{"delay seconds that would overflow", []Property{{Key: PropertyTimerDelaySec, Value: ms(1 << 62)}}, WheelTimerMsgIllegal, ""},
		{"a forged recall", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now + 1000)}, {Key: PropertyTimerDelUniqKey, Value: "0"}}, WheelTimerMsgIllegal, ""},
		{"exactly the maximum delay", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now + 259200000)}}, 0, TimerTopic},
		{"a delay level wins", []Property{{Key: PropertyTimerDeliverMS, Value: ms(now + 5000)}, {Key: PropertyDelayLevel, Value: "1"}}, 0, ScheduleTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.PutMessage(context.Background(), msg("Real", tt.name, tt.props...))
			if tt.status != 0 {
				var verr *ValidationError
				if !errors.As(err, &verr) || verr.Status != tt.status || res.Status != tt.status || res.Appended() {
					t.Fatalf("got %v %v, want %s", res.Status, err, tt.status)
				}
				return
			}
			if err != nil || res.Append.Topic != tt.topic {
				t.Fatalf("got %+v %v, want stored on %s", res.Append, err, tt.topic)
			}
		})
	}
	t.Run("reserved timer topic refused", func(t *testing.T) {
		_, err := s.PutMessage(context.Background(), msg(TimerTopic, "forged"))
		var verr *ValidationError
		if !errors.As(err, &verr) {
			t.Fatalf("put to %s: %v", TimerTopic, err)
		}
	})
	t.Run("batch refused", func(t *testing.T) {
		b := &Batch{Topic: "Real", Messages: []BatchMessage{{Body: []byte("x"),
			Properties: []Property{{Key: PropertyTimerDelaySec, Value: "5"}}}}}
		if _, err := s.PutMessages(context.Background(), b); !errors.Is(err, ErrIllegal) {
			t.Fatalf("timer batch: %v", err)
		}
	})
	t.Run("bounded count", func(t *testing.T) {
		// One is pending already (the maximum delay); two more fit.
		settle(t, s)
		for i := range 2 {
			putTimer(t, s, "Real", 0, fmt.Sprint("fill-", i), schedT0.Add(time.Minute))
		}
		settle(t, s)
		res, err := s.PutMessage(context.Background(), msg("Real", "one too many", Property{Key: PropertyTimerDelaySec, Value: "60"}))
		if !errors.Is(err, ErrTimerFull) || res.Status != WheelTimerFlowControl || res.Appended() {
			t.Fatalf("over the bound: %v %v", res.Status, err)
		}
		// A message due now is no timer message: still taken.
		if _, err := s.PutMessage(context.Background(), msg("Real", "due now", Property{Key: PropertyTimerDelaySec, Value: "0"})); err != nil {
			t.Fatalf("immediate put while full: %v", err)
		}
	})
}

// TestTimerRecall: a recall before the due time keeps the message from
// ever being delivered, across a restart too; a recall of a delivered, a
// recalled or an unknown message is ErrTimerNotPending.
func TestTimerRecall(t *testing.T) {
	modes(t, func(t *testing.T, mode FlushMode) {
		s, o, clock := openSched(t, mode, nil)
		haltTimers(s)
		due := schedT0.Add(10 * time.Second)
		keep := putTimer(t, s, "Real", 0, "keep", due)
		drop := putTimer(t, s, "Real", 0, "drop", due)
		early := putTimer(t, s, "Real", 0, "early", schedT0.Add(time.Second))
		overdue := putTimer(t, s, "Real", 0, "overdue", schedT0.Add(500*time.Millisecond))
		ctx := context.Background()
		settle(t, s)
		// Due, not delivered yet (no round ran): still pending, so it can
		// be recalled.
		clock.Set(schedT0.Add(600 * time.Millisecond))
		if err := s.RecallTimer(ctx, "Real", schedT0.Add(500*time.Millisecond).UnixMilli(), overdue.WroteOffset); err != nil {
			t.Fatalf("recall of a message due but not delivered: %v", err)
		}
		if err := s.RecallTimer(ctx, "Other", due.UnixMilli(), drop.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
			t.Fatalf("recall naming another topic: %v", err)
		}
		if err := s.RecallTimer(ctx, "Real", due.UnixMilli()+1, drop.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
			t.Fatalf("recall naming another due time: %v", err)
		}
		if err := s.RecallTimer(ctx, "Real", due.UnixMilli(), drop.WroteOffset); err != nil {
			t.Fatalf("recall: %v", err)
		}
		if err := s.RecallTimer(ctx, "Real", due.UnixMilli(), drop.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
			t.Fatalf("second recall: %v", err)
		}
		clock.Set(schedT0.Add(time.Second))
		timerRounds(s)
		if err := s.RecallTimer(ctx, "Real", schedT0.Add(time.Second).UnixMilli(), early.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
			t.Fatalf("recall after delivery: %v", err)
		}
		// A crash right now (nothing persisted since): the recall record
		// is in the log, the restart applies it.
		crashed := t.TempDir()
		release := s.timers.Hold()
		resume := s.pause()
		copyDir(t, o.Dir, crashed)
		resume()
		release()
		s.Close()
		o.Dir = crashed
		o.Clock = newAlarmClock(due)
		s2, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		haltTimers(s2)
		timerRounds(s2)
		got := timerBodies(t, s2, "Real", 0)
		if slices.Contains(got, "drop") || slices.Contains(got, "overdue") || !slices.Contains(got, "keep") || !slices.Contains(got, "early") {
			t.Fatalf("after the restart: %q", got)
		}
		if err := s2.RecallTimer(ctx, "Real", due.UnixMilli(), keep.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
			t.Fatalf("recall of a delivered message after the restart: %v", err)
		}
	})
}

// timerCheck checks that every body 0..n-1 is readable on Real/0 at least
// once and returns how many were there twice.
func timerCheck(t *testing.T, got []string, n int) (dups int) {
	t.Helper()
	seen := map[string]int{}
	for _, b := range got {
		seen[b]++
	}
	for i := range n {
		switch c := seen[strconv.Itoa(i)]; {
		case c == 0:
			t.Fatalf("timer message %d lost (%d readable)", i, len(got))
		case c > 1:
			dups += c - 1
		}
	}
	return dups
}

// TestTimerRestartNeverLost: messages due at random times, some delivered
// and persisted, some delivered after the last persist, some recalled;
// crash images (process crash: the page cache copied; power cuts: MemFS
// images) at each point. In every image, after the restart nothing is
// readable before its time and every message not recalled is delivered at
// least once.
func TestTimerRestartNeverLost(t *testing.T) {
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
		haltTimers(s)
		const n = 60
		rng := rand.New(rand.NewPCG(1, 2))
		dues := make([]time.Time, n)
		for i := range n {
			dues[i] = schedT0.Add(time.Duration(1+rng.IntN(100)) * 100 * time.Millisecond) // 0.1 s .. 10 s, unordered
			putTimer(t, s, "Real", 0, strconv.Itoa(i), dues[i])
		}
		if err := s.durableTo(s.log.MaxOffset()); err != nil { // acknowledged puts: durable in async mode too
			t.Fatal(err)
		}
		settle(t, s)
		images := func(name string, now time.Time) {
			t.Helper()
			for seed := uint64(1); seed <= 6; seed++ {
				release := s.timers.Hold()
				resume := s.pause()
				img := fs.Crash(rand.New(rand.NewPCG(seed, 9)))
				resume()
				release()
				o2 := o
				c2 := newAlarmClock(now)
				o2.FS, o2.Clock = img, c2
				s2, err := Open(o2)
				if err != nil {
					t.Fatalf("%s seed %d: open: %v", name, seed, err)
				}
				haltTimers(s2)
				timerRounds(s2)
				for _, b := range timerBodies(t, s2, "Real", 0) {
					i, _ := strconv.Atoi(b)
					if dues[i].After(now) {
						t.Fatalf("%s seed %d: message %d due %v readable at %v", name, seed, i, dues[i], now)
					}
				}
				c2.Set(schedT0.Add(time.Hour))
				timerRounds(s2)
				timerCheck(t, timerBodies(t, s2, "Real", 0), n)
				if err := s2.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
		images("before any delivery", schedT0)
		mid := schedT0.Add(4 * time.Second)
		clock.Set(mid)
		timerRounds(s)
		if err := s.timers.Persist(); err != nil {
			t.Fatal(err)
		}
		images("after a persist", mid)
		later := schedT0.Add(7 * time.Second)
		clock.Set(later)
		timerRounds(s)
		settle(t, s)
		images("after unpersisted deliveries", later)
		clock.Set(schedT0.Add(time.Hour))
		timerRounds(s)
		if dups := timerCheck(t, timerBodies(t, s, "Real", 0), n); dups != 0 {
			t.Fatalf("%d delivered twice without a restart", dups)
		}
	})
}

// TestTimerIndexBounded: a data dir holding more pending timer messages
// than the index may (the bound lowered between runs) keeps the rest in
// the timer queue and delivers them as the index drains: late, never
// lost; puts are refused meanwhile.
func TestTimerIndexBounded(t *testing.T) {
	s, o, _ := openSched(t, FlushAsync, nil)
	haltTimers(s)
	const n = 10
	for i := range n {
		putTimer(t, s, "Real", 0, strconv.Itoa(i), schedT0.Add(time.Duration(n-i)*time.Second))
	}
	settle(t, s)
	s.Close()
	o.MaxTimerMessages = 4
	o.Clock = newAlarmClock(schedT0)
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	haltTimers(s2)
	if st := s2.Stats().Timers; st.Pending != 4 || st.NotRead != n-4 || st.Max != 4 {
		t.Fatalf("after reopen with a bound of 4: %+v", st)
	}
	if _, err := s2.PutMessage(context.Background(), msg("Real", "x", Property{Key: PropertyTimerDelaySec, Value: "1"})); !errors.Is(err, ErrTimerFull) {
		t.Fatalf("put while over the bound: %v", err)
	}
	o.Clock.(*alarmClock).Set(schedT0.Add(time.Hour))
	timerRounds(s2)
	if dups := timerCheck(t, timerBodies(t, s2, "Real", 0), n); dups != 0 {
		t.Fatalf("%d twice", dups)
	}
}

// TestGroupTimerDelivery (design §3.5, as TestGroupDelayProgressReplicated
// for delay levels): only the ready leader delivers timer messages, its
// progress is a command every replica applies, a recall is a replicated
// record, and a new leader rebuilds its due index from the last committed
// progress: after a failover nothing delivered and replicated is delivered
// again, nothing pending is lost, a recalled message never comes, and a
// message due in an hour is still pending on the new leader.
func TestGroupTimerDelivery(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	timer := func(id uint64, body string, delay time.Duration) AppendResult {
		t.Helper()
		m := &Message{Topic: "D", Body: []byte(body), BornTimestamp: 1, BornHost: DefaultStoreHost,
			Properties: []Property{{Key: PropertyTimerDelayMS, Value: strconv.FormatInt(delay.Milliseconds(), 10)}}}
		res, err := g.m[id].s.PutMessage(context.Background(), m)
		if err != nil || res.Status != PutOK || res.Append.Topic != TimerTopic {
			t.Fatalf("timer put %s on %d: %v %v", body, id, res.Status, err)
		}
		return res.Append
	}
	start := time.Now()
	for i := range 10 {
		timer(1, fmt.Sprintf("a-%d", i), 200*time.Millisecond)
	}
	hour := timer(1, "z", time.Hour)
	recalled := timer(1, "r", time.Hour)
	rec, err := g.m[1].s.readRecord(recalled.WroteOffset)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := rec.Property(PropertyTimerOutMS)
	due, _ := strconv.ParseInt(out, 10, 64)
	if err := g.m[2].s.RecallTimer(context.Background(), "D", due, recalled.WroteOffset); !errors.As(err, new(*NotLeaderError)) {
		t.Fatalf("recall on a follower: %v", err)
	}
	if err := g.m[1].s.RecallTimer(context.Background(), "D", due, recalled.WroteOffset); err != nil {
		t.Fatalf("recall on the leader: %v", err)
	}
	g.poll("the first batch delivered and the progress replicated", func() bool {
		for _, id := range g.ids {
			if p, idx := g.m[id].s.TimerProgress(); idx == 0 || p.Ingested < 12 {
				return false
			}
			if len(g.pullBodies(id)) != 10 {
				return false
			}
		}
		return true
	}, g.ids...)
	for _, r := range pullAll(t, g.m[1].s, "D", 0) {
		if r.StoreTimestamp < start.Add(200*time.Millisecond).UnixMilli() {
			t.Fatalf("%s stored at %d, before its delivery time", r.Body, r.StoreTimestamp)
		}
	}
	g.poll("a ready leader", func() bool { return g.readyLeader(g.ids...) != 0 }, g.ids...)
	l1 := g.readyLeader(g.ids...)
	for i := range 5 {
		timer(l1, fmt.Sprintf("b-%d", i), 300*time.Millisecond)
	}
	// Acknowledged, so committed on a majority: whichever member leads
	// next holds them. (No converge: the leader may be delivering them,
	// moving its commit end, while the followers catch up.)
	g.net.setCut(l1, true)
	var rest []uint64
	for _, id := range g.ids {
		if id != l1 {
			rest = append(rest, id)
		}
	}
	g.poll("a new leader delivers the rest", func() bool {
		l := g.readyLeader(rest...)
		if l == 0 {
			return false
		}
		got := g.pullBodies(l)
		for i := range 5 {
			if got[fmt.Sprintf("b-%d", i)] == 0 {
				return false
			}
		}
		return true
	}, rest...)
	l2 := g.readyLeader(rest...)
	if l2 == 0 {
		g.poll("a ready leader", func() bool { return g.readyLeader(rest...) != 0 }, rest...)
		l2 = g.readyLeader(rest...)
	}
	got := g.pullBodies(l2)
	for i := range 10 {
		if n := got[fmt.Sprintf("a-%d", i)]; n != 1 {
			t.Fatalf("a-%d delivered %d times on the new leader (its delivery was replicated before the failover)", i, n)
		}
	}
	for i := range 5 {
		if n := got[fmt.Sprintf("b-%d", i)]; n < 1 || n > 2 {
			t.Fatalf("b-%d delivered %d times on the new leader", i, n)
		}
	}
	if got["r"] != 0 || got["z"] != 0 {
		t.Fatalf("recalled or hour-long message delivered: %v", got)
	}
	g.poll("the hour-long message pending on the new leader", func() bool {
		st := g.m[l2].s.Stats().Timers
		return st.Pending == 1 && st.NotRead == 0
	}, rest...)
	if err := g.m[l2].s.RecallTimer(context.Background(), "D", due, recalled.WroteOffset); !errors.Is(err, ErrTimerNotPending) {
		t.Fatalf("second recall on the new leader: %v", err)
	}
	_ = hour
	g.net.setCut(l1, false)
	g.poll("the old leader steps down", func() bool { return g.m[l1].s.ReplicaInfo().Role != "leader" }, g.ids...)
	g.poll("a ready leader after the heal", func() bool { return g.readyLeader(g.ids...) != 0 }, g.ids...)
	l3 := g.readyLeader(g.ids...)
	g.converge(l3, g.ids...)
	want, _ := g.m[l3].s.TimerProgress()
	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
		if p, idx := g.m[id].s.TimerProgress(); idx == 0 || p.Low > want.Low || p.Ingested < 17 {
			t.Fatalf("node %d reopened with timer progress %+v (index %d), the leader had %+v", id, p, idx, want)
		}
	}
}

// BenchmarkTimerDelivery measures delivery throughput: b.N timer messages
// of 200 bytes due at b.N distinct times in reverse put order (the index
// reorders them all), delivered by rounds and persisted.
func BenchmarkTimerDelivery(b *testing.B) {
	clock := newAlarmClock(schedT0)
	disk := &fakeDisk{pct: 10}
	s, err := Open(Options{Dir: b.TempDir(), FileSize: 64 << 20, FlushMode: FlushAsync, Clock: clock,
		FileReservedTime: -1, StatDisk: disk.stat, MaxTimerMessages: max(b.N, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	haltTimers(s)
	body := strings.Repeat("d", 200)
	for i := 0; i < b.N; i++ {
		due := schedT0.Add(time.Hour - time.Duration(i)*time.Millisecond)
		m := msg("Real", body, Property{Key: PropertyTimerDeliverMS, Value: strconv.FormatInt(due.UnixMilli(), 10)},
			Property{Key: PropertyWaitStoreOK, Value: "false"})
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			b.Fatal(err)
		}
	}
	settle(b, s)
	clock.Advance(2 * time.Hour)
	b.ResetTimer()
	timerRounds(s)
	if err := s.timers.Persist(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if got := s.timers.Stats().Delivered; got != uint64(b.N) {
		b.Fatalf("delivered %d of %d", got, b.N)
	}
}

// TestTimerModelPowerCuts runs random puts of timer messages (due from now
// to 5 s ahead), recalls, clock steps with delivery rounds, persists and
// power cuts (MemFS images, sync mode: an acknowledged put or recall is
// durable) against a model: nothing is ever readable before its time, a
// recalled message is never readable, a recall refused as not pending is
// one whose time has come, and in the end every message not recalled is
// readable at least once.
func TestTimerModelPowerCuts(t *testing.T) {
	seeds := uint64(12)
	if testing.Short() {
		seeds = 3
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 17))
			fs := vfs.NewMem()
			clock := newAlarmClock(schedT0)
			disk := &fakeDisk{pct: 10}
			o := Options{Dir: "/data", FS: fs, FileSize: 16 << 10, MaxMessageSize: 4096, FlushMode: FlushSync, Clock: clock,
				FileReservedTime: -1, StatDisk: disk.stat, CheckpointInterval: time.Hour, ConsumeQueueEntries: 64}
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Close() }()
			haltTimers(s)
			type msgState struct {
				due      time.Time
				phys     int64
				timer    bool // stored on the timer topic
				recalled bool
			}
			var model []msgState
			check := func(when string) {
				t.Helper()
				now := clock.Now()
				for _, b := range timerBodies(t, s, "Real", 0) {
					i, _ := strconv.Atoi(b)
					if m := model[i]; m.due.After(now) || m.recalled {
						t.Fatalf("%s: message %d (due %v, recalled %v) readable at %v", when, i, m.due, m.recalled, now)
					}
				}
			}
			for step := range 150 {
				switch r := rng.IntN(12); {
				case r < 5:
					i := len(model)
					due := clock.Now().Add(time.Duration(rng.IntN(5001)) * time.Millisecond)
					m := msg("Real", strconv.Itoa(i), Property{Key: PropertyTimerDeliverMS, Value: strconv.FormatInt(due.UnixMilli(), 10)})
					res, err := s.PutMessage(context.Background(), m)
					if err != nil {
						t.Fatalf("step %d: put: %v", step, err)
					}
					model = append(model, msgState{due: due, phys: res.Append.WroteOffset, timer: res.Append.Topic == TimerTopic})
				case r < 7 && len(model) > 0:
					i := rng.IntN(len(model))
					if !model[i].timer || model[i].recalled {
						continue
					}
					switch err := s.RecallTimer(context.Background(), "Real", model[i].due.UnixMilli(), model[i].phys); {
					case err == nil:
						model[i].recalled = true
					case errors.Is(err, ErrTimerNotPending):
						if model[i].due.After(clock.Now()) {
							t.Fatalf("step %d: message %d due %v refused a recall as delivered at %v", step, i, model[i].due, clock.Now())
						}
					default:
						t.Fatalf("step %d: recall: %v", step, err)
					}
				case r < 9:
					clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
					timerRounds(s)
					check(fmt.Sprintf("step %d", step))
				case r < 10:
					if err := s.timers.Persist(); err != nil {
						t.Fatalf("step %d: persist: %v", step, err)
					}
				default:
					resume := s.pause()
					img := fs.Crash(rng)
					resume()
					s.Close()
					fs = img
					o.FS = fs
					if s, err = Open(o); err != nil {
						t.Fatalf("step %d: open after a power cut: %v", step, err)
					}
					haltTimers(s)
					check(fmt.Sprintf("step %d, after a power cut", step))
				}
			}
			clock.Advance(time.Hour)
			timerRounds(s)
			check("at the end")
			got := map[string]bool{}
			for _, b := range timerBodies(t, s, "Real", 0) {
				got[b] = true
			}
			for i, m := range model {
				if !m.recalled && !got[strconv.Itoa(i)] {
					t.Fatalf("message %d (due %v) lost", i, m.due)
				}
			}
		})
	}
}
