package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/vfs"
)

// TestGroupSnapshotCarriesDeliveryProgress (design §3.5: a failover may
// repeat deliveries only since the last progress entry, never drop one):
// while member 3 is down, the leader delivers delayed (level 1) and timer
// messages and commits the progress of both; retention compacts those
// progress commands away, so member 3 rejoins by a snapshot. It must
// then hold the leader's delivery progress (from the manifest), keep it
// across a restart (its raft log starts past the commands: from
// config/groupProgress.json), and, leading once the old leader is gone,
// deliver none of those messages again while it delivers the ones put
// after the failover. Without the progress in the snapshot, member 3's
// scheduler and timer service would start from their queues' oldest
// messages and deliver the first batch a second time.
func TestGroupSnapshotCarriesDeliveryProgress(t *testing.T) {
	b := newBehindGroup(t, nil)
	g := b.testGroup
	put := func(id uint64, body string, delayed bool) {
		t.Helper()
		m := &Message{Topic: "D", Body: []byte(body), BornTimestamp: 1, BornHost: DefaultStoreHost,
			Properties: []Property{{Key: PropertyDelayLevel, Value: "1"}}}
		if !delayed {
			m.Properties = []Property{{Key: PropertyTimerDelayMS, Value: strconv.Itoa(500)}}
		}
		if res, err := g.m[id].s.PutMessage(context.Background(), m); err != nil || res.Status != PutOK {
			t.Fatalf("put %s on %d: %v %v", body, id, res.Status, err)
		}
	}
	for i := range 6 {
		put(1, fmt.Sprintf("a-%d", i), true)
		put(1, fmt.Sprintf("t-%d", i), false)
	}
	b.clock.Advance(2 * time.Second)
	g.poll("the first batch delivered and its progress applied on members 1 and 2", func() bool {
		for _, id := range []uint64{1, 2} {
			s := g.m[id].s
			if p, idx := s.DelayProgress(); p[1] != 6 || idx == 0 {
				return false
			}
			if p, idx := s.TimerProgress(); p.Low < 6 || idx == 0 {
				return false
			}
		}
		return len(g.pullBodies(1)) == 12
	}, 1, 2)
	wantDelay, delayIdx := g.m[1].s.DelayProgress()
	wantTimer, timerIdx := g.m[1].s.TimerProgress()

	// Member 3 comes back behind the leader's compacted log: a snapshot.
	g.open(3)
	g.converge(1, g.ids...)
	node3 := g.m[3].s
	base, _, _ := node3.group.rlog.Base()
	if base < max(delayIdx, timerIdx) {
		t.Fatalf("member 3's raft log starts at %d, below the progress commands at %d and %d: no snapshot covered them", base+1, delayIdx, timerIdx)
	}
	check := func(what string) {
		t.Helper()
		p, idx := g.m[3].s.DelayProgress()
		if p[1] != wantDelay[1] || idx < delayIdx {
			t.Fatalf("%s: member 3's delay progress %v (index %d), the leader's %v (index %d)", what, p, idx, wantDelay, delayIdx)
		}
		tp, tidx := g.m[3].s.TimerProgress()
		if tp.Low < wantTimer.Low || tidx < timerIdx {
			t.Fatalf("%s: member 3's timer progress %+v (index %d), the leader's %+v (index %d)", what, tp, tidx, wantTimer, timerIdx)
		}
	}
	check("after the install")
	g.closeMember(3)
	g.open(3)
	check("after a restart")

	// Member 3 takes over (member 2 cut off for one put, so member 3 has
	// the highest match), then the old leader goes.
	g.net.setCut(2, true)
	b.put("before the transfer")
	g.net.setCut(2, false)
	if to, err := g.m[1].s.TransferLeadership(context.Background()); err != nil || to != 3 {
		t.Fatalf("TransferLeadership: to %d, %v; want 3", to, err)
	}
	g.closeMember(1)
	g.poll("member 3 the ready leader", func() bool { return g.readyLeader(3) == 3 }, 2, 3)
	for i := range 3 {
		put(3, fmt.Sprintf("c-%d", i), true)
		put(3, fmt.Sprintf("u-%d", i), false)
	}
	b.clock.Advance(2 * time.Second)
	g.poll("the messages put after the failover delivered", func() bool {
		got := g.pullBodies(3)
		for i := range 3 {
			if got[fmt.Sprintf("c-%d", i)] == 0 || got[fmt.Sprintf("u-%d", i)] == 0 {
				return false
			}
		}
		return true
	}, 2, 3)
	got := g.pullBodies(3)
	for i := range 6 {
		for _, k := range []string{"a", "t"} {
			if n := got[fmt.Sprintf("%s-%d", k, i)]; n != 1 {
				t.Fatalf("%s-%d delivered %d times (its delivery was in the progress the snapshot carried): %v", k, i, n, got)
			}
		}
	}
}

