package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/pop"
	"github.com/storaged/storaged/storage/storagetest"
)

func popQueueKey(group, topic string, q int32) pop.QueueKey {
	return pop.QueueKey{Group: group, Topic: topic, Queue: q}
}

var popEpoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// openPopTest opens a store on dir with a fake clock (real mmapped files).
func openPopTest(t testing.TB, dir string, clk *storagetest.Clock, mod func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, FileSize: 64 << 10, MaxMessageSize: 4 << 10, Clock: clk, DefaultQueues: 3}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func popReq(group, topic string, n int) PopRequest {
	return PopRequest{Group: group, Topic: topic, MaxMessages: n, Invisible: 10 * time.Second}
}

func mustPop(t testing.TB, s *Store, req PopRequest) []PopMessage {
	t.Helper()
	ms, err := s.PopReceive(context.Background(), req)
	if err != nil {
		t.Fatalf("receive %+v: %v", req, err)
	}
	return ms
}

func bodies(ms []PopMessage) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Record.Body))
	}
	sort.Strings(out)
	return out
}

func putBodies(t testing.TB, s *Store, topic string, bs ...string) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for i, b := range bs {
		m := msg(topic, b)
		m.QueueID = int32(i % 3)
		res, err := s.PutMessage(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		ids[b] = res.Append.MsgIDs()[0]
	}
	return ids
}

// TestPopReceiveAckRedeliver: a receive hands out every visible message
// once (attempt 1, the sent msgId, a handle each); nothing more is visible
// while they are in flight; once their invisible duration passes, the
// unacknowledged ones come back through %RETRY%g with attempt 2, the
// original topic and msgId, and the acknowledged ones never do; a used or
// stale handle is refused.
func TestPopReceiveAckRedeliver(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			clk := storagetest.NewClock(popEpoch)
			s := openPopTest(t, t.TempDir(), clk, func(o *Options) { o.FlushMode = mode })
			ids := putBodies(t, s, "T", "a", "b", "c", "d", "e")
			got := mustPop(t, s, popReq("g", "T", 32))
			if want := []string{"a", "b", "c", "d", "e"}; !slices.Equal(bodies(got), want) {
				t.Fatalf("first receive %v, want %v", bodies(got), want)
			}
			handles := map[string]string{}
			for _, m := range got {
				b := string(m.Record.Body)
				if m.Attempt != 1 || m.Topic != "T" || m.MsgID != ids[b] || m.Handle == "" || !m.Deadline.Equal(popEpoch.Add(10*time.Second)) {
					t.Errorf("%s: attempt %d topic %s msgId %s (sent %s) handle %q deadline %v", b, m.Attempt, m.Topic, m.MsgID, ids[b], m.Handle, m.Deadline)
				}
				handles[b] = m.Handle
			}
			if again := mustPop(t, s, popReq("g", "T", 32)); len(again) != 0 {
				t.Fatalf("in flight, yet received again: %v", bodies(again))
			}
			// Another group has its own cursor.
			if other := mustPop(t, s, popReq("h", "T", 32)); len(other) != 5 {
				t.Fatalf("group h received %v", bodies(other))
			}
			errs, err := s.PopAck(context.Background(), "g", "T", []string{handles["a"], handles["c"], handles["a"]})
			if err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
				t.Fatalf("ack: %v %v", errs, err)
			}
			errs, err = s.PopAck(context.Background(), "g", "T", []string{handles["a"], "junk", handles["b"][:10]})
			if err != nil || !errors.Is(errs[0], ErrInvalidHandle) || !errors.Is(errs[1], ErrInvalidHandle) || !errors.Is(errs[2], ErrInvalidHandle) {
				t.Fatalf("acks of an acked handle and junk: %v %v", errs, err)
			}
			if errs, _ := s.PopAck(context.Background(), "h", "T", []string{handles["b"]}); !errors.Is(errs[0], ErrInvalidHandle) {
				t.Fatalf("g's handle acked for h: %v", errs)
			}
			clk.Advance(10*time.Second - time.Millisecond)
			if early := mustPop(t, s, popReq("g", "T", 32)); len(early) != 0 {
				t.Fatalf("redelivered before the invisible duration passed: %v", bodies(early))
			}
			clk.Advance(time.Millisecond)
			re := mustPop(t, s, popReq("g", "T", 32))
			if want := []string{"b", "d", "e"}; !slices.Equal(bodies(re), want) {
				t.Fatalf("redelivered %v, want %v", bodies(re), want)
			}
			for _, m := range re {
				b := string(m.Record.Body)
				if m.Attempt != 2 || m.Topic != "T" || m.MsgID != ids[b] || m.Record.Topic != RetryTopic("g") {
					t.Errorf("%s redelivered: attempt %d topic %s (record's %s) msgId %s, sent %s", b, m.Attempt, m.Topic, m.Record.Topic, m.MsgID, ids[b])
				}
				if v, _ := m.Record.Property(PropertyRetryTopic); v != "T" {
					t.Errorf("%s: RETRY_TOPIC %q", b, v)
				}
			}
			// The handle of the first delivery is over.
			if errs, _ := s.PopAck(context.Background(), "g", "T", []string{handles["b"]}); !errors.Is(errs[0], ErrInvalidHandle) {
				t.Fatalf("first delivery's handle after redelivery: %v", errs)
			}
			var hs []string
			for _, m := range re {
				hs = append(hs, m.Handle)
			}
			if errs, err := s.PopAck(context.Background(), "g", "T", hs); err != nil || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
				t.Fatalf("ack of the redeliveries: %v %v", errs, err)
			}
			clk.Advance(time.Hour)
			if after := mustPop(t, s, popReq("g", "T", 32)); len(after) != 0 {
				t.Fatalf("acknowledged, yet delivered again: %v", bodies(after))
			}
			if n := s.PopInflight("g"); n != 0 {
				t.Fatalf("%d in flight after every ack", n)
			}
		})
	}
}

