package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// TestGroupTopicConfig: topic creates and raises in group mode go through
// the raft log: the leader's CreateTopic, UpdateTopic and a put's
// auto-create are applied by every replica (and survive a failover: the
// new leader takes puts to the queues only the created count has); a
// follower refuses them naming the leader, changing nothing; a replica
// whose table on disk lost the changes replays them from its raft log.
func TestGroupTopicConfig(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	ld := g.m[1].s
	var nl *NotLeaderError
	if _, err := g.m[2].s.CreateTopic("A", 16); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("CreateTopic on a follower: %v", err)
	}
	if _, err := ld.CreateTopic("A", 16); err != nil {
		t.Fatalf("CreateTopic on the leader: %v", err)
	}
	if _, err := ld.CreateTopic("A", 16); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("CreateTopic of an existing topic: %v", err)
	}
	if _, err := ld.UpdateTopic("A", 20); err != nil {
		t.Fatalf("UpdateTopic on the leader: %v", err)
	}
	if _, err := ld.UpdateTopic("A", 10); !errors.Is(err, ErrQueuesLowered) {
		t.Fatalf("UpdateTopic lowering: %v", err)
	}
	put := func(id uint64, topic string, q int32) error {
		res, err := g.m[id].s.PutMessage(context.Background(), &Message{Topic: topic, QueueID: q, Body: []byte("x"),
			BornTimestamp: 1, BornHost: DefaultStoreHost})
		if err == nil && res.Status != PutOK {
			err = errors.New(res.Status.String())
		}
		return err
	}
	if err := put(1, "A", 18); err != nil {
		t.Fatalf("put to A/18 on the leader: %v", err)
	}
	if err := put(1, "B", 0); err != nil { // auto-created with DefaultQueues
		t.Fatalf("put to the new topic B: %v", err)
	}
	if _, err := g.m[3].s.UpdateTopic("B", 12); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("UpdateTopic on a follower: %v", err)
	}
	want := map[string]int32{"A": 20, "B": DefaultQueues}
	check := func(ids ...uint64) {
		t.Helper()
		for _, id := range ids {
			for name, n := range want {
				info, err := g.m[id].s.Topic(name)
				if err != nil || info.Queues != n {
					t.Fatalf("node %d: topic %s has %d queues (%v), want %d", id, name, info.Queues, err, n)
				}
			}
		}
	}
	g.converge(1, all...)
	check(all...)

	// The new leader knows A's 20 queues: a put to A/19 is taken (it would
	// be refused, queue id out of range, had it auto-created A itself).
	g.closeMember(1)
	nl2 := g.failover(2, 3)
	if err := put(nl2, "A", 19); err != nil {
		t.Fatalf("put to A/19 on the new leader: %v", err)
	}
	if _, err := g.m[nl2].s.UpdateTopic("B", 12); err != nil {
		t.Fatalf("UpdateTopic on the new leader: %v", err)
	}
	want["B"] = 12
	g.open(1)
	g.converge(nl2, all...)
	check(all...)

	// A replica whose table on disk is gone replays the commands from its
	// raft log (adopting topics from its consume queues alone would give
	// A 20 queues only by chance, and B the default).
	g.closeMember(3)
	if err := os.Remove(filepath.Join(g.m[3].opts.Dir, "config", topicsName)); err != nil {
		t.Fatal(err)
	}
	g.open(3)
	check(3)
	for _, id := range all {
		g.closeMember(id)
		g.open(id)
	}
	check(all...)
}

// awaitTombstone ticks leader until every member of ids has applied the
// delete of topic tombstoned at at (a delete moves no commit end, so
// converge does not wait for it).
func (g *testGroup) awaitTombstone(leader uint64, topic string, at int64, ids ...uint64) {
	g.t.Helper()
	g.poll(fmt.Sprintf("the delete of %s applied", topic), func() bool {
		for _, id := range ids {
			if g.m[id].s.topics.tombstones()[topic] != at {
				return false
			}
		}
		return true
	}, leader)
}

// putTopic puts body to topic/0 on member id and returns its queue offset.
func (g *testGroup) putTopic(id uint64, topic, body string) int64 {
	g.t.Helper()
	res, err := g.m[id].s.PutMessage(context.Background(), &Message{Topic: topic, QueueID: 0, Body: []byte(body),
		BornTimestamp: 1, BornHost: DefaultStoreHost})
	if err != nil || res.Status != PutOK {
		g.t.Fatalf("put %s to %s on %d: %v %v", body, topic, id, res.Status, err)
	}
	return res.Append.QueueOffset
}

