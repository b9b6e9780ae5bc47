package storage

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/pop"
)

// Consumer state of a deleted topic (topicclear.go): a delete forgets the
// topic's committed offsets and POP state, on every member of a group and
// across restarts, so a re-created topic is consumed from offset 0.

// topicKeys is what s holds of topic: its offset keys and its POP ops.
func topicKeys(s *Store, topic string) ([]offsets.Key, []pop.Op) {
	var ks []offsets.Key
	for _, e := range s.offsets.Entries() {
		if e.Key.Topic == topic {
			ks = append(ks, e.Key)
		}
	}
	var ops []pop.Op
	for _, op := range popState(s) {
		if op.Key.Topic == topic {
			ops = append(ops, op)
		}
	}
	return ks, ops
}

// receiveBodies pops up to n messages of topic for group on s, acks them,
// and returns their bodies sorted.
func receiveBodies(t testing.TB, s *Store, group, topic string, n int) []string {
	t.Helper()
	ctx := context.Background()
	ms, err := s.PopReceive(ctx, PopRequest{Group: group, Topic: topic, MaxMessages: n, Invisible: time.Minute})
	if err != nil {
		t.Fatalf("PopReceive %s/%s: %v", group, topic, err)
	}
	var bodies, handles []string
	for _, m := range ms {
		bodies = append(bodies, string(m.Record.Body))
		handles = append(handles, m.Handle)
	}
	if len(handles) > 0 {
		errs, err := s.PopAck(ctx, group, topic, handles)
		if err != nil || errors.Join(errs...) != nil {
			t.Fatalf("PopAck %s/%s: %v %v", group, topic, err, errs)
		}
	}
	slices.Sort(bodies)
	return bodies
}

// TestDeleteTopicClearsConsumerState (standalone, real files): a group's
// committed offset and another's POP cursor and messages in flight on a
// topic are gone once it is deleted; the re-created topic reads as no
// committed offset, and a POP receive gets its messages from offset 0;
// a restart (which replays the old offset and POP records from the
// commitlog) keeps all of it cleared.
func TestDeleteTopicClearsConsumerState(t *testing.T) {
	o := Options{Dir: t.TempDir(), FileSize: 64 << 10, MaxMessageSize: 16 << 10}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	ctx := context.Background()
	if _, err := s.CreateTopic("T", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := s.PutMessage(ctx, msg("T", fmt.Sprint("old", i))); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, s)
	if err := s.CommitOffset(ctx, "c", "T", 0, 5); err != nil {
		t.Fatal(err)
	}
	// p: two received and acked, three in flight, cursor at 5.
	if got := receiveBodies(t, s, "p", "T", 2); len(got) != 2 {
		t.Fatalf("received %v", got)
	}
	if ms, err := s.PopReceive(ctx, PopRequest{Group: "p", Topic: "T", MaxMessages: 3, Invisible: time.Hour}); err != nil || len(ms) != 3 {
		t.Fatalf("receive: %d, %v", len(ms), err)
	}
	if ks, ops := topicKeys(s, "T"); len(ks) != 1 || len(ops) == 0 {
		t.Fatalf("before the delete: offsets %v, POP %v", ks, ops)
	}
	if _, err := s.DeleteTopic("T"); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if ks, ops := topicKeys(s, "T"); len(ks) != 0 || len(ops) != 0 {
			t.Fatalf("%s: offsets %v, POP %v of the deleted topic remain", what, ks, ops)
		}
		if n := s.PopInflight("p"); n != 0 {
			t.Fatalf("%s: %d of p's messages in flight", what, n)
		}
	}
	check("after the delete")
	if _, err := s.CreateTopic("T", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if res, err := s.PutMessage(ctx, msg("T", fmt.Sprint("new", i))); err != nil || res.Append.QueueOffset != int64(i) {
			t.Fatalf("put %d to the re-created topic: offset %d, %v", i, res.Append.QueueOffset, err)
		}
	}
	settle(t, s)
	if off, err := s.GetOffset("c", "T", 0); !errors.Is(err, ErrOffsetNotFound) {
		t.Fatalf("c's offset of the re-created topic: %d, %v; want none", off, err)
	}
	// A consumer with no offset starts at the queue's first message.
	if recs := pullAll(t, s, "T", 0); len(recs) != 3 || string(recs[0].Body) != "new0" {
		t.Fatalf("pull of the re-created topic: %d records", len(recs))
	}
	if got := receiveBodies(t, s, "p", "T", 32); !slices.Equal(got, []string{"new0", "new1", "new2"}) {
		t.Fatalf("p receives %v from the re-created topic, want new0-new2", got)
	}
	// c commits on the new topic; d only before the delete (below).
	if err := s.CommitOffset(ctx, "c", "T", 0, 1); err != nil {
		t.Fatal(err)
	}

	for _, restart := range []string{"restart", "second restart"} {
		s.Close()
		if s, err = Open(o); err != nil {
			t.Fatalf("%s: %v", restart, err)
		}
		if off, err := s.GetOffset("c", "T", 0); err != nil || off != 1 {
			t.Fatalf("%s: c's offset %d, %v; want 1 (committed after the delete)", restart, off, err)
		}
		if ks, _ := topicKeys(s, "T"); len(ks) != 1 {
			t.Fatalf("%s: offset keys of T %v, want c's only", restart, ks)
		}
		if n := s.PopInflight("p"); n != 0 {
			t.Fatalf("%s: %d of p's messages in flight (the deleted topic's came back)", restart, n)
		}
		if _, err := s.PutMessage(ctx, msg("T", "after-"+restart)); err != nil {
			t.Fatal(err)
		}
		settle(t, s)
		if got := receiveBodies(t, s, "p", "T", 32); !slices.Equal(got, []string{"after-" + restart}) {
			t.Fatalf("%s: p receives %v, want only the message put since", restart, got)
		}
	}
}