// TestPopChangeInvisible: a new handle replaces the old; the message
// stays invisible until the new deadline, then comes back; zero makes it
// visible at once (a nack).
func TestPopChangeInvisible(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	s := openPopTest(t, t.TempDir(), clk, nil)
	putBodies(t, s, "T", "a")
	m := mustPop(t, s, popReq("g", "T", 1))[0]
	n, err := s.PopChangeInvisible(context.Background(), "g", "T", m.Handle, time.Minute)
	if err != nil || n.Handle == m.Handle || !n.Deadline.Equal(popEpoch.Add(time.Minute)) {
		t.Fatalf("change: %+v %v", n, err)
	}
	if _, err := s.PopChangeInvisible(context.Background(), "g", "T", m.Handle, time.Minute); !errors.Is(err, ErrInvalidHandle) {
		t.Fatalf("change with the old handle: %v", err)
	}
	clk.Advance(30 * time.Second) // past the first deadline, before the new one
	if got := mustPop(t, s, popReq("g", "T", 1)); len(got) != 0 {
		t.Fatalf("visible before the changed deadline: %v", bodies(got))
	}
	clk.Advance(30 * time.Second)
	re := mustPop(t, s, popReq("g", "T", 1))
	if len(re) != 1 || re[0].Attempt != 2 {
		t.Fatalf("after the changed deadline: %+v", re)
	}
	// A nack: visible again at once.
	if _, err := s.PopChangeInvisible(context.Background(), "g", "T", re[0].Handle, 0); err != nil {
		t.Fatal(err)
	}
	if again := mustPop(t, s, popReq("g", "T", 1)); len(again) != 1 || again[0].Attempt != 3 {
		t.Fatalf("after a nack: %+v", again)
	}
}

