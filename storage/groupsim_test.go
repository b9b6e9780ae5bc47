package storage

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/cryptotest"
	"testing/synctest"
	"time"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/replica"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/vfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The deterministic simulation of a replicated group (design
// replication.md §5.1, issue 13/14): three stores in group mode on
// vfs.MemFS, raft ticks given by the driver, and a seeded in-memory
// network (the Transport seam) that holds every message until the driver
// delivers, duplicates, drops or reorders it, or cuts a link. A seeded
// driver (math/rand/v2) picks the steps: Put, PutBatch, Tick(node),
// Deliver(k), Drop(k), Partition/Heal, Crash(node) (a MemFS.Crash power-cut
// image and a reopen), CrashAll (a coordinated power loss), Restart (a
// clean Close and Open), Member (the next membership change of a member's
// replacement: groupsim_members_test.go), clock jumps (backwards too) and Compact(node)
// (its raft log compacted up to what it applied, as retention does before
// it deletes files): a follower behind a compacted leader then gets a
// snapshot, which the network holds like a message until the driver
// delivers it (staged, verified and installed by the receiver) or drops it.
//
// Determinism: each seed runs in a synctest bubble and every step ends with
// synctest.Wait, so the raft loops, dispatchers and put goroutines are all
// blocked before the next decision; only one raft loop has work per step,
// so the network queue's order is a function of the seed; raft's election
// jitter (crypto/rand) is made deterministic with cryptotest.SetGlobalRandom;
// the store clock is the driver's. A failing seed replays with
// -sim.seed=N (and -sim.steps as it ran).
//
// Consumer offsets ride along (sysrecords.go): Commit steps commit
// offsets on a node (the ready leader mostly), Rewrite steps run the
// retention rewrite of every live offset on a node. The model is the
// committed history itself: a key's value is that of its last commit
// record in log order (a rewrite never changes a value: it copies the
// latest one or is skipped). After every step every replica's table must
// equal the model at its indexed end, and every acknowledged commit must
// be in the history where its answer said.
//
// Checks after every step: committed bytes (commitlog bytes below each
// replica's commit end) identical across replicas and incarnations (one
// reference history every replica must match), every record in it
// decodes, queue offsets dense and unique per queue, store times
// non-decreasing in log order, every PUT_OK at its (queue, offset) in the
// committed log with its body, nothing readable past any replica's commit
// end (QueueInfo, a pull at the first uncommitted queue offset,
// GetMessage at the commit end). After a coordinated crash of all three
// and at the end of a run, the network heals and the group must converge
// (a ready leader, every replica at its commit end and indexed) at a
// commit end no lower than the highest seen before: no acknowledged
// message lost.
var (
	simSeeds = flag.Int("sim.seeds", 20, "TestGroupSim: seeds to run (-sim.first..-sim.first+N-1)")
	simFirst = flag.Int("sim.first", 1, "TestGroupSim: the first seed of -sim.seeds (a search past the seeds CI runs)")
	simSteps = flag.Int("sim.steps", 2000, "TestGroupSim: steps per seed")
	simSeed  = flag.Uint64("sim.seed", 0, "TestGroupSim: run only this seed (replay)")
)

func TestGroupSim(t *testing.T) {
	seeds := make([]uint64, 0, *simSeeds)
	if *simSeed != 0 {
		seeds = append(seeds, *simSeed)
	} else {
		for i := range *simSeeds {
			seeds = append(seeds, uint64(*simFirst+i))
		}
	}
	// What every seed did, summed: the figures RELIABILITY.md reports
	// (how many coordinated power cuts the group survived, and so on).
	total, acked, ackedCommits := map[string]int{}, 0, 0
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cryptotest.SetGlobalRandom(t, seed)
			synctest.Test(t, func(t *testing.T) {
				sim := newGroupSim(t, seed)
				defer sim.closeAll()
				sim.run(*simSteps)
				if t.Failed() {
					t.Logf("replay: go test ./storage -run 'TestGroupSim' -sim.seed=%d -sim.steps=%d", seed, *simSteps)
				}
				for k, n := range sim.stats {
					total[k] += n
				}
				acked += sim.acked
				ackedCommits += sim.ackedCommits
			})
		})
	}
	t.Logf("%d seeds x %d steps: %d coordinated power cuts (crashAll) and %d single-node ones (crash), each followed by the checks; %d PUT_OK checked; %d acknowledged offset commits checked; all steps %v",
		len(seeds), *simSteps, total["crashAll"], total["crash"], acked, ackedCommits, total)
	if !t.Failed() && ackedCommits == 0 && len(seeds)**simSteps >= 2000 {
		t.Fatal("no offset commit was acknowledged in any seed: the offset checks tested nothing")
	}
}

const (
	simTopic    = "T"
	simQueues   = 3
	simFileSize = 16 << 10
	simMaxQueue = 2000 // in-flight messages; past it the network drops (a full transport queue)
	// simReplTimeout is in bubble time, which passes 2 ms a step
	// (settle): a put not committed within ~250 steps is answered
	// FLUSH_SLAVE_TIMEOUT (outcome unknown).
	simReplTimeout = 500 * time.Millisecond
)

// simClock is the stores' clock: the driver moves it (backwards too).
type simClock struct{ ms atomic.Int64 }

func (c *simClock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// simSnap is a snapshot in flight (the transport's SendSnapshot).
type simSnap struct {
	from, to uint64
	o        snapshot.Outgoing
}

type simMsg struct {
	from, to uint64
	b        []byte
}

// simNet holds every message sent until the driver delivers or drops it.
type simNet struct {
	mu    sync.Mutex
	q     []simMsg
	cut   map[[2]uint64]bool // directed links that drop
	drops int
	snaps []simSnap // snapshots in flight, in order
}

func (n *simNet) send(from, to uint64, b []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[[2]uint64{from, to}] || len(n.q) >= simMaxQueue {
		n.drops++
		return
	}
	n.q = append(n.q, simMsg{from, to, b})
}

func (n *simNet) take(k int, keep bool) simMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.q[k]
	if !keep {
		n.q = slices.Delete(n.q, k, k+1)
	}
	return m
}

func (n *simNet) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.q)
}

type simTransport struct {
	n    *simNet
	from uint64
}

func (t simTransport) Send(to uint64, b []byte) { t.n.send(t.from, to, b) }

// SendSnapshot holds the snapshot until the driver delivers it
// (deliverSnapshot): called by the raft goroutine, it must not block.
func (t simTransport) SendSnapshot(to uint64, o snapshot.Outgoing) {
	t.n.mu.Lock()
	t.n.snaps = append(t.n.snaps, simSnap{t.from, to, o})
	t.n.mu.Unlock()
}

