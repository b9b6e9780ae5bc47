package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/replica"
)

// testNet is an in-memory network between group members: a fault-injection
// seam (drop, partition) in place of the peer gRPC transport. Each member
// has a bounded inbox drained by one goroutine that calls StepPeer; a full
// inbox drops, as a real transport's bounded queue would.
//
// It also keeps the tests' ticks in step with the members' answers
// (heard): a member's tick waits until every member it sent a heartbeat
// to and can reach has answered. The tests give ticks far faster than
// real time, and a leader counts its followers' answers once per
// election timeout (CheckQuorum, ten ticks): a follower busy in a slow
// fsync on a loaded machine would otherwise miss ten ticks' answers and
// depose a healthy leader, which the test never meant (and with the
// followers not ticking, nobody is elected after it).
type testNet struct {
	mu     sync.Mutex
	stores map[uint64]*Store
	cut    map[uint64]bool // isolated members: nothing in or out
	inbox  map[uint64]chan []byte
	stop   chan struct{}
	wg     sync.WaitGroup
	// unheard counts, by [sender, receiver], the heartbeats delivered to
	// the receiver since it last answered the sender; changed is closed
	// (and replaced) whenever it changes.
	unheard map[[2]uint64]int
	changed chan struct{}
	// rejected counts, by [sender, receiver], the append rejections
	// stepped into the receiver (a leader): each can move raft's guess of
	// where that follower is back to what it has acknowledged.
	rejected map[[2]uint64]int
}

func newTestNet(ids ...uint64) *testNet {
	n := &testNet{stores: map[uint64]*Store{}, cut: map[uint64]bool{}, inbox: map[uint64]chan []byte{}, stop: make(chan struct{}),
		unheard: map[[2]uint64]int{}, changed: make(chan struct{}), rejected: map[[2]uint64]int{}}
	for _, id := range ids {
		n.add(id)
	}
	return n
}

// add puts member id on the network: its inbox and the goroutine that
// steps what arrives into its store (a member joining later too).
func (n *testNet) add(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.inbox[id]; ok {
		return
	}
	ch := make(chan []byte, 4096)
	n.inbox[id] = ch
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			select {
			case <-n.stop:
				return
			case m := <-ch:
				n.mu.Lock()
				s, cut := n.stores[id], n.cut[id]
				n.mu.Unlock()
				n.deliver(id, s, cut, m)
			}
		}
	}()
}

// deliver steps message b into member id's store s unless id is cut or
// closed (a dropped message; a closed store refuses too), and keeps
// unheard: a heartbeat s's raft will answer is counted before the step
// (the answer may be back before StepPeer returns); a follower's answer
// to a leader, of the two kinds that mark it active for CheckQuorum,
// clears the leader's count for it.
func (n *testNet) deliver(id uint64, s *Store, cut bool, b []byte) {
	m := &pb.Message{}
	if proto.Unmarshal(b, m) != nil {
		m = nil // StepPeer refuses it
	}
	pair := [2]uint64{m.GetFrom(), id}
	owed := s != nil && !cut && answerOwed(s, m)
	if owed {
		n.count(pair, +1)
	}
	if s != nil && !cut {
		err := s.StepPeer(b)
		if err != nil && owed {
			n.count(pair, -1) // refused: no answer comes
		}
		if err == nil && m.GetType() == pb.MsgAppResp && m.GetReject() {
			n.mu.Lock()
			n.rejected[pair]++
			n.mu.Unlock()
		}
	}
	if t := m.GetType(); t == pb.MsgHeartbeatResp || t == pb.MsgAppResp {
		n.count([2]uint64{id, m.GetFrom()}, 0)
	}
}

// answerOwed reports whether s's raft answers m: a heartbeat, unless its
// commit is past s's last index (a joining member drops it and waits for
// the leader's probe; any other stops). It looks before the step: a
// truncation in between, rare, only makes a tick wait for the minute.
func answerOwed(s *Store, m *pb.Message) bool {
	if m.GetType() != pb.MsgHeartbeat || s.group == nil {
		return false
	}
	last, err := s.group.rlog.LastIndex()
	return err == nil && m.GetCommit() <= last
}

// count adds d to unheard[pair], or clears it (d == 0).
func (n *testNet) count(pair [2]uint64, d int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.unheard[pair] + d; d != 0 && c > 0 {
		n.unheard[pair] = c
	} else {
		delete(n.unheard, pair)
	}
	n.changedLocked()
}

// changedLocked wakes the ticks waiting in heard. REQUIRES: n.mu.
func (n *testNet) changedLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// setStore puts member id's store s (nil: closed) on the network. What
// id was owed and owed, an earlier incarnation's, is void.
func (n *testNet) setStore(id uint64, s *Store) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k := range n.unheard {
		if k[0] == id || k[1] == id {
			delete(n.unheard, k)
		}
	}
	if s == nil {
		delete(n.stores, id)
	} else {
		n.stores[id] = s
	}
	n.changedLocked()
}

// heard reports whether every member id sent a heartbeat to and can
// reach (neither cut, both open) has answered it since; else it returns
// a channel closed at the next change.
func (n *testNet) heard(id uint64) (bool, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, c := range n.unheard {
		if k[0] == id && c > 0 && !n.cut[id] && !n.cut[k[1]] && n.stores[id] != nil && n.stores[k[1]] != nil {
			return false, n.changed
		}
	}
	return true, nil
}

// rejections is how many append rejections from member from were stepped
// into member to.
func (n *testNet) rejections(from, to uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rejected[[2]uint64{from, to}]
}

func (n *testNet) close() {
	close(n.stop)
	n.wg.Wait()
}

func (n *testNet) setCut(id uint64, cut bool) {
	n.mu.Lock()
	n.cut[id] = cut
	n.changedLocked()
	n.mu.Unlock()
}

type testTransport struct {
	n    *testNet
	from uint64
}

func (t testTransport) Send(to uint64, msg []byte) {
	t.n.mu.Lock()
	drop := t.n.cut[t.from] || t.n.cut[to]
	ch := t.n.inbox[to]
	t.n.mu.Unlock()
	if drop || ch == nil {
		return
	}
	select {
	case ch <- msg:
	default:
	}
}

// member is one replica: its store, options and tick channel.
type member struct {
	id    uint64
	opts  Options
	ticks chan time.Time
	s     *Store
}

type testGroup struct {
	t   testing.TB
	net *testNet
	m   map[uint64]*member
	ids []uint64
}

func newTestGroup(t testing.TB, replTimeout time.Duration) *testGroup {
	return newTestGroupWith(t, replTimeout, nil, nil)
}

// newTestGroupWith: voters 1, 2, 3 and the learners given.
func newTestGroupWith(t testing.TB, replTimeout time.Duration, learners []uint64, mod func(*Options)) *testGroup {
	voters := []uint64{1, 2, 3}
	ids := append(append([]uint64(nil), voters...), learners...)
	g := &testGroup{t: t, net: newTestNet(ids...), m: map[uint64]*member{}, ids: ids}
	for _, id := range ids {
		mb := &member{id: id}
		mb.opts = Options{Dir: t.TempDir(), FileSize: 64 << 10, MaxMessageSize: 16 << 10, FlushMode: FlushSync, DelayLevels: "1s 1h",
			Group: &GroupOptions{ID: id, Name: "g1", ClusterID: "c1", Peers: voters, Learners: learners, Transport: testTransport{g.net, id},
				ElectionTick: 10, HeartbeatTick: 1, ReplicationTimeout: replTimeout, IndexUnits: 64}}
		if mod != nil {
			mod(&mb.opts)
		}
		g.m[id] = mb
		g.open(id)
	}
	t.Cleanup(func() {
		for _, id := range g.ids {
			g.closeMember(id)
		}
		g.net.close()
	})
	return g
}

func (g *testGroup) open(id uint64) {
	g.t.Helper()
	mb := g.m[id]
	mb.ticks = make(chan time.Time)
	o := mb.opts
	gopts := *o.Group
	gopts.Ticks = mb.ticks
	o.Group = &gopts
	s, err := Open(o)
	if err != nil {
		g.t.Fatalf("open %d: %v", id, err)
	}
	mb.s = s
	g.net.setStore(id, s)
}

func (g *testGroup) closeMember(id uint64) {
	g.t.Helper()
	mb := g.m[id]
	if mb.s == nil {
		return
	}
	g.net.setStore(id, nil)
	if err := mb.s.Close(); err != nil {
		g.t.Errorf("close %d: %v", id, err)
	}
	mb.s = nil
}

// tick gives one raft tick to each of ids, each once the members it
// sent heartbeats to have answered them (testNet). A member that has not
// answered in a minute is reported and ticked past: a test that passes
// only through it is slow, not hung.
func (g *testGroup) tick(ids ...uint64) {
	for _, id := range ids {
		mb := g.m[id]
		if mb.s == nil {
			continue
		}
		limit := time.After(time.Minute)
	wait:
		for {
			ok, changed := g.net.heard(id)
			if ok {
				break
			}
			select {
			case <-changed:
			case <-limit:
				g.net.mu.Lock()
				unheard := maps.Clone(g.net.unheard)
				g.net.mu.Unlock()
				g.t.Logf("tick: node %d's heartbeats unanswered for a minute (by [sender receiver]: %v); ticking it anyway", id, unheard)
				break wait
			}
		}
		mb.ticks <- time.Time{}
	}
}

// poll waits for cond, ticking ids between looks; it fails after a
// generous deadline (a hang, not a timing assertion).
func (g *testGroup) poll(what string, cond func() bool, ids ...uint64) {
	g.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			g.t.Fatalf("timed out waiting for %s", what)
		}
		g.tick(ids...)
		<-time.After(2 * time.Millisecond)
	}
}