// TestPopDeadLetter: past the group's max attempts a message goes to
// %DLQ%g (readable there with its original topic and msgId) and is never
// received again; ForwardMessageToDeadLetterQueue moves one at once.
func TestPopDeadLetter(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	s := openPopTest(t, t.TempDir(), clk, nil)
	ids := putBodies(t, s, "T", "a", "b")
	req := popReq("g", "T", 32)
	req.MaxAttempts = 2
	first := mustPop(t, s, req)
	if len(first) != 2 {
		t.Fatalf("first receive %v", bodies(first))
	}
	var fwd PopMessage
	for _, m := range first {
		if string(m.Record.Body) == "b" {
			fwd = m
		}
	}
	if err := s.PopForwardDLQ(context.Background(), "g", "T", fwd.Handle); err != nil {
		t.Fatal(err)
	}
	if err := s.PopForwardDLQ(context.Background(), "g", "T", fwd.Handle); !errors.Is(err, ErrInvalidHandle) {
		t.Fatalf("forward twice: %v", err)
	}
	clk.Advance(req.Invisible)
	second := mustPop(t, s, req)
	if len(second) != 1 || string(second[0].Record.Body) != "a" || second[0].Attempt != 2 {
		t.Fatalf("second receive %+v", second)
	}
	clk.Advance(req.Invisible)
	if third := mustPop(t, s, req); len(third) != 0 {
		t.Fatalf("delivered past max attempts: %+v", third)
	}
	if n := s.PopInflight("g"); n != 0 {
		t.Fatalf("%d in flight", n)
	}
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: DLQTopic("g"), QueueID: 0})
	if err != nil {
		t.Fatal(err)
	}
	var dlq []string
	for _, r := range res.Messages {
		b := string(r.Body)
		dlq = append(dlq, b)
		if v, _ := r.Property(PropertyRetryTopic); v != "T" {
			t.Errorf("DLQ %s: RETRY_TOPIC %q", b, v)
		}
		if v, _ := r.Property(PropertyOriginMessageID); v != ids[b] {
			t.Errorf("DLQ %s: ORIGIN_MESSAGE_ID %q, sent %s", b, v, ids[b])
		}
	}
	if !slices.Equal(dlq, []string{"b", "a"}) {
		t.Fatalf("DLQ holds %v, want [b a]", dlq)
	}
}

// TestPopFilterAndBounds: a tag filter skips what it does not match (and
// a later receive without it does not see the skipped ones: they are
// consumed for the group); the batch, in-flight and request bounds hold.
func TestPopFilterAndBounds(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	s := openPopTest(t, t.TempDir(), clk, func(o *Options) { o.MaxPopInflight = 10; o.MaxPopInflightPerGroup = 4 })
	for i := range 6 {
		tag := "x"
		if i%2 == 1 {
			tag = "y"
		}
		if _, err := s.PutMessage(context.Background(), msg("T", fmt.Sprint(i), Property{Key: PropertyTags, Value: tag})); err != nil {
			t.Fatal(err)
		}
	}
	req := popReq("g", "T", 32)
	req.Tags = []string{"y"}
	if got := bodies(mustPop(t, s, req)); !slices.Equal(got, []string{"1", "3", "5"}) {
		t.Fatalf("tag y: %v", got)
	}
	if got := mustPop(t, s, popReq("g", "T", 32)); len(got) != 0 {
		t.Fatalf("after the filtered receive: %v", bodies(got))
	}
	// Group h: 4 in flight at most.
	if got := mustPop(t, s, popReq("h", "T", 3)); len(got) != 3 {
		t.Fatalf("batch of 3: %d", len(got))
	}
	if got := mustPop(t, s, popReq("h", "T", 32)); len(got) != 1 {
		t.Fatalf("room for 1: %d", len(got))
	}
	if _, err := s.PopReceive(context.Background(), popReq("h", "T", 1)); !errors.Is(err, ErrTooManyInflight) {
		t.Fatalf("beyond the group's bound: %v", err)
	}
	var verr *ValidationError
	for name, r := range map[string]PopRequest{
		"batch 0":        popReq("g", "T", 0),
		"batch 33":       popReq("g", "T", MaxPopBatch+1),
		"invisible 0":    {Group: "g", Topic: "T", MaxMessages: 1},
		"invisible 13h":  {Group: "g", Topic: "T", MaxMessages: 1, Invisible: 13 * time.Hour},
		"bad group":      popReq("g/", "T", 1),
		"long group":     popReq(string(make([]byte, 130)), "T", 1),
		"system topic":   popReq("g", PopTopic, 1),
		"offsets topic":  popReq("g", OffsetTopic, 1),
		"attempts 1001":  {Group: "g", Topic: "T", MaxMessages: 1, Invisible: time.Second, MaxAttempts: 1001},
		"schedule topic": popReq("g", ScheduleTopic, 1),
	} {
		if _, err := s.PopReceive(context.Background(), r); !errors.As(err, &verr) {
			t.Errorf("%s: %v, want a *ValidationError", name, err)
		}
	}
	if _, err := s.PopAck(context.Background(), "g", "T", nil); !errors.As(err, &verr) {
		t.Errorf("empty ack: %v", err)
	}
	if _, err := s.PopAck(context.Background(), "g", "T", make([]string, MaxPopAckEntries+1)); !errors.As(err, &verr) {
		t.Errorf("ack of too many: %v", err)
	}
	// The POP state topic is the store's own.
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: PopTopic}); !errors.Is(err, ErrQueueNotFound) {
		t.Errorf("pull of %s: %v", PopTopic, err)
	}
	for _, q := range s.Queues() {
		if q.Topic == PopTopic {
			t.Errorf("Queues lists %s", PopTopic)
		}
	}
}