type simNode struct {
	id    uint64
	fs    *vfs.MemFS
	s     *Store
	ticks chan time.Time
	inc   int   // incarnation
	seen  int64 // committed bytes of this incarnation checked against the reference
	join  bool  // joined the group after it started (GroupOptions.Join)
}

type simPut struct {
	node   uint64
	queue  int32
	bodies [][]byte
	batch  bool
	// key is the put's UNIQ_KEY ("": unkeyed); retry: a put of a key sent
	// before, whose first answer was an unknown outcome.
	key   string
	retry bool
	// cancel ends the put's ctx: its client went away (abandon).
	cancel context.CancelFunc
	done   chan struct{}
	res    PutResult
	err    error
}

// simRead is a linearizable read (ReadBarrier, then QueueInfo) and what
// it must see: every message of its queue acknowledged before it began.
type simRead struct {
	node  uint64
	queue int32
	want  int64 // acknowledged messages of the queue when the read began
	// follower: the node did not say it leads when the read began (it
	// asks the leader for its read index: FollowerReads).
	follower bool
	done     chan struct{}
	max      int64
	err      error
}

// simCommit is a CommitOffset in flight and its answer.
type simCommit struct {
	node   uint64
	key    offsets.Key
	offset int64
	done   chan struct{}
	res    AppendResult
	err    error
}

// simOffsetChange is one commit record's entry in the history.
type simOffsetChange struct {
	pos    int64
	key    offsets.Key
	offset int64
}

type simRec struct {
	off, end int64
	queue    int32
	qoff     int64
}

type groupSim struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	net   *simNet
	clock *simClock
	ids   []uint64
	nodes map[uint64]*simNode

	ref     []byte            // the committed history every replica must match
	walked  int64             // ref parsed up to here
	recs    []simRec          // records of ref in log order
	qends   map[int32][]int64 // per queue: end offsets of its records, in order
	qstarts map[int32][]int64 // per queue: their physical offsets
	lastTS  int64             // store time of the last record walked
	pending []*simPut         // puts not answered yet
	reads   []*simRead        // linearizable reads not answered yet
	ackMax  map[int32]int64   // per queue: the end of its acknowledged queue offsets
	acked   int               // PUT_OKs checked
	stats   map[string]int    // steps taken, by kind
	outcome map[string]int    // put outcomes, by kind
	log     []string          // the last steps, for a failure report
	step    int
	bodies  int             // bodies made: each starts with its number, "m<n>|"
	stored  map[string]bool // body keys in the history
	refused map[string]bool // body keys of puts answered "nothing stored"
	unsure  []*simPut       // keyed puts answered with an unknown outcome: Retry steps send them again
	calm    bool            // even seeds: a quarter of the faults, longer healthy spells, more puts in flight

	// Consumer offsets.
	commits      []*simCommit      // offset commits not answered yet
	rewrites     []chan struct{}   // retention rewrites under way
	changes      []simOffsetChange // commit entries of the history, in log order
	offQ         int64             // offset records walked (queue offsets of the offset topic)
	ackedCommits int               // acknowledged commits checked

	// Membership changes (groupsim_members_test.go).
	boot    []uint64                   // the bootstrap voters (the flags of nodes 1-3)
	nextID  uint64                     // the id the next joining node gets
	joiner  uint64                     // a node that joined and is not a voter yet (0: none)
	confOp  *simConf                   // the membership change in flight (one at a time)
	gone    map[uint64]uint64          // ids removed from the group (their nodes closed for good): the membership index that showed it
	confAt  map[uint64]GroupMembership // the membership each raft index made, as the first node seen reported it
	confLog []string                   // membership changes answered, for the run's log
}

func newGroupSim(t *testing.T, seed uint64) *groupSim {
	g := &groupSim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), net: &simNet{cut: map[[2]uint64]bool{}},
		clock: &simClock{}, ids: []uint64{1, 2, 3}, boot: []uint64{1, 2, 3}, nextID: 4, gone: map[uint64]uint64{},
		confAt: map[uint64]GroupMembership{}, nodes: map[uint64]*simNode{}, qends: map[int32][]int64{},
		qstarts: map[int32][]int64{}, stored: map[string]bool{}, refused: map[string]bool{}, ackMax: map[int32]int64{},
		stats: map[string]int{}, outcome: map[string]int{}}
	g.calm = seed%2 == 0
	g.clock.ms.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	for _, id := range g.ids {
		n := &simNode{id: id, fs: vfs.NewMem()}
		g.nodes[id] = n
		g.open(n)
	}
	synctest.Wait()
	return g
}

func (g *groupSim) options(n *simNode) Options {
	return Options{Dir: "/n", FS: n.fs, FileSize: simFileSize, MaxMessageSize: 4 << 10, ConsumeQueueEntries: 64,
		FlushMode: FlushSync, Clock: g.clock,
		// MemFS has no statfs: a large, empty disk (a snapshot's receiver
		// checks its room).
		StatDisk: func(string) (DiskUsage, error) { return DiskUsage{Size: 1 << 40, Avail: 1 << 40}, nil },
		Group: &GroupOptions{ID: n.id, Name: "g", ClusterID: "c", Peers: g.boot, Join: n.join, Transport: simTransport{g.net, n.id},
			Ticks: n.ticks, ElectionTick: 10, HeartbeatTick: 1, ReplicationTimeout: simReplTimeout, IndexUnits: 64,
			// Followers serve linearizable reads too (after the leader's
			// read index): the reads on a follower are checked as the
			// leader's are, under the same drops, reorders and crashes.
			FollowerReads: true,
			// raft/mark every few entries, so that restarts after crashes
			// start their walk of the index from one.
			markEvery: 4}}
}

func (g *groupSim) open(n *simNode) {
	g.t.Helper()
	n.ticks = make(chan time.Time)
	s, err := Open(g.options(n))
	if err != nil {
		g.fatalf("open node %d (incarnation %d): %v", n.id, n.inc+1, err)
	}
	n.s, n.inc, n.seen = s, n.inc+1, 0
}

func (g *groupSim) closeNode(n *simNode) {
	if n.s == nil {
		return
	}
	s := n.s
	n.s = nil // deliveries to it drop from now on
	_ = s.Close()
	synctest.Wait()
}

func (g *groupSim) closeAll() {
	for _, id := range g.ids {
		g.closeNode(g.nodes[id])
	}
	synctest.Wait()
}

