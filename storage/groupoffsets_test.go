package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/offsets"
)

// Consumer offsets in group mode (sysrecords.go, consumer_offsets.go):
// commits go through raft on the ready leader, every replica applies them
// as they commit, and the table survives restarts and leader changes.

// offsetTable is a store's table as key → offset.
func offsetTable(s *Store) map[offsets.Key]int64 {
	m := map[offsets.Key]int64{}
	for _, e := range s.offsets.Entries() {
		m[e.Key] = e.Offset
	}
	return m
}

// checkOffsets: every id's table is want, and GetOffset serves it.
func (g *testGroup) checkOffsets(want map[offsets.Key]int64, ids ...uint64) {
	g.t.Helper()
	for _, id := range ids {
		s := g.m[id].s
		if got := offsetTable(s); !maps.Equal(got, want) {
			g.t.Fatalf("node %d: offset table %v, want %v", id, got, want)
		}
		for k, v := range want {
			if off, err := s.GetOffset(k.Group, k.Topic, k.Queue); err != nil || off != v {
				g.t.Fatalf("node %d: GetOffset(%v) = %d, %v; want %d", id, k, off, err, v)
			}
		}
	}
}

// failover waits, ticking the live members ids, until one of them is the
// ready leader (their ticks end the lease of the leader that went:
// CheckQuorum) and returns it.
func (g *testGroup) failover(ids ...uint64) uint64 {
	g.t.Helper()
	g.poll("a new ready leader", func() bool { return g.readyLeader(ids...) != 0 }, ids...)
	return g.readyLeader(ids...)
}

