package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted is a MessageStoreService on a real gRPC server that answers
// GetReplicaInfo with its role and each put with the next scripted error
// (nil: PUT_OK; past the script, the last entry): the fault-injection
// seam for the exact statuses a client must tell apart. Real storaged
// processes are in tests/cluster.
type scripted struct {
	storagedv1.UnimplementedMessageStoreServiceServer
	addr string

	mu     sync.Mutex
	role   storagedv1.ReplicaRole
	ready  bool
	term   uint64
	script []error
	puts   int
	probes int
	onPut  func() // called after each put, with s.mu held (it may set another scripted)
	// onProbe, if set, is called at each GetReplicaInfo with s.mu held,
	// before the answer (it may change s's own role).
	onProbe func(s *scripted)
	// probeHang makes GetReplicaInfo wait for its caller to give up (an
	// address that drops packets: a deleted pod's).
	probeHang bool
	// leaderAddr is the leader's client address GetReplicaInfo names.
	leaderAddr string
	// membership is the group's membership GetReplicaInfo reports.
	membership *storagedv1.ReplicaMembership
	// stop stops the server: the member is gone (its address refuses).
	stop func()
	// window is the dedup window GetReplicaInfo reports (0: none).
	window time.Duration
	// keys are the UNIQ_KEYs of the puts received (a batch's first
	// entry's), in order; batches the PutMessages requests received.
	keys    []string
	batches []*storagedv1.PutMessagesRequest
	// hang makes a put wait for its caller's ctx (a paused member);
	// hungUntil are the deadlines of the puts that hung. onHang, if set,
	// is called with s.mu held as each such put (PutMessage, PutMessages)
	// starts to wait: the call has reached the member, so a test can end
	// its ctx then, not after a time a loaded machine may not have got the
	// call there in.
	hang      bool
	hungUntil []time.Time
	onHang    func(s *scripted)
	// PutMessageStream (stream_test.go) answers each message from the
	// script too (keys and puts as above); a hanging member never answers.
	// streamGate, if set, holds every answer until it is closed; breakAt
	// > 0 breaks the stream with a bare UNAVAILABLE (not OK: outcomes
	// unknown; with breakOK, ends it OK: nothing stored) once that many of
	// its messages are unanswered, once;
	// streamSeen, if set, gets each stream's unanswered count after each
	// message read; streams counts the streams opened, maxUnanswered is
	// the most messages one stream had unanswered.
	streamGate    chan struct{}
	breakAt       int
	breakOK       bool // breakAt ends the stream with OK instead (a server ending it)
	streamSeen    chan int
	streams       int
	maxUnanswered int
}

func startScripted(t *testing.T) *scripted {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{addr: lis.Addr().String(), role: storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER}
	srv := grpc.NewServer()
	storagedv1.RegisterMessageStoreServiceServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			srv.Stop()
			<-done
		})
	}
	t.Cleanup(s.stop)
	return s
}

// setMembership makes s report the membership at index whose members
// have the client addresses of ms (ids 1, 2, … in order).
func (s *scripted) setMembership(index uint64, ms ...*scripted) {
	m := &storagedv1.ReplicaMembership{Index: index, ClientAddrs: map[uint64]string{}}
	for i, o := range ms {
		m.Voters = append(m.Voters, uint64(i+1))
		m.ClientAddrs[uint64(i+1)] = o.addr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.membership = m
}

func (s *scripted) set(role storagedv1.ReplicaRole, ready bool, term uint64, script ...error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.role, s.ready, s.term, s.script = role, ready, term, script
}

func (s *scripted) putCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

func (s *scripted) probeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probes
}

func (s *scripted) GetReplicaInfo(ctx context.Context, _ *storagedv1.GetReplicaInfoRequest) (*storagedv1.GetReplicaInfoResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes++
	if s.probeHang {
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if s.onProbe != nil {
		s.onProbe(s)
	}
	var window *durationpb.Duration
	if s.window > 0 {
		window = durationpb.New(s.window)
	}
	return &storagedv1.GetReplicaInfoResponse{Role: s.role, Ready: s.ready, Term: s.term, LeaderAddr: s.leaderAddr,
		Membership: s.membership, DedupWindow: window}, nil
}

func (s *scripted) PutMessage(ctx context.Context, req *storagedv1.PutMessageRequest) (*storagedv1.PutMessageResponse, error) {
	if err := s.put(ctx, req.GetMessage().GetProperties()[UniqKeyProperty]); err != nil {
		return nil, err
	}
	return &storagedv1.PutMessageResponse{Status: storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK}, nil
}

func (s *scripted) PutMessages(ctx context.Context, req *storagedv1.PutMessagesRequest) (*storagedv1.PutMessagesResponse, error) {
	s.mu.Lock()
	s.batches = append(s.batches, req)
	s.mu.Unlock()
	var key string
	if len(req.GetMessages()) > 0 {
		key = req.GetMessages()[0].GetProperties()[UniqKeyProperty]
	}
	if err := s.put(ctx, key); err != nil {
		return nil, err
	}
	return &storagedv1.PutMessagesResponse{Status: storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK}, nil
}

// put counts a put of key and answers it from the script; a hanging
// member answers once ctx ends.
func (s *scripted) put(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onPut != nil {
		defer s.onPut()
	}
	s.puts++
	s.keys = append(s.keys, key)
	if s.hang {
		d, _ := ctx.Deadline()
		s.hungUntil = append(s.hungUntil, d)
		if s.onHang != nil {
			s.onHang(s)
		}
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return status.FromContextError(ctx.Err()).Err()
	}
	var err error
	if len(s.script) > 0 {
		err = s.script[min(s.puts, len(s.script))-1]
	}
	return err
}

func (s *scripted) putKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.keys)
}