// readyLeader is the id of a ready leader among ids, or 0.
func (g *testGroup) readyLeader(ids ...uint64) uint64 {
	for _, id := range ids {
		if s := g.m[id].s; s != nil && s.ReplicaInfo().Ready {
			return id
		}
	}
	return 0
}

func (g *testGroup) elect(id uint64) {
	g.t.Helper()
	if err := g.m[id].s.Campaign(); err != nil {
		g.t.Fatal(err)
	}
	g.poll(fmt.Sprintf("node %d ready", id), func() bool { return g.readyLeader(id) == id })
}

// converge ticks the leader until every live member knows its commit end.
func (g *testGroup) converge(leader uint64, ids ...uint64) int64 {
	g.t.Helper()
	want := g.m[leader].s.ReplicaInfo().CommitEnd
	g.poll("followers at the leader's commit end", func() bool {
		for _, id := range ids {
			// Known committed and indexed (a follower's dispatcher runs
			// after the commit reaches it).
			if s := g.m[id].s; s.ReplicaInfo().CommitEnd != want || s.index.Dispatched() < want {
				return false
			}
		}
		return true
	}, leader)
	return want
}

// sameBytes checks that the members' commitlogs are byte-identical below end.
func (g *testGroup) sameBytes(end int64, ids ...uint64) {
	g.t.Helper()
	ref := g.m[ids[0]].s
	for _, id := range ids[1:] {
		s := g.m[id].s
		for off := ref.log.MinOffset(); off < end; {
			a, b := ref.log.At(off), s.log.At(off)
			n := min(int64(len(a)), end-off)
			if int64(len(b)) < n || !bytes.Equal(a[:n], b[:n]) {
				g.t.Fatalf("node %d: commitlog differs from node %d's in [%d, %d)", id, ids[0], off, off+n)
			}
			off += n
			if n == 0 {
				g.t.Fatalf("no file holds %d below the commit end %d", off, end)
			}
		}
	}
}

// checkQueue checks that every id serves queue offsets [0, n) of T/0
// densely, with the bodies in want (by queue offset), by pull and by
// GetMessage.
func (g *testGroup) checkQueue(want map[int64]string, n int64, ids ...uint64) {
	g.t.Helper()
	for _, id := range ids {
		s := g.m[id].s
		var got []*Record
		for off := int64(0); off < n; {
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: off, MaxMessages: 64})
			if err != nil {
				g.t.Fatalf("node %d: pull at %d: %v", id, off, err)
			}
			if len(res.Messages) == 0 {
				g.t.Fatalf("node %d: nothing at queue offset %d (max %d), want %d", id, off, res.MaxOffset, n)
			}
			got = append(got, res.Messages...)
			off = res.NextOffset
		}
		for i, r := range got {
			if r.QueueOffset != int64(i) {
				g.t.Fatalf("node %d: message %d has queue offset %d", id, i, r.QueueOffset)
			}
			if b, ok := want[int64(i)]; ok && string(r.Body) != b {
				g.t.Fatalf("node %d: queue offset %d holds %q, want %q", id, i, r.Body, b)
			}
			rec, err := s.GetMessage(r.PhysicalOffset)
			if err != nil || string(rec.Body) != string(r.Body) {
				g.t.Fatalf("node %d: GetMessage(%d): %v", id, r.PhysicalOffset, err)
			}
		}
		if _, max, err := s.QueueInfo("T", 0); err != nil || max != n {
			g.t.Fatalf("node %d: queue max %d (%v), want %d", id, max, err, n)
		}
	}
}

func (g *testGroup) put(id uint64, body string) (PutResult, error) {
	return g.m[id].s.PutMessage(context.Background(), &Message{Topic: "T", QueueID: 0, Body: []byte(body), BornTimestamp: 1,
		BornHost: DefaultStoreHost})
}

// putOK puts body on id until it is PUT_OK: the setup of a test whose
// replication timeout is short on purpose, where on a loaded machine a
// put (or the creation of its topic) may time out, outcome unknown,
// with nothing wrong. Only where the test counts no messages: a put that
// timed out may still commit beside its retry.
func (g *testGroup) putOK(id uint64, body string) {
	g.t.Helper()
	g.poll(fmt.Sprintf("PUT_OK for %q on %d", body, id), func() bool {
		res, err := g.put(id, body)
		return err == nil && res.Status == PutOK
	})
}

// mustPut is put on id, failing the test unless it is PUT_OK (i names
// the put in the failure).
func (g *testGroup) mustPut(id uint64, i int, body string) {
	g.t.Helper()
	if res, err := g.put(id, body); err != nil || res.Status != PutOK {
		g.t.Fatalf("put %d: %v %v", i, res.Status, err)
	}
}

// TestGroupReplicates is the group-mode core over three real stores on an
// in-memory network: election, puts (single and batch) acknowledged on
// commit, byte-identical commitlogs, follower reads, NotLeaderError, a
// partitioned leader's puts not acknowledged and truncated after a heal,
// dense queue offsets across leaders, and a restart of all three.
func TestGroupReplicates(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	all := g.ids
	g.elect(1)
	want := map[int64]string{}
	next := int64(0)
	for i := range 20 {
		body := fmt.Sprintf("m-%d", i)
		res, err := g.put(1, body)
		if err != nil || res.Status != PutOK || res.Append.QueueOffset != next {
			t.Fatalf("put %d: %v %v at queue offset %d, want %d", i, res.Status, err, res.Append.QueueOffset, next)
		}
		want[next] = body
		next++
		// Read your writes on the leader: a PUT_OK is indexed already.
		if _, max, err := g.m[1].s.QueueInfo("T", 0); err != nil || max != next {
			t.Fatalf("after PUT_OK %d the leader's queue max is %d (%v), want %d", i, max, err, next)
		}
	}
	b := &Batch{Topic: "T", QueueID: 0, BornHost: DefaultStoreHost}
	for i := range 5 {
		b.Messages = append(b.Messages, BatchMessage{Body: []byte(fmt.Sprintf("b-%d", i)), BornTimestamp: 1})
	}
	res, err := g.m[1].s.PutMessages(context.Background(), b)
	if err != nil || res.Status != PutOK || res.Append.QueueOffset != next || res.Append.MsgNum != 5 {
		t.Fatalf("batch: %v %v at %d", res.Status, err, res.Append.QueueOffset)
	}
	for i := range 5 {
		want[next] = fmt.Sprintf("b-%d", i)
		next++
	}
	end := g.converge(1, all...)
	g.sameBytes(end, all...)
	g.checkQueue(want, next, all...)

	// A follower refuses, naming the leader; nothing is stored.
	_, err = g.put(2, "refused")
	var nl *NotLeaderError
	if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) || nl.LeaderID != 1 || nl.Cause != "NOT_LEADER" {
		t.Fatalf("put on a follower: %v", err)
	}
	if _, err := g.m[2].s.PutMessage(context.Background(), &Message{Topic: "Fresh", Body: []byte("x"), BornHost: DefaultStoreHost}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("put of a new topic on a follower: %v", err)
	} else if _, err := g.m[2].s.Topic("Fresh"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("a refused put created its topic on the follower: %v", err)
	}
	if info := g.m[1].s.ReplicaInfo(); info.Role != "leader" || !info.Ready || len(info.Peers) != 3 || info.CommitEnd != end {
		t.Fatalf("leader info %+v", info)
	}

	// Partition the leader away: its puts do not ack.
	g.net.setCut(1, true)
	type outcome struct {
		res PutResult
		err error
	}
	var inflight []chan outcome
	for i := range 3 {
		ch := make(chan outcome, 1)
		inflight = append(inflight, ch)
		go func() {
			r, err := g.put(1, fmt.Sprintf("lost-%d", i))
			ch <- outcome{r, err}
		}()
	}
	// The others elect a new leader (ticks past the old leader's lease).
	g.poll("a new leader among 2 and 3", func() bool { return g.readyLeader(2, 3) != 0 }, 2, 3)
	l2 := g.readyLeader(2, 3)
	// Nothing stored may be answered before the heal, and only as a
	// refusal: a check of CheckQuorum's activity may have run just before
	// the cut (IN_SYNC_REPLICAS_NOT_ENOUGH).
	answered := make([]*outcome, len(inflight))
	nothingStored := func(o outcome) bool {
		return o.err != nil && o.res.Status != PutOK && (errors.Is(o.err, ErrNotLeader) || errors.Is(o.err, ErrInSyncReplicasNotEnough))
	}
	for i, ch := range inflight {
		select {
		case o := <-ch:
			if !errors.Is(o.err, ErrInSyncReplicasNotEnough) {
				t.Fatalf("a partitioned leader's put answered %v %v", o.res.Status, o.err)
			}
			answered[i] = &o
		default:
		}
	}
	for i := range 10 {
		body := fmt.Sprintf("n-%d", i)
		res, err := g.put(l2, body)
		if err != nil || res.Status != PutOK || res.Append.QueueOffset != next {
			t.Fatalf("put %d on the new leader %d: %v %v at %d, want %d", i, l2, res.Status, err, res.Append.QueueOffset, next)
		}
		want[next] = body
		next++
	}
	// Heal: the old leader steps down, its suffix is truncated, its puts
	// are answered "not stored" (commit passed their positions).
	g.net.setCut(1, false)
	pending := 0
	for i, ch := range inflight {
		if answered[i] != nil {
			continue
		}
		pending++
		o := pollRecv(g, "the old leader's in-flight put answered", ch, l2)
		if !nothingStored(o) {
			t.Fatalf("in-flight put on the old leader: %v %v", o.res.Status, o.err)
		}
	}
	end = g.converge(l2, all...)
	g.sameBytes(end, all...)
	g.checkQueue(want, next, all...)
	if pending > 0 {
		// The old leader's uncommitted suffix was cut, a copy kept.
		names, err := filepath.Glob(filepath.Join(g.m[1].opts.Dir, "commitlog", "*.truncated"))
		if err != nil || len(names) == 0 {
			t.Fatalf("no .truncated copy on the old leader (%v)", err)
		}
	}

	// Restart all three: same state, and puts continue.
	for _, id := range all {
		g.closeMember(id)
	}
	for _, id := range all {
		g.open(id)
	}
	for _, id := range all {
		if ce := g.m[id].s.ReplicaInfo().CommitEnd; ce != end {
			t.Fatalf("node %d reopened at commit end %d, want %d", id, ce, end)
		}
	}
	g.checkQueue(want, next, all...)
	g.elect(3)
	for i := range 5 {
		body := fmt.Sprintf("r-%d", i)
		res, err := g.put(3, body)
		if err != nil || res.Status != PutOK || res.Append.QueueOffset != next {
			t.Fatalf("put %d after the restart: %v %v at %d, want %d", i, res.Status, err, res.Append.QueueOffset, next)
		}
		want[next] = body
		next++
	}
	end = g.converge(3, all...)
	g.sameBytes(end, all...)
	g.checkQueue(want, next, all...)
}

