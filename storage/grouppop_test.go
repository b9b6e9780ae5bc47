package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/pop"
	"github.com/storaged/storaged/storage/storagetest"
)

// POP consumption in group mode (pop.go, sysrecords.go): receives, acks,
// changes and redeliveries are proposed on the ready leader and applied by
// every replica as they commit, so a new leader holds the in-flight table
// and takes the handles the old one gave out.

// popState is a store's POP table as the ops that restate it (cursors and
// messages in flight with deadline and generation, in a fixed order).
func popState(s *Store) []pop.Op {
	s.pop.Mu.Lock()
	defer s.pop.Mu.Unlock()
	return s.pop.Below(math.MaxInt64)
}

// samePop checks that every id holds the POP table of ref, and that it
// has inflight messages in flight.
func (g *testGroup) samePop(ref uint64, inflight int, ids ...uint64) {
	g.t.Helper()
	want := popState(g.m[ref].s)
	if n := g.m[ref].s.PopInflight(""); n != inflight {
		g.t.Fatalf("node %d: %d messages in flight, want %d (%v)", ref, n, inflight, want)
	}
	for _, id := range ids {
		if got := popState(g.m[id].s); !reflect.DeepEqual(got, want) {
			g.t.Fatalf("node %d: POP state\n%v\nnode %d's\n%v", id, got, ref, want)
		}
	}
}

// popBodies maps the bodies of ms to their message.
func popBodies(t testing.TB, ms []PopMessage) map[string]PopMessage {
	t.Helper()
	out := map[string]PopMessage{}
	for _, m := range ms {
		if _, dup := out[string(m.Record.Body)]; dup {
			t.Fatalf("%q received twice in one receive", m.Record.Body)
		}
		out[string(m.Record.Body)] = m
	}
	return out
}

