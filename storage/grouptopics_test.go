package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
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
