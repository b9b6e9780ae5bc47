package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// Every transport of three sends to the other two; each message arrives
// once, and each receiver learns its senders' client addresses.
func TestDeliverBetweenThree(t *testing.T) {
	trs, recs := group(t, 3, nil)
	const per = 200
	for i, tr := range trs {
		for to := uint64(1); to <= 3; to++ {
			for k := range per {
				tr.Send(to, fmt.Appendf(nil, "%d->%d #%d", i+1, to, k)) // to self: dropped
			}
		}
	}
	for i, r := range recs {
		waitFor(t, fmt.Sprintf("member %d's %d messages", i+1, 2*per), 10*time.Second, func() bool { return r.count() >= 2*per })
	}
	for i, r := range recs {
		if r.count() != 2*per {
			t.Errorf("member %d got %d messages, want %d", i+1, r.count(), 2*per)
		}
		for from := 1; from <= 3; from++ {
			if from == i+1 {
				continue
			}
			for _, k := range []int{0, per / 2, per - 1} {
				if m := fmt.Sprintf("%d->%d #%d", from, i+1, k); !r.has(m) {
					t.Errorf("member %d lacks %q", i+1, m)
				}
			}
			if got, want := trs[i].ClientAddr(uint64(from)), fmt.Sprintf("127.0.0.1:%d", 9000+from); got != want {
				t.Errorf("member %d: client addr of %d = %q, want %q", i+1, from, got, want)
			}
		}
		if got := trs[i].ClientAddr(uint64(i + 1)); got != fmt.Sprintf("127.0.0.1:%d", 9001+i) {
			t.Errorf("own client addr %q", got)
		}
		if got := trs[i].Received(); got != 2*per {
			t.Errorf("member %d Received() = %d", i+1, got)
		}
	}
	if s := trs[0].PeerStats(2); s.Sent != per || s.Dropped != 0 || s.Connects != 1 {
		t.Errorf("stats 1->2: %+v", s)
	}
}

