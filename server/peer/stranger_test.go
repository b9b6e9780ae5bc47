package peer

import (
	"context"
	"crypto/tls"
	"maps"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/testcert"
)

// openRaw opens a Send stream to addr and sends b as its first batch; the
// stream stays open until the test ends (or the caller closes it).
func openRaw(t *testing.T, addr string, creds credentials.TransportCredentials, b *peerv1.RaftBatch) grpc.ClientStreamingClient[peerv1.RaftBatch, peerv1.SendSummary] {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := peerv1.NewRaftClient(conn).Send(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(b); err != nil {
		t.Fatal(err)
	}
	return st
}

// strangerBatch is a batch to member 1 of the test group from member
// from, naming peerAddr as its own.
func strangerBatch(from uint64, peerAddr, msg string) *peerv1.RaftBatch {
	return &peerv1.RaftBatch{Group: "g1", ClusterId: "c1", From: from, To: 1, FromPeerAddr: peerAddr,
		FromClientAddr: "127.0.0.1:" + strconv.Itoa(9000+int(from)), Msgs: [][]byte{[]byte(msg)}}
}

// A member that missed the addition of member 4 takes 4's stream as a
// stranger's (4 names its peer address in the header) and answers it at
// that address while the stream lasts; SetPeer makes 4 a peer and ends
// the stranger's link; a stream's end ends it too; a removed id, a
// stranger without an address or at a plaintext address off loopback, and
// one stranger beyond the bound are refused, and none of them steps
// anything.
func TestStranger(t *testing.T) {
	lis, peers := listeners(t, 3) // members 1, 2 and (as the listener of) 4
	addr1, addr4 := peers[1], peers[3]
	r1, r2, r4 := &recorder{}, &recorder{}, &recorder{}
	t1, err := New(lis[0], r1, testOptions(1, map[uint64]string{1: addr1, 2: peers[2]}))
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	t2, err := New(lis[1], r2, testOptions(2, map[uint64]string{1: addr1, 2: peers[2]}))
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	// Member 4 knows 1 and itself (it was added, and leads now); 1 does
	// not know 4.
	t4, err := New(lis[2], r4, testOptions(4, map[uint64]string{1: addr1, 4: addr4}))
	if err != nil {
		t.Fatal(err)
	}
	closed4 := false
	defer func() {
		if !closed4 {
			t4.Close()
		}
	}()

	t4.Send(1, []byte("append from 4"))
	waitFor(t, "member 1 stepping a stranger's message", 10*time.Second, func() bool { return r1.has("append from 4") })
	if got := t1.Strangers(); !maps.Equal(got, map[uint64]string{4: addr4}) {
		t.Fatalf("Strangers() = %v, want 4 at %s", got, addr4)
	}
	if got := t1.Peers(); !maps.Equal(got, map[uint64]string{2: peers[2]}) {
		t.Fatalf("Peers() = %v: a stranger is no peer", got)
	}
	if got, want := t1.ClientAddr(4), "127.0.0.1:9004"; got != want {
		t.Fatalf("ClientAddr(4) = %q, want %q (from the stranger's header)", got, want)
	}
	t1.Send(4, []byte("answer to 4"))
	waitFor(t, "member 1's answer at the stranger's address", 10*time.Second, func() bool { return r4.has("answer to 4") })

	// SetPeer makes 4 a peer: its stranger's link goes, the peer's link
	// carries the next answers, and 4's stream goes on.
	if err := t1.SetPeer(4, addr4); err != nil {
		t.Fatal(err)
	}
	if got := t1.Strangers(); len(got) != 0 {
		t.Fatalf("Strangers() = %v after SetPeer(4)", got)
	}
	t1.Send(4, []byte("to peer 4"))
	t4.Send(1, []byte("4 as a peer"))
	waitFor(t, "traffic both ways once 4 is a peer", 10*time.Second, func() bool {
		return r4.has("to peer 4") && r1.has("4 as a peer")
	})

	// Removed: a new stream from 4, naming its address, is refused.
	t1.RemovePeer(4)
	wantCode(t, "a removed member's stream", closeRaw(openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(4, addr4, "removed"))),
		codes.PermissionDenied, "member 4 was removed")
	if r1.has("removed") {
		t.Fatal("a removed member's message was stepped")
	}

	// Stranger 5, a raw stream: the stream's end takes its link with it.
	t5 := openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(5, "127.0.0.1:1", "from 5"))
	waitFor(t, "stranger 5 stepped", 10*time.Second, func() bool { return r1.has("from 5") })
	if _, ok := t1.Strangers()[5]; !ok {
		t.Fatalf("Strangers() = %v while 5 streams", t1.Strangers())
	}
	if _, err := t5.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stranger 5's link gone with its stream", 10*time.Second, func() bool { return len(t1.Strangers()) == 0 })
	if t1.ClientAddr(5) != "" {
		t.Fatalf("ClientAddr(5) = %q once its stream ended", t1.ClientAddr(5))
	}

	// A stranger's new stream replaces its link; the end of the old
	// stream (its handler returns before the caller's CloseAndRecv does)
	// leaves the new link alone.
	a := openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(20, "127.0.0.1:1", "stream a"))
	waitFor(t, "stranger 20's first stream", 10*time.Second, func() bool { return r1.has("stream a") })
	b := openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(20, "127.0.0.1:2", "stream b"))
	waitFor(t, "stranger 20's second stream", 10*time.Second, func() bool { return r1.has("stream b") })
	if got := t1.Strangers(); !maps.Equal(got, map[uint64]string{20: "127.0.0.1:2"}) {
		t.Fatalf("Strangers() = %v with stranger 20's second stream open", got)
	}
	if err := closeRaw(a); err != nil {
		t.Fatal(err)
	}
	if got := t1.Strangers(); !maps.Equal(got, map[uint64]string{20: "127.0.0.1:2"}) {
		t.Fatalf("Strangers() = %v once stranger 20's first stream ended", got)
	}
	if err := closeRaw(b); err != nil {
		t.Fatal(err)
	}
	if got := t1.Strangers(); len(got) != 0 {
		t.Fatalf("Strangers() = %v once both streams ended", got)
	}

	for _, tc := range []struct {
		name, addr, msg string
	}{
		{"no address", "", "no from_peer_addr"},
		{"plaintext off loopback", "10.1.2.3:9191", "plaintext peer traffic"},
		{"not host:port", "nowhere", "missing port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.name, closeRaw(openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(6, tc.addr, "bad "+tc.name))),
				codes.PermissionDenied, tc.msg)
		})
	}

	// The bound: maxStrangers streams stay open, one more is refused.
	for i := range maxStrangers {
		openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(uint64(10+i), "127.0.0.1:1", "bound "+strconv.Itoa(i)))
	}
	waitFor(t, "maxStrangers strangers", 10*time.Second, func() bool { return len(t1.Strangers()) == maxStrangers })
	wantCode(t, "one stranger too many", closeRaw(openRaw(t, addr1, insecure.NewCredentials(), strangerBatch(99, "127.0.0.1:1", "too many"))),
		codes.ResourceExhausted, "streaming already")
	if r1.has("too many") {
		t.Fatal("the stranger beyond the bound was stepped")
	}
	if err := t4.Close(); err != nil {
		t.Fatal(err)
	}
	closed4 = true
	if r2.count() != 0 {
		t.Fatalf("member 2 stepped %d messages: nobody sent it any", r2.count())
	}
}

