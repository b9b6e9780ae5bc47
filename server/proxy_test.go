package server

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proxytest"
	"github.com/storaged/storaged/storage"
)

// proxiedServer serves a real store behind haproxy (internal/proxytest)
// and returns a client that dials the proxy, plus the proxy.
func proxiedServer(t *testing.T, st Store, cfg GRPCConfig, opts ...Option) (storagedv1.MessageStoreServiceClient, *proxytest.Proxy) {
	t.Helper()
	srv := startServer(t, New(st, zerolog.Nop(), opts...), cfg)
	srv.SetServing(true)
	p := proxytest.Start(t, srv.addr, proxytest.Options{})
	return storagedv1.NewMessageStoreServiceClient(dial(t, p.Addr, nil)), p
}

// TestThroughProxy: behind an L7 HTTP/2 proxy that terminates the
// connection (haproxy), unary puts and reads, a PutMessageStream, a long
// poll woken by a put and the rich error details (ErrorInfo, BadRequest)
// all arrive intact.
func TestThroughProxy(t *testing.T) {
	proxytest.Path(t) // fail or skip before opening anything
	st, _ := openStore(t, nil)
	ps := &pullSignal{Store: st, started: make(chan pullCall, 16)}
	client, _ := proxiedServer(t, ps, GRPCConfig{})
	ctx := ctxT(t)

	put, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "P", Body: []byte("one"), Tags: "T", Properties: map[string]string{"k": "v"}}})
	if err != nil {
		t.Fatalf("PutMessage through the proxy: %v", err)
	}
	got, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: put.GetResult().GetMsgId()}})
	if err != nil {
		t.Fatalf("GetMessage: %v", err)
	}
	if m := got.GetMessage(); string(m.GetBody()) != "one" || m.GetTags() != "T" || m.GetProperties()["k"] != "v" {
		t.Errorf("read back %v", m)
	}

	// Error details survive the proxy.
	_, err = client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "../x", Body: []byte("x")}})
	d := details(t, err)
	d.want(t, codes.InvalidArgument, storage.MessageIllegal.String(), false)
	if d.badRequest == nil || len(d.badRequest.GetFieldViolations()) == 0 {
		t.Errorf("BadRequest lost behind the proxy: %v", err)
	}

	// A long poll at the end of the queue waits through the proxy and is
	// woken by a put.
	out := startPull(t, client, &storagedv1.PullMessagesRequest{Topic: "P", QueueId: 0, QueueOffset: 1, Wait: durationpb.New(9 * time.Second)})
	<-ps.started // the pull is in the store (waiting, or about to look)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "P", Body: []byte("two")}}); err != nil {
		t.Fatalf("PutMessage: %v", err)
	}
	if o := <-out; o.err != nil || len(o.resp.GetMessages()) != 1 || string(o.resp.GetMessages()[0].GetBody()) != "two" {
		t.Fatalf("long poll through the proxy: %v, %v", o.resp, o.err)
	}

	// A stream: every message answered, then OK.
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		if err := stream.Send(streamMsg(uint64(i), &storagedv1.Message{Topic: "S", Body: []byte("s")})); err != nil {
			t.Fatal(err)
		}
	}
	stream.CloseSend()
	res := recvAll(stream)
	if res.err != nil || len(res.acks) != n {
		t.Fatalf("stream through the proxy: %d answers, err %v", len(res.acks), res.err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after the end: %v", err)
	}
}

// TestMaxPullWaitUnderProxyTimeouts: the default long-poll cap stays
// under Envoy's default route timeout (15 s, Istio's too) and RocketMQ's
// 15 s pull suspension; a longer wait is lowered to the cap, which
// WithMaxPullWait moves.
func TestMaxPullWaitUnderProxyTimeouts(t *testing.T) {
	const envoyRouteTimeout = 15 * time.Second
	if DefaultMaxPullWait >= envoyRouteTimeout {
		t.Fatalf("DefaultMaxPullWait %v is not under the proxies' %v", DefaultMaxPullWait, envoyRouteTimeout)
	}
	req := &storagedv1.PullMessagesRequest{Topic: "w", Wait: durationpb.New(time.Minute)}
	for _, tc := range []struct {
		opts []Option
		want time.Duration
	}{{nil, DefaultMaxPullWait}, {[]Option{WithMaxPullWait(3 * time.Second)}, 3 * time.Second}} {
		pr, err := New(&fakeStore{}, zerolog.Nop(), tc.opts...).toPullRequest(t.Context(), req)
		if err != nil || pr.Wait != tc.want {
			t.Errorf("wait of 1 min with %d options: %v, %v; want %v", len(tc.opts), pr.Wait, err, tc.want)
		}
	}
}

// TestIdempotentPutOverGRPC: a plain storaged.v1 client makes a put
// idempotent by setting UNIQ_KEY in properties: a retry by PutMessage or
// on a PutMessageStream gets the first put's msgId and offsets and stores
// nothing; a batch is keyed by its first entry's UNIQ_KEY.
func TestIdempotentPutOverGRPC(t *testing.T) {
	client, st, _ := storeServer(t, nil)
	ctx := ctxT(t)
	keyed := &storagedv1.Message{Topic: "I", Body: []byte("once"), Properties: map[string]string{"UNIQ_KEY": "7F0000010F2A18B4AAC2000000000001"}}
	first, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: keyed})
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: keyed})
	if err != nil || again.GetResult().GetMsgId() != first.GetResult().GetMsgId() ||
		again.GetResult().GetQueueOffset() != first.GetResult().GetQueueOffset() || again.GetStatus() != first.GetStatus() {
		t.Fatalf("retry: %v, %v; first %v", again, err, first)
	}
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(streamMsg(1, keyed))
	stream.CloseSend()
	res := recvAll(stream)
	if ack := res.acks[1]; res.err != nil || ack.GetCode() != 0 || ack.GetResult().GetMsgId() != first.GetResult().GetMsgId() {
		t.Fatalf("retry on a stream: %v, %v", ack, res.err)
	}
	batch := &storagedv1.PutMessagesRequest{Topic: "I", Messages: []*storagedv1.BatchEntry{
		{Body: []byte("b0"), Properties: map[string]string{"UNIQ_KEY": "batch-1"}}, {Body: []byte("b1"), Properties: map[string]string{"UNIQ_KEY": "batch-1-1"}}}}
	b1, err := client.PutMessages(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := client.PutMessages(ctx, batch)
	if err != nil || fmt.Sprint(b2.GetResult().GetMsgIds()) != fmt.Sprint(b1.GetResult().GetMsgIds()) {
		t.Fatalf("batch retry: %v, %v; first %v", b2.GetResult().GetMsgIds(), err, b1.GetResult().GetMsgIds())
	}
	if _, maxOff, err := st.QueueInfo("I", 0); err != nil || maxOff != 3 {
		t.Fatalf("queue I holds %d (%v), want 3: one keyed message, one batch of 2", maxOff, err)
	}
}
