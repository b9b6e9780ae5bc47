package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/testcert"
	"github.com/storaged/storaged/storage/snapshot"
)

// sendRaw sends one batch claiming to come from member from to the
// transport at addr, as a bare gRPC client, and returns the stream's
// outcome: how a test sees what the handler makes of a sender.
func sendRaw(t *testing.T, addr string, creds credentials.TransportCredentials, from, to uint64, msg string) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := peerv1.NewRaftClient(conn).Send(ctx)
	if err != nil {
		return err
	}
	_ = st.Send(&peerv1.RaftBatch{Group: "g1", ClusterId: "c1", From: from, To: to, Msgs: [][]byte{[]byte(msg)}})
	_, err = st.CloseAndRecv()
	return err
}

func wantCode(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("%s: got %v, want %v containing %q", what, err, code, msg)
	}
}

// stopped reports whether l's goroutine has returned.
func stopped(l *link) bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// A member added while the transport runs gets messages, and its batches
// are taken: before SetPeer they were refused as a stranger's.
func TestSetPeerAdds(t *testing.T) {
	// Members 1 and 2 start as a group of two; member 3 already knows all
	// three (it is the one being added).
	trs, recs := group(t, 3, func(o *Options) {
		if o.ID != 3 {
			o.Peers = map[uint64]string{1: o.Peers[1], 2: o.Peers[2]}
		}
	})
	t1, t3 := trs[0], trs[2]
	addr3 := t3.Addr().String()
	wantCode(t, "member 3 before SetPeer", sendRaw(t, t1.Addr().String(), insecure.NewCredentials(), 3, 1, "early"),
		codes.PermissionDenied, "from member 3")
	t1.Send(3, []byte("not yet")) // dropped: not a peer
	if got := t1.Peers(); !maps.Equal(got, map[uint64]string{2: trs[1].Addr().String()}) {
		t.Fatalf("Peers() = %v before SetPeer", got)
	}

	if err := t1.SetPeer(3, addr3); err != nil {
		t.Fatal(err)
	}
	if got := t1.Peers(); got[3] != addr3 || len(got) != 2 {
		t.Fatalf("Peers() = %v after SetPeer(3, %s)", got, addr3)
	}
	const n = 100
	for k := range n {
		t1.Send(3, fmt.Appendf(nil, "1->3 #%d", k))
	}
	waitFor(t, "member 3's messages", 10*time.Second, func() bool { return recs[2].count() >= n })
	if recs[2].count() != n || !recs[2].has("1->3 #0") || !recs[2].has(fmt.Sprintf("1->3 #%d", n-1)) || recs[2].has("not yet") {
		t.Fatalf("member 3 got %d messages, want the %d sent after SetPeer", recs[2].count(), n)
	}
	if s := t1.PeerStats(3); s.Sent != n || s.Connects != 1 {
		t.Errorf("stats 1->3: %+v", s)
	}

	t3.Send(1, []byte("3->1"))
	waitFor(t, "member 3's message to 1", 10*time.Second, func() bool { return recs[0].has("3->1") })
	if got := t1.ClientAddr(3); got != "127.0.0.1:9003" {
		t.Errorf("member 1 learned client addr %q for member 3", got)
	}
	if err := sendRaw(t, t1.Addr().String(), insecure.NewCredentials(), 3, 1, "raw"); err != nil {
		t.Fatalf("member 3's batch after SetPeer: %v", err)
	}
}