// A peer that never answers (a TCP listener that accepts and stays silent)
// fills the queue: the rest is dropped at once, Send never blocks, and the
// peer is reported unreachable.
func TestDropWhenFull(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	o := testOptions(1, map[uint64]string{1: lis.Addr().String(), 2: silent.Addr().String()})
	o.QueueLen = 4
	tr, err := New(lis, rec, o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const n = 100
	for k := range n {
		tr.Send(2, fmt.Appendf(nil, "m%d", k))
	}
	// At most QueueLen queued, and at most one more batch (at most
	// QueueLen+1 messages) taken by the link goroutine.
	if s := tr.PeerStats(2); s.Dropped < uint64(n-2*o.QueueLen-1) {
		t.Fatalf("dropped %d of %d with a queue of %d", s.Dropped, n, o.QueueLen)
	}
	waitFor(t, "an unreachable report", 10*time.Second, func() bool { return rec.unreachableCount(2) > 0 })
	// A message over the batch bound is dropped, never queued.
	before := tr.PeerStats(2).Dropped
	tr.Send(2, make([]byte, DefaultMaxMsgSize))
	if got := tr.PeerStats(2).Dropped; got != before+1 {
		t.Fatalf("oversized message: dropped %d -> %d", before, got)
	}
	// Byte bound: a queue of 1 KiB takes no 2 KiB message.
	lis2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o2 := testOptions(1, map[uint64]string{1: lis2.Addr().String(), 2: silent.Addr().String()})
	o2.QueueBytes = 1024
	tr2, err := New(lis2, rec, o2)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	tr2.Send(2, make([]byte, 2048))
	if got := tr2.PeerStats(2).Dropped; got != 1 {
		t.Fatalf("over the byte bound: dropped %d", got)
	}
}

// connected starts transports 1 and 2 on lis[0] and lis[1] and has 1 send
// 2 a first message, delivered. 1 is closed at the test's end, 2 by the
// caller.
func connected(t *testing.T, lis []net.Listener, peers map[uint64]string) (t1 *Transport, r1 *recorder, t2 *Transport) {
	t.Helper()
	r1, r2 := &recorder{}, &recorder{}
	t1, err := New(lis[0], r1, testOptions(1, peers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t1.Close() })
	if t2, err = New(lis[1], r2, testOptions(2, peers)); err != nil {
		t.Fatal(err)
	}
	t1.Send(2, []byte("before"))
	waitFor(t, "the first message", 10*time.Second, func() bool { return r2.has("before") })
	return t1, r1, t2
}

// relisten listens on addr again once a closed transport has let it go.
func relisten(t *testing.T, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	waitFor(t, "the port again", 10*time.Second, func() bool {
		var err error
		l, err = net.Listen("tcp", addr)
		return err == nil
	})
	return l
}

// peerRestarted is two transports, 1 and 2, after 1 sent 2 a message and
// 2 was closed and started again on its address (t2b, r2b): the stream
// from 1 to 2 has broken, with nothing sent since. Both are closed at the
// test's end.
func peerRestarted(t *testing.T) (t1 *Transport, r1 *recorder, t2b *Transport, r2b *recorder) {
	t.Helper()
	lis, peers := listeners(t, 2)
	t1, r1, t2 := connected(t, lis, peers)
	if err := t2.Close(); err != nil {
		t.Fatal(err)
	}
	r2b = &recorder{}
	t2b, err := New(relisten(t, peers[2]), r2b, testOptions(2, peers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t2b.Close() })
	return t1, r1, t2b, r2b
}

// A peer that restarts on the same address gets messages again: the link
// reconnects after its stream breaks.
func TestReconnectAfterPeerRestart(t *testing.T) {
	t1, r1, _, r2b := peerRestarted(t)
	k := 0
	waitFor(t, "a message after the restart", 20*time.Second, func() bool {
		t1.Send(2, fmt.Appendf(nil, "after %d", k))
		k++
		return r2b.count() > 0
	})
	if s := t1.PeerStats(2); s.Connects < 2 {
		t.Errorf("connects %d after a restart", s.Connects)
	}
	waitFor(t, "unreachable reported for the restart", 10*time.Second, func() bool { return r1.unreachableCount(2) > 0 })
}

// TestIdleStreamReconnects: a peer restarts while the stream to it is
// idle (a follower's stream to another follower carries only elections).
// The link sees the stream end and opens the next one by itself, so the
// first message after the restart (a vote, in a group) is delivered, not
// dropped on the dead stream.
func TestIdleStreamReconnects(t *testing.T) {
	t1, _, _, r2b := peerRestarted(t)
	// Nothing sent since the restart: the link reconnects on its own.
	waitFor(t, "a second stream without a message", 20*time.Second, func() bool { return t1.PeerStats(2).Connects >= 2 })
	dropped := t1.PeerStats(2).Dropped
	t1.Send(2, []byte("after"))
	waitFor(t, "the one message after the restart", 20*time.Second, func() bool { return r2b.has("after") })
	if s := t1.PeerStats(2); s.Dropped != dropped {
		t.Errorf("dropped %d, then %d after one send", dropped, s.Dropped)
	}
}

// A client that breaks the header rules is refused with a status naming
// the rule, and nothing is stepped.
func TestHeaderChecks(t *testing.T) {
	trs, recs := group(t, 3, func(o *Options) { o.MaxBatchMsgs = 8 })
	conn, err := grpc.NewClient("passthrough:///"+trs[0].Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ok := func() *peerv1.RaftBatch {
		return &peerv1.RaftBatch{Group: "g1", ClusterId: "c1", From: 2, To: 1, Msgs: [][]byte{[]byte("x")}}
	}
	for _, tc := range []struct {
		name string
		mod  func(*peerv1.RaftBatch)
		code codes.Code
		msg  string
	}{
		{"group", func(b *peerv1.RaftBatch) { b.Group = "g2" }, codes.PermissionDenied, `group "g2"`},
		{"cluster", func(b *peerv1.RaftBatch) { b.ClusterId = "other" }, codes.PermissionDenied, `cluster "other"`},
		{"to", func(b *peerv1.RaftBatch) { b.To = 2 }, codes.PermissionDenied, "for member 2"},
		{"from unknown", func(b *peerv1.RaftBatch) { b.From = 9 }, codes.PermissionDenied, "from member 9"},
		{"from self", func(b *peerv1.RaftBatch) { b.From = 1 }, codes.PermissionDenied, "from member 1"},
		{"too many", func(b *peerv1.RaftBatch) { b.Msgs = make([][]byte, 9) }, codes.InvalidArgument, "9 messages"},
		{"client addr", func(b *peerv1.RaftBatch) { b.FromClientAddr = strings.Repeat("a", 300) }, codes.InvalidArgument, "from_client_addr"},
		{"too large", func(b *peerv1.RaftBatch) { b.Msgs = [][]byte{make([]byte, DefaultMaxMsgSize+1)} }, codes.ResourceExhausted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := peerv1.NewRaftClient(conn).Send(ctx, grpc.MaxCallSendMsgSize(64<<20))
			if err != nil {
				t.Fatal(err)
			}
			b := ok()
			tc.mod(b)
			_ = st.Send(b) // the error, if any, comes from CloseAndRecv
			_, err = st.CloseAndRecv()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	if n := recs[0].count(); n != 0 {
		t.Fatalf("%d messages stepped from refused batches", n)
	}
	// A good batch is counted in the summary; a stepper error is not.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := peerv1.NewRaftClient(conn).Send(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(ok()); err != nil {
		t.Fatal(err)
	}
	sum, err := st.CloseAndRecv()
	if err != nil || sum.GetBatches() != 1 || sum.GetMsgs() != 1 {
		t.Fatalf("summary %v, %v", sum, err)
	}
}

// Plaintext is refused unless every peer and the listener are loopback.
func TestPlaintextLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		peers map[uint64]string
		ok    bool
	}{
		{map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.2:2", 3: "[::1]:3"}, true},
		{map[uint64]string{1: "localhost:1", 2: "127.0.0.1:2"}, true},
		{map[uint64]string{1: "127.0.0.1:1", 2: "10.0.0.2:9191"}, false},
		{map[uint64]string{1: "127.0.0.1:1", 2: "host2:9191"}, false},
		{map[uint64]string{1: "127.0.0.1:1", 2: "[::ffff:127.0.0.1]:9191"}, true},
	} {
		o := testOptions(1, tc.peers)
		err := o.Validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrPlaintextNotLoopback)) {
			t.Errorf("%v: %v", tc.peers, err)
		}
	}
	// A listener on every interface is not loopback either.
	lis := newWildcardListener(t)
	if _, err := New(lis, nil, testOptions(1, map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"})); !errors.Is(err, ErrPlaintextNotLoopback) {
		t.Fatalf("plaintext on %v: %v", lis.Addr(), err)
	}
	for _, o := range []Options{
		{Peers: map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}},                     // no ID
		{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}},                                // alone
		{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1"}},                // no port
		{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1", 0: "127.0.0.1:2"}},              // id 0
		{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}, TLS: &TLS{}}, // half TLS
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v validated", o)
		}
	}
}

