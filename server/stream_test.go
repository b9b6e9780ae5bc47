package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// streamResult collects the answers of a PutMessageStream.
type streamResult struct {
	acks map[uint64]*storagedv1.PutMessageStreamResponse
	dups []uint64
	err  error // the stream's final error (nil when it ended with OK)
}

// recvAll receives answers until the stream ends.
func recvAll(stream grpc.BidiStreamingClient[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]) streamResult {
	r := streamResult{acks: map[uint64]*storagedv1.PutMessageStreamResponse{}}
	for {
		ack, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.err = err
			}
			return r
		}
		if _, ok := r.acks[ack.GetRequestId()]; ok {
			r.dups = append(r.dups, ack.GetRequestId())
		}
		r.acks[ack.GetRequestId()] = ack
	}
}

func streamMsg(id uint64, m *storagedv1.Message) *storagedv1.PutMessageStreamRequest {
	return &storagedv1.PutMessageStreamRequest{RequestId: id, Message: m}
}

// TestPutMessageStreamManyInFlight: one stream, many messages sent without
// waiting; each request id is answered exactly once with the same result a
// unary put gives, the stream ends OK after CloseSend, and every message
// reads back.
func TestPutMessageStreamManyInFlight(t *testing.T) {
	for _, mode := range []storage.FlushMode{storage.FlushAsync, storage.FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			client, _, _ := storeServer(t, func(o *storage.Options) { o.FlushMode = mode })
			stream, err := client.PutMessageStream(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			const n = 2000 // several times the window
			done := make(chan streamResult, 1)
			go func() { done <- recvAll(stream) }()
			for i := range n {
				id := uint64(1000 + i*3) // arbitrary client ids
				if err := stream.Send(streamMsg(id, &storagedv1.Message{Topic: "s", QueueId: int32(i % 4),
					Body: fmt.Appendf(nil, "body-%d", id), Tags: "t"})); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("stream ended with %v", r.err)
			}
			if len(r.acks) != n || len(r.dups) != 0 {
				t.Fatalf("%d answers for %d messages, duplicates %v", len(r.acks), n, r.dups)
			}
			perQueue := map[int32]map[int64]bool{}
			for i := range n {
				id := uint64(1000 + i*3)
				ack := r.acks[id]
				if ack == nil {
					t.Fatalf("request %d: no answer", id)
				}
				res := ack.GetResult()
				if ack.GetCode() != 0 || ack.GetReason() != "" || ack.GetErrorMessage() != "" ||
					ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK || res == nil {
					t.Fatalf("request %d: %v", id, ack)
				}
				checkMsgID(t, res.GetMsgId(), res.GetWroteOffset())
				if res.GetQueueId() != int32(i%4) || res.GetMessageCount() != 1 || res.GetStoreTimestamp() == nil {
					t.Fatalf("request %d: result %v", id, res)
				}
				if perQueue[res.GetQueueId()] == nil {
					perQueue[res.GetQueueId()] = map[int64]bool{}
				}
				perQueue[res.GetQueueId()][res.GetQueueOffset()] = true
			}
			for q, offs := range perQueue {
				for off := range int64(n / 4) {
					if !offs[off] {
						t.Fatalf("queue %d: offset %d missing: queue offsets are not dense", q, off)
					}
				}
			}
			// Every message reads back with its body.
			for q := range int32(4) {
				waitDispatched(t, client, "s", q, n/4-1)
				resp, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "s", QueueId: q, MaxMessages: MaxPullMessages})
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range resp.GetMessages() {
					var id uint64
					if _, err := fmt.Sscanf(string(m.GetBody()), "body-%d", &id); err != nil || r.acks[id].GetResult().GetMsgId() != m.GetMsgId() {
						t.Fatalf("queue %d offset %d: body %q, msgId %s", q, m.GetQueueOffset(), m.GetBody(), m.GetMsgId())
					}
				}
			}
		})
	}
}