// A removed member gets nothing more, its batches and fetches are
// refused, its link's goroutine is gone when RemovePeer returns, and it
// can be added back.
func TestRemovePeer(t *testing.T) {
	trs, recs := group(t, 3, nil)
	t1 := trs[0]
	addr2 := trs[1].Addr().String()
	t1.Send(2, []byte("warm 1->2"))
	trs[1].Send(1, []byte("warm 2->1"))
	waitFor(t, "the warm-up messages", 10*time.Second, func() bool {
		return recs[1].has("warm 1->2") && recs[0].has("warm 2->1") && t1.ClientAddr(2) != ""
	})

	l := t1.peerLink(2)
	t1.RemovePeer(2)
	if !stopped(l) {
		t.Fatal("the removed link's goroutine still runs after RemovePeer returned")
	}
	if got := t1.Peers(); !maps.Equal(got, map[uint64]string{3: trs[2].Addr().String()}) {
		t.Fatalf("Peers() = %v after RemovePeer(2)", got)
	}
	if s := t1.PeerStats(2); s != (Stats{}) {
		t.Errorf("PeerStats(2) = %+v for a removed member", s)
	}
	if got := t1.ClientAddr(2); got != "" {
		t.Errorf("client addr %q of a removed member", got)
	}

	before, sent, dropped := recs[1].count(), l.sent.Load(), l.dropped.Load()
	for k := range 50 {
		t1.Send(2, fmt.Appendf(nil, "after %d", k))
	}
	// Member 3's link is independent of member 2's: by the time this
	// reaches 3, anything member 2 could still get would long be there.
	t1.Send(3, []byte("fence"))
	waitFor(t, "the fence message", 10*time.Second, func() bool { return recs[2].has("fence") })
	if got := recs[1].count(); got != before || recs[1].has("after 0") {
		t.Fatalf("the removed member got %d messages after RemovePeer, had %d", got, before)
	}
	if l.sent.Load() != sent || l.dropped.Load() != dropped {
		t.Fatalf("the removed link counted sends after RemovePeer: sent %d->%d, dropped %d->%d",
			sent, l.sent.Load(), dropped, l.dropped.Load())
	}

	wantCode(t, "batch from the removed member", sendRaw(t, t1.Addr().String(), insecure.NewCredentials(), 2, 1, "intruder"),
		codes.PermissionDenied, "from member 2")
	rc, err := NewRangeClient(FetchOptions{Addr: t1.Addr().String(), Group: "g1", ClusterID: "c1", From: 2, To: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rc.State(ctx)
	wantCode(t, "state fetch from the removed member", err, codes.PermissionDenied, "from member 2")
	if recs[0].has("intruder") {
		t.Fatal("a removed member's message was stepped")
	}

	// No-ops: unknown, own, already removed.
	t1.RemovePeer(99)
	t1.RemovePeer(1)
	t1.RemovePeer(2)
	if got := t1.Peers(); len(got) != 1 || got[3] == "" {
		t.Fatalf("Peers() = %v after no-op removals", got)
	}

	// Added back, it gets messages again.
	if err := t1.SetPeer(2, addr2); err != nil {
		t.Fatal(err)
	}
	t1.Send(2, []byte("back"))
	waitFor(t, "a message after re-adding", 10*time.Second, func() bool { return recs[1].has("back") })
}

// SetPeer with a new address for a known member moves its traffic there:
// nothing more reaches the old address once SetPeer returns. The same
// address again keeps the working link.
func TestSetPeerMoves(t *testing.T) {
	trs, recs := group(t, 2, nil)
	t1 := trs[0]
	t1.Send(2, []byte("before"))
	waitFor(t, "the first message", 10*time.Second, func() bool { return recs[1].has("before") })

	// Member 2 again, on another port (the old process keeps running, so
	// a message to the old address would still be stepped there).
	l2b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	newAddr := l2b.Addr().String()
	r2b := &recorder{}
	t2b, err := New(l2b, r2b, testOptions(2, map[uint64]string{1: t1.Addr().String(), 2: newAddr}))
	if err != nil {
		t.Fatal(err)
	}
	defer t2b.Close()

	old := t1.peerLink(2)
	if err := t1.SetPeer(2, trs[1].Addr().String()); err != nil {
		t.Fatal(err)
	}
	if t1.peerLink(2) != old || stopped(old) {
		t.Fatal("SetPeer with the same address replaced the link")
	}
	if err := t1.SetPeer(2, newAddr); err != nil {
		t.Fatal(err)
	}
	if !stopped(old) {
		t.Fatal("the old link's goroutine still runs after SetPeer moved the member")
	}
	if got := t1.Peers()[2]; got != newAddr {
		t.Fatalf("Peers()[2] = %q, want %q", got, newAddr)
	}
	oldCount := recs[1].count()
	const n = 50
	for k := range n {
		t1.Send(2, fmt.Appendf(nil, "after %d", k))
	}
	waitFor(t, "the messages at the new address", 10*time.Second, func() bool { return r2b.count() >= n })
	if r2b.count() != n || r2b.has("before") {
		t.Fatalf("the new address got %d messages, want %d", r2b.count(), n)
	}
	if got := recs[1].count(); got != oldCount {
		t.Fatalf("the old address got %d messages after the move", got-oldCount)
	}
	if s := t1.PeerStats(2); s.Sent != n || s.Connects != 1 {
		t.Errorf("stats of the new link: %+v", s)
	}
	t2b.Send(1, []byte("from the new address"))
	waitFor(t, "the moved member's message", 10*time.Second, func() bool { return recs[0].has("from the new address") })
}

// SetPeer holds a member added at run time to Options.Validate's rules,
// ignores this member's own id, and starts nothing after Close.
func TestSetPeerValidation(t *testing.T) {
	trs, _ := group(t, 2, nil)
	t1 := trs[0]
	want := t1.Peers()
	for _, tc := range []struct {
		name  string
		id    uint64
		addr  string
		ok    bool
		isErr error
	}{
		{"id 0", 0, "127.0.0.1:7000", false, nil},
		{"no port", 3, "127.0.0.1", false, nil},
		{"empty", 3, "", false, nil},
		{"plaintext to a remote IP", 3, "10.0.0.3:9191", false, ErrPlaintextNotLoopback},
		{"plaintext to a host name", 3, "host3:9191", false, ErrPlaintextNotLoopback},
		{"own id", 1, "127.0.0.1:7001", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := t1.SetPeer(tc.id, tc.addr)
			if tc.ok != (err == nil) || (tc.isErr != nil && !errors.Is(err, tc.isErr)) {
				t.Fatalf("SetPeer(%d, %q) = %v", tc.id, tc.addr, err)
			}
			if got := t1.Peers(); !maps.Equal(got, want) {
				t.Fatalf("Peers() = %v, want %v", got, want)
			}
		})
	}

	t.Run("after Close", func(t *testing.T) {
		lis, peers := listeners(t, 2)
		lis[1].Close()
		tr, err := New(lis[0], &recorder{}, testOptions(1, peers))
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		if err := tr.SetPeer(3, "127.0.0.1:7003"); !errors.Is(err, ErrClosed) {
			t.Fatalf("SetPeer after Close: %v, want ErrClosed", err)
		}
		if _, ok := tr.Peers()[3]; ok {
			t.Fatal("SetPeer after Close recorded the peer")
		}
		tr.RemovePeer(2) // a no-op, and must not hang
	})
}

// With TLS, a member's certificate is checked against its current
// address: moving it to a host its certificate names lets it in, moving it
// back shuts it out again; a remote address is taken with TLS.
func TestSetPeerTLSIdentity(t *testing.T) {
	ca := testcert.NewCA(t, "group ca")
	cert, _, _ := leaf(t, ca, "127.0.0.1")
	tlsCfg := NewTLS(cert, ca.Pool())
	lis, peers := listeners(t, 2)
	lis[1].Close()
	_, port, _ := net.SplitHostPort(peers[2])
	peers[3] = net.JoinHostPort("localhost", port) // the certificate does not name "localhost"
	o := testOptions(1, peers)
	o.TLS = tlsCfg
	t1, err := New(lis[0], &recorder{}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	addr := t1.Addr().String()

	wantCode(t, "member 3 at localhost", sendRaw(t, addr, creds, 3, 1, "m"), codes.PermissionDenied, "member 3's certificate")
	if err := t1.SetPeer(3, net.JoinHostPort("127.0.0.1", port)); err != nil {
		t.Fatal(err)
	}
	if err := sendRaw(t, addr, creds, 3, 1, "m"); err != nil {
		t.Fatalf("member 3 at 127.0.0.1: %v", err)
	}
	if err := t1.SetPeer(3, peers[3]); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "member 3 back at localhost", sendRaw(t, addr, creds, 3, 1, "m"), codes.PermissionDenied, "member 3's certificate")
	if err := t1.SetPeer(4, "10.1.2.4:9191"); err != nil {
		t.Fatalf("a remote address with TLS: %v", err)
	}
}

// Sends from several goroutines, reads of the peer set, and batches from
// the changing member all run while another goroutine removes, adds and
// moves that member over and over (run with -race). Afterwards the member
// is reachable again.
func TestPeerChangesConcurrent(t *testing.T) {
	trs, recs := group(t, 3, nil)
	t1 := trs[0]
	addr3 := trs[2].Addr().String()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	// Each sender stops at stop or after maxSends (the recorders keep
	// every message they get).
	const maxSends = 10000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range maxSends {
				select {
				case <-stop:
					return
				default:
				}
				t1.Send(uint64(2+k%2), fmt.Appendf(nil, "g%d #%d", g, k))
				if k%64 == 0 {
					_ = t1.PeerStats(3)
					_ = t1.PeerSnapshotStats(3)
					_ = t1.Peers()
					_ = t1.ClientAddr(3)
				}
			}
		}()
	}
	// Member 3 keeps sending to 1, so batches are checked against a
	// membership that changes under them.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := range maxSends {
			select {
			case <-stop:
				return
			default:
			}
			trs[2].Send(1, fmt.Appendf(nil, "3->1 #%d", k))
		}
	}()

	const rounds = 100
	for i := range rounds {
		switch i % 4 {
		case 0:
			t1.RemovePeer(3)
		case 1:
			if err := t1.SetPeer(3, silent.Addr().String()); err != nil {
				t.Error(err)
			}
		case 2:
			if err := t1.SetPeer(3, addr3); err != nil {
				t.Error(err)
			}
		case 3:
			t1.RemovePeer(3)
			if err := t1.SetPeer(3, addr3); err != nil {
				t.Error(err)
			}
		}
	}
	close(stop)
	wg.Wait()

	if got := t1.Peers()[3]; got != addr3 {
		t.Fatalf("Peers()[3] = %q after the last SetPeer(3, %s)", got, addr3)
	}
	t1.Send(3, []byte("settled"))
	waitFor(t, "a message to member 3 after the changes", 10*time.Second, func() bool { return recs[2].has("settled") })
	waitFor(t, "a message from member 2 after the changes", 10*time.Second, func() bool {
		trs[1].Send(1, []byte("2 settled"))
		return recs[0].has("2 settled")
	})
}