func (g *groupSim) fatalf(format string, args ...any) {
	g.t.Helper()
	tail := g.log[max(len(g.log)-40, 0):]
	g.t.Fatalf("seed %d step %d: %s\nlast steps:\n  %s\nreplay: go test ./storage -run TestGroupSim -sim.seed=%d -sim.steps=%d",
		g.seed, g.step, fmt.Sprintf(format, args...), joinLines(tail), g.seed, *simSteps)
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for i, l := range s {
		if i > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString(l)
	}
	return b.String()
}

func (g *groupSim) note(format string, args ...any) {
	g.log = append(g.log, fmt.Sprintf("%d: ", g.step)+fmt.Sprintf(format, args...))
	if len(g.log) > 200 {
		g.log = g.log[100:]
	}
}

// leader is a node that says it is the ready leader, or 0.
func (g *groupSim) leader() uint64 {
	for _, id := range g.ids {
		if n := g.nodes[id]; n.s != nil && n.s.ReplicaInfo().Ready {
			return id
		}
	}
	return 0
}

func (g *groupSim) run(steps int) {
	for g.step = 1; g.step <= steps; g.step++ {
		g.doStep()
		g.settle()
		g.check()
	}
	g.converge("end of run")
	g.t.Logf("seed %d: %d steps %v; puts %v; %d PUT_OK checked, %d offset commits checked (%d offset keys), committed %d bytes, %d records, %d network drops; membership changes %v, members now %v",
		g.seed, steps, g.stats, g.outcome, g.acked, g.ackedCommits, len(g.modelOffsets(int64(len(g.ref)))), len(g.ref), len(g.recs), g.net.drops,
		g.confLog, g.ids)
	if g.outcome["ok"] == 0 {
		g.fatalf("no put was acknowledged: the run tested nothing")
	}
}

func (g *groupSim) doStep() {
	r := g.rng.IntN(1000)
	if g.calm && r >= 880 && g.rng.IntN(4) != 0 {
		r = 500 + g.rng.IntN(380) // a calm seed: three in four faults become deliveries or ticks
	}
	switch {
	case r < 150:
		g.put(g.pick(true), false)
	case r < 175:
		g.commit(g.pick(g.rng.IntN(8) != 0))
	case r < 180:
		g.rewrite(g.pick(g.rng.IntN(4) != 0))
	case r < 230:
		g.put(g.pick(true), true)
	case r < 244:
		g.put(g.pick(false), g.rng.IntN(2) == 0)
	case r < 250:
		g.retry()
	case r < 470:
		g.tick(g.ids[g.rng.IntN(len(g.ids))])
	case r < 500:
		g.read(g.pickReader())
	case r < 540:
		for _, id := range g.ids {
			g.tick(id)
		}
	case r < 850:
		g.deliver(g.rng.IntN(100) < 8)
	case r < 880:
		g.deliverAll()
	case r < 900:
		if l := g.net.len(); l > 0 {
			k := g.rng.IntN(l)
			m := g.net.take(k, false)
			g.count("drop")
			g.note("drop %d->%d", m.from, m.to)
		}
	case r < 920:
		g.partition()
	case r < 945:
		g.heal()
	case r < 955:
		g.moveClock()
	case r < 960:
		g.compact(g.ids[g.rng.IntN(len(g.ids))])
	case r < 975:
		g.crash(g.ids[g.rng.IntN(len(g.ids))])
	case r < 990:
		g.restart(g.ids[g.rng.IntN(len(g.ids))])
	case r < 995:
		g.member()
	default:
		g.crashAll()
	}
}

// settle lets the bubble's fake time pass a little (the dispatcher's
// 1 ms pause between rounds, the stores' tickers) and waits until every
// goroutine is blocked again. No decision depends on it: raft ticks are
// the driver's, the store clock is simClock.
func (g *groupSim) settle() {
	time.Sleep(2 * time.Millisecond)
	synctest.Wait()
}

func (g *groupSim) count(kind string) { g.stats[kind]++ }

// pick is the ready leader (when leader is set and there is one), else any node.
func (g *groupSim) pick(leader bool) uint64 {
	if leader {
		if l := g.leader(); l != 0 {
			return l
		}
	}
	return g.ids[g.rng.IntN(len(g.ids))]
}

func (g *groupSim) body() []byte {
	n := g.rng.IntN(600)
	if g.rng.IntN(20) == 0 {
		n = 2000 + g.rng.IntN(1500)
	}
	g.bodies++
	b := fmt.Appendf(nil, "m%d|s%d-%d-", g.bodies, g.seed, g.step)
	for len(b) < n {
		b = append(b, byte(g.rng.Uint32()))
	}
	return b
}

func (g *groupSim) put(id uint64, batch bool) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	p := &simPut{node: id, queue: int32(g.rng.IntN(simQueues)), batch: batch, done: make(chan struct{})}
	if g.rng.IntN(2) == 0 {
		p.key = fmt.Sprintf("k%d-%d", g.seed, g.bodies+1) // unique: the number its first body gets
	}
	k := 1
	if batch {
		k = 1 + g.rng.IntN(5)
	}
	total := 0
	for range k {
		b := g.body()
		if batch && total+len(b) > 4000 { // MaxMessageSize bounds a batch's bodies
			b = b[:min(len(b), max(4000-total, 16))]
		}
		total += len(b)
		p.bodies = append(p.bodies, b)
	}
	g.count(map[bool]string{false: "put", true: "batch"}[batch])
	g.note("put node %d queue %d x%d key %q", id, p.queue, k, p.key)
	g.send(n.s, p)
}