// TestGroupLeaderAlone: a leader whose followers are gone acknowledges
// nothing: its puts time out with the outcome unknown
// (FLUSH_SLAVE_TIMEOUT), and once CheckQuorum deposes it they are refused.
func TestGroupLeaderAlone(t *testing.T) {
	g := newTestGroup(t, 200*time.Millisecond)
	g.elect(1)
	g.putOK(1, "ok")
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	res, err := g.put(1, "unknown")
	if !errors.Is(err, ErrReplicationTimeout) || res.Status != FlushSlaveTimeout {
		t.Fatalf("put without followers: %v %v", res.Status, err)
	}
	// A linearizable read cannot confirm the leadership: refused after
	// the replication timeout, nothing read.
	if err := g.m[1].s.ReadBarrier(context.Background()); !errors.Is(err, ErrReadIndexTimeout) {
		t.Fatalf("a linearizable read on a leader without followers: %v", err)
	}
	// CheckQuorum, on the leader's ticks: the first check after the cut
	// (10 ticks) finds the followers active from before and resets their
	// activity; from then on puts are refused with nothing proposed.
	for range 10 {
		g.tick(1)
	}
	g.poll("the followers' activity reset", func() bool {
		info := g.m[1].s.ReplicaInfo()
		for _, p := range info.Peers {
			if p.ID != 1 && p.RecentActive {
				return false
			}
		}
		return info.Role == "leader"
	})
	res, err = g.put(1, "refused")
	if !errors.Is(err, ErrInSyncReplicasNotEnough) || res.Status != InSyncReplicasNotEnough || res.Appended() {
		t.Fatalf("put on a leader without active followers: %v %v", res.Status, err)
	}
	// The next check deposes it.
	g.poll("the lone leader steps down", func() bool { return g.m[1].s.ReplicaInfo().Role != "leader" }, 1)
	res, err = g.put(1, "refused")
	var nl *NotLeaderError
	if !errors.As(err, &nl) || res.Status != ServiceNotAvailable || res.Appended() {
		t.Fatalf("put on a deposed leader: %v %v", res.Status, err)
	}
	// The unknown put committed nowhere: no follower is past the old
	// leader's commit end (the first put's end).
	for _, id := range g.ids {
		if ce, want := g.m[id].s.ReplicaInfo().CommitEnd, g.m[1].s.ReplicaInfo().CommitEnd; ce > want {
			t.Fatalf("node %d at commit end %d, node 1 at %d", id, ce, want)
		}
	}
}

// TestGroupDeposedPutRefusedAtNewTerm: a put proposed by a leader cut
// off from its group is answered as soon as the next leader's first
// entry (its empty one, no put) reaches the old leader: refused with
// CauseSuperseded, definitely not stored, not FLUSH_SLAVE_TIMEOUT after
// the replication timeout. No put goes to the new leader, so no entry
// passes the lost put's position: only the term tells.
func TestGroupDeposedPutRefusedAtNewTerm(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	if res, err := g.put(1, "a"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	g.converge(1, g.ids...)
	end := g.m[1].s.log.MaxOffset()
	g.net.setCut(1, true)
	type answer struct {
		res PutResult
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := g.put(1, "lost")
		ch <- answer{res, err}
	}()
	g.poll("the lost put in node 1's log", func() bool { return g.m[1].s.log.MaxOffset() > end })
	nl := g.failover(2, 3)
	g.net.setCut(1, false)
	a := pollRecv(g, "the lost put answered", ch, nl)
	var ne *NotLeaderError
	if !errors.As(a.err, &ne) || ne.Cause != CauseSuperseded || a.res.Status != ServiceNotAvailable {
		t.Fatalf("the deposed leader's put: %v %v, want SERVICE_NOT_AVAILABLE (superseded)", a.res.Status, a.err)
	}
	ce := g.converge(nl, g.ids...)
	if ce != end {
		t.Fatalf("commit end %d after the heal, want %d (nothing put since)", ce, end)
	}
	for _, id := range g.ids {
		if mx := g.queueMax(id); mx != 1 {
			t.Fatalf("node %d: queue max %d, want 1 (the lost put stored nowhere)", id, mx)
		}
	}
}

// TestGroupDelayedDelivery: a delayed message is diverted to the
// schedule topic on the leader, replicated as such, and delivered once, by
// the ready leader's scheduler through the propose path, to every replica.
func TestGroupDelayedDelivery(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(2)
	m := &Message{Topic: "D", Body: []byte("later"), BornTimestamp: 1, BornHost: DefaultStoreHost,
		Properties: []Property{{Key: PropertyDelayLevel, Value: "1"}}}
	res, err := g.m[2].s.PutMessage(context.Background(), m)
	if err != nil || res.Status != PutOK || res.Append.Topic != ScheduleTopic || res.Append.QueueID != 0 {
		t.Fatalf("delayed put: %v %v %+v", res.Status, err, res.Append)
	}
	// Every member is ticked: a leader that steps down under load is
	// replaced (a follower never ticked refuses every vote, in its lease
	// forever), and the new leader resumes from the replicated progress.
	term := g.m[2].s.ReplicaInfo().Term
	g.poll("the delayed message delivered on every replica", func() bool {
		for _, id := range g.ids {
			if _, max, err := g.m[id].s.QueueInfo("D", 0); err != nil || max < 1 {
				return false
			}
		}
		return true
	}, g.ids...)
	g.poll("a ready leader", func() bool { return g.readyLeader(g.ids...) != 0 }, g.ids...)
	l := g.readyLeader(g.ids...)
	g.converge(l, g.ids...)
	g.sameBytes(g.m[l].s.ReplicaInfo().CommitEnd, g.ids...)
	// Delivered at least once, with the body it was put with. A second
	// delivery is allowed only across a leader change (a new leader
	// repeats what the last replicated progress does not cover): under
	// load a leader may step down before its progress entry commits.
	for _, id := range g.ids {
		r, err := g.m[id].s.PullMessages(context.Background(), PullRequest{Topic: "D", QueueID: 0})
		if err != nil || len(r.Messages) == 0 {
			t.Fatalf("node %d: pull D/0: %v %d", id, err, len(r.Messages))
		}
		for _, msg := range r.Messages {
			if string(msg.Body) != "later" {
				t.Fatalf("node %d: delivered %q", id, msg.Body)
			}
		}
		if n := len(r.Messages); n > 1 && g.m[id].s.ReplicaInfo().Term == term {
			t.Fatalf("node %d: delivered %d times without a leader change (term %d)", id, n, term)
		}
	}
}

// TestGroupLearner: a learner replicates and serves reads, says it is a
// learner, refuses puts and never leads.
func TestGroupLearner(t *testing.T) {
	g := newTestGroupWith(t, time.Minute, []uint64{4}, nil)
	if err := g.m[4].s.Campaign(); err != nil {
		t.Fatal(err)
	}
	g.elect(1)
	want := map[int64]string{}
	for i := range 10 {
		want[int64(i)] = fmt.Sprintf("m-%d", i)
		if res, err := g.put(1, want[int64(i)]); err != nil || res.Status != PutOK {
			t.Fatalf("put: %v %v", res.Status, err)
		}
	}
	end := g.converge(1, g.ids...)
	g.sameBytes(end, g.ids...)
	g.checkQueue(want, 10, g.ids...)
	info := g.m[4].s.ReplicaInfo()
	if info.Role != "learner" || info.LeaderID != 1 {
		t.Fatalf("learner info %+v", info)
	}
	var nl *NotLeaderError
	if _, err := g.put(4, "no"); !errors.As(err, &nl) || nl.LeaderID != 1 {
		t.Fatalf("put on the learner: %v", err)
	}
	if lead := g.m[1].s.ReplicaInfo(); len(lead.Peers) != 4 || !lead.Peers[3].Learner {
		t.Fatalf("leader's view %+v", lead)
	}
}

// TestGroupTransferLeadership: a stopping leader hands leadership to the
// recently active voter with the highest match, which campaigns at once
// (no tick runs: no election timeout passes); the old leader then names
// the new one, which takes puts, and every acked put is there. While a
// transfer cannot finish (its target cut off), puts are refused with
// TRANSFERRING and nothing is stored.
func TestGroupTransferLeadership(t *testing.T) {
	// The wait is two election timeouts of TickInterval; ticks are manual
	// here, so the wall-clock bound is only a hang guard.
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Group.TickInterval = time.Minute })
	g.elect(1)
	want := map[int64]string{}
	put := func(id uint64, i int) {
		t.Helper()
		body := fmt.Sprintf("m-%d", i)
		res, err := g.put(id, body)
		if err != nil || res.Status != PutOK || res.Append.QueueOffset != int64(i) {
			t.Fatalf("put %d to %d: %v %v at %d", i, id, res.Status, err, res.Append.QueueOffset)
		}
		want[int64(i)] = body
	}
	for i := range 5 {
		put(1, i)
	}
	g.converge(1, g.ids...)
	// Node 2 falls behind (still recently active: no quorum check runs
	// without ticks), so node 3 has the highest match.
	g.net.setCut(2, true)
	for i := 5; i < 10; i++ {
		put(1, i)
	}
	g.net.setCut(2, false)
	to, err := g.m[1].s.TransferLeadership(context.Background())
	if err != nil || to != 3 {
		t.Fatalf("TransferLeadership: leader %d, %v; want 3 (the highest match)", to, err)
	}
	var nl *NotLeaderError
	if _, err := g.put(1, "to the old leader"); !errors.As(err, &nl) || nl.Cause != CauseNotLeader || nl.LeaderID != 3 {
		t.Fatalf("put to the old leader: %v, want NOT_LEADER naming 3", err)
	}
	g.poll("node 3 ready", func() bool { return g.readyLeader(3) == 3 })
	for i := 10; i < 15; i++ {
		put(3, i)
	}
	end := g.converge(3, g.ids...)
	g.sameBytes(end, g.ids...)
	g.checkQueue(want, 15, g.ids...)

	// A transfer that cannot finish: both followers cut off after the
	// leader last heard from them.
	g.net.setCut(1, true)
	g.net.setCut(2, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := g.m[3].s.TransferLeadership(ctx)
		done <- err
	}()
	s := g.m[3].s
	g.poll("TRANSFERRING", func() bool { return errors.As(s.groupRefusal(), &nl) && nl.Cause == CauseTransferring })
	maxOff := s.log.MaxOffset()
	res, err := g.put(3, "during the transfer")
	if !errors.As(err, &nl) || nl.Cause != CauseTransferring || res.Status != ServiceNotAvailable || res.Appended() {
		t.Fatalf("put during the transfer: %v %v, want TRANSFERRING, nothing appended", res.Status, err)
	}
	if _, max, err := s.QueueInfo("T", 0); err != nil || max != 15 || s.log.MaxOffset() != maxOff {
		t.Fatalf("after the refused put: queue max %d (%v), commitlog end %d -> %d", max, err, maxOff, s.log.MaxOffset())
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("TransferLeadership with its target cut off: %v", err)
	}
	if role := s.ReplicaInfo().Role; role != "leader" {
		t.Fatalf("node 3 is %s after a transfer that never reached its target", role)
	}
	// A follower has nothing to hand over.
	if lead, err := g.m[2].s.TransferLeadership(context.Background()); err != nil || lead != 3 {
		t.Fatalf("TransferLeadership on a follower: %d %v", lead, err)
	}
}