// topicBodies is what member id serves of topic/0: its bounds and the
// bodies by queue offset (nil when the queue does not exist).
func (g *testGroup) topicBodies(id uint64, topic string) (int64, []string) {
	g.t.Helper()
	s := g.m[id].s
	min, max, err := s.QueueInfo(topic, 0)
	if errors.Is(err, ErrQueueNotFound) || errors.Is(err, ErrTopicNotFound) {
		return 0, nil
	}
	if err != nil {
		g.t.Fatalf("member %d: QueueInfo %s: %v", id, topic, err)
	}
	var out []string
	for off := min; off < max; {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: 0, Offset: off, MaxMessages: 64})
		if err != nil || len(res.Messages) == 0 {
			g.t.Fatalf("member %d: pull %s/0 at %d of [%d, %d): %v", id, topic, off, min, max, err)
		}
		for i, r := range res.Messages {
			if r.QueueOffset != off+int64(i) {
				g.t.Fatalf("member %d: %s/0 offset %d holds queue offset %d", id, topic, off+int64(i), r.QueueOffset)
			}
			out = append(out, string(r.Body))
		}
		off = res.NextOffset
	}
	return min, out
}

// TestGroupTopicDelete: DeleteTopic is a replicated command. A follower
// refuses it naming the leader, nothing changed; the leader's delete is
// applied by every member at the same tombstone offset: the topic is
// gone from every table and its queues from every index; a put to it
// afterwards re-creates it at queue offset 0 on every member, never
// continuing the deleted queue; a delete of an unknown topic is
// ErrTopicNotFound; and all of it survives a restart of every member
// (the table on disk, or Open's replay of the commands before the queues
// are rebuilt).
func TestGroupTopicDelete(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	for i := range 5 {
		g.putTopic(1, "Gone", fmt.Sprintf("old-%d", i))
	}
	g.putTopic(1, "Kept", "kept-0")
	g.converge(1, g.ids...)
	var nl *NotLeaderError
	if _, err := g.m[2].s.DeleteTopic("Gone"); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("DeleteTopic on a follower: %v, want NOT_LEADER naming 1", err)
	}
	if _, err := g.m[1].s.Topic("Gone"); err != nil {
		t.Fatalf("after the follower's refusal: %v", err)
	}
	at, err := g.m[1].s.DeleteTopic("Gone")
	if err != nil || at <= 0 {
		t.Fatalf("DeleteTopic on the leader: %d %v", at, err)
	}
	if _, err := g.m[1].s.DeleteTopic("Gone"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("second DeleteTopic: %v, want ErrTopicNotFound", err)
	}
	if _, err := g.m[1].s.DeleteTopic("Never"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("DeleteTopic of an unknown topic: %v", err)
	}
	check := func(what string, wantGone []string) {
		t.Helper()
		for _, id := range g.ids {
			s := g.m[id].s
			if got := s.topics.tombstones()["Gone"]; got != at {
				t.Fatalf("%s: member %d tombstones Gone at %d, the leader's delete at %d", what, id, got, at)
			}
			if _, bodies := g.topicBodies(id, "Gone"); !slices.Equal(bodies, wantGone) {
				t.Fatalf("%s: member %d serves Gone/0 %q, want %q", what, id, bodies, wantGone)
			}
			if _, bodies := g.topicBodies(id, "Kept"); !slices.Equal(bodies, []string{"kept-0"}) {
				t.Fatalf("%s: member %d serves Kept/0 %q", what, id, bodies)
			}
			_, err := s.Topic("Gone")
			if exists := err == nil; exists != (wantGone != nil) {
				t.Fatalf("%s: member %d: Topic(Gone) %v, want it to exist: %v", what, id, err, wantGone != nil)
			}
		}
	}
	g.converge(1, g.ids...)
	g.awaitTombstone(1, "Gone", at, g.ids...)
	check("after the delete", nil)

	// Re-created by a put: at queue offset 0 everywhere.
	if off := g.putTopic(1, "Gone", "new-0"); off != 0 {
		t.Fatalf("the first put to the re-created topic at queue offset %d", off)
	}
	if off := g.putTopic(1, "Gone", "new-1"); off != 1 {
		t.Fatalf("the second put to the re-created topic at queue offset %d", off)
	}
	end := g.converge(1, g.ids...)
	g.sameBytes(end, g.ids...)
	check("after the re-create", []string{"new-0", "new-1"})

	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
	}
	check("after a restart", []string{"new-0", "new-1"})

	// A crash before the table on disk took the delete: Open replays it
	// from the raft log before the queues are rebuilt.
	g.elect(2)
	g.putTopic(2, "Kept", "kept-1")
	at2, err := g.m[2].s.DeleteTopic("Kept")
	if err != nil {
		t.Fatal(err)
	}
	g.converge(2, g.ids...)
	g.awaitTombstone(2, "Kept", at2, g.ids...)
	for _, id := range g.ids {
		g.closeMember(id)
	}
	// Member 3's table as before the delete: the raft log replays it.
	tb := &topicTable{fs: g.m[3].opts.FS, dir: filepath.Join(g.m[3].opts.Dir, "config"), log: g.m[3].opts.Logger}
	if tb.fs == nil {
		tb.fs = vfs.Default
	}
	if ok, err := tb.load(); !ok || err != nil {
		t.Fatalf("load member 3's table: %v %v", ok, err)
	}
	snap := tb.cur.Load().clone()
	snap.topics["Kept"] = DefaultQueues
	delete(snap.deleted, "Kept")
	tb.raftIndex = 1
	if err := tb.persistLocked(snap); err != nil {
		t.Fatal(err)
	}
	for _, id := range g.ids {
		g.open(id)
		s := g.m[id].s
		if _, err := s.Topic("Kept"); !errors.Is(err, ErrTopicNotFound) {
			t.Fatalf("member %d after the restart: Topic(Kept) %v", id, err)
		}
		if got := s.topics.tombstones()["Kept"]; got != at2 {
			t.Fatalf("member %d tombstones Kept at %d, want %d", id, got, at2)
		}
		if _, bodies := g.topicBodies(id, "Kept"); bodies != nil {
			t.Fatalf("member %d serves the deleted Kept/0 %q after the restart", id, bodies)
		}
		// Member 3 replayed Gone's delete and re-create too, in log order.
		if _, bodies := g.topicBodies(id, "Gone"); !slices.Equal(bodies, []string{"new-0", "new-1"}) {
			t.Fatalf("member %d serves Gone/0 %q after the replay", id, bodies)
		}
	}
}