// A snapshot in flight ends when either side forgets the other: the
// sender's RemovePeer cancels it, the receiver's refuses its next chunk.
// Either way the receiver discards what it staged and takes nothing.
func TestRemovePeerSnapshot(t *testing.T) {
	for _, side := range []string{"sender", "receiver"} {
		t.Run(side, func(t *testing.T) {
			src, m, _ := snapSource(t, 60)
			t1, t2, recv := snapPair(t, nil)
			out := newOutgoing(src, m)
			paused, release := make(chan struct{}), make(chan struct{})
			out.mutate = func(i int, c *snapshot.Chunk) error {
				if i == 2 {
					<-recv.seen // the receiver has staged a chunk: it has something to discard
					close(paused)
					<-release
				}
				return nil
			}
			t1.SendSnapshot(2, out)
			<-paused
			if side == "sender" {
				t1.RemovePeer(2)
			} else {
				t2.RemovePeer(1)
			}
			close(release)
			err := out.wait(t)
			switch {
			case err == nil:
				t.Fatal("the snapshot was sent to or from a removed member")
			case side == "receiver" && status.Code(err) != codes.PermissionDenied:
				t.Fatalf("send: %v, want PermissionDenied", err)
			}
			waitFor(t, "the receiver's discard", 30*time.Second, func() bool { _, _, d := recv.counts(); return d == 1 })
			if _, f, _ := recv.counts(); f != 0 || t2.SnapshotsReceived() != 0 {
				t.Fatalf("finished %d, taken %d after the removal; want 0, 0", f, t2.SnapshotsReceived())
			}
		})
	}
}