const leader = storagedv1.ReplicaRole_REPLICA_ROLE_LEADER

// newTracker is a tracker over the scripted members. Its puts go as
// given (UniqKeysAsGiven) unless opts says otherwise: these tests are
// about the rules for puts as they come (a stamped key would make every
// put retried after an unknown outcome, also a call cut by AttemptTimeout
// on a loaded machine); newStampedTracker keeps the default.
func newTracker(t *testing.T, opts Options, members ...*scripted) *LeaderTracker {
	t.Helper()
	if opts.UniqKeys == UniqKeysStamped {
		opts.UniqKeys = UniqKeysAsGiven
	}
	return newStampedTracker(t, opts, members...)
}

// newStampedTracker is newTracker with opts.UniqKeys as given (the zero
// value: the default, a key stamped on every message).
func newStampedTracker(t *testing.T, opts Options, members ...*scripted) *LeaderTracker {
	t.Helper()
	for _, m := range members {
		opts.Addrs = append(opts.Addrs, m.addr)
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = time.Millisecond
	}
	tr, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func put(tr *LeaderTracker) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("b")}})
	return err
}

// TestTrackerFollowsHint: a leader is found and takes the first put,
// but leadership has just moved: its refusal names the new leader and
// the new term, and the new leader takes the put and the next ones. The
// deposed leader still says it leads, in the old term, and is not taken.
func TestTrackerFollowsHint(t *testing.T) {
	a, b, c := startScripted(t), startScripted(t), startScripted(t)
	a.set(leader, true, 5, statusErr(codes.Unavailable,
		info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER", "leader_addr": b.addr, "term": "6"}), retry(0)))
	a.onPut = func() { b.set(leader, true, 6) }
	tr := newTracker(t, Options{}, a, b, c)
	for range 3 {
		if err := put(tr); err != nil {
			t.Fatal(err)
		}
	}
	if a.putCount() != 1 || b.putCount() != 3 || c.putCount() != 0 || tr.Leader() != b.addr {
		t.Fatalf("puts a=%d b=%d c=%d, leader %s (b is %s)", a.putCount(), b.putCount(), c.putCount(), tr.Leader(), b.addr)
	}
}

// TestTrackerKeepsRefusalTerm: a refusal names the new leader and its
// term, but the new leader is not ready at the next two lookups (it is
// still applying its log), while the deposed leader still says it leads
// in its old term. The term the refusal named holds for the whole put,
// not only for the first lookup after it: the deposed leader is not asked
// again, and the put waits for the new leader.
func TestTrackerKeepsRefusalTerm(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5, statusErr(codes.Unavailable,
		info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER", "leader_addr": b.addr, "term": "6"}), retry(0)))
	a.onPut = func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		notReady := 2
		b.onProbe = func(s *scripted) {
			s.role, s.ready, s.term = leader, notReady == 0, 6
			notReady = max(notReady-1, 0)
		}
	}
	tr := newTracker(t, Options{}, a, b)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 1 || b.putCount() != 1 || tr.Leader() != b.addr {
		t.Fatalf("puts a=%d b=%d, leader %s (b is %s)", a.putCount(), b.putCount(), tr.Leader(), b.addr)
	}
}

// TestTrackerHintGone: the leader refuses a put while it hands over
// leadership (TRANSFERRING), naming an address that has gone meanwhile
// and drops packets (a deleted pod's), while another member given is the
// ready leader already. The lookup asks every address at once, so the
// put is taken there; asking the hint first would hold it for
// ProbeTimeout (an hour here: the put's 30 s would end first).
func TestTrackerHintGone(t *testing.T) {
	a, b, gone := startScripted(t), startScripted(t), startScripted(t)
	gone.probeHang = true
	a.set(leader, true, 5, statusErr(codes.Unavailable,
		info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "TRANSFERRING", "leader_addr": gone.addr}), retry(0)))
	a.onPut = func() {
		a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
		b.set(leader, true, 6)
	}
	tr := newTracker(t, Options{ProbeTimeout: time.Hour}, a, b)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 1 || b.putCount() != 1 || tr.Leader() != b.addr {
		t.Fatalf("puts a=%d b=%d, leader %s (b is %s)", a.putCount(), b.putCount(), tr.Leader(), b.addr)
	}
}