// TestPopLongPoll: a receive waiting on an empty topic returns the
// message put while it waits, and one waiting on messages in flight
// returns the redelivery once the clock passes their deadline.
func TestPopLongPoll(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	s := openPopTest(t, t.TempDir(), clk, nil)
	req := popReq("g", "T", 1)
	req.Wait = time.Minute // real time: only a failure would wait it out
	got := make(chan []PopMessage, 1)
	go func() {
		ms, err := s.PopReceive(context.Background(), req)
		if err != nil {
			t.Error(err)
		}
		got <- ms
	}()
	putBodies(t, s, "T", "a")
	ms := <-got
	if len(ms) != 1 || string(ms[0].Record.Body) != "a" {
		t.Fatalf("long poll got %v", bodies(ms))
	}
	pending := clk.Pending()
	go func() {
		ms, err := s.PopReceive(context.Background(), req)
		if err != nil {
			t.Error(err)
		}
		got <- ms
	}()
	clk.WaitPending(t, pending+1) // the receive waits for the deadline
	clk.Advance(req.Invisible)
	ms = <-got
	if len(ms) != 1 || ms[0].Attempt != 2 {
		t.Fatalf("long poll for the redelivery got %+v", ms)
	}
}

// popModel is what the POP state must be: every message by body.
type popModel struct {
	msgs map[string]*modelMsg
}

type modelMsg struct {
	deliveries int
	state      int // 0 never delivered, 1 in flight, 2 acked, 3 dead-lettered
	deadline   time.Time
	handle     string
	revived    bool // its deadline passed and a receive of the group moved it
}

// visible reports whether m may be received at now (a receive moves it
// first when its deadline passed).
func (m *modelMsg) visible(now time.Time, maxAttempts int) bool {
	switch m.state {
	case 0:
		return true
	case 1:
		return !now.Before(m.deadline) && m.deliveries < maxAttempts
	}
	return false
}

// TestPopModel drives the store's POP state with random puts, receives,
// acks (current and stale handles), invisible-duration changes, clock
// moves, clean reopens and kill -9 crashes (TempDir, real mmapped files),
// and checks every answer against a model: a receive returns exactly
// min(batch, visible) messages, each visible in the model with the attempt
// the model counts; an ack or a change succeeds exactly for a current
// handle; nothing acknowledged or dead-lettered is ever delivered again,
// across restarts.
func TestPopModel(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				popModelRun(t, mode, seed, 300)
			}
		})
	}
}