func sortedKeys(m map[string]PopMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestGroupPop: followers refuse every POP call with the leader's id and
// store nothing; a receive and an ack on the leader are applied by every
// replica; after the leader goes, the new one accepts the old one's
// receipt handles (ack, change of invisible duration), refuses a handle
// whose delivery is over, redelivers an unacknowledged message with its
// attempt counted once its invisible time has passed (through
// %RETRY%<group>, with the original topic and msgId), and forwards to
// %DLQ%<group>; the old leader rejoins with the same table, and a restart
// of all three rebuilds it.
func TestGroupPop(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Clock = clk })
	all := g.ids
	g.elect(1)
	ids := map[string]string{}
	for i := range 6 {
		body := fmt.Sprintf("m%d", i)
		res, err := g.put(1, body)
		if err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
		ids[body] = res.Append.MsgIDs()[0]
	}
	ctx := context.Background()
	g.converge(1, all...)

	// A follower refuses, naming the leader; nothing is stored.
	end := g.m[2].s.log.MaxOffset()
	f := g.m[2].s
	var nl *NotLeaderError
	if _, err := f.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 1, Invisible: time.Minute}); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("PopReceive on a follower: %v", err)
	}
	if _, err := f.PopAck(ctx, "g", "T", []string{"x"}); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("PopAck on a follower: %v", err)
	}
	if _, err := f.PopChangeInvisible(ctx, "g", "T", "x", time.Second); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("PopChangeInvisible on a follower: %v", err)
	}
	if err := f.PopForwardDLQ(ctx, "g", "T", "x"); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("PopForwardDLQ on a follower: %v", err)
	}
	if f.log.MaxOffset() != end {
		t.Fatal("a refused POP call wrote to the follower's commitlog")
	}

	// Receive four on the leader, ack one.
	ms, err := g.m[1].s.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 4, Invisible: 30 * time.Second})
	if err != nil || len(ms) != 4 {
		t.Fatalf("receive on the leader: %d messages, %v", len(ms), err)
	}
	got := popBodies(t, ms)
	if k := sortedKeys(got); !reflect.DeepEqual(k, []string{"m0", "m1", "m2", "m3"}) {
		t.Fatalf("received %v, want m0-m3", k)
	}
	for b, m := range got {
		if m.Attempt != 1 || m.MsgID != ids[b] || m.Topic != "T" {
			t.Fatalf("%s: attempt %d, msgId %s, topic %s", b, m.Attempt, m.MsgID, m.Topic)
		}
	}
	if errs, err := g.m[1].s.PopAck(ctx, "g", "T", []string{got["m0"].Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack m0 on the leader: %v %v", errs, err)
	}
	g.converge(1, all...)
	g.samePop(1, 3, all...)

	// The leader goes. The new one holds the table and the old handles.
	g.closeMember(1)
	nl2 := g.failover(2, 3)
	ld := g.m[nl2].s
	g.samePop(nl2, 3, 2, 3)
	if errs, err := ld.PopAck(ctx, "g", "T", []string{got["m1"].Handle, got["m0"].Handle}); err != nil ||
		errs[0] != nil || !errors.Is(errs[1], ErrInvalidHandle) {
		t.Fatalf("ack of m1 (in flight) and m0 (acknowledged) on the new leader: %v %v", errs, err)
	}
	m2, err := ld.PopChangeInvisible(ctx, "g", "T", got["m2"].Handle, 5*time.Minute)
	if err != nil {
		t.Fatalf("change of m2's invisible duration on the new leader: %v", err)
	}
	if _, err := ld.PopChangeInvisible(ctx, "g", "T", got["m2"].Handle, time.Minute); !errors.Is(err, ErrInvalidHandle) {
		t.Fatalf("m2's handle before its change: %v", err)
	}

	// m3's invisible time passes: the new leader's next receive hands it
	// out again, attempt 2, with the fresh m4 and m5; m2 stays invisible.
	clk.Advance(31 * time.Second)
	ms, err = ld.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 32, Invisible: 30 * time.Second})
	if err != nil {
		t.Fatalf("receive on the new leader: %v", err)
	}
	again := popBodies(t, ms)
	if k := sortedKeys(again); !reflect.DeepEqual(k, []string{"m3", "m4", "m5"}) {
		t.Fatalf("the new leader's receive got %v, want m3 (redelivered), m4, m5", k)
	}
	if m := again["m3"]; m.Attempt != 2 || m.Topic != "T" || m.MsgID != ids["m3"] {
		t.Fatalf("m3 redelivered with attempt %d, topic %s, msgId %s (want 2, T, %s)", m.Attempt, m.Topic, m.MsgID, ids["m3"])
	}
	if m := again["m4"]; m.Attempt != 1 {
		t.Fatalf("m4: attempt %d", m.Attempt)
	}
	if _, err := ld.PopAck(ctx, "g", "T", []string{got["m3"].Handle}); err != nil {
		t.Fatal(err)
	} else if errs, _ := ld.PopAck(ctx, "g", "T", []string{got["m3"].Handle}); !errors.Is(errs[0], ErrInvalidHandle) {
		t.Fatalf("m3's first handle after its redelivery: %v", errs[0])
	}
	if errs, err := ld.PopAck(ctx, "g", "T", []string{again["m3"].Handle, again["m4"].Handle}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack m3 and m4: %v %v", errs, err)
	}
	if err := ld.PopForwardDLQ(ctx, "g", "T", again["m5"].Handle); err != nil {
		t.Fatalf("forward m5 to the DLQ: %v", err)
	}
	// In flight: m2 only.
	end = g.converge(nl2, 2, 3)
	g.sameBytes(end, 2, 3)
	g.samePop(nl2, 1, 2, 3)

	// The old leader rejoins and catches up; the retry and dead-letter
	// copies are on every replica.
	g.open(1)
	end = g.converge(nl2, all...)
	g.sameBytes(end, all...)
	g.samePop(nl2, 1, all...)
	for _, id := range all {
		s := g.m[id].s
		res, err := s.PullMessages(ctx, PullRequest{Topic: DLQTopic("g"), QueueID: 0, MaxMessages: 8})
		if err != nil || len(res.Messages) != 1 || string(res.Messages[0].Body) != "m5" {
			t.Fatalf("node %d: %s holds %d messages (%v), want m5", id, DLQTopic("g"), len(res.Messages), err)
		}
		res, err = s.PullMessages(ctx, PullRequest{Topic: RetryTopic("g"), QueueID: 0, MaxMessages: 8})
		if err != nil || len(res.Messages) != 1 || string(res.Messages[0].Body) != "m3" || res.Messages[0].ReconsumeTimes != 1 {
			t.Fatalf("node %d: %s holds %d messages (%v), want m3 reconsumed once", id, RetryTopic("g"), len(res.Messages), err)
		}
	}

	// All restart: every table is rebuilt from the log as it was; a
	// third leader still takes m2's handle.
	want := popState(g.m[nl2].s)
	for _, id := range all {
		g.closeMember(id)
	}
	for _, id := range all {
		g.open(id)
	}
	for _, id := range all {
		if st := popState(g.m[id].s); !reflect.DeepEqual(st, want) {
			t.Fatalf("node %d after a restart: POP state\n%v\nwant\n%v", id, st, want)
		}
		// It closed cleanly: its start restored its snapshot and
		// replayed no POP record.
		if sn := &g.m[id].s.popSnap; !sn.restored || sn.replayed != 0 {
			t.Fatalf("node %d after a clean restart: restored %v, replayed %d", id, sn.restored, sn.replayed)
		}
	}
	g.elect(1)
	if errs, err := g.m[1].s.PopAck(ctx, "g", "T", []string{m2.Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack m2 on the third leader: %v %v", errs, err)
	}
	g.converge(1, all...)
	g.samePop(1, 0, all...)
	// Nothing is left to receive: m0-m5 all acknowledged or dead-lettered.
	if ms, err := g.m[1].s.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 32, Invisible: time.Minute}); err != nil || len(ms) != 0 {
		t.Fatalf("a receive after everything was acknowledged: %d messages (%v)", len(ms), err)
	}
}

