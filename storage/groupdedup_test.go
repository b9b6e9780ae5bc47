package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestGroupDedupAfterFailover: the idempotent-put window in group mode. A
// retried keyed put is answered with the first put's result on the leader
// that took it, and on a new leader after a failover, storing nothing
// twice; a new key is stored. The followers keep their windows up to the
// commit as it moves (one read of the log each, as they start),
// so the new leader reads nothing of the log again when it becomes ready.
func TestGroupDedupAfterFailover(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	keyed := g.keyed
	if res, err := g.put(1, "unkeyed"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	first := keyed(1, "k1", "one")
	if again := keyed(1, "k1", "one"); again.Append.WroteOffset != first.Append.WroteOffset || again.Append.QueueOffset != first.Append.QueueOffset {
		t.Fatalf("a retry on the same leader stored at %d (queue offset %d), the first at %d (%d)",
			again.Append.WroteOffset, again.Append.QueueOffset, first.Append.WroteOffset, first.Append.QueueOffset)
	}
	if mx := g.queueMax(1); mx != 2 {
		t.Fatalf("queue max %d after two puts and a retry, want 2", mx)
	}
	g.converge(1, all...)
	reads := map[uint64]int64{}
	for _, id := range []uint64{2, 3} {
		g.dedupRead(id)
		m := g.m[id].s
		if st := m.dedupStats(); st.Keys != 1 {
			t.Fatalf("follower %d's window: %+v, want the committed key k1", id, st)
		}
		if r := m.group.dedup.reads.Load(); r != 1 {
			t.Fatalf("follower %d read its window from the log %d times, want once (as it started)", id, r)
		}
		reads[id] = m.group.dedup.reads.Load()
	}

	g.closeMember(1)
	nl := g.failover(2, 3)
	if r := g.m[nl].s.group.dedup.reads.Load(); r != reads[nl] {
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
	if mx := g.queueMax(nl); mx != 3 {
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

// TestGroupDedupUndecided: a keyed put whose commit the leader did not see
// while it waited (its client went away; the replication timeout) keeps
// its key until raft decides. A retry meanwhile waits for that, is
// answered with the first put's place once the entry commits, and stores
// nothing (before, the key was freed at once, and the retry's own entry
// committed beside the first's). A retry that outwaits the replication
// timeout itself is answered FLUSH_SLAVE_TIMEOUT, appending nothing. An
// entry another leader's log supersedes frees the key: the message is
// stored once, by the retry on the new leader.
func TestGroupDedupUndecided(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	if res, err := g.put(1, "a"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	keyedMsg := func(key string) *Message {
		return &Message{Topic: "T", Body: []byte("body of " + key), BornTimestamp: 1, BornHost: DefaultStoreHost,
			Properties: []Property{uniq(key)}}
	}
	type answer struct {
		res PutResult
		err error
	}
	putAsync := func(ctx context.Context, id uint64, key string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			res, err := g.m[id].s.PutMessage(ctx, keyedMsg(key))
			ch <- answer{res, err}
		}()
		return ch
	}
	// undecided puts key on leader while it is cut off from the others and
	// ends the put's wait once the entry is in the leader's log.
	undecided := func(leader uint64, key string) AppendResult {
		t.Helper()
		end := g.m[leader].s.log.MaxOffset()
		ctx, cancel := context.WithCancel(context.Background())
		ch := putAsync(ctx, leader, key)
		g.poll("the keyed put in the leader's log", func() bool { return g.m[leader].s.log.MaxOffset() > end })
		cancel()
		a := <-ch
		if a.err == nil || !a.res.Appended() {
			t.Fatalf("a keyed put without a quorum, its client gone: %v %v, want an unknown outcome", a.res.Status, a.err)
		}
		return a.res.Append
	}

	// 1. The leader alone: k1 is proposed, its put gives up.
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	first := undecided(1, "k1")
	end := g.m[1].s.log.MaxOffset()
	// A retry with a deadline shorter than the replication timeout waits
	// for the first put and stores nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	res, err := g.m[1].s.PutMessage(ctx, keyedMsg("k1"))
	cancel()
	if err == nil || res.Appended() || g.m[1].s.log.MaxOffset() != end {
		t.Fatalf("a retry while the first put is undecided: %v %v, log %d → %d, want nothing appended", res.Status, err, end, g.m[1].s.log.MaxOffset())
	}
	// A retry that waits while the entry commits gets its place.
	waits := g.m[1].s.dedupStats().Waits
	retry := putAsync(context.Background(), 1, "k1")
	g.poll("the retry waiting for the first put", func() bool { return g.m[1].s.dedupStats().Waits > waits })
	g.net.setCut(2, false)
	g.net.setCut(3, false)
	a := pollRecv(g, "the retry answered", retry, 1)
	if a.err != nil || a.res.Status != PutOK || a.res.Append.WroteOffset != first.WroteOffset || a.res.Append.QueueOffset != first.QueueOffset {
		t.Fatalf("the retry after the entry committed: %v %v at %d (queue offset %d), the first put is at %d (%d)",
			a.res.Status, a.err, a.res.Append.WroteOffset, a.res.Append.QueueOffset, first.WroteOffset, first.QueueOffset)
	}
	g.converge(1, all...)
	for _, id := range all {
		if mx := g.queueMax(id); mx != 2 {
			t.Fatalf("node %d: queue max %d after a put and a keyed put retried twice, want 2", id, mx)
		}
	}

	// 2. The leader cut off from the others: k2 is proposed there only,
	// and superseded by the next leader's log.
	g.net.setCut(1, true)
	undecided(1, "k2")
	nl := g.failover(2, 3)
	res, err = g.m[nl].s.PutMessage(context.Background(), keyedMsg("k2"))
	if err != nil || res.Status != PutOK || res.Append.QueueOffset != 2 {
		t.Fatalf("k2 on the new leader: %v %v at queue offset %d, want PUT_OK at 2", res.Status, err, res.Append.QueueOffset)
	}
	stored := res.Append
	g.net.setCut(1, false)
	end = g.converge(nl, all...)
	g.sameBytes(end, all...)
	for _, id := range all {
		if mx := g.queueMax(id); mx != 3 {
			t.Fatalf("node %d: queue max %d, want 3 (k2 once)", id, mx)
		}
		if p := g.m[id].s.dedupStats().Pending; p != 0 {
			t.Fatalf("node %d: %d first puts still pending", id, p)
		}
	}
	res, err = g.m[nl].s.PutMessage(context.Background(), keyedMsg("k2"))
	if err != nil || res.Status != PutOK || res.Append.WroteOffset != stored.WroteOffset {
		t.Fatalf("k2 again on the new leader: %v %v at %d, want PUT_OK at %d", res.Status, err, res.Append.WroteOffset, stored.WroteOffset)
	}
}

// TestGroupDedupRetryTimeout: a keyed put that timed out waiting for its
// commit (FLUSH_SLAVE_TIMEOUT) keeps its key, and a retry on the same
// leader waits at most the replication timeout for it: answered
// FLUSH_SLAVE_TIMEOUT (outcome unknown) with nothing appended.
func TestGroupDedupRetryTimeout(t *testing.T) {
	g := newTestGroup(t, 100*time.Millisecond)
	g.elect(1)
	g.putOK(1, "creates T")
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	m := &Message{Topic: "T", Body: []byte("x"), BornTimestamp: 1, BornHost: DefaultStoreHost, Properties: []Property{uniq("k")}}
	res, err := g.m[1].s.PutMessage(context.Background(), m)
	if !errors.Is(err, ErrReplicationTimeout) || res.Status != FlushSlaveTimeout || !res.Appended() {
		t.Fatalf("a keyed put without followers: %v %v", res.Status, err)
	}
	end := g.m[1].s.log.MaxOffset()
	res, err = g.m[1].s.PutMessage(context.Background(), m)
	if !errors.Is(err, ErrReplicationTimeout) || res.Status != FlushSlaveTimeout || res.Appended() || g.m[1].s.log.MaxOffset() != end {
		t.Fatalf("its retry: %v %v appended %v, log %d → %d; want FLUSH_SLAVE_TIMEOUT, nothing appended",
			res.Status, err, res.Appended(), end, g.m[1].s.log.MaxOffset())
	}
	if st := g.m[1].s.dedupStats(); st.Pending != 1 || st.Keys != 0 {
		t.Fatalf("the window: %+v, want the first put pending", st)
	}
}

// queueMax is the max offset of queue 0 of topic T on member id.
func (g *testGroup) queueMax(id uint64) int64 {
	g.t.Helper()
	_, mx, err := g.m[id].s.QueueInfo("T", 0)
	if err != nil {
		g.t.Fatal(err)
	}
	return mx
}

// keyed puts body keyed key to queue 0 of T on member id, failing the
// test unless it is PUT_OK.
func (g *testGroup) keyed(id uint64, key, body string) PutResult {
	g.t.Helper()
	res, err := g.m[id].s.PutMessage(context.Background(), &Message{Topic: "T", QueueID: 0, Body: []byte(body),
		BornTimestamp: 1, BornHost: DefaultStoreHost, Properties: []Property{uniq(key)}})
	if err != nil || res.Status != PutOK {
		g.t.Fatalf("keyed put %s on node %d: %v %v", key, id, res.Status, err)
	}
	return res
}

// dedupRead waits until member id's window is not being read from the
// log (groupdedup.go: the read runs beside the raft loop).
func (g *testGroup) dedupRead(id uint64) {
	g.t.Helper()
	r := g.m[id].s.group.dedup
	g.poll(fmt.Sprintf("node %d's window read", id), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.reading
	})
}

// TestGroupDedupReadOffRaftLoop: a member's full read of its window from
// the log runs beside its raft loop, not on it. While follower 2's read is
// held (the hook), it still acknowledges appends: with member 3 down the
// leader's keyed puts commit through it. Made the leader while the read is
// still held, it is not ready: a put is refused LEADER_NOT_READY and
// stores nothing. Let go, the read catches up with the commits made
// meanwhile (over 1 MiB of them: read without the lock, then the rest
// under it) and the member becomes ready without a tick; its window holds
// every key committed during the read, so each retry is answered with its
// first put's place and stores nothing.
func TestGroupDedupReadOffRaftLoop(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	entered, release := make(chan struct{}, 8), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // runs before the group's Close (cleanups run last first)
	g.closeMember(2)
	g.m[2].opts.Group.dedupReadHook = func() {
		entered <- struct{}{}
		<-release
	}
	g.open(2)
	g.elect(1)
	pollRecv(g, "node 2's first read of its window", entered, 1)

	g.closeMember(3)
	body := strings.Repeat("x", 12<<10)
	first := map[string]PutResult{}
	for i := range 100 { // 1.2 MiB: past dedupCatchUpUnlocked
		k := fmt.Sprintf("k%d", i)
		first[k] = g.keyed(1, k, body)
	}
	r := g.m[2].s.group.dedup
	r.mu.Lock()
	reading, to := r.reading, r.to
	r.mu.Unlock()
	if !reading || to != -1 || r.reads.Load() != 1 {
		t.Fatalf("node 2's window: reading %v, up to %d, %d reads; want its one read held", reading, to, r.reads.Load())
	}

	g.open(3)
	g.converge(1, g.ids...)
	before := g.m[2].s.ReplicaInfo().Commit
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	moved := make(chan error, 1)
	go func() {
		_, err := g.m[1].s.MoveLeadership(ctx, 2)
		moved <- err
	}()
	if err := pollRecv(g, "the move to 2", moved, 1); err != nil {
		t.Fatal(err)
	}
	g.poll("node 2's first entry applied", func() bool {
		ri := g.m[2].s.ReplicaInfo()
		return ri.Role == "leader" && ri.Applied > before
	}, 2)
	end := g.m[2].s.log.MaxOffset()
	res, err := g.m[2].s.PutMessage(context.Background(), &Message{Topic: "T", Body: []byte("refused"), BornHost: DefaultStoreHost,
		Properties: []Property{uniq("k0")}})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Cause != CauseLeaderNotReady || res.Appended() || g.m[2].s.log.MaxOffset() != end {
		t.Fatalf("a put on the leader whose window is being read: %v %v (log %d → %d)", res.Status, err, end, g.m[2].s.log.MaxOffset())
	}
	if ri := g.m[2].s.ReplicaInfo(); ri.Ready {
		t.Fatal("node 2 is ready while its window is being read")
	}

	letGo()
	g.poll("node 2 ready", func() bool { return g.m[2].s.ReplicaInfo().Ready }) // no tick: the reader retries
	r.mu.Lock()
	to = r.to
	r.mu.Unlock()
	if n := r.reads.Load(); n != 1 || to != -1 {
		t.Fatalf("node 2 read its window %d times, want once; up to %d, want -1 (its put path keeps it now)", n, to)
	}
	mx := g.queueMax(2)
	for k, f := range first {
		again := g.keyed(2, k, body)
		if again.Append.WroteOffset != f.Append.WroteOffset || again.Append.QueueOffset != f.Append.QueueOffset {
			t.Fatalf("retry of %s on the new leader: stored at %d (queue offset %d), the first put at %d (%d)",
				k, again.Append.WroteOffset, again.Append.QueueOffset, f.Append.WroteOffset, f.Append.QueueOffset)
		}
	}
	if got := g.queueMax(2); got != mx {
		t.Fatalf("queue max %d after the retries, %d before", got, mx)
	}
	if st := g.m[2].s.dedupStats(); st.Keys != len(first) || st.Hits != uint64(len(first)) {
		t.Fatalf("node 2's window: %+v, want %d keys and as many hits", st, len(first))
	}
}

// TestGroupDedupReadAtStart: a member reads its window as it starts, up to
// the commit end it recovered, not at its first commit: a follower
// restarted in a quiet group holds the committed keys with no put after
// it, and the members of a group restarted whole each read once; the
// leader they elect answers a retry with the first put's place.
func TestGroupDedupReadAtStart(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	first := g.keyed(1, "k1", "one")
	g.converge(1, g.ids...)
	g.closeMember(2)
	g.open(2)
	g.poll("node 2's window after its restart", func() bool { return g.m[2].s.dedupStats().Keys == 1 }, 1)
	if ce, want := g.m[2].s.ReplicaInfo().CommitEnd, g.m[1].s.ReplicaInfo().CommitEnd; ce != want {
		t.Fatalf("node 2 at commit end %d, the leader at %d", ce, want)
	}

	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
	}
	g.elect(1)
	for _, id := range g.ids {
		g.dedupRead(id)
		if n := g.m[id].s.group.dedup.reads.Load(); n != 1 {
			t.Fatalf("node %d read its window %d times since its start, want once", id, n)
		}
	}
	again := g.keyed(1, "k1", "one")
	if again.Append.WroteOffset != first.Append.WroteOffset || again.Append.QueueOffset != first.Append.QueueOffset {
		t.Fatalf("a retry after the group's restart: stored at %d (queue offset %d), the first put at %d (%d)",
			again.Append.WroteOffset, again.Append.QueueOffset, first.Append.WroteOffset, first.Append.QueueOffset)
	}
}

// BenchmarkGroupDedupRead: follower 2, restarted beside a window at its
// default bound (262,144 keyed puts of 256 bytes), reads its window from
// the log. Reported: read-ms,
// from its Open until its window holds every key, and max-round-ms, the
// longest round of its raft loop meanwhile (the top bucket of
// storaged_raft_ready_seconds: a power of two), which is what its peers
// wait on for an answer.
func BenchmarkGroupDedupRead(b *testing.B) {
	const n, writers = DefaultDedupMaxMessages, 32
	g := newTestGroupWith(b, time.Minute, nil, func(o *Options) { o.FileSize, o.MaxMessageSize = 64<<20, 1<<20 })
	g.elect(1)
	body := make([]byte, 256)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range n / writers {
				res, err := g.m[1].s.PutMessage(context.Background(), &Message{Topic: "T", QueueID: int32(w % 8), Body: body,
					BornTimestamp: 1, BornHost: DefaultStoreHost, Properties: []Property{uniq(fmt.Sprintf("%d-%d", w, i))}})
				if err != nil || res.Status != PutOK {
					b.Errorf("keyed put: %v %v", res.Status, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	var read, round time.Duration
	for b.Loop() {
		g.closeMember(2)
		g.open(2)
		start := time.Now()
		g.putOK(1, "a commit") // a commit: builds before a152654 began the read only there
		g.poll("node 2's window", func() bool { return g.m[2].s.dedupStats().Keys == n }, 1)
		read += time.Since(start)
		round += g.m[2].s.ReplicaInfo().ReadyHandling.Quantile(1)
	}
	b.ReportMetric(float64(read.Milliseconds())/float64(b.N), "read-ms")
	b.ReportMetric(float64(round.Milliseconds())/float64(b.N), "max-round-ms")
}