// TestPutMessageStreamErrorAnswers: bad messages in the middle get error
// answers with the code, reason and status PutMessage would give; the
// messages around them are stored and the stream ends OK.
func TestPutMessageStreamErrorAnswers(t *testing.T) {
	client, _, _ := storeServer(t, nil)
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan streamResult, 1)
	go func() { done <- recvAll(stream) }()
	bad := map[uint64]*storagedv1.Message{
		3:  {Topic: "s", Body: nil},                                                          // no body
		5:  {Topic: "../etc", Body: []byte("x")},                                             // bad topic
		7:  nil,                                                                              // no message
		9:  {Topic: "s", Body: make([]byte, testMaxMessageSize+1)},                           // too large: refused by the store
		11: {Topic: "s", Body: []byte("x"), Properties: map[string]string{"TAGS": "forged"}}, // reserved property
	}
	const n = 14
	for i := range uint64(n) {
		m, isBad := bad[i]
		if !isBad {
			m = &storagedv1.Message{Topic: "s", Body: fmt.Appendf(nil, "ok-%d", i)}
		}
		if err := stream.Send(streamMsg(i, m)); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.acks) != n || len(r.dups) != 0 {
		t.Fatalf("stream: err %v, %d answers (want %d), duplicates %v", r.err, len(r.acks), n, r.dups)
	}
	for i := range uint64(n) {
		ack := r.acks[i]
		if _, isBad := bad[i]; !isBad {
			if ack.GetCode() != 0 || ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
				t.Errorf("request %d: %v, want PUT_OK", i, ack)
			}
			continue
		}
		if codes.Code(ack.GetCode()) != codes.InvalidArgument || ack.GetReason() != "MESSAGE_ILLEGAL" ||
			ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_MESSAGE_ILLEGAL ||
			ack.GetErrorMessage() == "" || ack.GetResult() != nil {
			t.Errorf("request %d: %v, want INVALID_ARGUMENT, MESSAGE_ILLEGAL, a message and no result", i, ack)
		}
	}
	// The stored ones have consecutive queue offsets: rejected messages took none.
	waitDispatched(t, client, "s", 0, int64(n-len(bad)-1))
	info, err := client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "s"})
	if err != nil || info.GetMaxOffset() != int64(n-len(bad)) {
		t.Errorf("queue info %v, %v; want max %d", info, err, n-len(bad))
	}
}

// gatedStore is the real store behind a gate: each put first reports that
// it entered, then waits for a token (or its context). It counts the puts
// in flight, so a test can see what the server holds at once.
type gatedStore struct {
	*storage.Store
	entered  chan struct{}
	gate     chan struct{}
	inflight atomic.Int64
	peak     atomic.Int64
}

func newGatedStore(st *storage.Store, capacity int) *gatedStore {
	return &gatedStore{Store: st, entered: make(chan struct{}, capacity), gate: make(chan struct{})}
}

func (g *gatedStore) PutMessage(ctx context.Context, m *storage.Message) (storage.PutResult, error) {
	n := g.inflight.Add(1)
	defer g.inflight.Add(-1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return storage.PutResult{Status: storage.UnknownError}, ctx.Err()
	}
	return g.Store.PutMessage(ctx, m)
}