// sidecar stands in for a service mesh's proxy in front of a member
// whose process is gone: it takes the connection and the stream, and
// ends the stream UNAVAILABLE at once (Envoy's "upstream connect error").
type sidecar struct{ peerv1.UnimplementedRaftServer }

func (sidecar) Send(grpc.ClientStreamingServer[peerv1.RaftBatch, peerv1.SendSummary]) error {
	return status.Error(codes.Unavailable, "upstream connect error or disconnect/reset before headers")
}

// serveSidecar serves a sidecar on l until the test ends.
func serveSidecar(t *testing.T, l net.Listener) { serveRaft(t, l, sidecar{}) }

// gate stands in for a mesh's sidecar in front of a member that is alive
// but that this one cannot reach: it takes each stream and ends it
// UNAVAILABLE when the test lets it, one stream per value on release.
type gate struct {
	peerv1.UnimplementedRaftServer
	release chan struct{}
}

func (g gate) Send(st grpc.ClientStreamingServer[peerv1.RaftBatch, peerv1.SendSummary]) error {
	select {
	case <-g.release:
		return status.Error(codes.Unavailable, "upstream connect error or disconnect/reset before headers")
	case <-st.Context().Done():
		return st.Context().Err()
	}
}

// serveRaft serves srv as the Raft service on l until the test ends.
func serveRaft(t *testing.T, l net.Listener, srv peerv1.RaftServer) {
	s := grpc.NewServer()
	peerv1.RegisterRaftServer(s, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
}

// heardFrom has from send to's transport messages tagged tag until to's
// recorder has one (from is up and heard: link.run).
func heardFrom(t *testing.T, tag string, from *Transport, toID uint64, to *recorder) {
	t.Helper()
	k := 0
	waitFor(t, "a message "+tag, 20*time.Second, func() bool {
		from.Send(toID, fmt.Appendf(nil, "%s %d", tag, k))
		k++
		return slices.ContainsFunc(to.all(), func(b []byte) bool { return strings.HasPrefix(string(b), tag+" ") })
	})
}

// TestPeerGone: a peer that was heard from and whose process is gone is
// reported gone once, however many attempts fail after that, whether its
// port refuses the next connection or a sidecar in front of it takes the
// stream and ends it at once; back, heard from and gone again, once more.
// A peer never heard from (behind the sidecar from the start, so not even
// its stream's hello arrives) is reported unreachable, never gone.
func TestPeerGone(t *testing.T) {
	lis, peers := listeners(t, 3)
	serveSidecar(t, lis[2])
	t1, r1, t2 := connected(t, lis, peers)
	heardFrom(t, "from 2", t2, 1, r1)
	if n := r1.goneCount(2); n != 0 {
		t.Fatalf("peer 2 reported gone %d times while up", n)
	}
	if err := t2.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "peer 2 gone (its port refuses)", 10*time.Second, func() bool { return r1.goneCount(2) == 1 })
	u := r1.unreachableCount(2)
	waitFor(t, "three more refused attempts", 10*time.Second, func() bool { return r1.unreachableCount(2) >= u+3 })
	if n := r1.goneCount(2); n != 1 {
		t.Fatalf("peer 2 reported gone %d times for one loss", n)
	}

	r2b := &recorder{}
	t2b, err := New(relisten(t, peers[2]), r2b, testOptions(2, peers))
	if err != nil {
		t.Fatal(err)
	}
	heardFrom(t, "to 2b", t1, 2, r2b)
	heardFrom(t, "from 2b", t2b, 1, r1)
	if err := t2b.Close(); err != nil {
		t.Fatal(err)
	}
	serveSidecar(t, relisten(t, peers[2]))
	waitFor(t, "peer 2 gone again (behind a sidecar)", 10*time.Second, func() bool { return r1.goneCount(2) == 2 })

	waitFor(t, "peer 3 unreachable", 10*time.Second, func() bool { return r1.unreachableCount(3) >= 3 })
	if n := r1.goneCount(3); n != 0 {
		t.Fatalf("peer 3, never heard from, reported gone %d times", n)
	}
}

