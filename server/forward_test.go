package server

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// forwardPair is a follower (a store that refuses every put with
// NOT_LEADER naming member 2) served on a real gRPC server, forwarding
// through a real peer transport to member 2: a Service over a real store,
// whose transport takes the forwarded puts.
type forwardPair struct {
	follower storagedv1.MessageStoreServiceClient
	leader   *storage.Store
	// clientAddr is the follower's client connection's local address:
	// the born host the leader must record.
	clientAddr atomic.Pointer[netip.AddrPort]
}

// notLeader is a follower's refusal naming member 2.
var notLeader = &fakeStore{res: storage.PutResult{Status: storage.ServiceNotAvailable},
	err: &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 2, Term: 3}}

func leaderAddrs(id uint64) string { return map[uint64]string{2: "127.0.0.1:9092"}[id] }

func newForwardPair(t *testing.T, wrap func(Forwarder) Forwarder) *forwardPair {
	t.Helper()
	return newForwardPairTo(t, wrap, nil)
}

// newForwardPairTo is newForwardPair with leader as member 2's Service
// (nil: a Service over a real store, forwardPair.leader).
func newForwardPairTo(t *testing.T, wrap func(Forwarder) Forwarder, leader *Service) *forwardPair {
	t.Helper()
	lis := make([]net.Listener, 2)
	peers := map[uint64]string{}
	for i := range lis {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i], peers[uint64(i+1)] = l, l.Addr().String()
	}
	trs := make([]*peer.Transport, 2)
	for i := range trs {
		tr, err := peer.New(lis[i], nil, peer.Options{Group: "g", ClusterID: "c", ID: uint64(i + 1), Peers: peers})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[i] = tr
	}
	p := &forwardPair{}
	if leader == nil {
		p.leader, _ = openStore(t, nil)
		leader = New(p.leader, zerolog.Nop())
	}
	trs[1].SetPutHandler(leader)
	var fwd Forwarder = trs[0]
	if wrap != nil {
		fwd = wrap(fwd)
	}
	srv := startServer(t, New(fakeOffsetStore{notLeader}, zerolog.Nop(), WithForwarder(fwd), WithReplication(func() ReplicaInfo {
		return ReplicaInfo{ID: 1, LeaderID: 2, Role: RoleFollower}
	}, leaderAddrs)), GRPCConfig{})
	conn, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				ap := c.LocalAddr().(*net.TCPAddr).AddrPort()
				p.clientAddr.Store(&ap)
			}
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.follower = storagedv1.NewMessageStoreServiceClient(conn)
	return p
}

// TestForwardedPuts: a follower with a Forwarder hands PutMessage,
// PutMessages, each PutMessageStream message and CommitOffset to the
// leader, through
// the peer transport, and answers with what the leader stored (with the
// client's address as born host); the leader's records are the ones
// acknowledged.
func TestForwardedPuts(t *testing.T) {
	p := newForwardPair(t, nil)
	ctx := ctxT(t)
	resp, err := p.follower.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("one")}})
	if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		t.Fatalf("PutMessage through the follower: %v %v", resp, err)
	}
	rec, err := p.leader.GetMessage(resp.GetResult().GetWroteOffset())
	if err != nil || string(rec.Body) != "one" || rec.BornHost != *p.clientAddr.Load() {
		t.Fatalf("the leader holds %+v (%v), want body one born at %v", rec, err, *p.clientAddr.Load())
	}
	bresp, err := p.follower.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "T",
		Messages: []*storagedv1.BatchEntry{{Body: []byte("b0")}, {Body: []byte("b1")}}})
	if err != nil || bresp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK || bresp.GetResult().GetQueueOffset() != 1 {
		t.Fatalf("PutMessages through the follower: %v %v", bresp, err)
	}
	st, err := p.follower.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&storagedv1.PutMessageStreamRequest{RequestId: 7, Message: &storagedv1.Message{Topic: "T", Body: []byte("s")}}); err != nil {
		t.Fatal(err)
	}
	ack, err := st.Recv()
	if err != nil || ack.GetCode() != 0 || ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK ||
		ack.GetResult().GetQueueOffset() != 3 || ack.GetRequestId() != 7 {
		t.Fatalf("stream through the follower: %v %v", ack, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
	if _, max, err := p.leader.QueueInfo("T", 0); err != nil || max != 4 {
		t.Fatalf("the leader's queue holds %d messages (%v), want 4", max, err)
	}
	if _, err := p.follower.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 3}); err != nil {
		t.Fatalf("CommitOffset through the follower: %v", err)
	}
	if off, err := p.leader.GetOffset("g", "T", 0); err != nil || off != 3 {
		t.Fatalf("the leader's committed offset %d (%v), want 3", off, err)
	}
}