// TestGroupPopTagSkip: messages a receive's tag filter skips, with
// nothing to hand out, move the group's cursor through the log (a
// replica's table changes only through records), so a new leader does not
// hand them out again.
func TestGroupPopTagSkip(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	ctx := context.Background()
	put := func(id uint64, body, tag string) {
		t.Helper()
		m := &Message{Topic: "T", Body: []byte(body), BornTimestamp: 1, BornHost: DefaultStoreHost,
			Properties: []Property{{Key: PropertyTags, Value: tag}}}
		if res, err := g.m[id].s.PutMessage(ctx, m); err != nil || res.Status != PutOK {
			t.Fatalf("put: %v %v", res.Status, err)
		}
	}
	put(1, "m0", "b")
	put(1, "m1", "b")
	if ms, err := g.m[1].s.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", Tags: []string{"a"}, MaxMessages: 32, Invisible: time.Minute}); err != nil || len(ms) != 0 {
		t.Fatalf("receive of tag a: %d messages, %v", len(ms), err)
	}
	g.converge(1, all...)
	g.samePop(1, 0, all...)
	g.closeMember(1)
	nl := g.failover(2, 3)
	put(nl, "m2", "a")
	ms, err := g.m[nl].s.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 32, Invisible: time.Minute})
	if err != nil || len(ms) != 1 || string(ms[0].Record.Body) != "m2" {
		t.Fatalf("the new leader's receive: %v (%v), want m2 only (m0 and m1 were skipped for the group)", bodies(ms), err)
	}
}