// TestGroupTransferAfterQuorumCheck: raft clears its followers'
// RecentActive at every check-quorum round (once per election timeout of
// the leader's ticks) and sets it again at their next answer. A leader
// stopped right after such a round, before any answer, must still hand
// its leadership to a voter it heard from within the last election
// timeout (it once found none: TestGroupSIGTERMTransfer in a CI dry run).
func TestGroupTransferAfterQuorumCheck(t *testing.T) {
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Group.TickInterval = time.Minute })
	g.elect(1)
	for range 5 { // half an election timeout (ElectionTick 10)
		g.tick(1)
	}
	if res, err := g.put(1, "m"); err != nil || res.Status != PutOK {
		t.Fatalf("put: %v %v", res.Status, err)
	}
	// No answer reaches the leader through its next check-quorum round
	// (its 10th tick): it stays leader (both answered within the round),
	// and raft marks neither follower recently active. The followers stay
	// cut off, so the transfer cannot finish: it must start
	// (TRANSFERRING), not be refused for want of an active voter. (The
	// 11th tick is handed over only once the loop has finished the 10th.)
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	for range 6 {
		g.tick(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := g.m[1].s.TransferLeadership(ctx)
		done <- err
	}()
	var nl *NotLeaderError
	var err error
	g.poll("the transfer started or refused", func() bool {
		if errors.As(g.m[1].s.groupRefusal(), &nl) && nl.Cause == CauseTransferring {
			cancel()
		}
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("TransferLeadership right after a quorum check: %v; want it started, then given up (ErrTransferTimeout)", err)
	}
}

// moveGroup is a group of voters 1, 2, 3 and learner 4 with manual ticks
// (TickInterval a minute: the move's own bound of two election timeouts
// never passes, so only ctx ends a move that cannot finish), 1 leading,
// and the puts acknowledged so far (acked, by queue offset).
type moveGroup struct {
	*testGroup
	acked map[int64]string
}

func newMoveGroup(t *testing.T) *moveGroup {
	g := &moveGroup{testGroup: newTestGroupWith(t, time.Minute, []uint64{4}, func(o *Options) { o.Group.TickInterval = time.Minute }),
		acked: map[int64]string{}}
	g.elect(1)
	g.puts(1, 5)
	return g
}

// puts puts k messages to id, each of which must be PUT_OK at the next
// queue offset.
func (g *moveGroup) puts(id uint64, k int) {
	g.t.Helper()
	for range k {
		off := int64(len(g.acked))
		body := fmt.Sprintf("m-%d", off)
		res, err := g.put(id, body)
		if err != nil || res.Status != PutOK || res.Append.QueueOffset != off {
			g.t.Fatalf("put %d to %d: %v %v at %d", off, id, res.Status, err, res.Append.QueueOffset)
		}
		g.acked[off] = body
	}
}

// move is MoveLeadership on member id with a minute's ctx (a hang guard).
func (g *moveGroup) move(id, to uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return g.m[id].s.MoveLeadership(ctx, to)
}

// moveTicking is MoveLeadership(to) on member id with a 30 s ctx, run
// while meanwhile() runs and then the test ticks id until it returns.
func (g *moveGroup) moveTicking(id, to uint64, meanwhile func()) (uint64, error) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		lead uint64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		lead, err := g.m[id].s.MoveLeadership(ctx, to)
		done <- result{lead, err}
	}()
	meanwhile()
	var r result
	g.poll(fmt.Sprintf("the move to %d", to), func() bool {
		select {
		case r = <-done:
			return true
		default:
			return false
		}
	}, id)
	return r.lead, r.err
}

// unchanged fails the test unless leader still leads, ready, in term
// with nothing refused, and takes a put.
func (g *moveGroup) unchanged(what string, leader, term uint64) {
	g.t.Helper()
	s := g.m[leader].s
	if ri := s.ReplicaInfo(); ri.Role != "leader" || !ri.Ready || ri.Term != term {
		g.t.Fatalf("%s: member %d is %s (ready %v) in term %d, want the ready leader in term %d", what, leader, ri.Role, ri.Ready, ri.Term, term)
	}
	if err := s.groupRefusal(); err != nil {
		g.t.Fatalf("%s: member %d refuses puts: %v", what, leader, err)
	}
	g.puts(leader, 1)
}

// checkAll checks that each of ids (every member when none is given)
// names leader and serves every acked put, byte for byte the same
// commitlog.
func (g *moveGroup) checkAll(leader uint64, ids ...uint64) {
	g.t.Helper()
	if len(ids) == 0 {
		ids = g.ids
	}
	g.poll(fmt.Sprintf("every member names %d", leader), func() bool {
		for _, id := range ids {
			if g.m[id].s.ReplicaInfo().LeaderID != leader {
				return false
			}
		}
		return true
	}, leader)
	end := g.converge(leader, ids...)
	g.sameBytes(end, ids...)
	g.checkQueue(g.acked, int64(len(g.acked)), ids...)
}

// TestGroupMoveLeadership: an operator's move (etcd's move-leader) hands
// the leadership to the voter asked for, even one behind the others (it
// catches up first), and returns it; the old leader names it and it takes
// puts; with to 0 it goes to the most caught-up active voter (another
// than the one behind); to the leader itself it returns at once, nothing
// changed; on a follower it is refused NOT_LEADER naming the leader.
// Every acked put is on every member, byte for byte.
func TestGroupMoveLeadership(t *testing.T) {
	g := newMoveGroup(t)
	g.converge(1, g.ids...)
	// Member 3 falls behind: to 0 would pick 2; 3 is asked for.
	g.net.setCut(3, true)
	g.puts(1, 5)
	g.net.setCut(3, false)
	if lead, err := g.move(1, 3); err != nil || lead != 3 {
		t.Fatalf("MoveLeadership(3) on 1: %d, %v; want 3", lead, err)
	}
	var nl *NotLeaderError
	if _, err := g.put(1, "to the old leader"); !errors.As(err, &nl) || nl.Cause != CauseNotLeader || nl.LeaderID != 3 {
		t.Fatalf("put to the old leader: %v, want NOT_LEADER naming 3", err)
	}
	g.poll("member 3 ready", func() bool { return g.readyLeader(3) == 3 })
	g.puts(3, 5)
	g.checkAll(3)

	// On a follower: refused, naming the leader; nothing moves.
	if _, err := g.move(2, 1); !errors.As(err, &nl) || nl.Cause != CauseNotLeader || nl.LeaderID != 3 {
		t.Fatalf("MoveLeadership on follower 2: %v, want NOT_LEADER naming 3", err)
	}
	// To itself: at once, nothing changed.
	term := g.m[3].s.ReplicaInfo().Term
	if lead, err := g.move(3, 3); err != nil || lead != 3 {
		t.Fatalf("MoveLeadership(3) on 3: %d, %v", lead, err)
	}
	g.unchanged("a move to the leader itself", 3, term)

	// To 0: member 1 falls behind, so 2 is the most caught up.
	g.net.setCut(1, true)
	g.puts(3, 5)
	g.net.setCut(1, false)
	if lead, err := g.move(3, 0); err != nil || lead != 2 {
		t.Fatalf("MoveLeadership(0) on 3: %d, %v; want 2 (the highest match)", lead, err)
	}
	g.poll("member 2 ready", func() bool { return g.readyLeader(2) == 2 })
	g.puts(2, 5)
	g.checkAll(2)
}

