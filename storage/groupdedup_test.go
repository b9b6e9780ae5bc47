package storage

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestGroupDedupAfterFailover: the idempotent-put window in group mode. A
// retried keyed put is answered with the first put's result on the leader
// that took it, and on a new leader after a failover, storing nothing
// twice; a new key is stored. The followers keep their windows up to the
// commit as it moves (one read of the log each, at their first commit),
// so the new leader reads nothing of the log again when it becomes ready.
func TestGroupDedupAfterFailover(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	keyed := func(id uint64, key, body string) PutResult {
		t.Helper()
		res, err := g.m[id].s.PutMessage(context.Background(), &Message{Topic: "T", QueueID: 0, Body: []byte(body),
			BornTimestamp: 1, BornHost: DefaultStoreHost, Properties: []Property{uniq(key)}})
		if err != nil || res.Status != PutOK {
			t.Fatalf("keyed put %s on node %d: %v %v", key, id, res.Status, err)
		}
		return res
	}
	maxOf := func(id uint64) int64 {
		t.Helper()
		_, mx, err := g.m[id].s.QueueInfo("T", 0)
		if err != nil {
			t.Fatal(err)
		}
		return mx
	}
	if res, err := g.put(1, "unkeyed"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	first := keyed(1, "k1", "one")
	if again := keyed(1, "k1", "one"); again.Append.WroteOffset != first.Append.WroteOffset || again.Append.QueueOffset != first.Append.QueueOffset {
		t.Fatalf("a retry on the same leader stored at %d (queue offset %d), the first at %d (%d)",
			again.Append.WroteOffset, again.Append.QueueOffset, first.Append.WroteOffset, first.Append.QueueOffset)
	}
	if mx := maxOf(1); mx != 2 {
		t.Fatalf("queue max %d after two puts and a retry, want 2", mx)
	}
	g.converge(1, all...)
	reads := map[uint64]int64{}
	for _, id := range []uint64{2, 3} {
		m := g.m[id].s
		if st := m.dedupStats(); st.Keys != 1 {
			t.Fatalf("follower %d's window: %+v, want the committed key k1", id, st)
		}
		if r := m.group.dedupReads.Load(); r != 1 {
			t.Fatalf("follower %d read its window from the log %d times, want once (its first commit)", id, r)
		}
		reads[id] = m.group.dedupReads.Load()
	}

	g.closeMember(1)
	nl := g.failover(2, 3)
	if r := g.m[nl].s.group.dedupReads.Load(); r != reads[nl] {
		t.Fatalf("the new leader read its window from the log again when it became ready (%d reads, %d before)", r, reads[nl])
	}
	retry := keyed(nl, "k1", "one")
	if retry.Append.WroteOffset != first.Append.WroteOffset || retry.Append.QueueOffset != first.Append.QueueOffset {
		t.Fatalf("a retry on the new leader stored at %d (queue offset %d), the first put is at %d (%d)",
			retry.Append.WroteOffset, retry.Append.QueueOffset, first.Append.WroteOffset, first.Append.QueueOffset)
	}
	fresh := keyed(nl, "k2", "two")
	if fresh.Append.QueueOffset != 2 {
		t.Fatalf("a new key on the new leader at queue offset %d, want 2", fresh.Append.QueueOffset)
	}
	if mx := maxOf(nl); mx != 3 {
		t.Fatalf("queue max %d on the new leader, want 3", mx)
	}
	if st := g.m[nl].s.dedupStats(); st.Hits != 1 || st.Keys != 2 {
		t.Fatalf("new leader's window: %+v, want 1 hit and 2 keys", st)
	}
	// The old leader rejoins as a follower and takes the new leader's
	// word for it: a follower refuses keyed puts like any other.
	g.open(1)
	g.converge(nl, all...)
	if res, err := g.m[1].s.PutMessage(context.Background(), &Message{Topic: "T", Body: []byte("one"), BornHost: DefaultStoreHost,
		Properties: []Property{uniq("k1")}}); !errors.Is(err, ErrNotLeader) || res.Appended() {
		t.Fatalf("a keyed put on a follower: %v %v", res.Status, err)
	}
}