// TestPeerNotGoneWhileHeard: 1's way to 2 fails (a sidecar in front of 2
// ends every stream 1 opens) while 2's own messages still reach 1: 2 is
// alive, and is not reported gone however many of 1's attempts fail. The
// steps go in lockstep, so that nothing depends on how fast either side
// runs: 1 has a message from 2 before each attempt is let fail (the gate),
// and that attempt's report is in before the next message. Every attempt
// ends within MaxBackoff (a minute), so each counts towards the two short
// ones of link.run's rule; only 2 being heard keeps 1 from reporting it
// gone at the second.
func TestPeerNotGoneWhileHeard(t *testing.T) {
	lis, peers := listeners(t, 2)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := gate{release: make(chan struct{})}
	serveRaft(t, gl, g)
	o1 := testOptions(1, map[uint64]string{1: peers[1], 2: gl.Addr().String()})
	o1.MaxBackoff = time.Minute
	r1, r2 := &recorder{}, &recorder{}
	t1, err := New(lis[0], r1, o1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t1.Close() })
	t2, err := New(lis[1], r2, testOptions(2, peers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t2.Close() })

	u := r1.unreachableCount(2) // 1's first attempt is held by the gate: nothing reported yet
	const attempts = 4
	for k := 1; k <= attempts; k++ {
		heardFrom(t, fmt.Sprintf("heard before attempt %d", k), t2, 1, r1)
		select {
		case g.release <- struct{}{}:
		case <-time.After(20 * time.Second):
			t.Fatalf("1's attempt %d to reach 2 never came", k)
		}
		waitFor(t, fmt.Sprintf("attempt %d reported unreachable", k), 20*time.Second, func() bool { return r1.unreachableCount(2) >= u+k })
		// reportLoop tells a gone right after the unreachable of the
		// same attempt, before it looks at the next: the gone of any
		// attempt before this one shows by now.
		if n := r1.goneCount(2); n != 0 {
			t.Fatalf("peer 2, heard from before every attempt, reported gone %d times by attempt %d", n, k)
		}
	}
}