// TestTrackerLookupSkipsGone: one of the members given has gone and its
// address swallows connections (a listener that never answers: a deleted
// pod's address, which drops packets, keeps a connection from coming up
// the same way). The leader hands over (TRANSFERRING, naming the member
// that takes over); the first lookup after it finds the new leader not
// ready yet. It must not wait for the gone member's probe (ProbeTimeout
// and the connection attempt's bound, an hour here: the put's 30 s would
// end first; 1 s by default) before the next lookup finds the new leader
// ready.
func TestTrackerLookupSkipsGone(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close() // never accepted: the client's handshake never ends
	a.set(leader, true, 5, nil)
	// Neither the probe nor the connection attempt gives up within the
	// put's 30 s (the tracker's own bound on a connection attempt is 1 s).
	tr, err := New(Options{Addrs: []string{a.addr, b.addr, hole.Addr().String()}, ProbeTimeout: time.Hour, UniqKeys: UniqKeysAsGiven,
		InitialBackoff: time.Millisecond, DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.DefaultConfig, MinConnectTimeout: time.Hour})}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	// The first put finds a leading (its answer ends the lookup, the hole
	// still connecting) and is taken.
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	a.set(leader, true, 5, statusErr(codes.Unavailable,
		info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "TRANSFERRING", "leader_addr": b.addr, "term": "5"}), retry(0)))
	a.mu.Lock()
	a.onPut = func() { a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false }
	a.mu.Unlock()
	b.mu.Lock()
	b.onProbe = func(s *scripted) {
		// Not ready at the first probe after the refusal, ready after it.
		s.onProbe = func(s *scripted) { s.role, s.ready, s.term = leader, true, 6 }
	}
	b.mu.Unlock()
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 2 || b.putCount() != 1 || tr.Leader() != b.addr {
		t.Fatalf("puts a=%d b=%d, leader %s (b is %s)", a.putCount(), b.putCount(), tr.Leader(), b.addr)
	}
}