// TestGroupCheckpointRaftPoint (design §3.6): a member's checkpoint
// records its applied raft index and term, the commit end and the raft
// log's durable end, with dispatched ≤ commit end; Open checks them
// against the raft log and refuses, as damage, a checkpoint whose applied
// index the log no longer holds or holds in another term (a raft
// directory that lost entries or belongs to another log), and starts on
// the checkpoint it wrote. ReadCheckpoint refuses a point with
// dispatched past the commit end.
func TestGroupCheckpointRaftPoint(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	for i := range 10 {
		if res, err := g.put(1, fmt.Sprintf("m-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	end := g.converge(1, g.ids...)
	s := g.m[2].s
	if err := s.index.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	dir := g.m[2].opts.Dir
	cp, ok, err := consumequeue.ReadCheckpoint(vfs.Default, dir)
	if err != nil || !ok {
		t.Fatalf("read the checkpoint: %v %v", ok, err)
	}
	info := s.ReplicaInfo()
	term, err := s.group.rlog.Term(cp.RaftApplied)
	if err != nil || cp.RaftApplied == 0 || cp.RaftApplied > info.Applied || cp.RaftAppliedTerm != term ||
		cp.CommitEnd != end || cp.Dispatched > cp.CommitEnd || cp.LogEnd < cp.CommitEnd {
		t.Fatalf("checkpoint raft point %+v (dispatched %d); member 2 applied %d, term there %d (%v), commit end %d",
			cp.RaftPoint, cp.Dispatched, info.Applied, term, err, end)
	}
	g.closeMember(2)
	good := cp
	for name, mod := range map[string]func(c *consumequeue.Checkpoint){
		"lost entries": func(c *consumequeue.Checkpoint) { c.RaftApplied += 1000 },
		"another term": func(c *consumequeue.Checkpoint) { c.RaftAppliedTerm++ },
	} {
		c := good
		mod(&c)
		if err := consumequeue.WriteCheckpoint(vfs.Default, dir, c); err != nil {
			t.Fatal(err)
		}
		var cerr *CorruptionError
		if st, err := Open(g.m[2].opts); !errors.As(err, &cerr) {
			if st != nil {
				st.Close()
			}
			t.Fatalf("%s: Open %v, want a *CorruptionError", name, err)
		}
	}
	bad := good
	bad.CommitEnd = bad.Dispatched - 1
	if err := consumequeue.WriteCheckpoint(vfs.Default, dir, bad); err != nil {
		t.Fatal(err)
	}
	var cperr *CheckpointError
	if _, _, err := consumequeue.ReadCheckpoint(vfs.Default, dir); !errors.As(err, &cperr) {
		t.Fatalf("a checkpoint with dispatched past the commit end: %v", err)
	}
	if err := consumequeue.WriteCheckpoint(vfs.Default, dir, good); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	g.converge(1, g.ids...)
	if _, max, err := g.m[2].s.QueueInfo("T", 0); err != nil || max != 10 {
		t.Fatalf("member 2 after the restart: T/0 up to %d (%v)", max, err)
	}
}

// TestGroupCompactionKeepsDeliveryProgress: retention compacts a member's
// raft log past the delay and timer progress commands (their entries lie
// in the files it deletes); the progress is written to
// config/groupProgress.json first, so the member restarts with it
// although its raft log no longer holds the commands (without the file
// it would restart with none, and repeat those deliveries when it leads).
func TestGroupCompactionKeepsDeliveryProgress(t *testing.T) {
	var delayIdx, timerIdx uint64
	b := newBehindGroupSteps(t, nil, func(b *behindGroup, i int) {
		if i != 5 {
			return
		}
		g := b.testGroup
		for j := range 4 {
			for _, p := range []Property{{Key: PropertyDelayLevel, Value: "1"}, {Key: PropertyTimerDelayMS, Value: "500"}} {
				m := &Message{Topic: "D", Body: []byte(fmt.Sprintf("%s-%d", p.Key, j)), BornTimestamp: 1, BornHost: DefaultStoreHost,
					Properties: []Property{p}}
				if res, err := g.m[1].s.PutMessage(context.Background(), m); err != nil || res.Status != PutOK {
					t.Fatalf("put: %v %v", res.Status, err)
				}
			}
		}
		b.clock.Advance(2 * time.Second)
		g.poll("the deliveries' progress applied on member 2", func() bool {
			p, di := g.m[2].s.DelayProgress()
			tp, ti := g.m[2].s.TimerProgress()
			delayIdx, timerIdx = di, ti
			return p[1] == 4 && di > 0 && tp.Low >= 4 && ti > 0
		}, 1, 2, 3)
	})
	g := b.testGroup
	first, _ := g.m[2].s.group.rlog.FirstIndex()
	if first <= max(delayIdx, timerIdx) {
		t.Fatalf("member 2's raft log starts at %d: not compacted past the progress commands at %d and %d", first, delayIdx, timerIdx)
	}
	g.closeMember(2)
	g.open(2)
	s := g.m[2].s
	if p, idx := s.DelayProgress(); p[1] != 4 || idx < delayIdx {
		t.Fatalf("member 2 restarted with delay progress %v (index %d), want level 1 at 4 (index %d)", p, idx, delayIdx)
	}
	if tp, idx := s.TimerProgress(); tp.Low < 4 || idx < timerIdx {
		t.Fatalf("member 2 restarted with timer progress %+v (index %d), want low ≥ 4 (index %d)", tp, idx, timerIdx)
	}
}

// TestGroupRestartReadsProgressPastThrough: the checkpoint writes the
// delivery progress with Through, an index applied before it was read,
// and a start reads from the raft log only the progress commands past
// Through: the file vouches for those at or below it. Told that none is
// at or below Through, a start finds none there (it did not read that
// part of the log); with Through below the command, or unknown (0, a file
// written before Through existed), it reads the command from the log.
func TestGroupRestartReadsProgressPastThrough(t *testing.T) {
	clock := storagetest.NewClock(time.Unix(1_750_000_000, 0))
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		o.Clock = clock
		o.Group.markEvery = 1
	})
	g.elect(1)
	m := &Message{Topic: "D", Body: []byte("later"), BornTimestamp: 1, BornHost: DefaultStoreHost,
		Properties: []Property{{Key: PropertyDelayLevel, Value: "1"}}}
	if res, err := g.m[1].s.PutMessage(context.Background(), m); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	clock.Advance(2 * time.Second)
	var idx uint64
	g.poll("the delivery's progress applied on member 2", func() bool {
		p, di := g.m[2].s.DelayProgress()
		idx = di
		return p[1] == 1 && di > 0
	}, 1, 2, 3)
	dir := g.m[2].opts.Dir
	g.poll("member 2's checkpoint writes the progress through the command", func() bool {
		clock.Advance(time.Second)
		p, err := readProgress(vfs.Default, dir)
		return err == nil && p.DelayIndex == idx && p.Through >= idx
	}, 1, 2, 3)
	p, err := readProgress(vfs.Default, dir)
	if err != nil {
		t.Fatal(err)
	}
	restart := func(file groupProgress) uint64 {
		t.Helper()
		g.closeMember(2)
		if err := writeProgress(vfs.Default, dir, file); err != nil {
			t.Fatal(err)
		}
		g.open(2)
		_, got := g.m[2].s.DelayProgress()
		return got
	}
	if got := restart(groupProgress{Through: p.Through}); got != 0 {
		t.Fatalf("restarted with delay progress at index %d from a file through %d that holds none: the log at or below Through was read", got, p.Through)
	}
	if got := restart(groupProgress{Through: idx - 1}); got != idx {
		t.Fatalf("restarted with delay progress at index %d, want %d (past Through %d, read from the log)", got, idx, idx-1)
	}
	if got := restart(groupProgress{}); got != idx {
		t.Fatalf("restarted with delay progress at index %d, want %d (Through unknown: the whole log read)", got, idx)
	}
}