// TestGroupMoveLeadershipRefused: a move to a learner, an unknown id, a
// removed id (ErrNotVoter) or a voter not heard from within an election
// timeout (ErrTransfereeInactive) is refused and changes nothing: the
// leader leads in the same term, ready, and takes puts.
func TestGroupMoveLeadershipRefused(t *testing.T) {
	g := newMoveGroup(t)
	term := g.m[1].s.ReplicaInfo().Term
	for _, tc := range []struct {
		name string
		to   uint64
		want error
	}{
		{"a learner", 4, ErrNotVoter},
		{"an unknown id", 9, ErrNotVoter},
	} {
		if lead, err := g.move(1, tc.to); !errors.Is(err, tc.want) || lead != 0 {
			t.Fatalf("move to %s (%d): %d, %v; want %v", tc.name, tc.to, lead, err, tc.want)
		}
		g.unchanged("a move to "+tc.name, 1, term)
	}
	if _, err := g.change(1, "remove learner 4", func(ctx context.Context, s *Store) (GroupMembership, error) {
		return s.RemoveMember(ctx, 4)
	}); err != nil {
		t.Fatal(err)
	}
	if lead, err := g.move(1, 4); !errors.Is(err, ErrNotVoter) || lead != 0 {
		t.Fatalf("move to removed member 4: %d, %v; want ErrNotVoter", lead, err)
	}
	g.unchanged("a move to a removed member", 1, term)

	// Member 3 cut off for more than an election timeout of the leader's
	// ticks (10), while 2 answers its heartbeats. Polled: a message 3 sent
	// before the cut may still be on its way. A move that the leader
	// takes meanwhile gives up at once (its ctx is done) and resumes.
	g.net.setCut(3, true)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	var err error
	g.poll("member 3 silent", func() bool {
		_, err = g.m[1].s.MoveLeadership(gone, 3)
		return errors.Is(err, ErrTransfereeInactive)
	}, 1)
	g.poll("member 2's answers to the leader's heartbeats", func() bool { return g.m[1].s.groupRefusal() == nil }, 1)
	g.unchanged("a move to a silent voter", 1, term)
	g.net.setCut(3, false)
	g.checkAll(1, 1, 2, 3) // 4 removed
}

// TestGroupMoveLeadershipGivesUp: a move whose target never answers (both
// followers cut off after the leader last heard from them) refuses puts
// with TRANSFERRING while it runs (nothing stored), and so another move
// and a membership change; once its ctx ends it returns
// ErrTransferTimeout and the leader takes puts again. A stop
// (TransferLeadership) that comes while a move runs keeps puts refused
// after the move gives up.
func TestGroupMoveLeadershipGivesUp(t *testing.T) {
	g := newMoveGroup(t)
	s := g.m[1].s
	term := s.ReplicaInfo().Term
	var nl *NotLeaderError
	transferring := func() bool { return errors.As(s.groupRefusal(), &nl) && nl.Cause == CauseTransferring }
	// start runs a move to 2 with its followers cut off and returns once
	// it refuses puts, with the cancel of its ctx and its outcome.
	start := func() (context.CancelFunc, <-chan error) {
		t.Helper()
		g.net.setCut(2, true)
		g.net.setCut(3, true)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := s.MoveLeadership(ctx, 2)
			done <- err
		}()
		g.poll("TRANSFERRING", transferring)
		return cancel, done
	}

	cancel, done := start()
	maxOff := s.log.MaxOffset()
	res, err := g.put(1, "during the move")
	if !errors.As(err, &nl) || nl.Cause != CauseTransferring || res.Status != ServiceNotAvailable || res.Appended() {
		t.Fatalf("put during the move: %v %v, want TRANSFERRING, nothing appended", res.Status, err)
	}
	if _, err := g.move(1, 3); !errors.As(err, &nl) || nl.Cause != CauseTransferring {
		t.Fatalf("a second move during the move: %v, want TRANSFERRING", err)
	}
	if _, err := s.AddLearner(context.Background(), 5, "127.0.0.1:9"); !errors.As(err, &nl) || nl.Cause != CauseTransferring {
		t.Fatalf("a membership change during the move: %v, want TRANSFERRING", err)
	}
	if s.log.MaxOffset() != maxOff {
		t.Fatalf("the commitlog grew from %d to %d while the move ran", maxOff, s.log.MaxOffset())
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("a move whose target is cut off: %v, want ErrTransferTimeout", err)
	}
	if err := s.groupRefusal(); err != nil {
		t.Fatalf("after the move gave up the leader refuses puts: %v", err)
	}
	g.net.setCut(2, false)
	g.net.setCut(3, false)
	g.unchanged("a move that gave up", 1, term)

	// The process begins stopping while a move runs: its own hand-over
	// (given up at once here, its ctx done) leaves puts refused, and so
	// must the move when it gives up.
	cancel, done = start()
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if _, err := s.TransferLeadership(stopped); !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("TransferLeadership during the move: %v, want ErrTransferTimeout (its ctx done)", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("the move: %v, want ErrTransferTimeout", err)
	}
	if !transferring() {
		t.Fatalf("a move that gave up while the process stops made the leader take puts: %v", s.groupRefusal())
	}
	g.net.setCut(2, false)
	g.net.setCut(3, false)
}

// TestGroupMoveLeadershipConfPending: while a membership change the
// leader proposed has not applied, a move is refused
// (ErrConfChangePending), nothing changed; once it applied, the move goes
// through.
func TestGroupMoveLeadershipConfPending(t *testing.T) {
	g := newMoveGroup(t)
	s := g.m[1].s
	term := s.ReplicaInfo().Term
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	done := make(chan error, 1)
	go func() {
		_, err := s.AddLearner(context.Background(), 5, "127.0.0.1:9")
		done <- err
	}()
	g.poll("the change in the leader's log", func() bool {
		ri := s.ReplicaInfo()
		for _, p := range ri.Peers {
			if p.ID == 1 && p.Match > ri.Commit {
				return true
			}
		}
		return false
	})
	if lead, err := g.move(1, 2); !errors.Is(err, ErrConfChangePending) || lead != 0 {
		t.Fatalf("a move while a change is pending: %d, %v; want ErrConfChangePending", lead, err)
	}
	if ri := s.ReplicaInfo(); ri.Role != "leader" || ri.Term != term || s.groupRefusal() != nil {
		t.Fatalf("after the refused move: %s in term %d (was %d), refusal %v", ri.Role, ri.Term, term, s.groupRefusal())
	}
	g.net.setCut(2, false)
	g.net.setCut(3, false)
	if err := pollRecv(g.testGroup, "the change applied", done, 1); err != nil {
		t.Fatalf("AddLearner(5): %v", err)
	}
	// Ticking: member 2 may not have applied the change yet, and raft's
	// transferee with a committed change still to apply does not campaign;
	// the move asks again once raft gave the transfer up.
	if lead, err := g.moveTicking(1, 2, func() {}); err != nil || lead != 2 {
		t.Fatalf("the move once the change applied: %d, %v; want 2", lead, err)
	}
}

// TestGroupMoveLeadershipRetries: raft gives a transfer up after an
// election timeout of the leader's ticks; a move then asks raft again at
// the next tick, so a transferee that missed the leader's MsgTimeoutNow
// (cut off here; in a real group, one that had a committed membership
// change still to apply, which makes raft refuse to campaign) gets
// another and the move finishes.
func TestGroupMoveLeadershipRetries(t *testing.T) {
	g := newMoveGroup(t)
	g.converge(1, g.ids...)
	g.net.setCut(2, true) // after the leader last heard from it: the move starts
	var nl *NotLeaderError
	lead, err := g.moveTicking(1, 2, func() {
		g.poll("TRANSFERRING", func() bool { return errors.As(g.m[1].s.groupRefusal(), &nl) && nl.Cause == CauseTransferring })
		for range 12 { // past raft's give-up (ElectionTick 10), 3 answering: no quorum loss
			g.tick(1)
		}
		g.net.setCut(2, false)
	})
	if err != nil || lead != 2 {
		t.Fatalf("MoveLeadership(2) whose first MsgTimeoutNow was lost: %d, %v; want 2", lead, err)
	}
	g.poll("member 2 ready", func() bool { return g.readyLeader(2) == 2 })
	g.puts(2, 5)
	g.checkAll(2)
}