// TestTrackerRemembersHintedLeader: the leader moves to a member the
// tracker was not given (one added to the group since): the refusal names
// it while it is not ready yet, and the lookups that follow find no ready
// leader among the given members. They must ask the hinted member too, or
// the tracker would never reach the group's leader again.
func TestTrackerRemembersHintedLeader(t *testing.T) {
	a, b, c := startScripted(t), startScripted(t), startScripted(t)
	a.set(leader, true, 5, statusErr(codes.Unavailable,
		info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER", "leader_addr": c.addr}), retry(0)))
	a.onPut = func() { a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false }
	c.onProbe = func(s *scripted) {
		if s.probes >= 2 { // not ready at the hint's probe, ready at a later lookup's
			s.role, s.ready, s.term = leader, true, 6
		}
	}
	tr := newTracker(t, Options{LeaderWait: 2 * time.Second}, a, b)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 1 || b.putCount() != 0 || c.putCount() != 2 || tr.Leader() != c.addr {
		t.Fatalf("puts a=%d b=%d c=%d, leader %s (c is %s)", a.putCount(), b.putCount(), c.putCount(), tr.Leader(), c.addr)
	}
}

// TestTrackerAsksNamedLeader: no member the tracker was given leads, and
// no put was refused (so no hint): the leader is a member added since,
// which the others name in their replica info. The lookup asks it, and it
// takes the puts.
func TestTrackerAsksNamedLeader(t *testing.T) {
	a, b, c := startScripted(t), startScripted(t), startScripted(t)
	c.set(leader, true, 7)
	a.leaderAddr = c.addr
	tr := newTracker(t, Options{LeaderWait: 2 * time.Second}, a, b)
	for range 2 {
		if err := put(tr); err != nil {
			t.Fatal(err)
		}
	}
	if a.putCount() != 0 || b.putCount() != 0 || c.putCount() != 2 || tr.Leader() != c.addr {
		t.Fatalf("puts a=%d b=%d c=%d, leader %s (c is %s)", a.putCount(), b.putCount(), c.putCount(), tr.Leader(), c.addr)
	}
}

// TestTrackerLearnsMembers: the tracker is given member a only; b was
// added to the group since, and a's replica info lists b's client
// address. Once a is gone and b leads, the puts reach b: the lookup asks
// the members it learned, not only the ones it was given (with those
// alone it would find no leader for ever).
func TestTrackerLearnsMembers(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5)
	a.setMembership(9, a, b)
	b.setMembership(9, a, b)
	tr := newTracker(t, Options{LeaderWait: 5 * time.Second, RefreshInterval: time.Hour}, a)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if got := tr.Addrs(); !slices.Equal(got, []string{a.addr, b.addr}) {
		t.Fatalf("addresses after the first lookup %v, want a then b %v", got, []string{a.addr, b.addr})
	}
	a.stop()
	b.set(leader, true, 6)
	// A put sent before the connection noticed a is gone fails with an
	// unknown outcome (it was sent): the next one looks the leader up.
	err := put(tr)
	if err != nil && !Classify(err).NothingStored {
		t.Logf("the put in flight to a when it went: %v", err)
		err = put(tr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 1 || b.putCount() != 1 || tr.Leader() != b.addr {
		t.Fatalf("puts a=%d b=%d, leader %s (b is %s)", a.putCount(), b.putCount(), tr.Leader(), b.addr)
	}
}

// TestTrackerRefresh: while a keeps leading no lookup runs, so the
// tracker learns that b joined only by asking the leader every
// RefreshInterval; a refresh also forgets a leader that says it no longer
// leads, so the next put looks the leader up instead of being refused.
func TestTrackerRefresh(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5)
	a.setMembership(1, a)
	// Each probe reports what it answers: the membership's index and
	// whether a said it leads.
	type answer struct {
		index   uint64
		leading bool
	}
	probed := make(chan answer, 1000)
	a.onProbe = func(s *scripted) {
		select { // never blocks with s.mu held (the test takes it too)
		case probed <- answer{s.membership.GetIndex(), s.role == leader}:
		default:
		}
	}
	// waitProbes waits for two probes answering want: the loop's probes
	// run one after the other, each learning before the next is sent, so
	// after the second the first one's answer was learned.
	waitProbes := func(want answer) {
		timeout := time.After(30 * time.Second)
		for n := 0; n < 2; {
			select {
			case got := <-probed:
				if got == want {
					n++
				}
			case <-timeout:
				t.Fatalf("no two probes of a answering %+v within 30 s", want)
			}
		}
	}
	tr := newTracker(t, Options{RefreshInterval: time.Millisecond}, a)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	a.setMembership(4, a, b)
	waitProbes(answer{4, true})
	if got := tr.Addrs(); !slices.Equal(got, []string{a.addr, b.addr}) {
		t.Fatalf("addresses after refreshes %v, want a then b", got)
	}
	if tr.Leader() != a.addr {
		t.Fatalf("leader %q, want a", tr.Leader())
	}
	a.mu.Lock()
	a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
	a.mu.Unlock()
	// A refresh that hears it (the loop's, or this one, whichever comes
	// first: only a lookup sets a leader, and no put runs) forgets a.
	tr.refresh()
	if l := tr.Leader(); l != "" {
		t.Fatalf("leader %q after it said it follows, want none", l)
	}
	b.set(leader, true, 6)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	if a.putCount() != 1 || b.putCount() != 1 {
		t.Fatalf("puts a=%d b=%d, want 1 and 1 (no put refused by a)", a.putCount(), b.putCount())
	}
}

// TestTrackerLearnBounded: what a membership names is bounded: at most
// MaxHintedAddrs connections beyond the given members, addresses longer
// than storaged accepts ignored, an older membership ignored, and a newer
// one replacing the members learned (the ones no longer named and unused
// evicted to make room), but never the leader's.
func TestTrackerLearnBounded(t *testing.T) {
	a := startScripted(t)
	a.set(leader, true, 5)
	tr := newTracker(t, Options{MaxHintedAddrs: 3, RefreshInterval: time.Hour}, a)
	membership := func(index uint64, addrs ...string) {
		m := &storagedv1.ReplicaMembership{Index: index, Voters: []uint64{1}, ClientAddrs: map[uint64]string{1: a.addr}}
		for i, x := range addrs {
			m.Voters = append(m.Voters, uint64(i+2))
			m.ClientAddrs[uint64(i+2)] = x
		}
		a.mu.Lock()
		a.membership = m
		a.mu.Unlock()
	}
	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf("127.0.0.1:%d", 1000+i)
	}
	long := "127.0.0.1:" + strings.Repeat("9", maxAddrLen)
	membership(10, append([]string{long}, many...)...)
	if err := put(tr); err != nil {
		t.Fatal(err)
	}
	got := tr.Addrs()
	if len(got) != 4 || got[0] != a.addr || slices.Contains(got, long) {
		t.Fatalf("addresses %v: want a and 3 learned, not the long one", got)
	}
	membership(9, "127.0.0.1:2000")
	tr.refresh()
	if now := tr.Addrs(); !slices.Equal(now, got) {
		t.Fatalf("an older membership changed the addresses: %v, was %v", now, got)
	}
	membership(11, "127.0.0.1:3000", "127.0.0.1:3001")
	tr.refresh()
	if now := tr.Addrs(); !slices.Contains(now, "127.0.0.1:3000") || !slices.Contains(now, "127.0.0.1:3001") || len(now) != 4 {
		t.Fatalf("after a newer membership: %v, want a, both new members and one stale address", now)
	}
}

// TestTrackerRetryRule: a put is retried only after storaged's own
// nothing-stored refusals; one that may have stored the message comes
// back after exactly one call, with its status.
func TestTrackerRetryRule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		puts  int // calls the leader sees
		code  codes.Code
		retry bool
	}{
		{"in-sync replicas, then OK", statusErr(codes.Unavailable, info("IN_SYNC_REPLICAS_NOT_ENOUGH", nil), retry(time.Millisecond)), 2, codes.OK, true},
		{"busy without RetryInfo, then OK", statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil)), 2, codes.OK, true},
		{"superseded, then OK", statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "SUPERSEDED"}), retry(0)), 2, codes.OK, true},
		{"replication timeout", statusErr(codes.DeadlineExceeded, info("FLUSH_SLAVE_TIMEOUT", map[string]string{"outcome": "unknown"})), 1, codes.DeadlineExceeded, false},
		{"cancelled", statusErr(codes.Canceled, info("UNKNOWN_ERROR", nil)), 1, codes.Canceled, false},
		{"internal", statusErr(codes.Internal, info("UNKNOWN_ERROR", map[string]string{"stored": "unknown"})), 1, codes.Internal, false},
		{"bare UNAVAILABLE", status.Error(codes.Unavailable, "upstream connect error"), 1, codes.Unavailable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScripted(t)
			s.set(leader, true, 1, tc.err, nil)
			tr := newTracker(t, Options{}, s)
			err := put(tr)
			if status.Code(err) != tc.code || s.putCount() != tc.puts {
				t.Fatalf("put: %v after %d calls, want %v after %d", err, s.putCount(), tc.code, tc.puts)
			}
			if err != nil && Classify(err).NothingStored {
				t.Fatalf("an unknown outcome came back as nothing stored: %v", err)
			}
		})
	}
}