// closeRaw ends a raw stream and returns its status.
func closeRaw(st grpc.ClientStreamingClient[peerv1.RaftBatch, peerv1.SendSummary]) error {
	_, err := st.CloseAndRecv()
	return err
}

// A stranger over TLS must present a certificate naming the host of the
// address it gives (a certificate from the group's CA for another host
// cannot claim a stranger's place); then it is taken, and a plaintext
// stranger is not even heard.
func TestStrangerTLS(t *testing.T) {
	ca := testcert.NewCA(t, "group ca")
	cert, _, _ := leaf(t, ca, "127.0.0.1")
	lis, peers := listeners(t, 2)
	o1 := testOptions(1, peers)
	o1.TLS = NewTLS(cert, ca.Pool())
	r1 := &recorder{}
	t1, err := New(lis[0], r1, o1)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	lis[1].Close() // member 2 never runs
	addr1 := t1.Addr().String()
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	_, port, _ := net.SplitHostPort(addr1)

	wantCode(t, "a stranger whose certificate does not name its address",
		closeRaw(openRaw(t, addr1, creds, strangerBatch(7, net.JoinHostPort("localhost", port), "wrong host"))),
		codes.PermissionDenied, "member 7's certificate")
	err = sendRaw(t, addr1, insecure.NewCredentials(), 8, 1, "plaintext")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a plaintext stranger: %v, want Unavailable (no TLS handshake)", err)
	}
	if err := closeRaw(openRaw(t, addr1, creds, strangerBatch(9, "127.0.0.1:1", "right host"))); err != nil {
		t.Fatalf("a stranger whose certificate names its address: %v", err)
	}
	if !r1.has("right host") || r1.has("wrong host") || r1.has("plaintext") {
		t.Fatalf("stepped %q: want only the stranger with the right certificate", r1.msgs)
	}
}

// A stranger whose Send stream is open may send a snapshot (a leader this
// member has not heard of, which no longer holds what this member
// misses); without the stream it is refused (TestSnapshotHeaderChecks).
func TestStrangerSnapshot(t *testing.T) {
	src, m, _ := snapSource(t, 10)
	lis, peers := listeners(t, 2)
	recv := &stager{dir: t.TempDir(), seen: make(chan struct{})}
	t1, err := New(lis[0], &recorder{}, testOptions(1, peers))
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	// Member 2 knows itself and a member 3, not 1.
	t2, err := New(lis[1], recv, testOptions(2, map[uint64]string{2: peers[2], 3: "127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	t1.Send(2, []byte("heartbeat"))
	waitFor(t, "member 1 a stranger to 2", 10*time.Second, func() bool { return recv.has("heartbeat") })
	out := newOutgoing(src, m)
	t1.SendSnapshot(2, out)
	if err := out.wait(t); err != nil {
		t.Fatalf("a stranger's snapshot: %v", err)
	}
	if r, f, d := recv.counts(); r != 1 || f != 1 || d != 0 {
		t.Fatalf("received %d, finished %d, discarded %d; want 1, 1, 0", r, f, d)
	}
}