func TestGroupOptionsValidate(t *testing.T) {
	tr := testTransport{}
	base := Options{Dir: t.TempDir(), FlushMode: FlushSync, Group: &GroupOptions{ID: 1, Peers: []uint64{1, 2, 3}, Transport: tr}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	// The bounds themselves are accepted.
	edge := base
	edgeGroup := *base.Group
	edgeGroup.TickInterval, edgeGroup.ElectionTick, edgeGroup.HeartbeatTick = MaxTickInterval, MaxElectionTick, 1
	edgeGroup.CatchUpReadahead = MaxCatchUpReadahead
	edge.Group = &edgeGroup
	if err := edge.Validate(); err != nil {
		t.Fatalf("the bounds: %v", err)
	}
	// A member joining an existing group lists no members: it learns them.
	join := base
	join.Group = &GroupOptions{ID: 4, Join: true, Transport: tr}
	if err := join.Validate(); err != nil {
		t.Fatalf("a joining member: %v", err)
	}
	for name, mod := range map[string]func(o *Options){
		"join id 0": func(o *Options) { o.Group.ID, o.Group.Join = 0, true },
		"async":     func(o *Options) { o.FlushMode = FlushAsync },
		"slave":     func(o *Options) { o.Role = RoleSlave },
		"no id":     func(o *Options) { o.Group.ID = 0 },
		"not peer":  func(o *Options) { o.Group.ID = 4 },
		"dup peer":  func(o *Options) { o.Group.Peers = []uint64{1, 1, 2} },
		"no trans":  func(o *Options) { o.Group.Transport = nil },
		"bad ticks": func(o *Options) { o.Group.ElectionTick, o.Group.HeartbeatTick = 2, 2 },
		"neg tick":  func(o *Options) { o.Group.TickInterval = -time.Millisecond },
		"long tick": func(o *Options) { o.Group.TickInterval = MaxTickInterval + time.Millisecond },
		"elections": func(o *Options) { o.Group.ElectionTick = MaxElectionTick + 1 },
		"neg elect": func(o *Options) { o.Group.ElectionTick = -1 },
		"neg ahead": func(o *Options) { o.Group.CatchUpReadahead = -1 },
		"big ahead": func(o *Options) { o.Group.CatchUpReadahead = MaxCatchUpReadahead + 1 },
	} {
		o := base
		gopts := *base.Group
		o.Group = &gopts
		mod(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestGroupStepPeerRefuses: StepPeer takes only well-formed messages for
// this node from a member (or, from a member it has not heard of, only a
// leader's or a candidate's), bounded in size; a standalone store has no
// peers.
func TestGroupStepPeerRefuses(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	s := g.m[1].s
	for name, msg := range map[string][]byte{
		"garbage":  {0xff, 0xff, 0xff},
		"too big":  make([]byte, 16<<20+1),
		"other to": {0x08, 0x08, 0x10, 0x02, 0x18, 0x02}, // MsgHeartbeat, To=2, From=2
		"stranger": {0x08, 0x09, 0x10, 0x01, 0x18, 0x09}, // MsgHeartbeatResp, To=1, From=9: an answer from a stranger (its heartbeats are taken: replica.TestStepPeerStrangers)
		"local":    {0x08, 0x00, 0x10, 0x01, 0x18, 0x02}, // MsgHup
	} {
		if err := s.StepPeer(msg); !errors.Is(err, ErrBadPeerMessage) {
			t.Errorf("%s: %v", name, err)
		}
	}
	solo, _ := openTest(t, nil)
	if err := solo.StepPeer([]byte{}); !errors.Is(err, ErrNotGroup) {
		t.Fatalf("standalone StepPeer: %v", err)
	}
	if info := solo.ReplicaInfo(); info.Role != "standalone" {
		t.Fatalf("standalone ReplicaInfo: %+v", info)
	}
}

// BenchmarkGroupPut: 1 KiB unary puts through the leader of an in-process
// three-replica group on real files (all three on this machine's one
// disk), 32 × GOMAXPROCS concurrent producers: each op is one PUT_OK, committed on a
// majority that synced. keyed: each put carries a fresh UNIQ_KEY (the
// leader's window and every follower's take it).
func BenchmarkGroupPut(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		b.Run(map[bool]string{false: "unkeyed", true: "keyed"}[keyed], func(b *testing.B) {
			g := newTestGroupWith(b, time.Minute, nil, func(o *Options) {
				o.FileSize, o.Group.IndexUnits = 256<<20, 0 // few rolls: the steady state
			})
			g.elect(1)
			s := g.m[1].s
			body := bytes.Repeat([]byte("x"), 1024)
			var seq atomic.Uint64
			b.SetBytes(int64(len(body)))
			b.SetParallelism(32) // × GOMAXPROCS producers
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m := &Message{Topic: "T", QueueID: 0, Body: body, BornTimestamp: 1, BornHost: DefaultStoreHost}
					if keyed {
						m.Properties = []Property{uniq(fmt.Sprintf("%032X", seq.Add(1)))}
					}
					res, err := s.PutMessage(context.Background(), m)
					if err != nil || res.Status != PutOK {
						b.Errorf("put: %v %v", res.Status, err)
						return
					}
				}
			})
		})
	}
}

// readMax is a linearizable QueueInfo of T/0 on id: the barrier, then the
// queue's max offset (0 for a queue not created yet).
func (g *testGroup) readMax(ctx context.Context, id uint64) (int64, error) {
	s := g.m[id].s
	if err := s.ReadBarrier(ctx); err != nil {
		return 0, err
	}
	_, max, err := s.QueueInfo("T", 0)
	if errors.Is(err, ErrQueueNotFound) {
		return 0, nil
	}
	return max, err
}

// readMaxAsync runs readMax on id on a goroutine of its own: the read may
// wait on the network the test drives.
func (g *testGroup) readMaxAsync(ctx context.Context, id uint64) <-chan readAnswer {
	ch := make(chan readAnswer, 1)
	go func() {
		max, err := g.readMax(ctx, id)
		ch <- readAnswer{max: max, err: err}
	}()
	return ch
}

// pollRecv waits for ch's value, ticking ids between looks (poll).
func pollRecv[T any](g *testGroup, what string, ch <-chan T, ids ...uint64) T {
	g.t.Helper()
	var v T
	g.poll(what, func() bool {
		select {
		case v = <-ch:
			return true
		default:
			return false
		}
	}, ids...)
	return v
}

// TestGroupLinearizableRead: a linearizable read (ReadBarrier, then the
// read) is served only by the ready leader after it confirmed its
// leadership: on the leader it sees every acknowledged put; followers
// refuse naming the leader; a leader cut off from its peers never passes
// the barrier while the others elect a new leader that takes more puts
// (it would answer without them), its waiting reads are refused when it
// steps down, and afterwards it refuses naming the new leader.
func TestGroupLinearizableRead(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	ctx := context.Background()
	acked := int64(0)
	for i := range 10 {
		if res, err := g.put(1, fmt.Sprintf("m-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
		acked++
		if max, err := g.readMax(ctx, 1); err != nil || max != acked {
			t.Fatalf("linearizable read after %d acked puts: max %d, %v", acked, max, err)
		}
	}
	for _, id := range []uint64{2, 3} {
		var nl *NotLeaderError
		if _, err := g.readMax(ctx, id); !errors.As(err, &nl) || nl.Cause != "NOT_LEADER" || nl.LeaderID != 1 || nl.Term == 0 {
			t.Fatalf("linearizable read on follower %d: %v", id, err)
		}
	}

	// Cut the leader off. A read that waits there must not pass.
	g.net.setCut(1, true)
	pending := g.readMaxAsync(ctx, 1)
	g.poll("the cut leader's read waiting", func() bool { return g.m[1].s.group.node.ReadsWaiting() == 1 })
	g.poll("a new leader among 2 and 3", func() bool { return g.readyLeader(2, 3) != 0 }, 2, 3)
	l2 := g.readyLeader(2, 3)
	for i := range 5 {
		if res, err := g.put(l2, fmt.Sprintf("n-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d on the new leader: %v %v", i, res.Status, err)
		}
		acked++
	}
	if max, err := g.readMax(ctx, l2); err != nil || max != acked {
		t.Fatalf("linearizable read on the new leader: max %d, %v; want %d", max, err, acked)
	}
	// The old leader still believes it leads (it had no ticks): a read
	// there, bounded by its deadline, must fail, never miss the new puts.
	if info := g.m[1].s.ReplicaInfo(); info.Role != "leader" {
		t.Fatalf("the cut leader already stepped down: %+v", info)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	max, err := g.readMax(short, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a linearizable read on the cut leader answered max %d, %v (the group acked %d)", max, err, acked)
	}
	select {
	case a := <-pending:
		t.Fatalf("the cut leader's waiting read answered max %d, %v", a.max, a.err)
	default:
	}
	// CheckQuorum deposes it (its ticks); its waiting read is refused.
	a := pollRecv(g, "the cut leader's waiting read answered", pending, 1)
	var nl *NotLeaderError
	if !errors.As(a.err, &nl) {
		t.Fatalf("the deposed leader's waiting read: max %d, %v", a.max, a.err)
	}
	if n := g.m[1].s.group.node.ReadsWaiting(); n != 0 {
		t.Fatalf("%d reads still waiting on the deposed leader", n)
	}
	// Healed, it follows and refuses naming the new leader.
	g.net.setCut(1, false)
	g.converge(l2, g.ids...)
	g.poll("the old leader knows the new one", func() bool { return g.m[1].s.ReplicaInfo().LeaderID == l2 }, l2)
	if _, err := g.readMax(ctx, 1); !errors.As(err, &nl) || nl.Cause != "NOT_LEADER" || nl.LeaderID != l2 {
		t.Fatalf("linearizable read on the old leader after the heal: %v", err)
	}
	if max, err := g.readMax(ctx, l2); err != nil || max != acked {
		t.Fatalf("linearizable read on the new leader: max %d, %v; want %d", max, err, acked)
	}
}

// TestGroupLinearizableReadBounds: beyond MaxReadWaiters a linearizable
// read is refused at once (ErrReadIndexBusy); the waiting ones end with
// their context; a standalone store's barrier passes at once.
func TestGroupLinearizableReadBounds(t *testing.T) {
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Group.MaxReadWaiters = 2 })
	g.elect(1)
	g.net.setCut(2, true)
	g.net.setCut(3, true)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- g.m[1].s.ReadBarrier(ctx) }()
	}
	g.poll("two reads waiting", func() bool { return g.m[1].s.group.node.ReadsWaiting() == 2 })
	if err := g.m[1].s.ReadBarrier(context.Background()); !errors.Is(err, ErrReadIndexBusy) {
		t.Fatalf("a third read over the bound of 2: %v", err)
	}
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiting read without its followers: %v", err)
		}
	}
	if n := g.m[1].s.group.node.ReadsWaiting(); n != 0 {
		t.Fatalf("%d reads still counted after their callers gave up", n)
	}
	solo, _ := openTest(t, nil)
	if err := solo.ReadBarrier(context.Background()); err != nil {
		t.Fatalf("standalone ReadBarrier: %v", err)
	}
}