// TestGroupTopicDeleteSnapshot: a member that was down while the leader
// deleted a topic it holds and then re-created it rejoins by a snapshot
// (the delete's command compacted away with the leader's log): the topic
// is deleted there too (tombstoned at the leader's offset, its old queue
// dropped, its consumer offsets and POP state gone as on the leader),
// and the re-created topic serves only the new messages from queue
// offset 0, after the install and after a restart.
func TestGroupTopicDeleteSnapshot(t *testing.T) {
	b := newBehindGroupSteps(t, nil, func(b *behindGroup, i int) {
		if i == 10 { // member 3 up, and down from the next put on
			for j := range 3 {
				b.putTopic(1, "Gone", fmt.Sprintf("old-%d", j))
			}
			// Consumer state of the old topic, on member 3 too.
			ld := b.m[1].s
			if err := ld.CommitOffset(context.Background(), "c", "Gone", 0, 3); err != nil {
				t.Fatal(err)
			}
			ms, err := ld.PopReceive(context.Background(), PopRequest{Group: "p", Topic: "Gone", MaxMessages: 2, Invisible: 10 * time.Hour})
			if err != nil || len(ms) != 2 {
				t.Fatalf("receive: %d, %v", len(ms), err)
			}
		}
	})
	g := b.testGroup
	// (Retention removed the files of those three on members 1 and 2.)
	if _, max, err := g.m[2].s.QueueInfo("Gone", 0); err != nil || max != 3 {
		t.Fatalf("member 2: Gone/0 up to %d before the delete (%v), want 3", max, err)
	}
	at, err := g.m[1].s.DeleteTopic("Gone")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		g.putTopic(1, "Gone", fmt.Sprintf("new-%d", i))
	}
	g.open(3)
	g.converge(1, g.ids...)
	base, _, _ := g.m[3].s.group.rlog.Base()
	if base == 0 {
		t.Fatal("member 3 did not rejoin by a snapshot")
	}
	check := func(what string) {
		t.Helper()
		s := g.m[3].s
		if got := s.topics.tombstones()["Gone"]; got != at {
			t.Fatalf("%s: member 3 tombstones Gone at %d, the leader at %d", what, got, at)
		}
		if min, bodies := g.topicBodies(3, "Gone"); min != 0 || !slices.Equal(bodies, []string{"new-0", "new-1"}) {
			t.Fatalf("%s: member 3 serves Gone/0 from %d: %q, want the re-created topic's two messages from 0", what, min, bodies)
		}
		// The old topic's consumer state is not brought back by the
		// snapshot (topicclear.go).
		for _, id := range g.ids {
			if ks, ops := topicKeys(g.m[id].s, "Gone"); len(ks) != 0 || len(ops) != 0 {
				t.Fatalf("%s: member %d holds offsets %v, POP %v of the deleted topic", what, id, ks, ops)
			}
		}
	}
	check("after the install")
	g.closeMember(3)
	g.open(3)
	g.converge(1, g.ids...)
	check("after a restart")
	// And it follows the log from there: a put and a delete after.
	g.putTopic(1, "Gone", "new-2")
	at2, err := g.m[1].s.DeleteTopic("Gone")
	if err != nil {
		t.Fatal(err)
	}
	g.converge(1, g.ids...)
	g.awaitTombstone(1, "Gone", at2, g.ids...)
	if _, bodies := g.topicBodies(3, "Gone"); bodies != nil {
		t.Fatalf("member 3 serves Gone/0 %q after the second delete", bodies)
	}
}

