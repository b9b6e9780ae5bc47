package replica

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const fileSize = 16 << 10

var host = netip.MustParseAddrPort("127.0.0.1:10911")

// fakeHost records what the raft loop tells the store.
type fakeHost struct {
	mu        sync.Mutex
	commitEnd int64
	ready     int
	failed    error
}

func (h *fakeHost) Committed(end, _ int64, _ bool) { h.mu.Lock(); h.commitEnd = end; h.mu.Unlock() }
func (h *fakeHost) ApplyCmd(uint64, []byte)        {}
func (h *fakeHost) BecomeReady(int64) error {
	h.mu.Lock()
	h.ready++
	h.mu.Unlock()
	return nil
}
func (h *fakeHost) Fail(err error)                              { h.mu.Lock(); h.failed = err; h.mu.Unlock() }
func (h *fakeHost) SendSnapshot(uint64, []byte, uint64, uint64) {}
func (h *fakeHost) InstallSnapshot(index, _ uint64, _ raftlog.Membership) (int64, int64, error) {
	return 0, 0, fmt.Errorf("fakeHost: no snapshot is staged for %d", index)
}
func (h *fakeHost) MembershipChanged(raftlog.ConfChange) {}

type nopTransport struct{}

func (nopTransport) Send(uint64, []byte) {}

// open makes a commitlog and a raft log on a MemFS for node id of voters.
func open(t *testing.T, id uint64, voters []uint64) (*commitlog.Log, *raftlog.Log) {
	t.Helper()
	fs := vfs.NewMem()
	nop := zerolog.Nop()
	if err := fs.MkdirAll("/d/commitlog"); err != nil {
		t.Fatal(err)
	}
	cl, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: fileSize, RequireCRC: true,
		Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	cl.Start()
	rl, err := raftlog.Open(raftlog.Options{FS: fs, Dir: "/d/raft", Commitlog: cl, RequireCRC: true, IndexUnits: 16,
		Meta: raftlog.Meta{NodeID: id, Group: "g", ClusterUUID: "c", FileSize: fileSize, Voters: voters}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rl.Close()
		cl.WaitPopulated()
		cl.Close()
	})
	return cl, rl
}

// putOf is a put of one record with body for Propose: its size and its
// stamp.
func putOf(body string) (int, Stamp) {
	s := record.Spec{Topic: "T", Body: []byte(body), StoreHost: host, BornHost: host, PropCRC: true}
	s.BodyCRC = record.BodyCRC(s.Body)
	if err := s.Size(); err != nil {
		panic(err)
	}
	return int(s.Total), func(pos int64, dst []byte) ([]byte, func(), func(), error) {
		dst = slices.Grow(dst, int(s.Total))
		s.Encode(dst[len(dst):len(dst)+int(s.Total)], 0, pos, 1)
		return dst[:len(dst)+int(s.Total)], func() {}, func() {}, nil
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(time.Millisecond)
	}
}