// TestTrackerBounded: refusals forever end after MaxAttempts calls, with
// the last refusal (nothing stored); no ready leader anywhere ends after
// LeaderWait with ErrNoLeader and no put sent.
func TestTrackerBounded(t *testing.T) {
	s := startScripted(t)
	s.set(leader, true, 1, statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil), retry(time.Millisecond)))
	tr := newTracker(t, Options{MaxAttempts: 4}, s)
	if err := put(tr); !Classify(err).NothingStored || s.putCount() != 4 {
		t.Fatalf("put: %v after %d calls, want a refusal after 4", err, s.putCount())
	}

	f1, f2 := startScripted(t), startScripted(t)
	f2.set(leader, false, 3) // elected, not ready: no put yet
	tr2 := newTracker(t, Options{LookupInterval: time.Millisecond, LeaderWait: 50 * time.Millisecond}, f1, f2)
	if err := put(tr2); !errors.Is(err, ErrNoLeader) || f1.putCount()+f2.putCount() != 0 {
		t.Fatalf("put without a ready leader: %v, %d puts sent", err, f1.putCount()+f2.putCount())
	}
}

// TestTrackerClose: Close ends a put waiting for a leader (no member is
// the leader, so nothing is sent and the only answer is ErrClosed).
func TestTrackerClose(t *testing.T) {
	s := startScripted(t)
	tr := newTracker(t, Options{LookupInterval: time.Hour, LeaderWait: 2 * time.Hour}, s)
	waiting := make(chan struct{}, 1)
	tr.retryWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	// No deadline: only Close can end the put (after a deadline too the
	// error would be ErrClosed, the tracker closed by then).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("b")}})
		done <- err
	}()
	recv(t, waiting, "the put waiting for the next lookup")
	tr.Close()
	if err := recv(t, done, "end of the put after Close"); !errors.Is(err, ErrClosed) || s.putCount() != 0 {
		t.Fatalf("put after Close: %v (%d puts sent)", err, s.putCount())
	}
}