// pullBodies reads every message of D/0 on id, by body.
func (g *testGroup) pullBodies(id uint64) map[string]int {
	g.t.Helper()
	s := g.m[id].s
	got := map[string]int{}
	_, max, err := s.QueueInfo("D", 0)
	if errors.Is(err, ErrQueueNotFound) {
		return got
	}
	for off := int64(0); off < max; {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: "D", QueueID: 0, Offset: off, MaxMessages: 64})
		if err != nil || len(res.Messages) == 0 {
			g.t.Fatalf("node %d: pull D/0 at %d of %d: %v", id, off, max, err)
		}
		for _, r := range res.Messages {
			got[string(r.Body)]++
		}
		off = res.NextOffset
	}
	return got
}

// TestGroupDelayProgressReplicated (design §3.5): the leader's scheduler
// proposes its progress after each delivering round, every replica
// applies it, and a new leader resumes from it: after the first leader
// delivered a batch and the progress committed everywhere, that leader is
// cut off with more delayed messages pending; the new leader delivers
// those, and none of the first batch again; after a restart every replica
// recovers the replicated progress from its raft log; nothing is lost.
func TestGroupDelayProgressReplicated(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	delayed := func(id uint64, body string) {
		t.Helper()
		m := &Message{Topic: "D", Body: []byte(body), BornTimestamp: 1, BornHost: DefaultStoreHost,
			Properties: []Property{{Key: PropertyDelayLevel, Value: "1"}}}
		if res, err := g.m[id].s.PutMessage(context.Background(), m); err != nil || res.Status != PutOK {
			t.Fatalf("delayed put %s on %d: %v %v", body, id, res.Status, err)
		}
	}
	for i := range 10 {
		delayed(1, fmt.Sprintf("a-%d", i))
	}
	// Delivered (1 s later), its progress committed and applied on every
	// replica. Every member is ticked: a leader that steps down under load
	// is replaced (a follower never ticked would refuse every vote).
	// A member applies the progress command in its raft loop, and indexes
	// the delivered messages (commitlog records before it) in its
	// dispatcher, which may lag: wait for both before reading the queue.
	g.poll("the first batch delivered and its progress replicated", func() bool {
		for _, id := range g.ids {
			s := g.m[id].s
			if p, idx := s.DelayProgress(); p[1] != 10 || idx == 0 || s.index.Dispatched() < s.ReplicaInfo().CommitEnd {
				return false
			}
		}
		return true
	}, g.ids...)
	for _, id := range g.ids {
		if got := g.pullBodies(id); len(got) != 10 {
			t.Fatalf("node %d: %d bodies delivered, want 10: %v", id, len(got), got)
		}
	}
	// Five more, then cut the leader off before they are due (1 s: it may
	// still deliver them, but alone it commits nothing).
	g.poll("a ready leader", func() bool { return g.readyLeader(g.ids...) != 0 }, g.ids...)
	l1 := g.readyLeader(g.ids...)
	for i := range 5 {
		delayed(l1, fmt.Sprintf("b-%d", i))
	}
	g.converge(l1, g.ids...)
	g.net.setCut(l1, true)
	var rest []uint64
	for _, id := range g.ids {
		if id != l1 {
			rest = append(rest, id)
		}
	}
	g.poll("a new leader", func() bool { return g.readyLeader(rest...) != 0 }, rest...)
	g.poll("the rest delivered", func() bool {
		p, _ := g.m[rest[0]].s.DelayProgress()
		q, _ := g.m[rest[1]].s.DelayProgress()
		return p[1] == 15 && q[1] == 15
	}, rest...)
	l2 := g.readyLeader(rest...)
	if l2 == 0 {
		l2 = rest[0] // between leaders: any live member holds what committed
	}
	g.poll("the live members at one commit end", func() bool {
		a, b := g.m[rest[0]].s, g.m[rest[1]].s
		ca, cb := a.ReplicaInfo().CommitEnd, b.ReplicaInfo().CommitEnd
		return ca == cb && a.index.Dispatched() >= ca && b.index.Dispatched() >= cb
	}, rest...)
	got := g.pullBodies(l2)
	for i := range 10 {
		if n := got[fmt.Sprintf("a-%d", i)]; n != 1 {
			t.Fatalf("a-%d delivered %d times on the new leader (its delivery was replicated before the failover)", i, n)
		}
	}
	for i := range 5 {
		// Once, or twice when node 1 delivered it before the cut and its
		// progress command did not commit: at least once, never lost.
		if n := got[fmt.Sprintf("b-%d", i)]; n < 1 || n > 2 {
			t.Fatalf("b-%d delivered %d times on the new leader", i, n)
		}
	}
	// Heal; every replica converges on the same deliveries and progress,
	// and recovers that progress from its raft log on a restart.
	g.net.setCut(l1, false)
	g.poll("the old leader steps down", func() bool { return g.m[l1].s.ReplicaInfo().Role != "leader" }, g.ids...)
	g.poll("a ready leader after the heal", func() bool { return g.readyLeader(g.ids...) != 0 }, g.ids...)
	l3 := g.readyLeader(g.ids...)
	g.converge(l3, g.ids...)
	want := g.pullBodies(l3)
	for _, id := range g.ids {
		g.closeMember(id)
	}
	for _, id := range g.ids {
		g.open(id)
		if p, idx := g.m[id].s.DelayProgress(); p[1] != 15 || idx == 0 {
			t.Fatalf("node %d reopened with delay progress %v (index %d), want level 1 at 15", id, p, idx)
		}
		if got := g.pullBodies(id); !maps.Equal(got, want) {
			t.Fatalf("node %d: delivered %v, the leader %v", id, got, want)
		}
	}
}

// TestGroupFollowerReadCoversCommit: a follower's pull, QueueInfo and
// GetOffset cover the commit end it knows even when its dispatcher has not
// indexed it. Nobody waits on a follower for its index, so only the
// dispatcher's round (after its pause) indexed what was committed, and a read right
// after GetReplicaInfo showed the commit could miss it (a CI failure of
// the group scenarios' readback: one member's queue 18 records short).
func TestGroupFollowerReadCoversCommit(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	if res, err := g.put(1, "first"); err != nil || res.Status != PutOK {
		t.Fatal(res.Status, err)
	}
	g.converge(1, 2, 3)
	f := g.m[2].s
	resume := sync.OnceFunc(f.index.HoldRounds()) // the follower's dispatcher cannot run
	t.Cleanup(resume)                             // before Close, on a failure
	res, err := g.put(1, "second")
	if err != nil || res.Status != PutOK {
		t.Fatal(res.Status, err)
	}
	if err := g.m[1].s.CommitOffset(context.Background(), "cg", "T", 0, 1); err != nil {
		t.Fatal(err)
	}
	end := g.m[1].s.ReplicaInfo().CommitEnd
	g.poll("node 2 to learn the commit end", func() bool { return f.ReplicaInfo().CommitEnd >= end }, 1)
	if d := f.index.Dispatched(); d >= res.Append.NextOffset() {
		t.Fatalf("node 2 indexed up to %d with its rounds held", d)
	}
	got := heldReads(t, f, resume, map[string]func() readAnswer{
		"QueueInfo": func() readAnswer { _, hi, err := f.QueueInfo("T", 0); return readAnswer{max: hi, err: err} },
		"GetOffset": func() readAnswer { off, err := f.GetOffset("cg", "T", 0); return readAnswer{max: off, err: err} },
		"a pull":    func() readAnswer { return pullAnswer(f, PullRequest{Topic: "T", Offset: 1}) },
	})
	if a := got["QueueInfo"]; a.err != nil || a.max != 2 {
		t.Errorf("QueueInfo: max offset %d, %v; want 2", a.max, a.err)
	}
	if a := got["a pull"]; a.err != nil || a.max != 2 || !slices.Equal(a.bodies, []string{"second"}) {
		t.Errorf("pull at 1: %q, max offset %d, %v; want [second] and 2", a.bodies, a.max, a.err)
	}
	if a := got["GetOffset"]; a.err != nil || a.max != 1 {
		t.Errorf("GetOffset: %d, %v; want 1", a.max, a.err)
	}
}