// TestGroupTopicDeleteClearsConsumerState: in a group the delete drops
// the topic's committed offsets and POP state on every member at the
// delete's log position: after it and a re-create, no member holds the
// old offsets (GetOffset reads none), a pull and a POP receive on the
// leader and, after a failover, on the new leader get the new messages
// from offset 0, and a restart of every member (replaying the old
// records) rebuilds the same cleared tables.
func TestGroupTopicDeleteClearsConsumerState(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	ctx := context.Background()
	for i := range 5 {
		g.putTopic(1, "T", fmt.Sprintf("old-%d", i))
	}
	ld := g.m[1].s
	for _, c := range []string{"c", "d"} {
		if err := ld.CommitOffset(ctx, c, "T", 0, 5); err != nil {
			t.Fatal(err)
		}
	}
	if ms, err := ld.PopReceive(ctx, PopRequest{Group: "p", Topic: "T", MaxMessages: 3, Invisible: time.Hour}); err != nil || len(ms) != 3 {
		t.Fatalf("receive: %d, %v", len(ms), err)
	}
	g.converge(1, g.ids...)
	g.samePop(1, 3, g.ids...)
	at, err := ld.DeleteTopic("T")
	if err != nil {
		t.Fatal(err)
	}
	g.converge(1, g.ids...)
	g.awaitTombstone(1, "T", at, g.ids...)
	check := func(what string, ids ...uint64) {
		t.Helper()
		for _, id := range ids {
			s := g.m[id].s
			ks, ops := topicKeys(s, "T")
			ops = slices.DeleteFunc(ops, func(op pop.Op) bool { return op.Key.Group == "q" }) // q received the new topic only
			if len(ks) != 0 || len(ops) != 0 {
				t.Fatalf("%s: member %d keeps offsets %v, POP %v of the deleted topic", what, id, ks, ops)
			}
			if n := s.PopInflight("p"); n != 0 {
				t.Fatalf("%s: member %d has %d of p's messages in flight", what, id, n)
			}
		}
	}
	check("after the delete", g.ids...)

	for i := range 2 {
		if off := g.putTopic(1, "T", fmt.Sprintf("new-%d", i)); off != int64(i) {
			t.Fatalf("re-created topic: put %d at queue offset %d", i, off)
		}
	}
	g.converge(1, g.ids...)
	for _, id := range g.ids {
		if off, err := g.m[id].s.GetOffset("c", "T", 0); !errors.Is(err, ErrOffsetNotFound) {
			t.Fatalf("member %d: c's offset of the re-created topic %d, %v; want none", id, off, err)
		}
		if _, bodies := g.topicBodies(id, "T"); !slices.Equal(bodies, []string{"new-0", "new-1"}) {
			t.Fatalf("member %d serves %q", id, bodies)
		}
	}
	if got := receiveBodies(t, ld, "q", "T", 32); !slices.Equal(got, []string{"new-0", "new-1"}) {
		t.Fatalf("q receives %v on the leader", got)
	}
	g.converge(1, g.ids...)
	g.samePop(1, 0, g.ids...)

	// The leader goes: the new one holds no old state either.
	g.closeMember(1)
	nl := g.failover(2, 3)
	check("after the failover", 2, 3)
	if got := receiveBodies(t, g.m[nl].s, "p", "T", 32); !slices.Equal(got, []string{"new-0", "new-1"}) {
		t.Fatalf("p receives %v on the new leader %d, want the re-created topic's messages from 0", got, nl)
	}
	if err := g.m[nl].s.CommitOffset(ctx, "c", "T", 0, 2); err != nil {
		t.Fatal(err)
	}
	g.open(1)
	g.converge(nl, g.ids...)
	want := map[offsets.Key]int64{{Group: "c", Topic: "T", Queue: 0}: 2}
	g.checkOffsets(want, g.ids...)
	g.samePop(nl, 0, g.ids...)

	// Every member restarts: the replay skips the deleted topic's records.
	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
	}
	g.checkOffsets(want, g.ids...)
	g.samePop(1, 0, g.ids...)
	if off, err := g.m[2].s.GetOffset("d", "T", 0); !errors.Is(err, ErrOffsetNotFound) {
		t.Fatalf("after the restart d's offset %d, %v; want none", off, err)
	}
	g.elect(3)
	g.putTopic(3, "T", "new-2")
	g.converge(3, g.ids...)
	if got := receiveBodies(t, g.m[3].s, "p", "T", 32); !slices.Equal(got, []string{"new-2"}) {
		t.Fatalf("p receives %v after the restart, want new-2 only", got)
	}
}