func TestOptionsValidate(t *testing.T) {
	for name, o := range map[string]Options{
		"no addrs":     {},
		"empty addr":   {Addrs: []string{""}},
		"too many":     {Addrs: make([]string, MaxMembers+1)},
		"attempts":     {Addrs: []string{"a:1"}, MaxAttempts: MaxAttemptsLimit + 1},
		"backoff":      {Addrs: []string{"a:1"}, InitialBackoff: time.Second, MaxBackoff: time.Millisecond},
		"negative cap": {Addrs: []string{"a:1"}, MaxRetryDelay: -1},
		"key mode":     {Addrs: []string{"a:1"}, UniqKeys: UniqKeysAsGiven + 1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func keyedPut(tr *LeaderTracker, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("b"),
		Properties: map[string]string{UniqKeyProperty: key}}})
	return err
}

// TestTrackerKeyedRetry: a keyed put is sent again after an unknown
// outcome, with its key, when the leader remembers keyed puts long enough
// (its dedup window); not when deduplication is off or its window too
// short, not for an answer that would only come again (INTERNAL), and an
// unkeyed put never. Once a call's outcome was unknown, the put's error
// stays unknown whatever the later calls answered.
func TestTrackerKeyedRetry(t *testing.T) {
	unknown := statusErr(codes.DeadlineExceeded, info("FLUSH_SLAVE_TIMEOUT", map[string]string{"outcome": "unknown"}))
	refused := statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil), retry(0))
	for _, tc := range []struct {
		name   string
		window time.Duration
		key    string
		script []error
		puts   int
		code   codes.Code
	}{
		{"replication timeout, then OK", 10 * time.Minute, "k", []error{unknown, nil}, 2, codes.OK},
		{"bare UNAVAILABLE, then OK", 10 * time.Minute, "k", []error{status.Error(codes.Unavailable, "upstream connect error"), nil}, 2, codes.OK},
		{"cancelled, then OK", 10 * time.Minute, "k", []error{status.Error(codes.Canceled, "stream reset"), nil}, 2, codes.OK},
		{"unknown twice, then OK", 10 * time.Minute, "k", []error{unknown, unknown, nil}, 3, codes.OK},
		{"unknown, then refused until the attempts run out", 10 * time.Minute, "k", []error{unknown, refused}, 4, codes.DeadlineExceeded},
		{"deduplication off", 0, "k", []error{unknown, nil}, 1, codes.DeadlineExceeded},
		{"window too short", time.Nanosecond, "k", []error{unknown, nil}, 1, codes.DeadlineExceeded},
		{"internal", 10 * time.Minute, "k", []error{statusErr(codes.Internal, info("UNKNOWN_ERROR", nil)), nil}, 1, codes.Internal},
		{"not keyed", 10 * time.Minute, "", []error{unknown, nil}, 1, codes.DeadlineExceeded},
		{"key too long", 10 * time.Minute, strings.Repeat("k", maxUniqKeyLen+1), []error{unknown, nil}, 1, codes.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScripted(t)
			s.set(leader, true, 1, tc.script...)
			s.window = tc.window
			tr := newTracker(t, Options{MaxAttempts: 4}, s)
			err := keyedPut(tr, tc.key)
			if status.Code(err) != tc.code || s.putCount() != tc.puts {
				t.Fatalf("put: %v after %d calls, want %v after %d", err, s.putCount(), tc.code, tc.puts)
			}
			if err != nil && Classify(err).NothingStored {
				t.Fatalf("an unknown outcome came back as nothing stored: %v", err)
			}
			for i, k := range s.putKeys() {
				if k != tc.key {
					t.Fatalf("call %d carried key %q, want %q", i+1, k, tc.key)
				}
			}
		})
	}
}