// TestGroupPopSnapshotInstall: a follower that rejoins by a snapshot over a
// gap in its log ends up with the leader's POP table, though the records
// of the gap (an ack of a message it holds in flight among them) are
// never applied on it: it empties its table and applies the snapshot's
// records, which hold the live state (retention keeps every file holding
// a live POP record). A new leader then takes the old handles, and a
// restart of the follower rebuilds the same table.
func TestGroupPopSnapshotInstall(t *testing.T) {
	ctx := context.Background()
	const invisible = 12 * time.Hour // past the test clock's two hours of retention
	// byNum maps the messages of a receive by their number (the first
	// four bytes of behindGroup's bodies).
	byNum := func(ms []PopMessage) map[string]PopMessage {
		out := map[string]PopMessage{}
		for _, m := range ms {
			out[string(m.Record.Body[:4])] = m
		}
		return out
	}
	var got map[string]PopMessage   // the first receive: 0000-0003
	var m3 PopMessage               // 0003's handle after its change
	var later map[string]PopMessage // the receive while member 3 is down
	ack := func(s *Store, h string) {
		t.Helper()
		if errs, err := s.PopAck(ctx, "g", "T", []string{h}); err != nil || errs[0] != nil {
			t.Fatalf("ack: %v %v", errs, err)
		}
	}
	step := func(b *behindGroup, i int) {
		t.Helper()
		ld := b.m[1].s
		switch i {
		case 10: // member 3 is up: it applies this
			ms, err := ld.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 4, Invisible: invisible})
			if err != nil || len(ms) != 4 {
				t.Fatalf("receive: %d, %v", len(ms), err)
			}
			got = byNum(ms)
			ack(ld, got["0000"].Handle)
			ack(ld, got["0001"].Handle)
		case 11: // member 3 is down: the ack of 0002 lies in a file retention deletes
			ack(ld, got["0002"].Handle)
		case 40: // all the live state is written again past member 3's end
			var err error
			if m3, err = ld.PopChangeInvisible(ctx, "g", "T", got["0003"].Handle, invisible); err != nil {
				t.Fatal(err)
			}
			ms, err := ld.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 2, Invisible: invisible})
			if err != nil || len(ms) != 2 {
				t.Fatalf("receive: %d, %v", len(ms), err)
			}
			later = byNum(ms)
			ack(ld, later["0004"].Handle)
		}
	}
	b := newBehindGroupSteps(t, func(o *Options) { o.DefaultQueues = 1 }, step)
	g := b.testGroup
	if len(got) != 4 || got["0003"].Handle == "" || later["0005"].Handle == "" {
		t.Fatalf("received %v, then %v", got, later)
	}
	g.open(3)
	g.converge(1, g.ids...)
	g.poll("the leader's snapshot sender done", func() bool { sent, _, _, _ := b.loops[1].stats(); return sent > 0 }, 1)
	if min := g.m[3].s.log.MinOffset(); min <= b.old3End {
		t.Fatalf("member 3's oldest file starts at %d, not past its old end %d: no gap", min, b.old3End)
	}
	// In flight: 0003 (changed) and 0005.
	g.samePop(1, 2, g.ids...)

	g.closeMember(3)
	g.open(3)
	g.converge(1, g.ids...)
	g.samePop(1, 2, g.ids...)

	g.closeMember(1)
	nl := g.failover(2, 3)
	ld := g.m[nl].s
	if errs, err := ld.PopAck(ctx, "g", "T", []string{m3.Handle, later["0005"].Handle, got["0002"].Handle}); err != nil ||
		errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrInvalidHandle) {
		t.Fatalf("ack of 0003, 0005 (in flight) and 0002 (acknowledged) on the new leader %d: %v %v", nl, errs, err)
	}
	g.converge(nl, 2, 3)
	g.samePop(nl, 0, 2, 3)
}