// send runs put p on store s.
func (g *groupSim) send(s *Store, p *simPut) {
	var props []Property
	if p.key != "" {
		props = []Property{{Key: PropertyUniqKey, Value: p.key}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		defer cancel()
		if p.batch {
			b := &Batch{Topic: simTopic, QueueID: p.queue, BornHost: DefaultStoreHost}
			for i, body := range p.bodies {
				m := BatchMessage{Body: body, BornTimestamp: 1}
				if i == 0 {
					m.Properties = props
				}
				b.Messages = append(b.Messages, m)
			}
			p.res, p.err = s.PutMessages(ctx, b)
		} else {
			p.res, p.err = s.PutMessage(ctx, &Message{Topic: simTopic, QueueID: p.queue, Body: p.bodies[0],
				BornTimestamp: 1, BornHost: DefaultStoreHost, Properties: props})
		}
	}()
	g.pending = append(g.pending, p)
}

// abandon cancels the ctx of a keyed put not answered yet: its client
// went away, and its answer is an unknown outcome (the entry may commit
// later), which a retry step sends again.
func (g *groupSim) abandon() {
	var keyed []*simPut
	for _, p := range g.pending {
		if p.key != "" && !p.retry {
			keyed = append(keyed, p)
		}
	}
	if len(keyed) == 0 {
		return
	}
	p := keyed[g.rng.IntN(len(keyed))]
	g.count("abandon")
	g.note("abandon key %q", p.key)
	p.cancel()
}

// retry sends a keyed put whose answer was an unknown outcome again, the
// same bodies with the same key, to the ready leader (any node when there
// is none), as a client does: the group must store it once whatever the
// first put's fate (walk fails on a body stored twice), and a PUT_OK must
// name where it is (checkAnswer). The put stays retriable until a retry
// is answered PUT_OK.
func (g *groupSim) retry() {
	if g.rng.IntN(2) == 0 {
		g.abandon()
		return
	}
	if len(g.unsure) == 0 {
		return
	}
	i := g.rng.IntN(len(g.unsure))
	first := g.unsure[i]
	n := g.nodes[g.pick(true)]
	if n.s == nil {
		return
	}
	p := &simPut{node: n.id, queue: first.queue, bodies: first.bodies, batch: first.batch, key: first.key, retry: true,
		done: make(chan struct{})}
	g.count("retry")
	g.note("retry node %d key %q", n.id, p.key)
	g.send(n.s, p)
}

func (g *groupSim) tick(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	g.count("tick")
	n.ticks <- time.Time{}
	synctest.Wait() // the tick's Ready handled before the next decision
}

// deliver hands one message, chosen at random (a reorder), to its
// destination; dup keeps a copy in flight (a duplicate).
func (g *groupSim) deliver(dup bool) {
	l := g.net.len()
	if l == 0 {
		return
	}
	k := g.rng.IntN(l)
	if g.rng.IntN(2) == 0 {
		k = g.rng.IntN(min(l, 4)) // mostly near the head: progress
	}
	if g.net.snapsLen() > 0 && g.rng.IntN(4) == 0 {
		g.deliverSnapshot(g.rng.IntN(8) == 0)
		return
	}
	m := g.net.take(k, dup)
	g.count(map[bool]string{false: "deliver", true: "duplicate"}[dup])
	g.step1(m)
}

func (n *simNet) snapsLen() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.snaps)
}

// compact compacts node id's raft log up to what it has applied (and has
// durably committed), as retention does before it deletes files; its
// commitlog stays, so only the raft entries go. It compacts more eagerly
// than retention (to the applied data end, not a file boundary, and with
// no data below it too: CompactBelow then does nothing, or seed 4223's
// group, which stored nothing, waited forever on snapshots without files).
func (g *groupSim) compact(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	g.count("compact")
	applied := n.s.ReplicaInfo().Applied
	end, err := n.s.group.rlog.DataEndAt(applied)
	if err == nil {
		err = n.s.group.rlog.CompactBelow(end, applied)
	}
	if err != nil {
		g.fatalf("compact node %d to %d: %v", id, applied, err)
	}
	first, _ := n.s.group.rlog.FirstIndex()
	g.note("compact %d: first index %d (applied %d)", id, first, applied)
	synctest.Wait()
}

// deliverSnapshot hands the oldest snapshot in flight to its receiver
// (ReceiveSnapshot, every chunk, Finish: staged, verified, installed) or,
// with drop, loses it; either way the sender hears the outcome.
func (g *groupSim) deliverSnapshot(drop bool) {
	g.net.mu.Lock()
	sn := g.net.snaps[0]
	g.net.snaps = g.net.snaps[1:]
	g.net.mu.Unlock()
	var err error
	if drop {
		g.count("snapshot dropped")
		err = errors.New("sim: snapshot dropped")
	} else {
		err = g.sendSnapshot(sn)
		g.count(map[bool]string{true: "snapshot", false: "snapshot refused"}[err == nil])
	}
	g.note("snapshot %d->%d: %v", sn.from, sn.to, err)
	sn.o.Done(err)
	synctest.Wait()
}

func (g *groupSim) sendSnapshot(sn simSnap) error {
	dst := g.nodes[sn.to].s
	if dst == nil || g.net.isCut(sn.from, sn.to) {
		return errors.New("sim: receiver down or cut off")
	}
	msg, err := sn.o.Message()
	if err != nil {
		return err
	}
	in, err := dst.ReceiveSnapshot(sn.from, msg)
	if err != nil {
		return err
	}
	if err := sn.o.Read(0, func(file, off int64, b []byte, crc uint32) error { return in.Write(file, off, b, crc) }); err != nil {
		in.Discard()
		return err
	}
	if err := in.Finish(); err != nil {
		g.fatalf("node %d: a verified snapshot from %d failed to install: %v", sn.to, sn.from, err)
	}
	return nil
}

func (g *groupSim) step1(m simMsg) {
	n := g.nodes[m.to]
	if n.s == nil {
		return
	}
	if g.net.isCut(m.from, m.to) {
		return // cut while in flight
	}
	if err := n.s.StepPeer(m.b); errors.Is(err, ErrBadPeerMessage) && (n.s.group.node.IsMember(m.from) || leaderOrCandidate(n.s, m)) {
		// (From a node it does not count as a member, a refusal is right
		// but for a leader's or a candidate's messages from a node it
		// does not record as removed: one whose addition it missed may be
		// the leader it must follow, or need its vote.)
		g.fatalf("node %d refused a message from %d: %v", m.to, m.from, err)
	}
	synctest.Wait()
}

// leaderOrCandidate: m is an append or a heartbeat (what a leader sends its
// followers) or a vote request, from a node that s's raft/conf does not
// record as removed. (Not the simulation's own record of removals: a
// member applies a removal before the simulation sees the group's newest
// membership show it.)
func leaderOrCandidate(s *Store, m simMsg) bool {
	pm := &pb.Message{}
	if err := proto.Unmarshal(m.b, pm); err != nil {
		return false
	}
	mem, err := s.Membership()
	if err != nil || slices.Contains(mem.Removed, m.from) {
		return false
	}
	switch pm.GetType() {
	case pb.MsgApp, pb.MsgHeartbeat, pb.MsgVote, pb.MsgPreVote:
		return true
	}
	return false
}

func (n *simNet) isCut(from, to uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[[2]uint64{from, to}]
}

// deliverAll delivers every message in flight in order (a calm network),
// and what those produce, up to a bound.
func (g *groupSim) deliverAll() {
	g.count("deliverAll")
	for i := 0; i < 3*simMaxQueue && (g.net.len() > 0 || g.net.snapsLen() > 0); i++ {
		if g.net.snapsLen() > 0 {
			g.deliverSnapshot(false)
			continue
		}
		g.step1(g.net.take(0, false))
	}
}