// faultForwarder fails every forward with err (fault injection on the
// real transport's seam) and counts the calls.
type faultForwarder struct {
	err   error
	calls atomic.Int32
}

func (f *faultForwarder) ForwardPut(context.Context, uint64, *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	f.calls.Add(1)
	return nil, f.err
}

// TestForwardFailures: what the client is told when a forward does not
// reach the leader's answer. Nothing sent (no route, the leader's
// connection down, too large): the follower's own refusal, nothing
// stored. The leader's own status: passed on unchanged. A call that
// failed in transit: DEADLINE_EXCEEDED, FLUSH_SLAVE_TIMEOUT, cause
// FORWARD_FAILED, outcome unknown (in a stream: code 4 with that
// reason). A refusal that names no leader is not forwarded, and a
// forwarded put is never forwarded again.
func TestForwardFailures(t *testing.T) {
	leaderRefusal, _ := status.New(codes.InvalidArgument, "bad topic").WithDetails(
		&errdetails.ErrorInfo{Reason: "MESSAGE_ILLEGAL", Domain: ErrorDomain})
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason string
		md     map[string]string
	}{
		{"no route", peer.ErrNoRoute, codes.Unavailable, ReasonUnavailable, map[string]string{"cause": "NOT_LEADER", "leader_id": "2"}},
		{"peer down", peer.ErrPeerDown, codes.Unavailable, ReasonUnavailable, map[string]string{"cause": "NOT_LEADER"}},
		{"too large", peer.ErrForwardTooLarge, codes.Unavailable, ReasonUnavailable, map[string]string{"cause": "NOT_LEADER"}},
		{"leader's refusal", leaderRefusal.Err(), codes.InvalidArgument, "MESSAGE_ILLEGAL", nil},
		{"in transit", status.Error(codes.Unavailable, "connection reset"), codes.DeadlineExceeded, "FLUSH_SLAVE_TIMEOUT",
			map[string]string{"cause": CauseForwardFailed, "outcome": "unknown", "leader_id": "2", "leader_addr": "127.0.0.1:9092"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &faultForwarder{err: tc.err}
			p := newForwardPair(t, func(Forwarder) Forwarder { return f })
			ctx := ctxT(t)
			_, err := p.follower.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("x")}})
			d := details(t, err)
			if d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
				t.Fatalf("PutMessage: %v %q (%s), want %v %s", d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, tc.reason)
			}
			for k, v := range tc.md {
				if d.info.GetMetadata()[k] != v {
					t.Errorf("metadata %s = %q, want %q (%v)", k, d.info.GetMetadata()[k], v, d.info.GetMetadata())
				}
			}
			_, err = p.follower.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "T", Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}}})
			if d := details(t, err); d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
				t.Fatalf("PutMessages: %v %q", d.st.Code(), d.info.GetReason())
			}
			st, err := p.follower.PutMessageStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&storagedv1.PutMessageStreamRequest{RequestId: 1, Message: &storagedv1.Message{Topic: "T", Body: []byte("s")}}); err != nil {
				t.Fatal(err)
			}
			ack, err := st.Recv()
			if err != nil || codes.Code(ack.GetCode()) != tc.code || ack.GetReason() != tc.reason {
				t.Fatalf("stream: %v %v, want code %v reason %s", ack, err, tc.code, tc.reason)
			}
			_, err = p.follower.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 3})
			if d := details(t, err); d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
				t.Fatalf("CommitOffset: %v %q", d.st.Code(), d.info.GetReason())
			}
			if f.calls.Load() != 4 {
				t.Fatalf("%d forwards, want 4", f.calls.Load())
			}
			if _, max, _ := p.leader.QueueInfo("T", 0); max != 0 {
				t.Fatalf("the leader stored %d messages", max)
			}
		})
	}

	// No leader named: nothing to forward to.
	f := &faultForwarder{}
	srv := startServer(t, New(&fakeStore{res: storage.PutResult{Status: storage.ServiceNotAvailable},
		err: &storage.NotLeaderError{Cause: CauseNoLeader, Term: 3}}, zerolog.Nop(), WithForwarder(f)), GRPCConfig{})
	c := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	_, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("x")}})
	if d := details(t, err); d.st.Code() != codes.Unavailable || d.info.GetMetadata()["cause"] != "NO_LEADER" || f.calls.Load() != 0 {
		t.Fatalf("without a leader: %v, %d forwards", err, f.calls.Load())
	}

	// A forwarded put reaching a member that is no longer the leader: its
	// refusal goes back, it is not forwarded again.
	svc := New(notLeader, zerolog.Nop(), WithForwarder(f))
	_, err = svc.ForwardedPut(ctxT(t), &peerv1.ForwardPutRequest{BornHost: "127.0.0.1:1", Put: &peerv1.ForwardPutRequest_Message{
		Message: &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("x")}}}})
	if d := details(t, err); d.st.Code() != codes.Unavailable || d.info.GetMetadata()["cause"] != "NOT_LEADER" || f.calls.Load() != 0 {
		t.Fatalf("a forwarded put on a follower: %v, %d forwards", err, f.calls.Load())
	}
}

