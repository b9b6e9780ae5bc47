package server

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

func TestBufferPoolTiers(t *testing.T) {
	var p bufferPool
	for _, c := range []struct{ size, cap int }{
		{0, 256},
		{1, 256},
		{256, 256},
		{257, 512},
		{16 << 10, 16 << 10},
		{110_000, 128 << 10}, // a PutMessages of 100 × 1 KiB
		{1<<20 + 1, 2 << 20},
		{1 << 23, 1 << 23},
		{1<<23 + 1, 1<<23 + 1}, // above the top tier: allocated as asked
	} {
		b := p.Get(c.size)
		if len(*b) != c.size || cap(*b) != c.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", c.size, len(*b), cap(*b), c.size, c.cap)
		}
		p.Put(b)
	}
	// Buffers the pool did not hand out are dropped, not filed in a tier
	// whose Get would then return too short a buffer.
	for _, n := range []int{0, 100, 3000, 1<<23 + 1, 1 << 24} {
		b := make([]byte, n)
		p.Put(&b)
	}
	for _, size := range []int{1, 2048, 3000, 4096} {
		if b := p.Get(size); len(*b) != size || cap(*b) < size {
			t.Errorf("Get(%d) after foreign Puts: len %d cap %d", size, len(*b), cap(*b))
		}
	}
}

// dirty fills buffers of every tier up to 256 KiB with 0xAA and returns
// them to p, so that later Gets may hand out stale bytes.
func dirty(p mem.BufferPool) {
	for exp := minBufferTierExp; exp <= 18; exp++ {
		b := p.Get(1 << exp)
		for i := range *b {
			(*b)[i] = 0xAA
		}
		p.Put(b)
	}
}

func randomBatch(r *rand.ChaCha8, n, size int) *storagedv1.PutMessagesRequest {
	req := &storagedv1.PutMessagesRequest{Topic: "pool", QueueId: 3}
	for range n {
		body := make([]byte, size)
		r.Read(body)
		req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: body})
	}
	return req
}

// TestBufferPoolInstalled: the tests run with the pool storaged's main
// installs (TestMain), and grpc-go's proto codec, which the server's codec
// uses, takes its buffers from it: a ~110 KB batch is marshalled into a
// 128 KiB buffer (grpc-go's own default pool would hand out 1 MiB).
func TestBufferPoolInstalled(t *testing.T) {
	if _, ok := mem.DefaultBufferPool().(*bufferPool); !ok {
		t.Fatalf("gRPC's default pool is %T, want *bufferPool (TestMain installs it)", mem.DefaultBufferPool())
	}
	req := randomBatch(rand.NewChaCha8([32]byte{2}), 100, 1024)
	enc, err := newCodec(nil).Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	if len(enc) != 1 || cap(enc[0].ReadOnlyData()) != 128<<10 || enc[0].Len() != proto.Size(req) {
		t.Errorf("marshalled %d bytes into %d buffers, the first of capacity %d; want one of 128 KiB", enc.Len(), len(enc), cap(enc[0].ReadOnlyData()))
	}
}

// TestProtoCodecRoundTrip: messages decoded from uncleared pooled buffers,
// in one piece or in 16 KiB frames, equal what was encoded.
func TestProtoCodecRoundTrip(t *testing.T) {
	p := mem.DefaultBufferPool() // storaged's (TestBufferPoolInstalled)
	c := newCodec(nil)
	r := rand.NewChaCha8([32]byte{1})
	for _, want := range []proto.Message{
		&storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("small")}},
		randomBatch(r, 100, 1024),
		randomBatch(r, 7, 30_000),
	} {
		dirty(p)
		enc, err := c.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		flat := enc.Materialize()
		std, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(flat, std) {
			t.Fatalf("%T: Marshal differs from proto.Marshal (%d vs %d bytes)", want, len(flat), len(std))
		}
		enc.Free()
		for _, frame := range []int{len(flat), 16 << 10} {
			dirty(p)
			var in mem.BufferSlice
			for rest := flat; len(rest) > 0; {
				n := min(frame, len(rest))
				in = append(in, mem.Copy(rest[:n], p))
				rest = rest[n:]
			}
			got := want.ProtoReflect().New().Interface()
			if err := c.Unmarshal(in, got); err != nil {
				t.Fatal(err)
			}
			in.Free()
			dirty(p) // got must not alias a pooled buffer
			if !proto.Equal(got, want) {
				t.Errorf("%T in frames of %d: decoded message differs", want, frame)
			}
		}
	}
	if err := c.Unmarshal(nil, "not a message"); err == nil {
		t.Error("Unmarshal into a string: want an error")
	}
	if _, err := c.Marshal(42); err == nil {
		t.Error("Marshal of an int: want an error")
	}
}

// batchStore keeps a copy of the bodies of every batch it is given.
type batchStore struct {
	fakeStore
	mu     sync.Mutex
	bodies map[string][][]byte // by topic
}

func (s *batchStore) PutMessages(_ context.Context, b *storage.Batch) (storage.PutResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range b.Messages {
		s.bodies[b.Topic] = append(s.bodies[b.Topic], bytes.Clone(m.Body))
	}
	return storage.PutResult{Status: storage.PutOK}, nil
}

// TestBatchesThroughPool: concurrent 100 × 1 KiB batches (~110 KB
// requests, several HTTP/2 frames each) reach the store byte for byte
// although the server's buffers are reused without being cleared.
func TestBatchesThroughPool(t *testing.T) {
	st := &batchStore{bodies: map[string][][]byte{}}
	srv := startServer(t, New(st, zerologNop()), GRPCConfig{MaxMessageSize: storage.DefaultMaxMessageSize})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	const senders, batches = 4, 8
	sent := make([][]*storagedv1.PutMessagesRequest, senders)
	var wg sync.WaitGroup
	for i := range senders {
		r := rand.NewChaCha8([32]byte{byte(i)})
		for range batches {
			req := randomBatch(r, 100, 1024)
			req.Topic = "sender" + string(rune('a'+i))
			sent[i] = append(sent[i], req)
		}
		wg.Go(func() {
			for _, req := range sent[i] {
				if _, err := client.PutMessages(ctxT(t), req); err != nil {
					t.Errorf("PutMessages: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, reqs := range sent {
		got := st.bodies[reqs[0].Topic]
		if len(got) != batches*100 {
			t.Fatalf("sender %d: store got %d bodies, want %d", i, len(got), batches*100)
		}
		for j, req := range reqs {
			for k, m := range req.Messages {
				if !bytes.Equal(got[j*100+k], m.Body) {
					t.Fatalf("sender %d, batch %d, message %d: body differs", i, j, k)
				}
			}
		}
	}
}