func (g *groupSim) partition() {
	g.count("partition")
	var gone [][2]uint64 // {reporter, member}: what the transports may say of a cut link (below)
	g.net.mu.Lock()
	a := g.ids[g.rng.IntN(len(g.ids))]
	switch g.rng.IntN(3) {
	case 0: // isolate a
		for _, b := range g.ids {
			if b != a {
				g.net.cut[[2]uint64{a, b}], g.net.cut[[2]uint64{b, a}] = true, true
				gone = append(gone, [2]uint64{a, b}, [2]uint64{b, a})
			}
		}
		g.note("isolate %d", a)
	case 1: // one way: a hears nobody
		for _, b := range g.ids {
			if b != a {
				g.net.cut[[2]uint64{b, a}] = true
				gone = append(gone, [2]uint64{b, a})
			}
		}
		g.note("deafen %d", a)
	default: // one link
		b := g.ids[(slices.Index(g.ids, a)+1+g.rng.IntN(len(g.ids)-1))%len(g.ids)]
		g.net.cut[[2]uint64{a, b}], g.net.cut[[2]uint64{b, a}] = true, true
		gone = append(gone, [2]uint64{a, b}, [2]uint64{b, a})
		g.note("cut %d-%d", a, b)
	}
	g.net.mu.Unlock()
	// A cut that resets connections makes the next stream fail to open
	// (the proxies of tests/cluster do so): the transport then reports
	// the member on the other side gone although its process lives. Half
	// the cuts do so here, a wrong report that must depose no one whose
	// majority still hears it.
	if g.rng.IntN(2) == 0 {
		for _, r := range gone {
			g.peerGone(r[0], r[1])
		}
	}
}

// peerGone tells reporter's store that member id's process is gone, as
// its peer transport does when a stream id took ended and it takes no new
// one (server/peer).
func (g *groupSim) peerGone(reporter, id uint64) {
	if n := g.nodes[reporter]; n != nil && n.s != nil {
		g.count("gone")
		g.note("%d: %d gone", reporter, id)
		before := n.s.ReplicaInfo().LeadersForgotten
		n.s.PeerGone(id)
		if n.s.ReplicaInfo().LeadersForgotten > before {
			g.count("gone: leader forgotten")
		}
	}
}

// goneToAll is what the others' transports report when member id's
// process ends (crash, restart): it is gone.
func (g *groupSim) goneToAll(id uint64) {
	for _, r := range g.ids {
		if r != id {
			g.peerGone(r, id)
		}
	}
}

func (g *groupSim) heal() {
	g.count("heal")
	g.net.mu.Lock()
	clear(g.net.cut)
	g.net.mu.Unlock()
	g.note("heal")
}

// moveClock moves the store clock: mostly forward, sometimes back (the
// stamped store times must still never go backwards along the log).
func (g *groupSim) moveClock() {
	g.count("clock")
	d := int64(g.rng.IntN(5000))
	if g.rng.IntN(4) == 0 {
		d = -d
	}
	g.clock.ms.Add(d)
	g.note("clock %+dms", d)
}

// crash cuts node id's power: the store is dropped and reopened on the
// image a power cut would leave (vfs.MemFS.Crash).
func (g *groupSim) crash(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	g.count("crash")
	g.note("crash %d", id)
	img := n.fs.Crash(rand.New(rand.NewPCG(g.seed, uint64(g.step))))
	g.closeNode(n) // the old incarnation writes only to the discarded file system now
	g.goneToAll(id)
	n.fs = img
	g.open(n)
}

func (g *groupSim) restart(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	g.count("restart")
	g.note("restart %d", id)
	g.closeNode(n)
	g.goneToAll(id)
	g.open(n)
}

// crashAll is a coordinated power loss: every node's image at the same
// instant; then the group must come back with every acknowledged message.
func (g *groupSim) crashAll() {
	g.count("crashAll")
	g.note("crash all")
	before := int64(len(g.ref))
	imgs := map[uint64]*vfs.MemFS{}
	for _, id := range g.ids {
		imgs[id] = g.nodes[id].fs.Crash(rand.New(rand.NewPCG(g.seed, uint64(g.step)<<8|id)))
	}
	for _, id := range g.ids {
		g.closeNode(g.nodes[id])
	}
	for _, id := range g.ids {
		n := g.nodes[id]
		n.fs = imgs[id]
		g.open(n)
	}
	synctest.Wait()
	g.converge("after a coordinated crash")
	if ce := g.nodes[g.leader()].s.ReplicaInfo().CommitEnd; ce < before {
		g.fatalf("after a coordinated crash the group converged at commit end %d, below the %d committed before: acknowledged messages lost", ce, before)
	}
}

// converge heals the network and runs it calmly (every node ticked, every
// message delivered in order) until a ready leader has every replica at
// its commit end, indexed.
func (g *groupSim) converge(why string) {
	g.heal()
	for round := 0; round < 400; round++ {
		g.check()
		if g.converged() {
			g.checkIndexed()
			return
		}
		for _, id := range g.ids {
			g.tick(id)
		}
		g.deliverAll()
		g.settle()
	}
	var infos []string
	for _, id := range g.ids {
		s := g.nodes[id].s
		in := s.ReplicaInfo()
		infos = append(infos, fmt.Sprintf("node %d %s term %d commit %d commit end %d dispatched %d", id, in.Role, in.Term, in.Commit, in.CommitEnd, s.index.Dispatched()))
	}
	g.fatalf("%s: the group did not converge in 400 calm rounds (history %d bytes): %v", why, len(g.ref), infos)
}

func (g *groupSim) converged() bool {
	l := g.leader()
	if l == 0 {
		return false
	}
	info := g.nodes[l].s.ReplicaInfo()
	want := info.CommitEnd
	for _, id := range g.ids {
		if !g.isMember(info.Membership, id) {
			continue // a node joining, not added yet
		}
		s := g.nodes[id].s
		if s.ReplicaInfo().CommitEnd != want || s.index.Dispatched() < want {
			return false
		}
	}
	return want >= int64(len(g.ref))
}