// TestGroupPopRewrite: retention's restating of live POP state goes
// through raft on the ready leader only; every replica applies it (so the
// files holding the old records may go everywhere), with the same
// deadlines and generations: the handles given out before stay good, and
// a restart rebuilds the same table.
func TestGroupPopRewrite(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	ctx := context.Background()
	for i := range 4 {
		if res, err := g.put(1, fmt.Sprintf("m%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	ld := g.m[1].s
	ms, err := ld.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: 2, Invisible: time.Hour})
	if err != nil || len(ms) != 2 {
		t.Fatalf("receive: %d, %v", len(ms), err)
	}
	ld.pop.Mu.Lock()
	first, _ := ld.pop.OldestAt()
	ld.pop.Mu.Unlock()
	if res, err := g.put(1, "after"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	end := g.converge(1, all...)
	if first >= end {
		t.Fatalf("the receive's record at %d, the end %d", first, end)
	}
	// A follower cannot rewrite: it keeps the file holding the record.
	if keep := g.m[2].s.rewritePop(end); keep != first {
		t.Fatalf("a follower's rewrite below %d keeps from %d, want %d (the receive's record)", end, keep, first)
	}
	before := popState(ld)
	if keep := ld.rewritePop(end); keep != end {
		t.Fatalf("the leader's rewrite below %d keeps from %d, want %d", end, keep, end)
	}
	g.converge(1, all...)
	g.samePop(1, 2, all...)
	if after := popState(ld); !reflect.DeepEqual(after, before) {
		t.Fatalf("the rewrite changed the table:\n%v\nwas\n%v", after, before)
	}
	for _, id := range all {
		s := g.m[id].s
		s.pop.Mu.Lock()
		at, ok := s.pop.OldestAt()
		s.pop.Mu.Unlock()
		if !ok || at < end {
			t.Fatalf("node %d: after the rewrite the oldest POP record is at %d (%v), want at or past %d", id, at, ok, end)
		}
		if keep := s.rewritePop(end); keep != end {
			t.Fatalf("node %d: after the leader's rewrite, its own keeps from %d, want %d", id, keep, end)
		}
	}
	for _, id := range all {
		g.closeMember(id)
		g.open(id)
	}
	g.elect(2)
	g.converge(2, all...)
	g.samePop(2, 2, all...)
	handles := []string{ms[0].Handle, ms[1].Handle}
	if errs, err := g.m[2].s.PopAck(ctx, "g", "T", handles); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack of the handles given out before the rewrite: %v %v", errs, err)
	}
}

// TestGroupPopRewriteRacesAcks: rewrites before retention run while the
// received messages are acknowledged one by one; no rewrite restates a
// message whose ack was decided before it (it would be delivered again),
// on any replica.
func TestGroupPopRewriteRacesAcks(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	ctx := context.Background()
	const n = 32
	for i := range n {
		if res, err := g.put(1, fmt.Sprintf("m%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	ld := g.m[1].s
	ms, err := ld.PopReceive(ctx, PopRequest{Group: "g", Topic: "T", MaxMessages: n, Invisible: time.Hour})
	if err != nil || len(ms) != n {
		t.Fatalf("receive: %d, %v", len(ms), err)
	}
	done := make(chan struct{})
	rewrites := make(chan int)
	go func() {
		k := 0
		defer func() { rewrites <- k }()
		for {
			select {
			case <-done:
				return
			default:
			}
			ld.rewritePop(ld.log.MaxOffset())
			k++
		}
	}()
	for _, m := range ms {
		if errs, err := ld.PopAck(ctx, "g", "T", []string{m.Handle}); err != nil || errs[0] != nil {
			t.Fatalf("ack: %v %v", errs, err)
		}
	}
	close(done)
	k := <-rewrites
	g.converge(1, all...)
	g.samePop(1, 0, all...)
	t.Logf("%d rewrites during %d acks", k, n)
}

// TestGroupPopFifo: a FIFO group's deliveries in place are replicated: a
// message delivered again in place on one leader is delivered in place
// again by the next with its attempts counted on, and nothing after it
// is handed out before its ack.
func TestGroupPopFifo(t *testing.T) {
	clk := storagetest.NewClock(popEpoch)
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Clock = clk })
	all := g.ids
	g.elect(1)
	ctx := context.Background()
	if _, err := g.m[1].s.CreateTopic("F", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m := &Message{Topic: "F", Body: []byte(fmt.Sprintf("m%d", i)), BornTimestamp: 1, BornHost: DefaultStoreHost}
		if res, err := g.m[1].s.PutMessage(ctx, m); err != nil || res.Status != PutOK {
			t.Fatalf("put: %v %v", res.Status, err)
		}
	}
	req := PopRequest{Group: "g", Topic: "F", MaxMessages: 1, Invisible: 10 * time.Second, MaxAttempts: 5, Fifo: true}
	receive := func(id uint64, want string, attempt int32) PopMessage {
		t.Helper()
		ms, err := g.m[id].s.PopReceive(ctx, req)
		if err != nil || len(ms) != 1 || string(ms[0].Record.Body) != want || ms[0].Attempt != attempt {
			t.Fatalf("receive on %d: %d messages (%v), %v; want %s attempt %d", id, len(ms), bodies(ms), err, want, attempt)
		}
		return ms[0]
	}
	receive(1, "m0", 1)
	clk.Advance(10 * time.Second)
	receive(1, "m0", 2)
	g.converge(1, all...)
	g.samePop(1, 1, all...)
	g.closeMember(1)
	nl := g.failover(2, 3)
	if ms, err := g.m[nl].s.PopReceive(ctx, req); err != nil || len(ms) != 0 {
		t.Fatalf("the new leader handed out %v (%v) while m0 is in flight", bodies(ms), err)
	}
	clk.Advance(10 * time.Second)
	m0 := receive(nl, "m0", 3)
	if errs, err := g.m[nl].s.PopAck(ctx, "g", "F", []string{m0.Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack m0: %v %v", errs, err)
	}
	receive(nl, "m1", 1)
	g.converge(nl, 2, 3)
	g.samePop(nl, 1, 2, 3)
}

// BenchmarkPopReceiveAck: 16 consumers (8 × GOMAXPROCS on 2 cores), each
// op one receive of one 1 KiB message and its ack (two durable POP
// records), standalone sync against an in-process three-replica group on
// real files (one disk), with the 16 consumers in one consumer group (its
// changes serialized: one raft round each) or in 16 groups.
func BenchmarkPopReceiveAck(b *testing.B) {
	for _, c := range []struct {
		name   string
		group  bool
		groups int
	}{{"standalone-sync/1group", false, 1}, {"group3/1group", true, 1}, {"group3/16groups", true, 16}} {
		b.Run(c.name, func(b *testing.B) {
			var s *Store
			if c.group {
				g := newTestGroupWith(b, time.Minute, nil, func(o *Options) {
					o.FileSize, o.MaxMessageSize, o.Group.IndexUnits = 256<<20, 1<<20, 0
				})
				g.elect(1)
				s = g.m[1].s
			} else {
				var err error
				if s, err = Open(Options{Dir: b.TempDir(), FileSize: 256 << 20, FlushMode: FlushSync}); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
			}
			ctx := context.Background()
			if _, err := s.CreateTopic("P", 4); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 1024)
			for left := b.N; left > 0; {
				bt := &Batch{Topic: "P", QueueID: int32(left % 4), BornHost: DefaultStoreHost}
				for range min(left, 100) {
					bt.Messages = append(bt.Messages, BatchMessage{Body: body, BornTimestamp: 1})
				}
				if res, err := s.PutMessages(ctx, bt); err != nil || res.Status != PutOK {
					b.Fatalf("put: %v %v", res.Status, err)
				}
				left -= len(bt.Messages)
			}
			var next atomic.Int32
			b.SetBytes(int64(len(body)))
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				group := fmt.Sprintf("g%d", int(next.Add(1))%c.groups)
				for pb.Next() {
					ms, err := s.PopReceive(ctx, PopRequest{Group: group, Topic: "P", MaxMessages: 1, Invisible: time.Minute})
					if err != nil || len(ms) != 1 {
						b.Errorf("receive: %d, %v", len(ms), err)
						return
					}
					if errs, err := s.PopAck(ctx, group, "P", []string{ms[0].Handle}); err != nil || errs[0] != nil {
						b.Errorf("ack: %v %v", errs, err)
						return
					}
				}
			})
		})
	}
}