// TestForwardedStreamAppendedUnknown: a stream message the leader appended
// but could not see committed in time (FLUSH_SLAVE_TIMEOUT, outcome
// unknown) is answered through a follower exactly as the leader's own
// stream answers it: the same code and reason, and the same AppendResult
// (where it was written), which the leader's error carries in its
// ErrorInfo metadata.
func TestForwardedStreamAppendedUnknown(t *testing.T) {
	appended := &fakeStore{err: storage.ErrReplicationTimeout, res: storage.PutResult{Status: storage.FlushSlaveTimeout,
		Append: storage.AppendResult{Status: storage.AppendOK, WroteOffset: 1<<32 + 4096, WroteBytes: 180, QueueID: 2, QueueOffset: 17,
			MsgNum: 1, StoreTimestamp: 1764800000123, StoreHost: testStoreHost, Offsets: []int64{1<<32 + 4096}}}}
	leader := New(appended, zerolog.Nop())
	streamAck := func(c storagedv1.MessageStoreServiceClient) *storagedv1.PutMessageStreamResponse {
		t.Helper()
		st, err := c.PutMessageStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&storagedv1.PutMessageStreamRequest{RequestId: 9, Message: &storagedv1.Message{Topic: "T", Body: []byte("s")}}); err != nil {
			t.Fatal(err)
		}
		ack, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	want := streamAck(storagedv1.NewMessageStoreServiceClient(dial(t, startServer(t, leader, GRPCConfig{}).addr, nil)))
	got := streamAck(newForwardPairTo(t, nil, leader).follower)
	if codes.Code(want.GetCode()) != codes.DeadlineExceeded || want.GetResult() == nil {
		t.Fatalf("the leader's own stream answered %v", want)
	}
	if got.GetCode() != want.GetCode() || got.GetReason() != want.GetReason() || got.GetStatus() != want.GetStatus() ||
		!proto.Equal(got.GetResult(), want.GetResult()) {
		t.Fatalf("forwarded:\n %v\nthe leader's own stream:\n %v", got, want)
	}
}

// TestAppendResultOf: a leader error without the appended fields (nothing
// stored, or a leader that does not send them) rebuilds no result.
func TestAppendResultOf(t *testing.T) {
	full := map[string]string{"stored": "unknown", "msg_id": "7F00000100002A9F0000000000001000", "wrote_offset": "4096",
		"wrote_bytes": "180", "queue_id": "2", "queue_offset": "17", "message_count": "1", "store_timestamp_ms": "1764800000123"}
	if r := appendResultOf(full); r.GetWroteOffset() != 4096 || r.GetStoreTimestamp().AsTime().UnixMilli() != 1764800000123 {
		t.Fatalf("full metadata: %v", r)
	}
	for _, k := range []string{"stored", "msg_id", "wrote_offset", "store_timestamp_ms"} {
		md := maps.Clone(full)
		delete(md, k)
		if r := appendResultOf(md); r != nil {
			t.Errorf("without %s: %v, want none", k, r)
		}
	}
	md := maps.Clone(full)
	md["queue_id"] = "99999999999"
	if r := appendResultOf(md); r != nil {
		t.Errorf("queue_id out of range: %v, want none", r)
	}
}