// checkIndexed: once converged, every replica serves every committed
// record of every queue (followers index what commits), each the
// history's record at its queue offset.
func (g *groupSim) checkIndexed() {
	mem := g.nodes[g.leader()].s.ReplicaInfo().Membership
	for _, id := range g.ids {
		if !g.isMember(mem, id) {
			continue
		}
		s := g.nodes[id].s
		for q := int32(0); q < simQueues; q++ {
			_, mx, err := s.QueueInfo(simTopic, q)
			want := int64(len(g.qends[q]))
			if (err != nil && want > 0) || (err == nil && mx != want) {
				g.fatalf("converged, node %d queue %d: max offset %d (%v), want %d", id, q, mx, err, want)
			}
			for off := int64(0); off < want; {
				res, err := s.PullMessages(context.Background(), PullRequest{Topic: simTopic, QueueID: q, Offset: off, MaxMessages: 32})
				if err != nil || len(res.Messages) == 0 {
					g.fatalf("converged, node %d queue %d: pull at %d of %d: %d messages, %v", id, q, off, want, len(res.Messages), err)
				}
				for _, r := range res.Messages {
					at := g.qstarts[q][off]
					if r.QueueOffset != off || r.PhysicalOffset != at || !bytes.Equal(r.Raw, g.ref[at:at+int64(len(r.Raw))]) {
						g.fatalf("converged, node %d queue %d offset %d: served the record at %d (queue offset %d), the history has it at %d",
							id, q, off, r.PhysicalOffset, r.QueueOffset, at)
					}
					off++
				}
			}
		}
	}
}

// check runs the invariants over the state the last step left.
func (g *groupSim) check() {
	g.t.Helper()
	for _, id := range g.ids {
		g.checkCommitted(g.nodes[id])
	}
	g.walk()
	for _, id := range g.ids {
		g.checkNotPastCommit(g.nodes[id])
		g.checkOffsets(g.nodes[id])
	}
	g.answer()
	g.checkMembership()
}

// checkCommitted compares node n's committed bytes with the reference
// history, extending it where n is ahead.
func (g *groupSim) checkCommitted(n *simNode) {
	if n.s == nil {
		return
	}
	ce := n.s.group.commitEnd.Load()
	for off := n.seen; off < ce; {
		b := n.s.log.At(off)
		if len(b) == 0 {
			g.fatalf("node %d: no commitlog file holds offset %d below its commit end %d", n.id, off, ce)
		}
		b = b[:min(int64(len(b)), ce-off)]
		if have := int64(len(g.ref)) - off; have > 0 {
			k := min(have, int64(len(b)))
			if i := mismatch(g.ref[off:off+k], b[:k]); i >= 0 {
				g.fatalf("node %d (incarnation %d): committed byte %d differs from the committed history (commit end %d, history %d bytes)",
					n.id, n.inc, off+int64(i), ce, len(g.ref))
			}
		}
		if e := off + int64(len(b)); e > int64(len(g.ref)) {
			g.ref = append(g.ref, b[int64(len(g.ref))-off:]...)
		}
		off += int64(len(b))
	}
	n.seen = max(n.seen, ce)
}

func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// walk parses the new part of the history: records decode, queue offsets
// are dense per queue, store times never go back, physical offsets are
// where the records are.
func (g *groupSim) walk() {
	for g.walked < int64(len(g.ref)) {
		off := g.walked
		b := g.ref[off:]
		fileEnd := (off/simFileSize + 1) * simFileSize
		if !record.HasMagic(b) {
			// The rest of the file is padding (a blank or zeros): the next
			// entry was placed at the next file.
			if fileEnd > int64(len(g.ref)) {
				g.fatalf("history: no record at %d, yet the history goes on to %d inside the file", off, len(g.ref))
			}
			g.walked = fileEnd
			continue
		}
		r, size, err := record.Decode(b)
		if err != nil {
			g.fatalf("history: committed record at %d: %v", off, err)
		}
		if off+int64(size) > fileEnd {
			g.fatalf("history: record at %d crosses its file's end", off)
		}
		if r.PhysicalOffset != off {
			g.fatalf("history: record at %d says physical offset %d", off, r.PhysicalOffset)
		}
		if r.StoreTimestamp < g.lastTS {
			g.fatalf("history: record at %d has store time %d, before the previous record's %d", off, r.StoreTimestamp, g.lastTS)
		}
		if r.Topic == OffsetTopic {
			g.walkOffsets(off, r)
			g.lastTS = r.StoreTimestamp
			g.walked = off + int64(size)
			continue
		}
		if r.Topic != simTopic || r.QueueID < 0 || r.QueueID >= simQueues {
			g.fatalf("history: record at %d for %s/%d", off, r.Topic, r.QueueID)
		}
		if want := int64(len(g.qends[r.QueueID])); r.QueueOffset != want {
			g.fatalf("history: record at %d has queue offset %d in queue %d, want %d (dense, unique)", off, r.QueueOffset, r.QueueID, want)
		}
		g.lastTS = r.StoreTimestamp
		k := bodyKey(r.Body)
		switch {
		case k == "":
			g.fatalf("history: record at %d has a body the driver did not make", off)
		case g.stored[k]:
			g.fatalf("history: body %s stored twice (the second at %d)", k, off)
		case g.refused[k]:
			g.fatalf("history: body %s stored at %d, its put was answered nothing stored", k, off)
		}
		g.stored[k] = true
		end := off + int64(size)
		g.qends[r.QueueID] = append(g.qends[r.QueueID], end)
		g.qstarts[r.QueueID] = append(g.qstarts[r.QueueID], off)
		g.recs = append(g.recs, simRec{off: off, end: end, queue: r.QueueID, qoff: r.QueueOffset})
		g.walked = end
	}
}

// bodyKey is the "m<n>" a driver's body starts with, or "".
func bodyKey(b []byte) string {
	i := bytes.IndexByte(b, '|')
	if i < 2 || b[0] != 'm' {
		return ""
	}
	return string(b[:i])
}

// countBelow is how many records of queue q end at or below end.
func (g *groupSim) countBelow(q int32, end int64) int64 {
	ends := g.qends[q]
	return int64(sort.Search(len(ends), func(i int) bool { return ends[i] > end }))
}

// checkNotPastCommit: nothing past n's commit end is readable on n.
func (g *groupSim) checkNotPastCommit(n *simNode) {
	if n.s == nil {
		return
	}
	ce := n.s.group.commitEnd.Load()
	for q := int32(0); q < simQueues; q++ {
		limit := g.countBelow(q, ce)
		_, mx, err := n.s.QueueInfo(simTopic, q)
		if err == nil && mx > limit {
			g.fatalf("node %d: queue %d max offset %d, only %d committed below its commit end %d", n.id, q, mx, limit, ce)
		}
		res, err := n.s.PullMessages(context.Background(), PullRequest{Topic: simTopic, QueueID: q, Offset: limit, MaxMessages: 4})
		if err == nil && len(res.Messages) > 0 {
			g.fatalf("node %d: a pull at queue %d offset %d (past its %d committed) returned %d messages", n.id, q, limit, limit, len(res.Messages))
		}
	}
	if r, err := n.s.GetMessage(ce); err == nil {
		g.fatalf("node %d: GetMessage at its commit end %d returned a record (queue %d offset %d)", n.id, ce, r.QueueID, r.QueueOffset)
	}
}