// TestTrackerAttemptTimeout: a leader that stops answering (a paused
// process) costs a keyed put AttemptTimeout: it is sent again, with its
// key, to the member that leads then. An unkeyed put is not cut short:
// its call carries the caller's deadline.
//
// AttemptTimeout bounds every keyed call, the answered ones too: one a
// loaded machine answers later than that is cut and sent again with its
// key to the same member, the behaviour under test and not a failure, so
// the keys are compared with such repeats compacted. It is 1 s, not a few
// ms, so that no put runs out of attempts on a slow machine, and the
// leader check is off (after its default 500 ms it would cut the hung
// call first).
func TestTrackerAttemptTimeout(t *testing.T) {
	s1, s2 := startScripted(t), startScripted(t)
	s1.set(leader, true, 1)
	s1.window, s2.window = 10*time.Minute, 10*time.Minute
	tr := newTracker(t, Options{AttemptTimeout: time.Second, LeaderCheckAfter: -1, LookupInterval: time.Millisecond}, s1, s2)
	if err := keyedPut(tr, "k0"); err != nil || tr.Leader() != s1.addr {
		t.Fatalf("first put: %v, leader %q", err, tr.Leader())
	}
	// s1 stops answering puts, and s2 is elected (s1 says it follows: a
	// paused process's probes would time out instead).
	s1.mu.Lock()
	s1.hang = true
	s1.mu.Unlock()
	s1.set(storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false, 2)
	s2.set(leader, true, 2)
	if err := keyedPut(tr, "k1"); err != nil {
		t.Fatalf("a keyed put while the leader hangs: %v", err)
	}
	k1, k2 := slices.Compact(s1.putKeys()), slices.Compact(s2.putKeys())
	if !slices.Equal(k1, []string{"k0", "k1"}) || !slices.Equal(k2, []string{"k1"}) {
		t.Fatalf("keys at the old leader %q, at the new %q (repeats compacted); want k0 k1 and k1", k1, k2)
	}
	// An unkeyed put to a hanging leader waits for its own ctx: a minute,
	// ended by the test once the call waits at s2 (ending it by a short
	// deadline would race the call's way there).
	hung := make(chan struct{}, 1)
	s2.mu.Lock()
	s2.hang = true
	s2.onHang = func(*scripted) { hung <- struct{}{} }
	n2 := s2.puts
	s2.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("b")}})
		errs <- err
	}()
	recv(t, hung, "the unkeyed call at the hanging leader")
	cancel()
	err := recv(t, errs, "the unkeyed put's end")
	if got := s2.putKeys()[n2:]; status.Code(err) != codes.Canceled || !slices.Equal(got, []string{""}) {
		t.Fatalf("an unkeyed put to a hanging leader, its ctx cancelled: %v after calls %q there, want CANCELLED after one unkeyed", err, got)
	}
	// The call carried the caller's deadline (gRPC sends what remains of
	// it, so the member's is a little earlier), not one AttemptTimeout
	// away: 59 s earlier.
	want, _ := ctx.Deadline()
	s2.mu.Lock()
	got := s2.hungUntil[len(s2.hungUntil)-1]
	s2.mu.Unlock()
	if got.Before(want.Add(-30 * time.Second)) {
		t.Fatalf("the unkeyed call had deadline %v, %v before the caller's", got, want.Sub(got))
	}
}

