package server

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// benchClient serves a real async store with 64 MiB files over loopback TCP.
func benchClient(b *testing.B) storagedv1.MessageStoreServiceClient {
	b.Helper()
	st, err := storage.Open(storage.Options{Dir: b.TempDir(), FileSize: 64 << 20, StoreHost: testStoreHost})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	srv := startServer(b, New(st, zerolog.Nop()), GRPCConfig{MaxMessageSize: storage.DefaultMaxMessageSize})
	srv.SetServing(true)
	return storagedv1.NewMessageStoreServiceClient(dial(b, srv.addr, nil))
}

var benchBody = make([]byte, 1024)

// BenchmarkPutMessageStream: single 1 KiB messages on one stream, the
// window full. allocs/op counts client and server together.
func BenchmarkPutMessageStream(b *testing.B) {
	client := benchClient(b)
	stream, err := client.PutMessageStream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	req := &storagedv1.PutMessageStreamRequest{Message: &storagedv1.Message{Topic: "bench", Body: benchBody}}
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	b.ResetTimer()
	var wg sync.WaitGroup
	wg.Go(func() {
		for range b.N {
			ack, err := stream.Recv()
			if err != nil || ack.GetCode() != 0 {
				b.Errorf("ack %v, %v", ack, err)
				return
			}
		}
	})
	for i := range b.N {
		req.RequestId = uint64(i)
		if err := stream.Send(req); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	b.StopTimer()
	stream.CloseSend()
	stream.Recv()
}

// BenchmarkPutMessageUnary: the same messages as unary calls, 64 at once;
// keyed: each with a fresh UNIQ_KEY, so every put is remembered by the
// dedup window (its cost against unkeyed).
func BenchmarkPutMessageUnary(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		name := "unkeyed"
		if keyed {
			name = "keyed"
		}
		b.Run(name, func(b *testing.B) {
			client := benchClient(b)
			var next atomic.Int64
			b.ReportAllocs()
			b.SetBytes(int64(len(benchBody)))
			b.SetParallelism(32) // x GOMAXPROCS goroutines
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "bench", Body: benchBody}}
				if keyed {
					req.Message.Properties = map[string]string{}
				}
				for pb.Next() {
					if keyed {
						req.Message.Properties[storage.PropertyUniqKey] = fmt.Sprintf("%032X", next.Add(1))
					}
					if _, err := client.PutMessage(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkPutMessagesBatch100: PutMessages of 100 × 1 KiB bodies (~110 KB
// requests, several HTTP/2 frames each), 16 at once. One op is one call
// (100 messages).
func BenchmarkPutMessagesBatch100(b *testing.B) {
	client := benchClient(b)
	req := &storagedv1.PutMessagesRequest{Topic: "bench"}
	for range 100 {
		req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: benchBody})
	}
	b.ReportAllocs()
	b.SetBytes(100 * int64(len(benchBody)))
	b.SetParallelism(8) // x GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.PutMessages(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// edgeRequests are the requests of BenchmarkEdge: 100 batch entries (plain,
// or with tags, keys and two user properties), one message, and the store's
// answers to them.
func edgeRequests(withProps bool) (*storagedv1.PutMessagesRequest, *storage.PutResult, *storagedv1.PutMessageRequest, *storage.PutResult) {
	batch := &storagedv1.PutMessagesRequest{Topic: "bench"}
	res := &storage.PutResult{Status: storage.PutOK, Append: storage.AppendResult{StoreHost: testStoreHost, MsgNum: 100}}
	for i := range 100 {
		e := &storagedv1.BatchEntry{Body: benchBody}
		if withProps {
			e.Tags, e.Keys, e.Properties = "TagA", "order-1", map[string]string{"trace": "abc", "region": "eu"}
		}
		batch.Messages = append(batch.Messages, e)
		res.Append.Offsets = append(res.Append.Offsets, int64(i)*1100)
	}
	one := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "bench", Body: benchBody}}
	if withProps {
		one.Message.Tags, one.Message.Keys, one.Message.Properties = "TagA", "order-1", map[string]string{"trace": "abc", "region": "eu"}
	}
	oneRes := &storage.PutResult{Status: storage.PutOK, Append: storage.AppendResult{StoreHost: testStoreHost, MsgNum: 1}}
	return batch, res, one, oneRes
}

// edgeSink keeps BenchmarkEdge's answers on the heap, as a handler's are.
var edgeSink any

// BenchmarkEdge: the service's own work around the store, without gRPC or
// a store: validate and convert a request, build the answer (for a batch,
// with its 100 msgIds).
func BenchmarkEdge(b *testing.B) {
	for _, withProps := range []bool{false, true} {
		batch, res, one, oneRes := edgeRequests(withProps)
		name := "plain"
		if withProps {
			name = "props"
		}
		b.Run("Batch100/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, fe := toBatch(batch, 1, netip.AddrPort{}, DefaultMaxBatchMessages); fe != nil {
					b.Fatal(fe)
				}
				edgeSink = toPutMessagesResponse(res)
			}
		})
		b.Run("Message/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, fe := toMessage(one, 1, netip.AddrPort{}); fe != nil {
					b.Fatal(fe)
				}
				edgeSink = toPutMessageResponse(oneRes)
			}
		})
	}
}