// pickReader is a node that says it leads (one at random when two do: a
// deposed leader that has not heard of it yet is the case to catch), three
// times in four; else any node.
func (g *groupSim) pickReader() uint64 {
	var leaders []uint64
	for _, id := range g.ids {
		if n := g.nodes[id]; n.s != nil && n.s.ReplicaInfo().Role == "leader" {
			leaders = append(leaders, id)
		}
	}
	if len(leaders) > 0 && g.rng.IntN(4) != 0 {
		return leaders[g.rng.IntN(len(leaders))]
	}
	return g.ids[g.rng.IntN(len(g.ids))]
}

// read starts a linearizable read of a queue on node id. Every put
// answered so far was checked at the end of the last step (answer), and
// none is answered between then and now (every goroutine is blocked): the
// read must see every message acknowledged until now.
func (g *groupSim) read(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	q := int32(g.rng.IntN(simQueues))
	r := &simRead{node: id, queue: q, want: g.ackMax[q], follower: n.s.ReplicaInfo().Role != "leader", done: make(chan struct{})}
	g.count("read")
	g.note("linearizable read node %d queue %d (acked %d)", id, q, r.want)
	s := n.s
	go func() {
		defer close(r.done)
		if r.err = s.ReadBarrier(context.Background()); r.err != nil {
			return
		}
		_, r.max, r.err = s.QueueInfo(simTopic, q)
		if errors.Is(r.err, ErrQueueNotFound) {
			r.max, r.err = 0, nil
		}
	}()
	g.reads = append(g.reads, r)
}

// checkRead: a linearizable read that answered saw every message of its
// queue acknowledged before it began, and nothing past the history.
func (g *groupSim) checkRead(r *simRead) {
	var nl *NotLeaderError
	switch {
	case r.err == nil:
		g.outcome["read ok"]++
		if r.follower {
			g.outcome["read ok on a follower"]++
		}
		if r.max < r.want {
			g.fatalf("linearizable read on node %d: queue %d max offset %d, yet %d were acknowledged before the read began",
				r.node, r.queue, r.max, r.want)
		}
		if h := int64(len(g.qends[r.queue])); r.max > h {
			g.fatalf("linearizable read on node %d: queue %d max offset %d, past the committed history's %d", r.node, r.queue, r.max, h)
		}
	case errors.As(r.err, &nl):
		g.outcome["read refused"]++
	case errors.Is(r.err, ErrReadIndexTimeout):
		g.outcome["read timeout"]++
	case errors.Is(r.err, ErrClosed):
		g.outcome["read closed"]++
	default:
		g.outcome["read other: "+r.err.Error()]++
	}
}

// answer checks every put, read and commit answered since the last look.
func (g *groupSim) answer() {
	keepC := g.commits[:0]
	for _, c := range g.commits {
		select {
		case <-c.done:
			g.checkCommit(c)
		default:
			keepC = append(keepC, c)
		}
	}
	clear(g.commits[len(keepC):])
	g.commits = keepC
	keepW := g.rewrites[:0]
	for _, w := range g.rewrites {
		select {
		case <-w:
		default:
			keepW = append(keepW, w)
		}
	}
	clear(g.rewrites[len(keepW):])
	g.rewrites = keepW
	keepR := g.reads[:0]
	for _, r := range g.reads {
		select {
		case <-r.done:
			g.checkRead(r)
		default:
			keepR = append(keepR, r)
		}
	}
	clear(g.reads[len(keepR):])
	g.reads = keepR
	keep := g.pending[:0]
	for _, p := range g.pending {
		select {
		case <-p.done:
			g.checkAnswer(p)
		default:
			keep = append(keep, p)
		}
	}
	clear(g.pending[len(keep):])
	g.pending = keep
}

func (g *groupSim) checkAnswer(p *simPut) {
	var nl *NotLeaderError
	kind := ""
	if p.retry {
		kind = "retry "
	}
	unsure := func() {
		if p.key != "" && !p.retry {
			g.unsure = append(g.unsure, p)
		}
	}
	switch {
	case p.err == nil && p.res.Status == PutOK:
		g.outcome[kind+"ok"]++
		if p.key != "" {
			g.unsure = slices.DeleteFunc(g.unsure, func(u *simPut) bool { return u.key == p.key })
		}
	case p.err == nil:
		g.fatalf("put on node %d answered %v without an error", p.node, p.res.Status)
	case p.retry && (errors.As(p.err, &nl) || errors.Is(p.err, ErrInSyncReplicasNotEnough)):
		// This retry stored nothing; the first put may have.
		g.outcome["retry refused"]++
		return
	case errors.As(p.err, &nl), errors.Is(p.err, ErrInSyncReplicasNotEnough):
		// Nothing stored, ever: not in the history now, nor later (walk).
		g.outcome["refused"]++
		if nl != nil && nl.Cause == replica.CauseSuperseded {
			g.outcome["superseded"]++
		}
		for _, b := range p.bodies {
			k := bodyKey(b)
			if g.stored[k] {
				g.fatalf("put on node %d answered %v (nothing stored), yet body %s is in the history", p.node, p.err, k)
			}
			g.refused[k] = true
		}
		return
	case errors.Is(p.err, ErrClosed), errors.Is(p.err, replica.ErrClosed):
		g.outcome[kind+"unknown"]++
		unsure()
		return
	case errors.Is(p.err, ErrReplicationTimeout):
		if p.res.Status != FlushSlaveTimeout {
			g.fatalf("a put that timed out answered %v", p.res.Status)
		}
		g.outcome[kind+"timeout"]++
		unsure()
		return
	default:
		g.outcome[kind+"other: "+p.err.Error()]++
		unsure()
		return
	}
	a := p.res.Append
	end := a.WroteOffset + int64(a.WroteBytes)
	if a.MsgNum != int32(len(p.bodies)) || a.Topic != simTopic || a.QueueID != p.queue {
		g.fatalf("PUT_OK on node %d: %d messages for %s/%d, sent %d for %s/%d", p.node, a.MsgNum, a.Topic, a.QueueID, len(p.bodies), simTopic, p.queue)
	}
	if end > int64(len(g.ref)) {
		g.fatalf("PUT_OK on node %d at [%d, %d): past every replica's commit end (history %d bytes)", p.node, a.WroteOffset, end, len(g.ref))
	}
	off := a.WroteOffset
	for i, body := range p.bodies {
		r, size, err := record.Decode(g.ref[off:])
		if err != nil {
			g.fatalf("PUT_OK on node %d: message %d at %d: %v", p.node, i, off, err)
		}
		if r.QueueID != p.queue || r.QueueOffset != a.QueueOffset+int64(i) || !bytes.Equal(r.Body, body) {
			g.fatalf("PUT_OK on node %d: message %d at %d is queue %d offset %d (%d bytes), acknowledged as queue %d offset %d (%d bytes)",
				p.node, i, off, r.QueueID, r.QueueOffset, len(r.Body), p.queue, a.QueueOffset+int64(i), len(body))
		}
		off += int64(size)
	}
	if off != end {
		g.fatalf("PUT_OK on node %d: records end at %d, acknowledged [%d, %d)", p.node, off, a.WroteOffset, end)
	}
	g.ackMax[p.queue] = max(g.ackMax[p.queue], a.QueueOffset+int64(a.MsgNum))
	g.acked++
}

