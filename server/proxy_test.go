package server

import (
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
	ps := &pullSignal{Store: st, started: make(chan struct{}, 16)}
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