// BenchmarkCodecBatch100: the codec's work for one PutMessages request of
// 100 × 1 KiB bodies (~110 KB) as the server does it, in the process's
// default buffer pool (storaged's, TestMain): marshal (the client's side),
// split into 16 KiB HTTP/2 frames copied into pooled buffers (the
// transport), unmarshal (the copy of the frames into one buffer, then
// proto.Unmarshal). One op is one request.
func BenchmarkCodecBatch100(b *testing.B) {
	c := newCodec(nil)
	pool := mem.DefaultBufferPool()
	req := &storagedv1.PutMessagesRequest{Topic: "bench"}
	for range 100 {
		req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: benchBody})
	}
	b.ReportAllocs()
	flat := make([]byte, proto.Size(req)) // the bytes on the wire
	b.SetBytes(int64(len(flat)))
	var frames mem.BufferSlice
	for b.Loop() {
		enc, err := c.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		enc.CopyTo(flat)
		frames = frames[:0]
		for rest := flat; len(rest) > 0; {
			n := min(16<<10, len(rest))
			frames = append(frames, mem.Copy(rest[:n], pool))
			rest = rest[n:]
		}
		enc.Free()
		var got storagedv1.PutMessagesRequest
		if err := c.Unmarshal(frames, &got); err != nil {
			b.Fatal(err)
		}
		frames.Free()
	}
}

// BenchmarkRocketMQSendMessage: SendMessage of the RocketMQ protocol with
// one 1 KiB message carrying a message id (as the SDKs send every message:
// stored as UNIQ_KEY, so the dedup window is on the path), 32 x GOMAXPROCS
// at once over one connection: the same load as
// BenchmarkPutMessageUnary/keyed, through the RocketMQ mapping.
func BenchmarkRocketMQSendMessage(b *testing.B) {
	st, err := storage.Open(storage.Options{Dir: b.TempDir(), FileSize: 64 << 20, StoreHost: testStoreHost})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	srv := startServer(b, New(st, zerolog.Nop()), GRPCConfig{MaxMessageSize: storage.DefaultMaxMessageSize})
	srv.SetServing(true)
	client := rocketmqv2.NewMessagingServiceClient(dial(b, srv.addr, nil))
	var next atomic.Int64
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	b.SetParallelism(32) // x GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := &rocketmqv2.Message{Topic: &rocketmqv2.Resource{Name: "bench"}, Body: benchBody,
			SystemProperties: &rocketmqv2.SystemProperties{MessageType: rocketmqv2.MessageType_NORMAL}}
		req := &rocketmqv2.SendMessageRequest{Messages: []*rocketmqv2.Message{m}}
		for pb.Next() {
			m.SystemProperties.MessageId = fmt.Sprintf("%034X", next.Add(1))
			r, err := client.SendMessage(context.Background(), req)
			if err != nil || r.GetStatus().GetCode() != rocketmqv2.Code_OK {
				b.Errorf("%v %v", r.GetStatus(), err)
				return
			}
		}
	})
}

// BenchmarkRocketMQPopReceiveAck: POP consumption of 1 KiB messages over
// the RocketMQ protocol by 16 consumers of one group on one connection:
// each receives up to 16 messages (no long poll) and acks them in one
// AckMessage, until the b.N messages stored before the timer started are
// all acknowledged. ns/op is per message (received and acked). Async
// store, as BenchmarkRocketMQSendMessage: the figure to set beside it.
func BenchmarkRocketMQPopReceiveAck(b *testing.B) {
	st, err := storage.Open(storage.Options{Dir: b.TempDir(), FileSize: 64 << 20, StoreHost: testStoreHost,
		MaxPopInflight: 1 << 20, MaxPopInflightPerGroup: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if _, err := st.CreateTopic("bench", 8); err != nil {
		b.Fatal(err)
	}
	for put := 0; put < b.N; {
		n := min(b.N-put, 256)
		batch := &storage.Batch{Topic: "bench", QueueID: int32(put/256) % 8, Messages: make([]storage.BatchMessage, n)}
		for i := range batch.Messages {
			batch.Messages[i].Body = benchBody
		}
		if _, err := st.PutMessages(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
		put += n
	}
	srv := startServer(b, New(st, zerolog.Nop()), GRPCConfig{MaxMessageSize: storage.DefaultMaxMessageSize})
	srv.SetServing(true)
	client := rocketmqv2.NewMessagingServiceClient(dial(b, srv.addr, nil))
	const consumers, batch = 16, 16
	var acked atomic.Int64
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	b.ResetTimer()
	var wg sync.WaitGroup
	for range consumers {
		wg.Go(func() {
			req := &rocketmqv2.ReceiveMessageRequest{Group: &rocketmqv2.Resource{Name: "bench-group"}, BatchSize: batch,
				MessageQueue:      &rocketmqv2.MessageQueue{Topic: &rocketmqv2.Resource{Name: "bench"}},
				InvisibleDuration: durationpb.New(time.Minute)}
			for acked.Load() < int64(b.N) {
				stream, err := client.ReceiveMessage(context.Background(), req)
				if err != nil {
					b.Error(err)
					return
				}
				ack := &rocketmqv2.AckMessageRequest{Group: req.Group, Topic: req.MessageQueue.Topic}
				for {
					r, err := stream.Recv()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Error(err)
						return
					}
					if m := r.GetMessage(); m != nil {
						ack.Entries = append(ack.Entries, &rocketmqv2.AckMessageEntry{MessageId: m.GetSystemProperties().GetMessageId(),
							ReceiptHandle: m.GetSystemProperties().GetReceiptHandle()})
					}
				}
				if len(ack.Entries) == 0 {
					continue // another consumer holds the rest
				}
				r, err := client.AckMessage(context.Background(), ack)
				if err != nil || r.GetStatus().GetCode() != rocketmqv2.Code_OK {
					b.Errorf("ack: %v %v", r.GetStatus(), err)
					return
				}
				acked.Add(int64(len(ack.Entries)))
			}
		})
	}
	wg.Wait()
}