// commit starts a CommitOffset on node id: one of two groups, a queue of
// the sim's topic, an offset within what the history holds of the queue.
func (g *groupSim) commit(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	q := int32(g.rng.IntN(simQueues))
	c := &simCommit{node: id, key: offsets.Key{Group: fmt.Sprintf("g%d", g.rng.IntN(2)), Topic: simTopic, Queue: q},
		offset: int64(g.rng.IntN(len(g.qends[q]) + 1)), done: make(chan struct{})}
	g.count("commit")
	g.note("commit node %d %v = %d", id, c.key, c.offset)
	s := n.s
	go func() {
		defer close(c.done)
		c.res, c.err = s.commitOffset(context.Background(), c.key.Group, c.key.Topic, c.key.Queue, c.offset)
	}()
	g.commits = append(g.commits, c)
}

// rewrite runs the retention rewrite of every live offset on node id (as
// retention would before deleting every file below its commit end).
func (g *groupSim) rewrite(id uint64) {
	n := g.nodes[id]
	if n.s == nil {
		return
	}
	g.count("rewrite")
	end := n.s.group.commitEnd.Load()
	g.note("rewrite offsets node %d below %d", id, end)
	s, done := n.s, make(chan struct{})
	go func() {
		defer close(done)
		s.rewriteOffsets(end)
	}()
	g.rewrites = append(g.rewrites, done)
}

// walkOffsets takes an offset record of the history into the model.
func (g *groupSim) walkOffsets(off int64, r *Record) {
	if r.QueueID != 0 || r.QueueOffset != g.offQ {
		g.fatalf("history: offset record at %d is queue %d offset %d, want queue 0 offset %d (dense, unique)", off, r.QueueID, r.QueueOffset, g.offQ)
	}
	g.offQ++
	es, err := offsets.Decode(r.Body)
	if err != nil {
		g.fatalf("history: offset record at %d: %v", off, err)
	}
	for _, e := range es {
		if e.Rewrite {
			continue // a rewrite never changes a value (see the top of this file)
		}
		g.changes = append(g.changes, simOffsetChange{pos: off, key: e.Key, offset: e.Offset})
	}
}

// modelOffsets is the model table of the history below end.
func (g *groupSim) modelOffsets(end int64) map[offsets.Key]int64 {
	m := map[offsets.Key]int64{}
	for _, c := range g.changes {
		if c.pos >= end {
			break
		}
		m[c.key] = c.offset
	}
	return m
}

// checkOffsets: node n's offset table is the model at its indexed end,
// and GetOffset serves it.
func (g *groupSim) checkOffsets(n *simNode) {
	if n.s == nil {
		return
	}
	end := n.s.index.Dispatched()
	if end > int64(len(g.ref)) {
		g.fatalf("node %d indexed up to %d, past the committed history (%d bytes)", n.id, end, len(g.ref))
	}
	want := g.modelOffsets(end)
	got := n.s.offsets.Entries()
	if len(got) != len(want) {
		g.fatalf("node %d: %d consumer offsets, the history below its indexed end %d has %d: %v, want %v", n.id, len(got), end, len(want), got, want)
	}
	for _, e := range got {
		if w, ok := want[e.Key]; !ok || w != e.Offset {
			g.fatalf("node %d: offset of %v is %d, the history below its indexed end %d says %d (present %v)", n.id, e.Key, e.Offset, end, w, ok)
		}
		if off, err := n.s.GetOffset(e.Key.Group, e.Key.Topic, e.Key.Queue); err != nil || off != e.Offset {
			g.fatalf("node %d: GetOffset(%v) = %d, %v; its table has %d", n.id, e.Key, off, err, e.Offset)
		}
	}
}

// checkCommit checks a commit's answer: an acknowledged one is in the
// committed history where its answer said.
func (g *groupSim) checkCommit(c *simCommit) {
	var nl *NotLeaderError
	var re *RangeError
	switch {
	case c.err == nil:
		g.outcome["commit ok"]++
	case errors.As(c.err, &nl), errors.Is(c.err, ErrInSyncReplicasNotEnough):
		g.outcome["commit refused"]++
		return
	case errors.As(c.err, &re):
		g.outcome["commit range"]++
		return
	case errors.Is(c.err, ErrTopicNotFound):
		g.outcome["commit topic unknown"]++ // a leader that never indexed the queue (the topic table is not replicated)
		return
	case errors.Is(c.err, ErrOffsetNotDurable), errors.Is(c.err, ErrClosed), errors.Is(c.err, replica.ErrClosed):
		g.outcome["commit unknown"]++
		return
	default:
		g.outcome["commit other: "+c.err.Error()]++
		return
	}
	a := c.res
	end := a.WroteOffset + int64(a.WroteBytes)
	if a.Topic != OffsetTopic || end > int64(len(g.ref)) {
		g.fatalf("commit on node %d acknowledged at [%d, %d) of %s: past the committed history (%d bytes)", c.node, a.WroteOffset, end, a.Topic, len(g.ref))
	}
	r, _, err := record.Decode(g.ref[a.WroteOffset:])
	if err != nil || r.Topic != OffsetTopic {
		g.fatalf("commit on node %d acknowledged at %d: the history has no offset record there (%v)", c.node, a.WroteOffset, err)
	}
	es, err := offsets.Decode(r.Body)
	if err != nil || len(es) != 1 || es[0].Rewrite || es[0].Key != c.key || es[0].Offset != c.offset {
		g.fatalf("commit on node %d of %v = %d acknowledged at %d: the record there holds %v (%v)", c.node, c.key, c.offset, a.WroteOffset, es, err)
	}
	g.ackedCommits++
}