func popModelRun(t *testing.T, mode FlushMode, seed uint64, steps int) {
	const maxAttempts = 3
	rng := rand.New(rand.NewPCG(seed, 99))
	clk := storagetest.NewClock(popEpoch)
	dir := t.TempDir()
	open := func() *Store {
		s, err := Open(Options{Dir: dir, FileSize: 64 << 10, MaxMessageSize: 4 << 10, Clock: clk, DefaultQueues: 3, FlushMode: mode})
		if err != nil {
			t.Fatalf("seed %d: open: %v", seed, err)
		}
		return s
	}
	s := open()
	defer func() { s.Close() }()
	m := popModel{msgs: map[string]*modelMsg{}}
	next := 0
	var handles []string // every handle ever handed out
	stats := map[string]int{}
	for step := 0; step < steps && !t.Failed(); step++ {
		now := clk.Now()
		switch op := rng.IntN(100); {
		case op < 20:
			b := fmt.Sprintf("m%d", next)
			next++
			mm := msg("T", b)
			mm.QueueID = int32(rng.IntN(3))
			if _, err := s.PutMessage(context.Background(), mm); err != nil {
				t.Fatal(err)
			}
			m.msgs[b] = &modelMsg{}
			stats["put"]++
		case op < 50:
			n := 1 + rng.IntN(4)
			visible := 0
			for _, mm := range m.msgs {
				if mm.visible(now, maxAttempts) {
					visible++
				}
			}
			req := PopRequest{Group: "g", Topic: "T", MaxMessages: n, Invisible: time.Duration(1+rng.IntN(5)) * time.Second, MaxAttempts: maxAttempts}
			got, err := s.PopReceive(context.Background(), req)
			if err != nil {
				t.Fatalf("seed %d step %d: receive: %v", seed, step, err)
			}
			// The receive moved every due message first.
			for _, mm := range m.msgs {
				if mm.state == 1 && !now.Before(mm.deadline) {
					mm.revived = true
					if mm.deliveries >= maxAttempts {
						mm.state = 3
					}
				}
			}
			if len(got) != min(n, visible) {
				t.Fatalf("seed %d step %d: received %v, want %d of %d visible", seed, step, bodies(got), min(n, visible), visible)
			}
			for _, g := range got {
				b := string(g.Record.Body)
				mm := m.msgs[b]
				if mm == nil || !mm.visible(now, maxAttempts) {
					t.Fatalf("seed %d step %d: received %s, model %+v", seed, step, b, mm)
				}
				if int(g.Attempt) != mm.deliveries+1 {
					t.Fatalf("seed %d step %d: %s attempt %d, model delivered it %d times", seed, step, b, g.Attempt, mm.deliveries)
				}
				mm.deliveries++
				mm.state, mm.deadline, mm.handle, mm.revived = 1, now.Add(req.Invisible), g.Handle, false
				handles = append(handles, g.Handle)
			}
			stats["receive"] += len(got)
		case op < 70 && len(handles) > 0:
			h := handles[rng.IntN(len(handles))]
			errs, err := s.PopAck(context.Background(), "g", "T", []string{h})
			if err != nil {
				t.Fatal(err)
			}
			var owner *modelMsg
			for _, mm := range m.msgs {
				if mm.handle == h && mm.state == 1 && !mm.revived {
					owner = mm
				}
			}
			if (errs[0] == nil) != (owner != nil) {
				t.Fatalf("seed %d step %d: ack: %v, model: current handle %v", seed, step, errs[0], owner != nil)
			}
			if owner != nil {
				owner.state = 2
				stats["ack"]++
			}
		case op < 80 && len(handles) > 0:
			h := handles[rng.IntN(len(handles))]
			d := time.Duration(rng.IntN(4)) * time.Second
			nm, err := s.PopChangeInvisible(context.Background(), "g", "T", h, d)
			var owner *modelMsg
			for _, mm := range m.msgs {
				if mm.handle == h && mm.state == 1 && !mm.revived {
					owner = mm
				}
			}
			if (err == nil) != (owner != nil) {
				t.Fatalf("seed %d step %d: change: %v, model: current handle %v", seed, step, err, owner != nil)
			}
			if owner != nil {
				owner.handle, owner.deadline = nm.Handle, now.Add(d)
				handles = append(handles, nm.Handle)
				stats["change"]++
			}
		case op < 93:
			clk.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		case op < 97:
			s.crash()
			s = open()
			stats["crash"]++
		default:
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open()
			stats["reopen"]++
		}
	}
	t.Logf("seed %d %s: %v", seed, mode, stats)
}

// TestPopSurvivesRetention: POP state recorded in files that retention
// deletes is written again first: the cursor and the messages in flight
// (with their handles' generations) survive the deletion and a restart
// after it.
func TestPopSurvivesRetention(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, nil)
	fill(t, s, "T", 6)
	got, err := s.PopReceive(context.Background(), PopRequest{Group: "g", Topic: "T", MaxMessages: 2, Invisible: MaxPopInvisible})
	if err != nil || len(got) != 2 {
		t.Fatalf("receive: %d, %v", len(got), err)
	}
	first, _, _, _ := s.index.Queue(PopTopic, 0).Get(0)
	fill(t, s, "T", 30) // more files at T0
	clock.Advance(80 * time.Hour)
	fill(t, s, "T", 12)
	settle(t, s)
	clock.Set(time.Date(2026, 12, 2, 4, 0, 0, 0, time.Local))
	s.ret.Round()
	if s.log.MinOffset() <= first {
		t.Fatalf("retention kept the file of the first POP record (min %d, record at %d): %+v", s.log.MinOffset(), first, s.Stats().Retention)
	}
	check := func(s *Store) {
		t.Helper()
		s.pop.Mu.Lock()
		cur, ok := s.pop.Cursor(popQueueKey("g", "T", 0))
		n := s.pop.Inflight("g")
		s.pop.Mu.Unlock()
		if !ok || cur != 2 || n != 2 {
			t.Fatalf("cursor %d (%v), %d in flight; want 2, 2", cur, ok, n)
		}
	}
	check(s)
	s.Close()
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	haltScheduler(s2)
	check(s2)
	errs, err := s2.PopAck(context.Background(), "g", "T", []string{got[0].Handle, got[1].Handle})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack after retention and restart: %v %v", errs, err)
	}
}