// TestPutMessageStreamBackpressure: the server never holds more than the
// window of one stream's messages; it reads on as answers go out.
func TestPutMessageStreamBackpressure(t *testing.T) {
	const window, n = 8, 60
	st, _ := openStore(t, nil)
	g := newGatedStore(st, n)
	srv := startServer(t, New(g, zerolog.Nop(), WithStreamWindow(window)), GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan streamResult, 1)
	go func() { done <- recvAll(stream) }()
	sendErr := make(chan error, 1)
	go func() { // the client sends everything at once
		for i := range uint64(n) {
			if err := stream.Send(streamMsg(i, &storagedv1.Message{Topic: "bp", Body: []byte("x")})); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()

	entered := 0
	for released := 0; released < n; released++ {
		// Wait until the server holds as many puts as it may, then let one go.
		for entered-released < min(window, n-released) {
			<-g.entered
			entered++
		}
		if in := g.inflight.Load(); in > window {
			t.Fatalf("%d puts in flight, window %d", in, window)
		}
		g.gate <- struct{}{}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.acks) != n {
		t.Fatalf("stream: %v, %d answers, want %d", r.err, len(r.acks), n)
	}
	if p := g.peak.Load(); p != window {
		t.Errorf("peak puts in flight %d, want the window %d", p, window)
	}
}

// TestPutMessageStreamCancel: a client that cancels mid-stream, with puts
// blocked in the store, ends the handler: the server drains gracefully at
// once and no goroutine is left.
func TestPutMessageStreamCancel(t *testing.T) {
	st, _ := openStore(t, nil)
	ignore := goleak.IgnoreCurrent()
	g := newGatedStore(st, 64)
	svc := New(g, zerolog.Nop(), WithStreamWindow(16))
	gs, err := NewGRPCServer(svc, GRPCConfig{MaxMessageSize: testMaxMessageSize})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn := dial(t, lis.Addr().String(), nil) // closed below too; a second Close is harmless
	client := storagedv1.NewMessageStoreServiceClient(conn)

	ctx, cancel := context.WithCancel(t.Context())
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(40) {
		if err := stream.Send(streamMsg(i, &storagedv1.Message{Topic: "c", Body: []byte("x")})); err != nil {
			t.Fatal(err)
		}
	}
	for range 16 { // the window is full: every held put is blocked in the store
		<-g.entered
	}
	cancel()
	if _, err := stream.Recv(); codeOf(err) != codes.Canceled {
		t.Errorf("Recv after cancel: %v, want CANCELLED", err)
	}
	conn.Close()
	if !gs.Shutdown(10 * time.Second) {
		t.Error("graceful stop timed out: the stream handler did not end")
	}
	if err := <-served; err != nil {
		t.Error(err)
	}
	if n := g.inflight.Load(); n != 0 {
		t.Errorf("%d puts still in flight", n)
	}
	goleak.VerifyNone(t, ignore)
}

// TestPutMessageStreamDrain: after Drain, further messages are answered
// UNAVAILABLE (nothing stored) and the stream still ends cleanly.
func TestPutMessageStreamDrain(t *testing.T) {
	st, _ := openStore(t, nil)
	svc := New(st, zerolog.Nop())
	srv := startServer(t, svc, GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(streamMsg(1, &storagedv1.Message{Topic: "d", Body: []byte("before")})); err != nil {
		t.Fatal(err)
	}
	if ack, err := stream.Recv(); err != nil || ack.GetCode() != 0 {
		t.Fatalf("before drain: %v, %v", ack, err)
	}
	svc.Drain()
	if err := stream.Send(streamMsg(2, &storagedv1.Message{Topic: "d", Body: []byte("after")})); err != nil {
		t.Fatal(err)
	}
	ack, err := stream.Recv()
	if err != nil || codes.Code(ack.GetCode()) != codes.Unavailable || ack.GetReason() != "SERVICE_NOT_AVAILABLE" ||
		ack.GetRequestId() != 2 || ack.GetResult() != nil {
		t.Fatalf("after drain: %v, %v; want UNAVAILABLE, SERVICE_NOT_AVAILABLE, no result", ack, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v, want EOF", err)
	}
	if _, maxOff, err := st.QueueInfo("d", 0); err == nil && maxOff > 1 {
		t.Errorf("queue max %d: the message after the drain was stored", maxOff)
	}
}

// TestPutMessageStreamAppendedUnknown: a put that was appended but whose
// sync wait ended with an error is answered with that error and the
// append result, as PutMessage reports it in ErrorInfo metadata.
func TestPutMessageStreamAppendedUnknown(t *testing.T) {
	res := storage.PutResult{Status: storage.UnknownError, Append: storage.AppendResult{Status: storage.AppendOK,
		WroteOffset: 4096, WroteBytes: 100, QueueOffset: 7, MsgNum: 1, StoreHost: testStoreHost, StoreTimestamp: 1_700_000_000_000}}
	srv := startServer(t, New(&fakeStore{res: res, err: context.DeadlineExceeded}, zerolog.Nop()), GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(streamMsg(42, &storagedv1.Message{Topic: "u", Body: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	ack, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if codes.Code(ack.GetCode()) != codes.DeadlineExceeded || ack.GetReason() != "UNKNOWN_ERROR" ||
		ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR ||
		ack.GetResult().GetWroteOffset() != 4096 || ack.GetResult().GetQueueOffset() != 7 {
		t.Fatalf("answer %v: want DEADLINE_EXCEEDED, UNKNOWN_ERROR, the append result", ack)
	}
	checkMsgID(t, ack.GetResult().GetMsgId(), 4096)
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

// TestPutMessageStreamPanic: a panic while putting a stream message (in a
// worker, outside the recovery interceptor's reach) is answered INTERNAL,
// logged, and the stream goes on.
func TestPutMessageStreamPanic(t *testing.T) {
	var logs syncBuffer
	srv := startServer(t, New(&fakeStore{panic: "boom"}, newLogger(&logs)), GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(3) {
		if err := stream.Send(streamMsg(i, &storagedv1.Message{Topic: "p", Body: []byte("x")})); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	r := recvAll(stream)
	if r.err != nil || len(r.acks) != 3 {
		t.Fatalf("stream: %v, %d answers; want OK and 3", r.err, len(r.acks))
	}
	for id, ack := range r.acks {
		if codes.Code(ack.GetCode()) != codes.Internal || ack.GetReason() != "UNKNOWN_ERROR" || ack.GetResult() != nil {
			t.Errorf("request %d: %v, want INTERNAL, UNKNOWN_ERROR", id, ack)
		}
	}
	if !strings.Contains(logs.String(), "recovered a panic while putting a stream message") {
		t.Errorf("panic not logged:\n%s", logs.String())
	}
}