// TestTrackerStampUniqKeys: by default (UniqKeysStamped) every message
// without a key gets its own (32 hexadecimal digits), in a copy of the
// request; keys given are kept, and the body is not copied. With
// UniqKeysAsGiven nothing is stamped.
func TestTrackerStampUniqKeys(t *testing.T) {
	s := startScripted(t)
	s.set(leader, true, 1)
	tr := newStampedTracker(t, Options{}, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("b")
	req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: body, Tags: "tag", Properties: map[string]string{"a": "1"}}}
	for range 2 {
		if _, err := tr.PutMessage(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	keyed := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: body, Properties: map[string]string{UniqKeyProperty: "mine"}}}
	if _, err := tr.PutMessage(ctx, keyed); err != nil {
		t.Fatal(err)
	}
	keys := s.putKeys()
	hex32 := func(k string) bool {
		return len(k) == 32 && strings.Trim(k, "0123456789ABCDEF") == ""
	}
	if len(keys) != 3 || !hex32(keys[0]) || !hex32(keys[1]) || keys[0] == keys[1] || keys[2] != "mine" {
		t.Fatalf("keys sent %q: want two distinct 32-digit keys, then the caller's", keys)
	}
	if len(req.Message.Properties) != 1 || req.Message.Tags != "tag" {
		t.Fatalf("the caller's request changed: %v", req)
	}
	batch := &storagedv1.PutMessagesRequest{Topic: "T", QueueId: 3, Messages: []*storagedv1.BatchEntry{
		{Body: body, Properties: map[string]string{UniqKeyProperty: "first"}}, {Body: body, Tags: "x"}}}
	if _, err := tr.PutMessages(ctx, batch); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	got := s.batches[0]
	s.mu.Unlock()
	if got.GetTopic() != "T" || got.GetQueueId() != 3 || len(got.GetMessages()) != 2 ||
		got.GetMessages()[0].GetProperties()[UniqKeyProperty] != "first" || !hex32(got.GetMessages()[1].GetProperties()[UniqKeyProperty]) ||
		got.GetMessages()[1].GetTags() != "x" {
		t.Fatalf("batch sent: %v", got)
	}
	if len(batch.Messages[1].Properties) != 0 {
		t.Fatalf("the caller's batch entry changed: %v", batch.Messages[1])
	}
	m := withKey(req.Message, "k")
	if &m.Body[0] != &body[0] {
		t.Fatal("the body was copied")
	}

	given := newTracker(t, Options{UniqKeys: UniqKeysAsGiven}, s)
	if _, err := given.PutMessage(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := given.PutMessages(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if keys := s.putKeys(); len(keys) != 6 || keys[4] != "" || keys[5] != "first" {
		t.Fatalf("keys sent as given: %q, want \"\" and \"first\" last", keys)
	}
	s.mu.Lock()
	got = s.batches[1]
	s.mu.Unlock()
	if got.GetMessages()[1].GetProperties()[UniqKeyProperty] != "" {
		t.Fatalf("a batch entry keyed as given: %v", got)
	}
}

// TestTrackerLeaderCheck: a keyed put waits at a leader that stopped
// answering (a paused process; no AttemptTimeout here). From
// LeaderCheckAfter on the tracker asks the other members; while one only
// claims to lead in an older term (a deposed leader that has not heard of
// the new one) the put keeps waiting; once one is the ready leader in a
// later term the call is cut and the put sent there with its key. An
// unkeyed put is never cut: it waits for its own ctx, also when the check
// cuts a keyed one at the same member.
func TestTrackerLeaderCheck(t *testing.T) {
	a, b, c := startScripted(t), startScripted(t), startScripted(t)
	a.set(leader, true, 5)
	a.window, b.window, c.window = 10*time.Minute, 10*time.Minute, 10*time.Minute
	tr := newTracker(t, Options{AttemptTimeout: -1, LeaderCheckAfter: 10 * time.Millisecond, LookupInterval: time.Millisecond}, a, b, c)
	if err := keyedPut(tr, "k0"); err != nil || tr.Leader() != a.addr {
		t.Fatalf("first put: %v, leader %q", err, tr.Leader())
	}
	a.mu.Lock()
	a.hang = true
	a.mu.Unlock()
	const stale = 3 // b's probes that claim an older term before it leads
	b.mu.Lock()
	base := b.probes
	b.onProbe = func(s *scripted) {
		switch n := s.probes - base; {
		case n > stale:
			s.role, s.ready, s.term = leader, true, 6
		case n > 0:
			s.role, s.ready, s.term = leader, true, 4
		}
	}
	b.mu.Unlock()
	if err := keyedPut(tr, "k1"); err != nil {
		t.Fatalf("a keyed put while the leader hangs: %v", err)
	}
	if ka, kb := a.putKeys(), b.putKeys(); !slices.Equal(ka, []string{"k0", "k1"}) || !slices.Equal(kb, []string{"k1"}) {
		t.Fatalf("keys at the old leader %q, at the new %q; want k0 k1 and k1", ka, kb)
	}
	if n := b.probeCount() - base; n <= stale || c.probeCount() < stale || tr.Leader() != b.addr {
		t.Fatalf("b probed %d times, c %d, leader %q: want the put cut only once b led in a later term (after %d probes)",
			n, c.probeCount(), tr.Leader(), stale)
	}

	// b hangs too. An unkeyed put waits at b, then a keyed one; then c
	// leads in a later term: the check cuts the keyed one, which is sent
	// to c, but not the unkeyed one (its outcome would only become unknown
	// sooner): it still waits for its own ctx, which the test ends then
	// (ending it by a short deadline would race the call's way to b). c
	// leads only once both wait at b: a check round for k1's call at b,
	// still running, could otherwise find c leading and send them there.
	hung := make(chan struct{}, 2)
	b.mu.Lock()
	b.hang = true
	b.onHang = func(*scripted) { hung <- struct{}{} }
	nb := b.puts
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	unkeyed, keyedDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("b")}})
		unkeyed <- err
	}()
	recv(t, hung, "the unkeyed call at b")
	go func() { keyedDone <- keyedPut(tr, "k2") }()
	recv(t, hung, "the keyed call at b")
	c.set(leader, true, 7)
	if err := recv(t, keyedDone, "the keyed put's end"); err != nil {
		t.Fatalf("a keyed put while b hangs: %v", err)
	}
	select {
	case err := <-unkeyed:
		t.Fatalf("the unkeyed put at b ended before its ctx (the keyed one was cut and sent to c): %v", err)
	default:
	}
	cancel()
	// A cut call's error says so (and the cut may have come just before
	// the cancel, its put not returned yet at the check above).
	err := recv(t, unkeyed, "the unkeyed put's end")
	if kb, kc := b.putKeys()[nb:], c.putKeys(); status.Code(err) != codes.Canceled || strings.Contains(err.Error(), "later term") ||
		!slices.Equal(kb, []string{"", "k2"}) || !slices.Equal(kc, []string{"k2"}) {
		t.Fatalf("an unkeyed put at a hanging leader: %v, keys %q there and %q at c; want CANCELLED, \"\" k2 and k2", err, kb, kc)
	}
}