// TestGroupFollowerReads: with GroupOptions.FollowerReads a follower and
// a learner serve linearizable reads themselves. A follower that missed
// puts (cut off while the others committed them) holds a stale queue,
// and its barrier read still sees every acknowledged put: it waits for
// the leader's read index and applies up to it first. A follower cut off
// from the leader never answers; one whose leader is replaced while it
// waits is refused with NOT_LEADER naming no stale state.
func TestGroupFollowerReads(t *testing.T) {
	g := newTestGroupWith(t, time.Minute, []uint64{4}, func(o *Options) { o.Group.FollowerReads = true })
	g.elect(1)
	ctx := context.Background()
	// Reads only: a follower still refuses puts, naming the leader.
	for _, id := range []uint64{2, 4} {
		var nl *NotLeaderError
		if res, err := g.put(id, "no"); !errors.As(err, &nl) || nl.Cause != "NOT_LEADER" || nl.LeaderID != 1 {
			t.Fatalf("a put on member %d: %v %v, want NOT_LEADER naming 1", id, res.Status, err)
		}
	}
	// await waits for a read's answer, ticking the leader meanwhile.
	await := func(ch <-chan readAnswer, leader uint64) readAnswer {
		t.Helper()
		return pollRecv(g, "the read's answer", ch, leader)
	}

	acked := int64(0)
	for i := range 5 {
		g.mustPut(1, i, fmt.Sprintf("m-%d", i))
		acked++
		// At once: the three members number their read batches alike,
		// and the leader must keep their requests apart.
		reads := map[uint64]<-chan readAnswer{}
		for _, id := range []uint64{2, 3, 4} {
			reads[id] = g.readMaxAsync(ctx, id)
		}
		for _, id := range []uint64{2, 3, 4} {
			if a := await(reads[id], 1); a.err != nil || a.max != acked {
				t.Fatalf("linearizable read on %d after %d acked puts: max %d, %v", id, acked, a.max, a.err)
			}
		}
	}

	// Member 2 misses puts; its own queue is stale, its barrier read is not.
	g.net.setCut(2, true)
	for i := range 5 {
		g.mustPut(1, i, fmt.Sprintf("n-%d", i))
		acked++
	}
	if _, max, err := g.m[2].s.QueueInfo("T", 0); err != nil || max >= acked {
		t.Fatalf("the cut follower's own queue: max %d (%v), want it behind %d", max, err, acked)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if max, err := g.readMax(short, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a linearizable read on the cut follower answered max %d, %v (the group acked %d)", max, err, acked)
	}
	cancel()
	g.net.setCut(2, false)
	if a := await(g.readMaxAsync(ctx, 2), 1); a.err != nil || a.max != acked {
		t.Fatalf("linearizable read on the healed follower: max %d, %v; want %d", a.max, a.err, acked)
	}

	// The leader cut off: a follower's read waits (its request is lost),
	// and is refused once 2 and 3 elect another leader.
	g.net.setCut(1, true)
	pending := g.readMaxAsync(ctx, 3)
	g.poll("the follower's read waiting", func() bool { return g.m[3].s.group.node.ReadsWaiting() == 1 })
	g.poll("a new leader among 2 and 3", func() bool { return g.readyLeader(2, 3) != 0 }, 2, 3)
	l2 := g.readyLeader(2, 3)
	a := await(pending, l2)
	var nl *NotLeaderError
	if l2 == 3 {
		// 3 leads now: its read was refused when its leadership began
		// (not ready), or it was served after its own ReadIndex round.
		if a.err != nil && !errors.As(a.err, &nl) {
			t.Fatalf("the read on the member that became leader: max %d, %v", a.max, a.err)
		}
	} else if !errors.As(a.err, &nl) {
		t.Fatalf("the follower's read waiting on the cut leader: max %d, %v, want a NotLeaderError", a.max, a.err)
	}
	if a.err == nil && a.max != acked {
		t.Fatalf("the read on 3 answered max %d, want %d", a.max, acked)
	}
	g.mustPut(l2, 0, "o-0")
	acked++
	for _, id := range []uint64{2, 3, 4} {
		if a := await(g.readMaxAsync(ctx, id), l2); a.err != nil || a.max != acked {
			t.Fatalf("linearizable read on %d under the new leader: max %d, %v; want %d", id, a.max, a.err, acked)
		}
	}
}

// TestGroupRestartWalksFromMark: a member's clean close writes raft/mark,
// and its next start checks no unit of the index below it (its walk
// starts past the mark); without the mark the start walks every unit from
// FirstIndex again. The member then catches up and serves what was put.
func TestGroupRestartWalksFromMark(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	want := map[int64]string{}
	for i := range 30 {
		g.mustPut(1, i, fmt.Sprintf("m%02d", i))
		want[int64(i)] = fmt.Sprintf("m%02d", i)
	}
	g.converge(1, 2)
	walk := func(what string) (from, last, first uint64) {
		t.Helper()
		rl := g.m[2].s.group.rlog
		from, last = rl.RecoveryWalk()
		first, _ = rl.FirstIndex()
		t.Logf("%s: walked %d..%d (first index %d)", what, from, last, first)
		return from, last, first
	}
	g.closeMember(2)
	g.open(2)
	if from, last, _ := walk("after a clean close"); from != last+1 || last < 30 {
		t.Fatalf("the start after a clean close walked %d..%d: want nothing (the mark at the last entry)", from, last)
	}
	g.closeMember(2)
	if err := os.Remove(filepath.Join(g.m[2].opts.Dir, "raft", "mark")); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	if from, last, first := walk("without the mark"); from != first || last < 30 {
		t.Fatalf("the start without a mark walked %d..%d: want every unit from %d", from, last, first)
	}
	g.mustPut(1, 30, "m30")
	want[30] = "m30"
	g.converge(1, 2)
	g.checkQueue(want, 31, 2)
}

// TestGroupStartReadsPayloadsFromTheScan: a member's start reads the
// records of raft entries only from where its commitlog's recovery scan
// began (the file holding the checkpoint's flushed offset), not a field of
// every retained record (raftlog.Options.Checked, set by the store), also
// when it walks every unit (no raft/mark): a record damaged in an earlier,
// sealed file does not stop the start, and a read of it reports the
// damage instead of serving it.
func TestGroupStartReadsPayloadsFromTheScan(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	body := strings.Repeat("s", 3000)
	for i := range 80 { // 240 KB: four 64 KiB files
		g.mustPut(1, i, fmt.Sprintf("%02d%s", i, body))
	}
	g.converge(1, 2)
	g.closeMember(2)
	dir := filepath.Join(g.m[2].opts.Dir, "commitlog")
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("%d commitlog files, want at least 3", len(files))
	}
	// The first record's PHYSICALOFFSET, in the first file.
	f, err := os.OpenFile(filepath.Join(dir, files[0].Name()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, record.PosPhysOffset+7); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, record.PosPhysOffset+7); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Without raft/mark the start walks every unit of the index, as after
	// a crash before any mark, so each DATA entry is looked at.
	if err := os.Remove(filepath.Join(g.m[2].opts.Dir, "raft", "mark")); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	if from, _ := g.m[2].s.group.rlog.RecoveryWalk(); from != 1 {
		t.Fatalf("the start walked from index %d, want every unit from 1", from)
	}
	if rec, err := g.m[2].s.GetMessage(0); err == nil {
		t.Fatalf("the damaged record was served: %q", rec.Body[:2])
	}
	// The rest is served, and member 2 goes on replicating.
	g.mustPut(1, 80, "after")
	g.converge(1, 2)
	res, err := g.m[2].s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: 79, MaxMessages: 2})
	if err != nil || len(res.Messages) != 2 || string(res.Messages[1].Body) != "after" {
		t.Fatalf("member 2 after the start: %v, %d messages", err, len(res.Messages))
	}
}

// TestGroupDroppedPutsNotStored: puts whose entry raft drops (its bound
// on uncommitted bytes, lowered to one byte: every entry proposed while
// another is uncommitted) are answered OS_PAGE_CACHE_BUSY and leave
// nothing behind: the stamps of the refused puts are undone, so the
// queue offsets the stored puts were answered with are dense, on every
// member, and hold their bodies.
func TestGroupDroppedPutsNotStored(t *testing.T) {
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.Group.maxUncommittedBytes = 1 })
	g.elect(1)
	g.mustPut(1, 0, "first") // the topic is created: its command is not what raft drops below
	want := map[int64]string{0: "first"}
	var mu sync.Mutex
	dropped := 0
	for round := 0; dropped == 0 || len(want) < 3; round++ {
		if round == 50 {
			t.Fatalf("after %d rounds, %d puts stored and %d dropped; want both", round, len(want), dropped)
		}
		var wg sync.WaitGroup
		for c := range 8 {
			wg.Go(func() {
				for i := range 8 {
					body := fmt.Sprintf("r%d-c%d-%d", round, c, i)
					res, err := g.put(1, body)
					mu.Lock()
					switch {
					case err == nil && res.Status == PutOK:
						if old, dup := want[res.Append.QueueOffset]; dup {
							t.Errorf("%q and %q both answered queue offset %d", old, body, res.Append.QueueOffset)
						}
						want[res.Append.QueueOffset] = body
					case res.Status == OSPageCacheBusy && errors.Is(err, replica.ErrProposalDropped):
						dropped++
					default:
						t.Errorf("put %q: %v %v", body, res.Status, err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d puts stored, %d dropped", len(want), dropped)
	g.converge(1, g.ids...)
	g.checkQueue(want, int64(len(want)), g.ids...)
}
