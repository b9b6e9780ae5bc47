package server

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestMarshalReadRoundTrip: the codec's encoding of read answers, with
// bodies and raw records by reference, decodes to the same message, and
// large bodies are not copied.
func TestMarshalReadRoundTrip(t *testing.T) {
	raw := bytes.Repeat([]byte("r"), 5000)
	big := raw[100:4100] // a body aliases its raw record, as the store's do
	stored := func(body, raw []byte, props map[string]string) *storagedv1.StoredMessage {
		return &storagedv1.StoredMessage{Topic: "T", QueueId: 3, QueueOffset: 7, CommitLogOffset: 1 << 40, MsgId: "AB",
			Body: body, Raw: raw, Flag: -1, Tags: "t", Properties: props, BornTimestamp: timestamppb.New(time.UnixMilli(1700000000123)),
			StoreTimestamp: timestamppb.New(time.UnixMilli(1700000000123)), BornHost: "127.0.0.1:1", StoreHost: "[::1]:2", SysFlag: 4,
			ReconsumeTimes: 1, StoreSize: 5000, BodyCrc: 99}
	}
	for _, tc := range []struct {
		name string
		msg  proto.Message
	}{
		{"pull, big body and raw", &storagedv1.PullMessagesResponse{Messages: []*storagedv1.StoredMessage{
			stored(big, raw, map[string]string{"TAGS": "t", "a": "b"}), stored([]byte("small"), nil, nil), stored(nil, nil, nil),
			stored(big, nil, nil)}, NextOffset: 9, MinOffset: 1, MaxOffset: 12}},
		{"pull, empty", &storagedv1.PullMessagesResponse{MaxOffset: 3}},
		{"pull, zero", &storagedv1.PullMessagesResponse{}},
		{"get, big raw", &storagedv1.GetMessageResponse{Message: stored(big, raw, nil)}},
		{"get, small", &storagedv1.GetMessageResponse{Message: stored([]byte("x"), []byte("y"), nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := proto.Clone(tc.msg)
			out, err := newCodec(nil).Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(tc.msg, want) {
				t.Fatal("Marshal changed the message")
			}
			if got, want := out.Len(), proto.Size(want); got != want {
				t.Errorf("encoded %d bytes, proto.Size says %d", got, want)
			}
			got := want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(out.Materialize(), got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("round trip:\n got %v\nwant %v", got, want)
			}
			if bytes.Contains(out.Materialize(), big) && !references(out, big) {
				t.Error("the 4000-byte body was copied, not referenced")
			}
			out.Free()
		})
	}
}

// references reports whether one of out's buffers is b's memory.
func references(out mem.BufferSlice, b []byte) bool {
	for _, buf := range out {
		d := buf.ReadOnlyData()
		if len(d) == len(b) && unsafe.SliceData(d) == unsafe.SliceData(b) {
			return true
		}
	}
	return false
}

// TestPullInflightLimit: pulls whose answers are held (their client does
// not read them, so HTTP/2 flow control keeps them in the server) hold the
// in-flight read limit; while they do, further maximal pulls and
// GetMessage are RESOURCE_EXHAUSTED (SYSTEM_BUSY) with a RetryInfo and
// read nothing; once the held answers are read, everything is released
// and later pulls succeed. Through the real gRPC server.
func TestPullInflightLimit(t *testing.T) {
	const (
		body     = 200 << 10
		maxBytes = 1 << 20 // five records
		held     = 3
	)
	st, _ := openStore(t, func(o *storage.Options) { o.FileSize = 8 << 20; o.MaxMessageSize = 256 << 10 })
	svc := New(st, zerolog.Nop(), WithMaxPullInflightBytes(held*maxBytes), WithMaxMessageSize(256<<10))
	srv := startServer(t, svc, GRPCConfig{MaxMessageSize: 256 << 10})
	srv.SetServing(true)
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	ctx := ctxT(t)
	var first *storagedv1.AppendResult
	for i := 0; i < 12; i++ {
		res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
			Topic: "M", Body: bytes.Repeat([]byte{byte(i)}, body)}})
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = res.GetResult()
		}
	}
	pull := &storagedv1.PullMessagesRequest{Topic: "M", MaxBytes: maxBytes, MaxMessages: 100, IncludeRaw: true}
	for next := int64(0); next < 12; { // long polls until all twelve are visible
		res, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "M", QueueOffset: next, MaxMessages: 1,
			Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatalf("waiting for message %d: %v", next, err)
		}
		next = res.GetNextOffset()
	}
	waitInUse(ctx, t, svc.inflight, func(n int64) bool { return n == 0 })

	// A connection that does not read: 64 KiB windows, no BDP growth.
	stalled, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	var streams []grpc.ClientStream
	for i := 0; i < held; i++ {
		before := svc.inflight.inUse()
		cs, err := stalled.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, storagedv1.MessageStoreService_PullMessages_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(pull); err != nil {
			t.Fatal(err)
		}
		if err := cs.CloseSend(); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, cs)
		// Admitted and read: the reservation shrank to the five records.
		waitInUse(ctx, t, svc.inflight, func(n int64) bool { return n > before && n < before+maxBytes })
	}

	// The limit is held: every further read is refused, nothing read.
	errs := make(chan error, 9)
	for i := 0; i < 8; i++ {
		go func() { _, err := client.PullMessages(ctx, pull); errs <- err }()
	}
	go func() {
		_, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_CommitLogOffset{
			CommitLogOffset: first.GetWroteOffset()}})
		errs <- err
	}()
	for i := 0; i < 9; i++ {
		d := details(t, <-errs)
		d.want(t, codes.ResourceExhausted, ReasonSystemBusy, true)
		if d.info.GetMetadata()["cause"] != "PULL_INFLIGHT_BYTES" {
			t.Errorf("metadata %v", d.info.GetMetadata())
		}
	}

	// The held answers arrive whole, and then nothing is reserved.
	for i, cs := range streams {
		var resp storagedv1.PullMessagesResponse
		if err := cs.RecvMsg(&resp); err != nil {
			t.Fatalf("held pull %d: %v", i, err)
		}
		if len(resp.GetMessages()) != 5 || len(resp.GetMessages()[4].GetBody()) != body || len(resp.GetMessages()[4].GetRaw()) == 0 {
			t.Fatalf("held pull %d: %d messages", i, len(resp.GetMessages()))
		}
	}
	waitInUse(ctx, t, svc.inflight, func(n int64) bool { return n == 0 })
	for i := 0; i < held+1; i++ { // one after another: each is released before the next
		res, err := client.PullMessages(ctx, pull)
		if err != nil || len(res.GetMessages()) != 5 {
			t.Fatalf("pull %d after the release: %v", i, err)
		}
	}
	if _, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_CommitLogOffset{
		CommitLogOffset: first.GetWroteOffset()}}); err != nil {
		t.Fatalf("GetMessage after the release: %v", err)
	}
	waitInUse(ctx, t, svc.inflight, func(n int64) bool { return n == 0 })
}

// waitInUse waits until the reserved bytes satisfy ok (or ctx ends).
func waitInUse(ctx context.Context, t *testing.T, in *inflight, ok func(int64) bool) {
	t.Helper()
	for {
		n, changed := in.changed()
		if ok(n) {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("in-flight read bytes stuck at %d", n)
		}
	}
}

// TestInflightReserve: the accounting itself.
func TestInflightReserve(t *testing.T) {
	in := newInflight(100)
	a, err := in.reserve(60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.reserve(41); err == nil {
		t.Fatal("60 + 41 fit a limit of 100")
	}
	a.shrink(20)
	b, err := in.reserve(80)
	if err != nil {
		t.Fatalf("20 + 80: %v", err)
	}
	a.release()
	a.release() // once only
	b.release()
	if n := in.inUse(); n != 0 {
		t.Fatalf("in use %d after releasing everything", n)
	}
	huge, err := in.reserve(1000) // alone, larger than the limit: admitted
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.reserve(1); err == nil {
		t.Fatal("admitted beside an over-limit read")
	}
	huge.release()
}