// raceDelete deletes topic Gone on s (standalone, or a group's leader)
// while two groups commit offsets of Gone/0 (holding 50 messages) and a
// third POP-receives from it and changes the invisible duration of what
// it got, in tight loops, and stops them once they tried 100 more times
// after the delete. It returns the delete's offset.
func raceDelete(t *testing.T, s *Store) int64 {
	t.Helper()
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var done atomic.Int64 // changes stored
	var tries atomic.Int64
	loop := func(fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tries.Add(1)
				if fn(i) == nil {
					done.Add(1)
				}
			}
		}()
	}
	for w := range 2 {
		loop(func(i int) error { return s.CommitOffset(ctx, fmt.Sprint("c", w), "Gone", 0, int64(i%51)) })
	}
	loop(func(int) error {
		ms, err := s.PopReceive(ctx, PopRequest{Group: "p", Topic: "Gone", MaxMessages: 1, Invisible: time.Hour})
		if err != nil || len(ms) == 0 {
			return errors.New("nothing received")
		}
		_, err = s.PopChangeInvisible(ctx, "p", "Gone", ms[0].Handle, 2*time.Hour)
		return err
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	wait := func(what string, cond func() bool) {
		deadline := time.Now().Add(time.Minute) // a hang guard
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: %d changes stored of %d tries", what, done.Load(), tries.Load())
			}
			runtime.Gosched()
		}
	}
	wait("changes before the delete", func() bool { return done.Load() >= 30 })
	at, err := s.DeleteTopic("Gone")
	if err != nil {
		t.Fatal(err)
	}
	after := tries.Load()
	wait("tries after the delete", func() bool { return tries.Load() >= after+100 })
	return at
}

// checkGoneCleared fails unless s holds no consumer state of Gone.
func checkGoneCleared(t *testing.T, what string, id uint64, s *Store) {
	t.Helper()
	if err := s.WriteErr(); err != nil {
		t.Fatalf("%s: member %d stopped: %v", what, id, err)
	}
	if ks, ops := topicKeys(s, "Gone"); len(ks) != 0 || len(ops) != 0 {
		t.Fatalf("%s: member %d holds offsets %v, POP %v of the deleted topic", what, id, ks, ops)
	}
	if n := s.PopInflight("p"); n != 0 {
		t.Fatalf("%s: member %d has %d of p's messages in flight", what, id, n)
	}
}

// TestDeleteTopicRacingConsumers (standalone): offset commits, POP
// receives and changes of invisible duration racing a delete land before
// it (and are dropped with it) or are refused: nothing of the topic's
// consumer state is left, nor after a restart.
func TestDeleteTopicRacingConsumers(t *testing.T) {
	o := Options{Dir: t.TempDir(), FileSize: 1 << 20, MaxMessageSize: 16 << 10}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	if _, err := s.CreateTopic("Gone", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := s.PutMessage(context.Background(), msg("Gone", fmt.Sprint("old-", i))); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, s)
	raceDelete(t, s)
	settle(t, s)
	checkGoneCleared(t, "after the delete", 0, s)
	s.Close()
	if s, err = Open(o); err != nil {
		t.Fatal(err)
	}
	checkGoneCleared(t, "after a restart", 0, s)
}

// TestGroupTopicDeleteRacingConsumers: the same on a group's leader: no
// member holds any consumer state of the topic after the delete, nor
// after a restart (the leader fences the changes from the proposal to the
// apply, topicclear.go).
func TestGroupTopicDeleteRacingConsumers(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	for i := range 50 {
		g.putTopic(1, "Gone", fmt.Sprintf("old-%d", i))
	}
	g.converge(1, g.ids...)
	at := raceDelete(t, g.m[1].s)
	g.converge(1, g.ids...)
	g.awaitTombstone(1, "Gone", at, g.ids...)
	for _, id := range g.ids {
		checkGoneCleared(t, "after the delete", id, g.m[id].s)
	}
	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
	}
	for _, id := range g.ids {
		checkGoneCleared(t, "after a restart", id, g.m[id].s)
	}
}
