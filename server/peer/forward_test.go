package peer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// putRecorder is a PutHandler that keeps what it was given and answers
// with answer (or err).
type putRecorder struct {
	mu     sync.Mutex
	got    []*peerv1.ForwardPutRequest
	answer *peerv1.ForwardPutResponse
	err    error
}

func (r *putRecorder) ForwardedPut(_ context.Context, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, proto.Clone(req).(*peerv1.ForwardPutRequest))
	return r.answer, r.err
}

func (r *putRecorder) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func forwardReq(body []byte) *peerv1.ForwardPutRequest {
	return &peerv1.ForwardPutRequest{BornHost: "127.0.0.1:4242", Put: &peerv1.ForwardPutRequest_Message{
		Message: &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: body}}}}
}

// errorInfo is err's storaged ErrorInfo, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// TestForwardPut: a member forwards a put to another, which hands it,
// with the header filled in, to its PutHandler and returns the answer,
// or the handler's status with its details unchanged. Before a handler
// is set the put is refused (NOT_FORWARDED); an unknown member, a put
// over the size bound and a member whose connection is down send
// nothing; a member of another cluster is refused (FORWARD_REFUSED).
func TestForwardPut(t *testing.T) {
	trs, _ := group(t, 3, func(o *Options) { o.MaxMsgSize = 256 << 10 })
	ctx := context.Background()

	_, err := trs[0].ForwardPut(ctx, 2, forwardReq([]byte("early")))
	if info := errorInfo(err); status.Code(err) != codes.Unavailable || info.GetMetadata()["cause"] != "NOT_FORWARDED" {
		t.Fatalf("before a handler: %v", err)
	}

	h := &putRecorder{answer: &peerv1.ForwardPutResponse{Result: &peerv1.ForwardPutResponse_Message{
		Message: &storagedv1.PutMessageResponse{Status: storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK,
			Result: &storagedv1.AppendResult{QueueOffset: 41}}}}}
	trs[1].SetPutHandler(h)
	resp, err := trs[0].ForwardPut(ctx, 2, forwardReq([]byte("one")))
	if err != nil || resp.GetMessage().GetResult().GetQueueOffset() != 41 {
		t.Fatalf("forwarded put: %v %v", resp, err)
	}
	got := h.got[0]
	if got.GetGroup() != "g1" || got.GetClusterId() != "c1" || got.GetFrom() != 1 || got.GetTo() != 2 ||
		got.GetBornHost() != "127.0.0.1:4242" || !bytes.Equal(got.GetMessage().GetMessage().GetBody(), []byte("one")) {
		t.Fatalf("the leader got %v", got)
	}

	// The handler's refusal comes back as it is.
	st, _ := status.New(codes.Unavailable, "not the leader").WithDetails(&errdetails.ErrorInfo{Reason: "SERVICE_NOT_AVAILABLE",
		Domain: "storaged", Metadata: map[string]string{"cause": "NOT_LEADER", "leader_id": "3"}})
	h.mu.Lock()
	h.err = st.Err()
	h.mu.Unlock()
	_, err = trs[0].ForwardPut(ctx, 2, forwardReq([]byte("two")))
	if info := errorInfo(err); status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "not the leader" ||
		info.GetMetadata()["cause"] != "NOT_LEADER" || info.GetMetadata()["leader_id"] != "3" {
		t.Fatalf("the leader's refusal came back as %v (%v)", err, info)
	}

	calls := h.calls()
	if _, err := trs[0].ForwardPut(ctx, 9, forwardReq([]byte("x"))); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("to an unknown member: %v", err)
	}
	if _, err := trs[0].ForwardPut(ctx, 2, forwardReq(make([]byte, 300<<10))); !errors.Is(err, ErrForwardTooLarge) {
		t.Fatalf("a put over the bound: %v", err)
	}
	if h.calls() != calls {
		t.Fatal("a put that was not to be sent reached the leader")
	}
	if sent, _ := trs[0].Forwarded(); sent != 3 {
		t.Fatalf("member 1 counts %d puts forwarded, want 3", sent)
	}
	if _, taken := trs[1].Forwarded(); taken != 2 {
		t.Fatalf("member 2 counts %d forwarded puts taken, want 2", taken)
	}

	// A member of another cluster, at member 2's address.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := testOptions(1, map[uint64]string{1: lis.Addr().String(), 2: trs[0].opts.Peers[2]})
	o.ClusterID = "c2"
	foreign, err := New(lis, &recorder{}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { foreign.Close() })
	_, err = foreign.ForwardPut(ctx, 2, forwardReq([]byte("foreign")))
	if info := errorInfo(err); status.Code(err) != codes.PermissionDenied || info.GetReason() != "FORWARD_REFUSED" {
		t.Fatalf("from another cluster: %v", err)
	}
	if h.calls() != calls {
		t.Fatal("a foreign put reached the handler")
	}

	// Member 3 stops: once its connection is seen failing, nothing is sent.
	if err := trs[2].Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "member 3's connection seen down", 30*time.Second, func() bool {
		_, err := trs[0].ForwardPut(ctx, 3, forwardReq([]byte("down")))
		return errors.Is(err, ErrPeerDown)
	})
}