func TestGroupOffsets(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	for i := range 10 {
		if res, err := g.put(1, fmt.Sprintf("m-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	ctx := context.Background()

	// A follower refuses, naming the leader; nothing is stored.
	end := g.m[2].s.log.MaxOffset()
	var nl *NotLeaderError
	if err := g.m[2].s.CommitOffset(ctx, "g", "T", 0, 3); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("CommitOffset on a follower: %v", err)
	}
	if g.m[2].s.log.MaxOffset() != end {
		t.Fatal("a refused commit wrote to the follower's commitlog")
	}

	kg, kh := offsets.Key{Group: "g", Topic: "T", Queue: 0}, offsets.Key{Group: "h", Topic: "T", Queue: 0}
	want := map[offsets.Key]int64{}
	for _, c := range []struct {
		k   offsets.Key
		off int64
	}{{kg, 3}, {kg, 7}, {kh, 10}} {
		if err := g.m[1].s.CommitOffset(ctx, c.k.Group, c.k.Topic, c.k.Queue, c.off); err != nil {
			t.Fatalf("CommitOffset %v = %d on the leader: %v", c.k, c.off, err)
		}
		want[c.k] = c.off
		// Read your writes on the leader: an acknowledged commit is applied.
		if off, err := g.m[1].s.GetOffset(c.k.Group, c.k.Topic, c.k.Queue); err != nil || off != c.off {
			t.Fatalf("after committing %v = %d the leader answers %d, %v", c.k, c.off, off, err)
		}
	}
	var re *RangeError
	if err := g.m[1].s.CommitOffset(ctx, "g", "T", 0, 11); !errors.As(err, &re) {
		t.Fatalf("a commit past the queue's end: %v", err)
	}
	end = g.converge(1, all...)
	g.sameBytes(end, all...)
	// Followers serve the committed offsets, though only the leader's
	// topic table knows T (the topic table is not replicated).
	g.checkOffsets(want, all...)
	for _, id := range all {
		lo, err1 := g.m[id].s.GetOffsetByTime("T", 0, time.UnixMilli(0))
		hi, err2 := g.m[id].s.GetOffsetByTime("T", 0, time.Now().Add(time.Hour))
		if err1 != nil || err2 != nil || lo != 0 || hi != 10 {
			t.Fatalf("node %d: GetOffsetByTime before the first message %d (%v), after the last %d (%v); want 0 and 10", id, lo, err1, hi, err2)
		}
	}

	// The leader goes; a new one serves and takes commits.
	g.closeMember(1)
	nl2 := g.failover(2, 3)
	g.checkOffsets(want, 2, 3)
	if err := g.m[nl2].s.CommitOffset(ctx, "g", "T", 0, 9); err != nil {
		t.Fatalf("CommitOffset on the new leader %d: %v", nl2, err)
	}
	want[kg] = 9
	g.converge(nl2, 2, 3)
	g.checkOffsets(want, 2, 3)

	// The old leader rejoins and catches up; then all restart: every
	// table is rebuilt from the log as it was.
	g.open(1)
	end = g.converge(nl2, all...)
	g.sameBytes(end, all...)
	g.checkOffsets(want, all...)
	for _, id := range all {
		g.closeMember(id)
	}
	for _, id := range all {
		g.open(id)
	}
	g.checkOffsets(want, all...)
	// Each member closed cleanly: its start restored the table from its
	// snapshot and replayed no offset record.
	for _, id := range all {
		if sn := &g.m[id].s.offSnap; !sn.restored || sn.replayed != 0 {
			t.Fatalf("member %d after a clean restart: restored %v, replayed %d", id, sn.restored, sn.replayed)
		}
	}
	g.elect(3)
	g.converge(3, all...)
	g.checkOffsets(want, all...)
}

// TestGroupOffsetRewrite: retention's rewrite of live offsets goes through
// raft on the leader only, every replica applies it (so files holding
// old offset records may go everywhere), and a stale rewrite (one whose
// source a newer commit superseded) changes nothing on any replica, also
// after a restart.
func TestGroupOffsetRewrite(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	for i := range 5 {
		if res, err := g.put(1, fmt.Sprintf("m-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	ctx := context.Background()
	ld := g.m[1].s
	first, err := ld.commitOffset(ctx, "g", "T", 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := g.put(1, "after"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	end := g.converge(1, all...)

	// A follower cannot rewrite: it keeps the file holding the record.
	if keep := g.m[2].s.rewriteOffsets(end); keep != first.WroteOffset {
		t.Fatalf("a follower's rewrite below %d keeps from %d, want %d (the offset record)", end, keep, first.WroteOffset)
	}
	if keep := ld.rewriteOffsets(end); keep != end {
		t.Fatalf("the leader's rewrite below %d keeps from %d, want %d", end, keep, end)
	}
	g.converge(1, all...)
	for _, id := range all {
		if at, ok := g.m[id].s.offsets.OldestAt(); !ok || at < end {
			t.Fatalf("node %d: after the rewrite the oldest offset record is at %d (%v), want at or past %d", id, at, ok, end)
		}
		if keep := g.m[id].s.rewriteOffsets(end); keep != end {
			t.Fatalf("node %d: after the leader's rewrite, its own keeps from %d, want %d", id, keep, end)
		}
	}
	want := map[offsets.Key]int64{{Group: "g", Topic: "T", Queue: 0}: 2}
	g.checkOffsets(want, all...)

	// A newer commit, then a rewrite whose source is older: it must not
	// bring the old value back (the race between a rewrite's read of the
	// table and a commit, made deterministic).
	newer, err := ld.commitOffset(ctx, "g", "T", 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	stale := offsets.Encode([]offsets.Entry{{Key: offsets.Key{Group: "g", Topic: "T", Queue: 0}, Offset: 2, Rewrite: true, From: first.WroteOffset}})
	if out, err := ld.putSystem(ctx, OffsetTopic, stale, true); err != nil || out.Status != PutOK {
		t.Fatalf("stale rewrite: %v %v", out.Status, err)
	}
	want[offsets.Key{Group: "g", Topic: "T", Queue: 0}] = 4
	end = g.converge(1, all...)
	g.checkOffsets(want, all...)
	for _, id := range all {
		if at, _ := g.m[id].s.offsets.OldestAt(); at != newer.WroteOffset {
			t.Fatalf("node %d: the key's record is at %d, want the newer commit's %d", id, at, newer.WroteOffset)
		}
	}
	g.sameBytes(end, all...)
	for _, id := range all {
		g.closeMember(id)
		g.open(id)
	}
	g.checkOffsets(want, all...)
}