// TestSingleVoter: a one-voter group elects itself, passes the readiness
// barrier, commits a proposal (its waiter answers nil) and refuses after
// Close; a waiter pending at Close is answered ErrClosed.
func TestSingleVoter(t *testing.T) {
	_, rl := open(t, 1, []uint64{1})
	h := &fakeHost{}
	ticks := make(chan time.Time)
	n, err := New(Options{ID: 1, Log: rl, FileSize: fileSize, Transport: nopTransport{}, Host: h, Ticks: ticks}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, _, err := n.Propose(putOf("x")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("propose before the election: %v", err)
	}
	if err := n.Campaign(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", n.Ready)
	w, pos, err := n.Propose(putOf("hello"))
	if err != nil || pos != 0 {
		t.Fatalf("propose: %v at %d", err, pos)
	}
	<-w.Done()
	if w.Err() != nil {
		t.Fatalf("committed proposal: %v", w.Err())
	}
	if info := n.Info(); info.Role != "leader" || !info.Ready || info.CommitEnd <= 0 || info.Commit < 2 {
		t.Fatalf("info %+v", info)
	}
	// Each round of the loop is timed, and the log's syncs in them: at
	// least the election's and the proposal's, at most one sync a round
	// (the round that answered the put may not be counted yet).
	if info := n.Info(); info.LogSync.Count() < 2 || info.ReadyHandling.Count()+1 < info.LogSync.Count() {
		t.Fatalf("%d rounds timed, %d syncs", info.ReadyHandling.Count(), info.LogSync.Count())
	}
	h.mu.Lock()
	if h.ready != 1 || h.commitEnd != n.Info().CommitEnd {
		t.Fatalf("host saw ready %d, commit end %d", h.ready, h.commitEnd)
	}
	h.mu.Unlock()
	n.Close()
	if _, _, err := n.Propose(putOf("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("propose after Close: %v", err)
	}
}

// newSingleVoter is a one-voter group's member, not elected yet, closed
// at the test's end.
func newSingleVoter(t *testing.T) *Node {
	t.Helper()
	_, rl := open(t, 1, []uint64{1})
	n, err := New(Options{ID: 1, Log: rl, FileSize: fileSize, Transport: nopTransport{}, Host: &fakeHost{}, Ticks: make(chan time.Time)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// TestInfoTiming: Info says the tick and election timeout the node runs
// with: the options given, New's defaults for those left zero, and no
// tick when the host drives the ticks.
func TestInfoTiming(t *testing.T) {
	for _, c := range []struct {
		name         string
		opts         Options
		tick         time.Duration
		electionTick int
	}{
		{"given", Options{TickInterval: time.Hour, ElectionTick: 7}, time.Hour, 7},
		{"defaults", Options{}, 100 * time.Millisecond, 10},
		{"host ticks", Options{Ticks: make(chan time.Time), ElectionTick: 3}, 0, 3},
	} {
		_, rl := open(t, 1, []uint64{1})
		o := c.opts
		o.ID, o.Log, o.FileSize, o.Transport, o.Host = 1, rl, fileSize, nopTransport{}, &fakeHost{}
		n, err := New(o, 0)
		if err != nil {
			t.Fatal(err)
		}
		in := n.Info()
		n.Close()
		if in.TickInterval != c.tick || in.ElectionTick != c.electionTick {
			t.Errorf("%s: Info says tick %v, election %d ticks; want %v, %d", c.name, in.TickInterval, in.ElectionTick, c.tick, c.electionTick)
		}
	}
}

// TestWaiterThen: Then's f hears a waiter's outcome once: from the raft
// loop before Done is closed (what it records is in place when the putter
// wakes), or at once, inside Then, for a waiter answered already.
func TestWaiterThen(t *testing.T) {
	n := newSingleVoter(t)
	if err := n.Campaign(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", n.Ready)
	type call struct {
		err              error
		doneOpen, inThen bool
	}
	var (
		calls  []call // written by f, under the node's lock
		inThen atomic.Bool
		w      *Waiter
	)
	f := func(err error) {
		open := true
		select {
		case <-w.Done():
			open = false
		default:
		}
		calls = append(calls, call{err, open, inThen.Load()})
	}
	then := func() {
		inThen.Store(true)
		n.Then(w, f)
		inThen.Store(false)
	}
	for i := range 20 {
		var err error
		w, _, err = n.Propose(putOf(fmt.Sprint("then-", i)))
		if err != nil {
			t.Fatal(err)
		}
		calls = nil
		then()
		<-w.Done()
		n.mu.Lock() // f ran under it
		got := slices.Clone(calls)
		n.mu.Unlock()
		if len(got) != 1 || got[0].err != nil || (!got[0].inThen && !got[0].doneOpen) {
			t.Fatalf("proposal %d: f heard %+v, want one nil outcome, from the loop before Done or inside Then", i, got)
		}
		then() // answered already: at once
		if len(calls) != 2 || calls[1].err != nil || !calls[1].inThen {
			t.Fatalf("proposal %d: f heard %+v, want a second nil outcome inside Then", i, calls)
		}
	}
}

// TestFollowerRefuses: a member of a three-voter group that never
// hears from its peers has no leader; a proposal is refused with
// NO_LEADER; an undecodable or misaddressed message is refused.
func TestFollowerRefuses(t *testing.T) {
	_, rl := open(t, 2, []uint64{1, 2, 3})
	n, err := New(Options{ID: 2, Log: rl, FileSize: fileSize, Transport: nopTransport{}, Host: &fakeHost{}, Ticks: make(chan time.Time)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var nl *NotLeaderError
	if _, _, err := n.Propose(putOf("x")); !errors.As(err, &nl) || nl.Cause != CauseNoLeader {
		t.Fatalf("propose without a leader: %v", err)
	}
	if err := n.StepPeer([]byte{0xff}); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("garbage: %v", err)
	}
	// A MsgSnap comes only through the (verified) snapshot install.
	snap, err := proto.Marshal(&pb.Message{Type: pb.MsgSnap.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(5),
		Snapshot: &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(100), Term: proto.Uint64(5),
			ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}, Data: []byte("m")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.StepPeer(snap); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("a MsgSnap through StepPeer: %v, want ErrBadMessage", err)
	}
	from, to, index, term, data, err := SnapshotOf(snap)
	if err != nil || from != 1 || to != 2 || index != 100 || term != 5 || string(data) != "m" {
		t.Fatalf("SnapshotOf: %d %d %d %d %q %v", from, to, index, term, data, err)
	}
	if b, err := SnapshotMessage(snap, []byte("manifest")); err != nil {
		t.Fatal(err)
	} else if _, _, _, _, data, err := SnapshotOf(b); err != nil || string(data) != "manifest" {
		t.Fatalf("SnapshotMessage: %q %v", data, err)
	}
	if _, _, _, _, _, err := SnapshotOf([]byte{0xff}); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("SnapshotOf garbage: %v", err)
	}
	if info := n.Info(); info.Role != "follower" || info.Ready || len(info.Peers) != 0 {
		t.Fatalf("info %+v", info)
	}
}

// TestStepPeerStrangers: from an id its membership does not name, a
// replica steps what a leader sends (heartbeats, appends; a snapshot
// passes the checks) and a candidate's vote requests unless the id was
// removed, and refuses the rest (answers, a leadership transfer); it
// grants a stranger's vote, follows a stranger that leads a later term
// and answers it.
func TestStepPeerStrangers(t *testing.T) {
	_, rl := open(t, 2, []uint64{1, 2, 3})
	if err := rl.SetMembership(raftlog.ConfChange{Membership: rl.MembershipAt(0), Removed: []uint64{7}}); err != nil {
		t.Fatal(err)
	}
	if err := rl.Joined(); err != nil { // a member that kept its data (a joining one withholds votes)
		t.Fatal(err)
	}
	tr := &recTransport{}
	n, err := New(Options{ID: 2, Log: rl, FileSize: fileSize, Transport: tr, Host: &fakeHost{}, Ticks: make(chan time.Time)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	msg := func(typ pb.MessageType, from uint64, term uint64) []byte {
		b, err := proto.Marshal(&pb.Message{Type: typ.Enum(), From: proto.Uint64(from), To: proto.Uint64(2), Term: proto.Uint64(term),
			LogTerm: proto.Uint64(term), Index: proto.Uint64(100)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, b := range map[string][]byte{
		"a vote from a removed id":         msg(pb.MsgVote, 7, 5),
		"a heartbeat from a removed id":    msg(pb.MsgHeartbeat, 7, 5),
		"an append from a removed id":      msg(pb.MsgApp, 7, 5),
		"a heartbeat answer, a stranger's": msg(pb.MsgHeartbeatResp, 9, 5),
		"a vote answer, a stranger's":      msg(pb.MsgVoteResp, 9, 5),
		"a transfer, a stranger's":         msg(pb.MsgTimeoutNow, 9, 5),
	} {
		if err := n.StepPeer(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: %v, want ErrBadMessage", name, err)
		}
	}
	if info := n.Info(); info.Term != 0 || info.LeaderID != 0 {
		t.Fatalf("a refused message moved raft: %+v", info)
	}
	if n.TakesSnapshotFrom(7) || n.TakesSnapshotFrom(2) || !n.TakesSnapshotFrom(9) || !n.TakesSnapshotFrom(1) {
		t.Fatal("TakesSnapshotFrom: want a member's and a stranger's, not a removed id's nor its own")
	}
	// A candidate this replica has not heard of, with a log ahead of its
	// (empty) one, gets its vote.
	if err := n.StepPeer(msg(pb.MsgVote, 8, 4)); err != nil {
		t.Fatalf("a vote request from a stranger: %v", err)
	}
	n.kick()
	waitFor(t, "the vote for stranger 8", func() bool { return tr.granted(8, 4) })
	if err := n.StepPeer(msg(pb.MsgHeartbeat, 9, 5)); err != nil {
		t.Fatalf("a heartbeat from a stranger: %v", err)
	}
	if info := n.Info(); info.Term != 5 || info.LeaderID != 9 {
		t.Fatalf("after a heartbeat from stranger 9 at term 5: %+v, want 9 leading term 5", info)
	}
	// An append it cannot take yet (index 100 is past its log): the
	// rejection goes back to the stranger.
	if err := n.StepPeer(msg(pb.MsgApp, 9, 5)); err != nil {
		t.Fatalf("an append from a stranger: %v", err)
	}
	n.kick()
	waitFor(t, "the answer to the stranger's append", func() bool { return tr.has(pb.MsgAppResp) })
}

// recTransport records what the node sends.
type recTransport struct {
	mu   sync.Mutex
	msgs []*pb.Message
}

func (r *recTransport) Send(_ uint64, b []byte) {
	m := &pb.Message{}
	if proto.Unmarshal(b, m) == nil {
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.mu.Unlock()
	}
}

// granted: a vote at term went to candidate to.
func (r *recTransport) granted(to, term uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m.GetType() == pb.MsgVoteResp && m.GetTo() == to && m.GetTerm() == term && !m.GetReject() {
			return true
		}
	}
	return false
}

func (r *recTransport) has(typ pb.MessageType) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m.GetType() == typ {
			return true
		}
	}
	return false
}

func step(t *testing.T, n *Node, m *pb.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.StepPeer(b); err != nil {
		t.Fatal(err)
	}
}

// TestJoiningWithholdsVotes: a replica bootstrapped empty (its raft dir has
// the joining marker) that already holds entries but has heard from no
// leader since it started (it may have been halfway through catching up)
// answers no vote request from a candidate with a log; after a leader's
// append brings it to that leader's commit index it has caught up: the
// marker is gone and it answers votes again.
func TestJoiningWithholdsVotes(t *testing.T) {
	_, rl := open(t, 2, []uint64{1, 2, 3})
	if !rl.Joining() {
		t.Fatal("a raft dir bootstrapped empty is not joining")
	}
	var ents []*pb.Entry
	for i := uint64(1); i <= 3; i++ {
		ents = append(ents, &pb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(i)})
	}
	if err := rl.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := rl.SetHardState(&pb.HardState{Term: proto.Uint64(1)}); err != nil {
		t.Fatal(err)
	}
	if err := rl.Sync(); err != nil {
		t.Fatal(err)
	}
	tr := &recTransport{}
	ticks := make(chan time.Time)
	n, err := New(Options{ID: 2, Log: rl, FileSize: fileSize, Transport: tr, Host: &fakeHost{}, Ticks: ticks}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	vote := func(term uint64) *pb.Message {
		return &pb.Message{Type: pb.MsgVote.Enum(), From: proto.Uint64(3), To: proto.Uint64(2), Term: proto.Uint64(term),
			Index: proto.Uint64(3), LogTerm: proto.Uint64(1)}
	}
	step(t, n, vote(2))
	if info := n.Info(); !info.Joining || info.VotesWithheld != 1 || info.Term != 1 {
		t.Fatalf("after a vote request while joining: %+v, want joining, 1 withheld, term unchanged", info)
	}
	// Leader 1's append at term 3: nothing new, commit 3.
	step(t, n, &pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(3),
		Index: proto.Uint64(3), LogTerm: proto.Uint64(1), Commit: proto.Uint64(3)})
	waitFor(t, "caught up", func() bool { return !n.Info().Joining })
	if rl.Joining() {
		t.Fatal("the joining marker survived catching up")
	}
	// Past the leader's lease (CheckQuorum ignores votes within it).
	for range 30 {
		ticks <- time.Time{}
	}
	step(t, n, vote(5))
	waitFor(t, "a vote answer", func() bool { return tr.has(pb.MsgVoteResp) })
	if info := n.Info(); info.VotesWithheld != 1 {
		t.Fatalf("after catching up: %+v, want no more withheld votes", info)
	}
}

// TestStepSnapshot: StepSnapshot refuses what is not a MsgSnap to this
// node from a peer (ErrBadMessage; a member not known yet may send one,
// TestStepPeerStrangers, a removed one may not); a MsgSnap that raft restores (this
// node's log is empty, the snapshot at 100) is handed to
// Host.InstallSnapshot at its index before anything else, and the
// install's error comes back to the caller and stops the node (sticky).
// SnapshotMessageAt moves a MsgSnap to a later index, never back.
func TestStepSnapshot(t *testing.T) {
	_, rl := open(t, 2, []uint64{1, 2, 3})
	if err := rl.SetMembership(raftlog.ConfChange{Membership: rl.MembershipAt(0), Removed: []uint64{7}}); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{}
	n, err := New(Options{ID: 2, Log: rl, FileSize: fileSize, Transport: nopTransport{}, Host: h, Ticks: make(chan time.Time)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	mk := func(typ pb.MessageType, from, to uint64) []byte {
		t.Helper()
		m := &pb.Message{Type: typ.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(5)}
		if typ == pb.MsgSnap {
			m.Snapshot = &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(100), Term: proto.Uint64(5),
				ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}, Data: []byte("m")}
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, b := range map[string][]byte{
		"garbage":           {0xff},
		"an append":         mk(pb.MsgApp, 1, 2),
		"for node 3":        mk(pb.MsgSnap, 1, 3),
		"from itself":       mk(pb.MsgSnap, 2, 2),
		"from a removed id": mk(pb.MsgSnap, 7, 2),
	} {
		if installed, err := n.StepSnapshot(b); installed || !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: %v %v, want ErrBadMessage", name, installed, err)
		}
	}
	installed, err := n.StepSnapshot(mk(pb.MsgSnap, 1, 2))
	if installed || err == nil || !strings.Contains(err.Error(), "no snapshot is staged for 100") {
		t.Fatalf("a restored snapshot whose install fails: %v %v", installed, err)
	}
	h.mu.Lock()
	failed := h.failed
	h.mu.Unlock()
	if failed == nil {
		t.Fatal("the failed install did not stop the node")
	}
	if _, err := n.StepSnapshot(mk(pb.MsgSnap, 1, 2)); err == nil {
		t.Fatal("a stopped node took a snapshot")
	}

	snap := mk(pb.MsgSnap, 1, 2)
	mem := raftlog.Membership{Index: 110, Voters: []uint64{1, 2, 4}, Learners: []uint64{5}}
	b, err := SnapshotMessageAt(snap, 120, 6, []byte("manifest"), mem)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, index, term, data, err := SnapshotOf(b); err != nil || index != 120 || term != 6 || string(data) != "manifest" {
		t.Fatalf("SnapshotMessageAt: %d %d %q %v", index, term, data, err)
	}
	// The ConfState is the membership given, not raft's (the base's).
	var got pb.Message
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if cs := got.GetSnapshot().GetMetadata().GetConfState(); !slices.Equal(cs.GetVoters(), mem.Voters) || !slices.Equal(cs.GetLearners(), mem.Learners) {
		t.Fatalf("SnapshotMessageAt's ConfState %v, want voters %v learners %v", cs, mem.Voters, mem.Learners)
	}
	if _, err := SnapshotMessageAt(snap, 99, 5, nil, mem); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("a snapshot moved back: %v", err)
	}
}

// TestSplitMessages: only the answers that vouch for durable state
// (MsgAppResp, votes) wait for a Ready's Sync (raft.send's rule for its
// asynchronous-write mode); a heartbeat answer leaves before it in every
// role, so a leader's ReadIndex round waits for no follower's disk, and
// so do a follower's read index request and the leader's answer to it
// (FollowerReads); a leader's appends and heartbeats leave before its own
// write.
func TestSplitMessages(t *testing.T) {
	all := []pb.MessageType{pb.MsgApp, pb.MsgHeartbeat, pb.MsgHeartbeatResp, pb.MsgAppResp, pb.MsgVote, pb.MsgVoteResp,
		pb.MsgPreVote, pb.MsgPreVoteResp, pb.MsgTimeoutNow, pb.MsgSnap, pb.MsgReadIndex, pb.MsgReadIndexResp}
	for _, tc := range []struct {
		leader bool
		early  []pb.MessageType
	}{
		{leader: true, early: []pb.MessageType{pb.MsgApp, pb.MsgHeartbeat, pb.MsgHeartbeatResp, pb.MsgReadIndex, pb.MsgReadIndexResp}},
		{leader: false, early: []pb.MessageType{pb.MsgHeartbeatResp, pb.MsgReadIndex, pb.MsgReadIndexResp}},
	} {
		var msgs []*pb.Message
		for _, typ := range all {
			msgs = append(msgs, &pb.Message{Type: typ.Enum()})
		}
		early, late := splitMessages(tc.leader, msgs)
		var gotEarly []pb.MessageType
		for _, m := range early {
			gotEarly = append(gotEarly, m.GetType())
		}
		if len(early)+len(late) != len(all) || len(gotEarly) != len(tc.early) {
			t.Fatalf("leader %v: early %v, %d late; want early %v, the other %d late", tc.leader, gotEarly, len(late), tc.early, len(all)-len(tc.early))
		}
		for i := range gotEarly {
			if gotEarly[i] != tc.early[i] {
				t.Fatalf("leader %v: early %v, want %v", tc.leader, gotEarly, tc.early)
			}
		}
		for _, m := range late {
			for _, e := range tc.early {
				if m.GetType() == e {
					t.Fatalf("leader %v: %v late", tc.leader, e)
				}
			}
		}
	}
}

// TestMoveLeadershipRefusals: MoveLeadership on a member that knows no
// leader is refused NO_LEADER; on a one-voter group's leader a move to
// itself returns it at once, a move to an id that is no voter is
// ErrNotVoter and a move to 0 ErrNoTransferee, each leaving it the ready
// leader, taking puts. (The moves themselves: storage's
// TestGroupMoveLeadership*.)
func TestMoveLeadershipRefusals(t *testing.T) {
	n := newSingleVoter(t)
	var nl *NotLeaderError
	if _, err := n.MoveLeadership(t.Context(), 2); !errors.As(err, &nl) || nl.Cause != CauseNoLeader {
		t.Fatalf("a move before the election: %v, want NO_LEADER", err)
	}
	if err := n.Campaign(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", n.Ready)
	for _, tc := range []struct {
		name     string
		to, lead uint64
		want     error
	}{
		{"itself", 1, 1, nil},
		{"an unknown id", 9, 0, ErrNotVoter},
		{"the most caught-up voter", 0, 0, ErrNoTransferee},
	} {
		lead, err := n.MoveLeadership(t.Context(), tc.to)
		if lead != tc.lead || !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Errorf("a move to %s: %d, %v; want %d, %v", tc.name, lead, err, tc.lead, tc.want)
		}
		if !n.Ready() || n.Refusal() != nil {
			t.Fatalf("after a move to %s: ready %v, refusal %v", tc.name, n.Ready(), n.Refusal())
		}
	}
	w, _, err := n.Propose(putOf("after the moves"))
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if w.Err() != nil {
		t.Fatalf("a put after the moves: %v", w.Err())
	}
}

// gateHost is a fakeHost whose MembershipChanged reports each call on
// entered and then waits until release is closed: it holds the raft loop
// between applying a conf change (its proposer answered) and the Ready's
// Advance.
type gateHost struct {
	fakeHost
	entered chan raftlog.ConfChange
	release chan struct{}
}

func (h *gateHost) MembershipChanged(c raftlog.ConfChange) {
	h.entered <- c
	<-h.release
}

// TestConfChangeBeforeAdvance: a membership change proposed right after
// the previous one applied, while raft has not yet counted it applied
// (the loop has not reached the Ready's Advance), applies: raft would
// have replaced it with an empty entry, silently, and its proposer would
// have waited until its deadline (TestTransferLeadershipOnGroup's second
// AddReplicaMember in a CI run). The loop is held inside the first
// change's MembershipChanged; synctest.Wait lets the second proposer go
// as far as it can before the loop moves on.
func TestConfChangeBeforeAdvance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, rl := open(t, 1, []uint64{1})
		h := &gateHost{entered: make(chan raftlog.ConfChange, 2), release: make(chan struct{})}
		n, err := New(Options{ID: 1, Log: rl, FileSize: fileSize, Transport: nopTransport{}, Host: h, Ticks: make(chan time.Time)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if err := n.Campaign(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !n.Ready() {
			t.Fatal("a one-voter group's member is not the ready leader after its campaign")
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // bubble time
		defer cancel()
		type result struct {
			m   raftlog.Membership
			err error
		}
		propose := func(id uint64) chan result {
			ch := make(chan result, 1)
			go func() {
				m, err := n.ProposeConfChange(ctx, ConfChange{Op: AddLearner, ID: id, PeerAddr: fmt.Sprintf("127.0.0.1:9%d9%d", id, id)})
				ch <- result{m, err}
			}()
			return ch
		}
		first := propose(2)
		if c := <-h.entered; !slices.Equal(c.Membership.Learners, []uint64{2}) {
			t.Fatalf("the first change applied %+v", c.Membership)
		}
		if r := <-first; r.err != nil {
			t.Fatalf("the first change: %v", r.err)
		}
		second := propose(3)
		synctest.Wait() // the second proposer blocked: on raft's answer, or before proposing
		close(h.release)
		r := <-second
		if r.err != nil || !slices.Equal(r.m.Learners, []uint64{2, 3}) || !slices.Equal(r.m.Voters, []uint64{1}) {
			t.Fatalf("the change proposed before raft counted the first applied: %+v, %v; want learners [2 3]", r.m, r.err)
		}
		if c := <-h.entered; !slices.Equal(c.Membership.Learners, []uint64{2, 3}) {
			t.Fatalf("the host heard %+v", c.Membership)
		}
	})
}