// TestGroupTopicDeleteRacingPuts: puts to a topic racing its delete on
// the leader are either stored before the delete (and deleted with it),
// refused (ErrTopicNotFound) or land after it in a re-created topic from
// queue offset 0: no member ever indexes a put that continues the
// deleted queue's offsets after the delete (the leader blocks the topic
// from the proposal to the apply), no member stops, and every member
// serves the same re-created queue.
func TestGroupTopicDeleteRacingPuts(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	for i := range 20 {
		g.putTopic(1, "Gone", fmt.Sprintf("old-%d", i))
	}
	leader := g.m[1].s
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stored atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res, err := leader.PutMessage(context.Background(), &Message{Topic: "Gone", QueueID: 0,
					Body: []byte(fmt.Sprintf("w%d-%d", w, i)), BornTimestamp: 1, BornHost: DefaultStoreHost})
				if err == nil && res.Status == PutOK {
					stored.Add(1)
				}
			}
		}()
	}
	waitStored := func(n int64) {
		deadline := time.Now().Add(time.Minute) // a hang guard
		for stored.Load() < n {
			if err := leader.WriteErr(); err != nil {
				t.Fatalf("the leader stopped: %v", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d puts stored, waiting for %d", stored.Load(), n)
			}
			runtime.Gosched()
		}
	}
	waitStored(50)
	at, err := leader.DeleteTopic("Gone")
	if err != nil {
		t.Fatal(err)
	}
	waitStored(stored.Load() + 50)
	close(stop)
	wg.Wait()
	g.converge(1, g.ids...)
	var ref []string
	for _, id := range g.ids {
		s := g.m[id].s
		if err := s.WriteErr(); err != nil {
			t.Fatalf("member %d stopped: %v", id, err)
		}
		if got := s.topics.tombstones()["Gone"]; got != at {
			t.Fatalf("member %d tombstones Gone at %d, want %d", id, got, at)
		}
		min, bodies := g.topicBodies(id, "Gone")
		if min != 0 || len(bodies) == 0 {
			t.Fatalf("member %d: the re-created Gone/0 from %d with %d messages", id, min, len(bodies))
		}
		for _, b := range bodies {
			if strings.HasPrefix(b, "old-") {
				t.Fatalf("member %d serves %s from before the delete", id, b)
			}
		}
		if ref == nil {
			ref = bodies
		} else if !slices.Equal(bodies, ref) {
			t.Fatalf("member %d serves Gone/0 %q, member 1 %q", id, bodies, ref)
		}
	}
}
