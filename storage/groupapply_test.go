package storage

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// gatedFS holds the msyncs of commitlog segments at a gate the test opens
// (the seam: the real files underneath are written and synced as usual).
type gatedFS struct {
	vfs.FS
	mu    sync.Mutex
	gates []chan struct{} // the next commitlog msyncs wait on these, in order
	held  chan struct{}   // signalled when an msync reaches a gate
}

func (f *gatedFS) wrap(s vfs.Segment, path string, err error) (vfs.Segment, error) {
	if err != nil || !strings.Contains(path, "commitlog") {
		return s, err
	}
	return gatedSegment{Segment: s, fs: f}, nil
}

func (f *gatedFS) CreateSegment(path string, size int64) (vfs.Segment, error) {
	s, err := f.FS.CreateSegment(path, size)
	return f.wrap(s, path, err)
}

func (f *gatedFS) OpenSegment(path string, size int64) (vfs.Segment, error) {
	s, err := f.FS.OpenSegment(path, size)
	return f.wrap(s, path, err)
}

// arm makes the next n commitlog msyncs wait, each at its own gate.
func (f *gatedFS) arm(n int) []chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]chan struct{}, n)
	for i := range out {
		out[i] = make(chan struct{})
	}
	f.gates = append(f.gates, out...)
	return out
}

type gatedSegment struct {
	vfs.Segment
	fs *gatedFS
}

func (s gatedSegment) Sync(lo, hi int64) error {
	f := s.fs
	f.mu.Lock()
	var gate chan struct{}
	if len(f.gates) > 0 {
		gate, f.gates = f.gates[0], f.gates[1:]
	}
	f.mu.Unlock()
	if gate != nil {
		f.held <- struct{}{}
		<-gate
	}
	return s.Segment.Sync(lo, hi)
}

// putOutcome is what a put the test runs in a goroutine returned.
type putOutcome struct {
	res PutResult
	err error
}

// startM1 puts m1 through member 1 in a goroutine: its outcome comes on
// first; second is for m2's. idx1 is m1's raft index (nothing else is
// proposed meanwhile).
func (g *testGroup) startM1(leader *groupState) (first, second chan putOutcome, idx1 uint64) {
	g.t.Helper()
	first, second = make(chan putOutcome, 1), make(chan putOutcome, 1)
	last, err := leader.rlog.LastIndex()
	if err != nil {
		g.t.Fatal(err)
	}
	go func() { r, err := g.put(1, "m1"); first <- putOutcome{r, err} }()
	return first, second, last + 1
}

// ackWhileHeld: m1's outcome (first) arrives while the leader's msync of
// m2 waits at gate, and is PUT_OK, and m2's (second) has not arrived by
// then; then gate opens. A hang past 30 s is reported as why (and the gate
// opened, so that the test ends), not taken as a timing bound.
func ackWhileHeld(t *testing.T, first, second <-chan putOutcome, gate chan struct{}, why string) {
	t.Helper()
	var r1 putOutcome
	select {
	case r1 = <-first:
		select {
		case r := <-second:
			t.Errorf("m2 answered %v %v before the leader synced it", r.res.Status, r.err)
		default:
		}
		close(gate)
	case <-time.After(30 * time.Second):
		t.Error(why)
		close(gate)
		r1 = <-first
	}
	if r1.err != nil || r1.res.Status != PutOK {
		t.Errorf("put m1: %v %v", r1.res.Status, r1.err)
	}
}

// TestGroupAckDoesNotWaitForNextSync: a put committed by its followers'
// answers is acknowledged as soon as the leader's raft loop sees the
// commit, before the loop's write of the entries proposed meanwhile: with
// the leader's msync of the next entry held, the first put's PUT_OK
// arrives. (It used to wait for that msync: the loop applied committed
// entries only after syncing the Ready's new ones.)
func TestGroupAckDoesNotWaitForNextSync(t *testing.T) {
	gfs := &gatedFS{FS: vfs.Default, held: make(chan struct{}, 4)}
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		if o.Group.ID == 1 {
			o.FS = gfs
		}
	})
	g.elect(1)
	if res, err := g.put(1, "m0"); err != nil || res.Status != PutOK {
		t.Fatalf("put m0: %v %v", res.Status, err)
	}
	leader := g.m[1].s.group
	gates := gfs.arm(2)

	first, second, idx1 := g.startM1(leader)
	<-gfs.held // the leader syncs m1: its MsgApp went out before
	// Both followers have m1 and the leader has stepped their answers: its
	// commit moves to m1 once its own sync is done.
	g.poll("the followers' answers for m1", func() bool {
		n := 0
		for _, p := range g.m[1].s.ReplicaInfo().Peers {
			if p.ID != 1 && p.Match >= idx1 {
				n++
			}
		}
		return n == 2
	})
	// m2 is proposed while the loop is held: it goes into the Ready that
	// also commits m1.
	tail := leader.node.ProposedEnd()
	go func() { r, err := g.put(1, "m2"); second <- putOutcome{r, err} }()
	g.poll("m2 proposed", func() bool { return leader.node.ProposedEnd() > tail })
	close(gates[0]) // m1's sync returns
	<-gfs.held      // the loop now syncs m2, and holds there

	ackWhileHeld(t, first, second, gates[1], "m1's PUT_OK waited for the leader's msync of m2, proposed after m1 was committed")
	if r := <-second; r.err != nil || r.res.Status != PutOK {
		t.Fatalf("put m2: %v %v", r.res.Status, r.err)
	}
	end := g.converge(1, g.ids...)
	g.sameBytes(end, g.ids...)
}

// TestGroupAckWhileLeaderFlushes: a put whose followers answer while the
// leader flushes the next entry is acknowledged during that flush, not
// after it. With the followers' msyncs of m1 held, the leader syncs m1,
// then holds its msync of m2; one follower's m1 msync is let through, and
// m1's PUT_OK must arrive while the leader's m2 msync is still held (the
// raft loop used to see the commit only in the Ready after that msync).
// m2 is not answered before the leader synced it.
func TestGroupAckWhileLeaderFlushes(t *testing.T) {
	gfs := map[uint64]*gatedFS{}
	for id := uint64(1); id <= 3; id++ {
		gfs[id] = &gatedFS{FS: vfs.Default, held: make(chan struct{}, 4)}
	}
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.FS = gfs[o.Group.ID] })
	g.elect(1)
	if res, err := g.put(1, "m0"); err != nil || res.Status != PutOK {
		t.Fatalf("put m0: %v %v", res.Status, err)
	}
	leader := g.m[1].s.group
	g2, g3 := gfs[2].arm(1), gfs[3].arm(1)

	first, second, idx1 := g.startM1(leader)
	<-gfs[2].held // both followers hold their msync of m1
	<-gfs[3].held
	g.poll("the leader synced m1", func() bool { return leader.rlog.SyncedIndex() >= idx1 })
	gl := gfs[1].arm(1)
	go func() { r, err := g.put(1, "m2"); second <- putOutcome{r, err} }()
	<-gfs[1].held // the leader's raft loop holds in its msync of m2
	select {
	case r := <-first:
		t.Fatalf("m1 answered %v %v before a follower synced it", r.res.Status, r.err)
	default:
	}
	close(g2[0]) // follower 2 syncs m1 and answers

	ackWhileHeld(t, first, second, gl[0], "m1's PUT_OK waited for the leader's msync of m2")
	close(g3[0])
	if r := <-second; r.err != nil || r.res.Status != PutOK {
		t.Fatalf("put m2: %v %v", r.res.Status, r.err)
	}
	end := g.converge(1, g.ids...)
	g.sameBytes(end, g.ids...)
}