// TestPopFifo: a FIFO receive pops a queue only when the group has none
// of its messages in flight, so nothing passes a message not yet
// acknowledged; one not acknowledged in time comes back in place (same
// queue offset, attempt + 1, new handle, nothing after it in the batch),
// not through %RETRY%; past the max attempts it goes to %DLQ% and the
// queue moves on. The deliveries in place survive a restart (version 2
// records).
func TestPopFifo(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	dir := t.TempDir()
	s := openPopTest(t, dir, clk, nil)
	if _, err := s.CreateTopic("F", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := s.PutMessage(context.Background(), msg("F", fmt.Sprintf("m%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	req := PopRequest{Group: "g", Topic: "F", MaxMessages: 2, Invisible: 10 * time.Second, MaxAttempts: 3, Fifo: true}
	check := func(what string, got []PopMessage, want []string, attempt int32) {
		t.Helper()
		var b []string
		for _, m := range got {
			b = append(b, string(m.Record.Body))
			if m.Attempt != attempt || m.Record.Topic != "F" {
				t.Fatalf("%s: %s with attempt %d from %s, want attempt %d from F", what, m.Record.Body, m.Attempt, m.Record.Topic, attempt)
			}
		}
		if !slices.Equal(b, want) {
			t.Fatalf("%s: received %v, want %v", what, b, want)
		}
	}
	ack := func(ms ...PopMessage) {
		t.Helper()
		for _, m := range ms {
			if errs, err := s.PopAck(ctx, "g", "F", []string{m.Handle}); err != nil || errs[0] != nil {
				t.Fatalf("ack %s: %v %v", m.Record.Body, errs, err)
			}
		}
	}
	first := mustPop(t, s, req)
	check("first", first, []string{"m0", "m1"}, 1)
	check("while both are in flight", mustPop(t, s, req), nil, 0)
	ack(first[0])
	check("while m1 is in flight", mustPop(t, s, req), nil, 0)
	clk.Advance(10 * time.Second)
	again := mustPop(t, s, req)
	check("m1 due", again, []string{"m1"}, 2)
	if errs, _ := s.PopAck(ctx, "g", "F", []string{first[1].Handle}); !errors.Is(errs[0], ErrInvalidHandle) {
		t.Fatalf("m1's first handle after its redelivery: %v", errs[0])
	}
	ack(again[0])
	next := mustPop(t, s, req)
	check("after m1's ack", next, []string{"m2", "m3"}, 1)

	// m2 and m3 are never acknowledged: delivered again in place, across
	// a restart, until their third delivery is over.
	clk.Advance(10 * time.Second)
	check("m2, m3 due", mustPop(t, s, req), []string{"m2", "m3"}, 2)
	s.Close()
	s = openPopTest(t, dir, clk, nil)
	clk.Advance(10 * time.Second)
	check("m2, m3 due after a restart", mustPop(t, s, req), []string{"m2", "m3"}, 3)
	clk.Advance(10 * time.Second)
	check("m2, m3 dead-lettered", mustPop(t, s, req), []string{"m4", "m5"}, 1)
	res, err := s.PullMessages(ctx, PullRequest{Topic: DLQTopic("g"), QueueID: 0, MaxMessages: 8})
	if err != nil || len(res.Messages) != 2 {
		t.Fatalf("%s: %d messages, %v", DLQTopic("g"), len(res.Messages), err)
	}
	for i, r := range res.Messages {
		if string(r.Body) != fmt.Sprintf("m%d", i+2) || r.ReconsumeTimes != 2 {
			t.Fatalf("%s holds %s with reconsume times %d, want m%d, 2", DLQTopic("g"), r.Body, r.ReconsumeTimes, i+2)
		}
	}
	if _, err := s.Topic(RetryTopic("g")); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("a FIFO group used its retry topic: %v", err)
	}
}
