package server

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// NewBufferPool returns storaged's buffer pool (see bufferPool) for main
// to install as gRPC's default before it starts any gRPC server or client:
//
//	experimental.SetDefaultBufferPool(server.NewBufferPool())
//
// The setting is process-wide (the transports of every server and client
// without a pool of their own, and grpc-go's proto codec, which takes no
// other) and not safe to change once gRPC runs, so a library package never
// makes it. Without it the server works the same, with grpc-go's default
// pool, which clears every buffer it hands out, and a 100 × 1 KiB batch
// costs 16 % more CPU in the codec and 18 % more end to end (client,
// server and store in one process); 1 KiB unary calls cost the same
// (interleaved A/B of 2026-12-01, CPU time per op, BENCHMARKS.md "Buffer
// pool through SetDefaultBufferPool").
func NewBufferPool() mem.BufferPool { return new(bufferPool) }

// Tiers of bufferPool: every power of two from 256 B to 8 MiB, so that a
// request up to the largest valid one (MaxMessageSize + RequestOverhead,
// 5 MiB by default) is served from a tier. An oversized one the transport
// still takes (up to MaxRecvMsgSize) only to refuse it is allocated
// outright.
const (
	minBufferTierExp = 8
	maxBufferTierExp = 23
)

// bufferPool is the mem.BufferPool of storaged's gRPC server (HTTP/2
// frames, write buffers) and of grpc-go's proto codec (a request spread
// over several frames is copied into one buffer before it is decoded),
// once main has made it gRPC's default (NewBufferPool). It differs from
// grpc-go's default pool (google.golang.org/grpc@v1.85.0
// mem/buffer_pool.go:42, tiers 256 B, 4 KiB, 16 KiB, 32 KiB and 1 MiB) in
// two ways:
//
//   - A tier at every power of two, so that a 110 KB PutMessages request
//     takes a 128 KiB buffer, not the 1 MiB one.
//   - Buffers are not cleared. The default pool clears a buffer's whole
//     capacity on every Get (internal/mem/buffer_pool.go:247-249,
//     sizedBufferPool.Get), 1 MiB per batch request. Nothing in grpc-go
//     reads a buffer from the pool before writing it: the HTTP/2 framer
//     reads exactly the frame length into it (internal/transport/
//     http_util.go:533-586, readDataFrame, io.ReadFull), the write buffer
//     tracks what it copied in (http_util.go:328-352, bufWriter.Write),
//     MaterializeToBuffer copies the whole message in (mem/buffer_slice.go:
//     114-115), the proto codec marshals the whole message in
//     (encoding/proto/proto.go:73-75, MarshalAppend of proto.Size bytes),
//     and grpc-go's own ALTS record layer uses the same kind of uncleared
//     pool (credentials/alts/internal/conn/record.go:83-90,
//     NewDirtyBinaryTieredBufferPool). proto.Unmarshal copies bytes and
//     strings out of its input, so no message aliases a pooled buffer.
//
// Larger buffers than the top tier are allocated and left to the garbage
// collector.
type bufferPool struct {
	tiers [maxBufferTierExp - minBufferTierExp + 1]sync.Pool // of *[]byte, cap 1<<(minBufferTierExp+i)
}

var _ mem.BufferPool = (*bufferPool)(nil)

// Get returns a buffer of length size; its bytes are not cleared.
func (p *bufferPool) Get(size int) *[]byte {
	if size > 1<<maxBufferTierExp {
		b := make([]byte, size)
		return &b
	}
	t := 0
	if size > 1<<minBufferTierExp {
		t = bits.Len(uint(size-1)) - minBufferTierExp // smallest tier ≥ size
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<(minBufferTierExp+t))
	return &b
}

// Put returns a buffer from Get to its tier; buffers of any other capacity
// are dropped.
func (p *bufferPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minBufferTierExp || c > 1<<maxBufferTierExp || c&(c-1) != 0 {
		return
	}
	p.tiers[bits.Len(uint(c))-1-minBufferTierExp].Put(b)
}

// codec is the gRPC codec of NewGRPCServer: grpc-go's own proto codec
// (google.golang.org/grpc/encoding/proto) for every message but read
// answers, which marshalRead encodes with their bodies by reference; the
// reservation of a read answer (see inflight) is released once it is
// written. The server gets it through grpc.ForceServerCodecV2.
//
// grpc-go's codec takes its buffers from mem.DefaultBufferPool(), which no
// server option changes (encoding/proto/proto.go:73 and :91); main makes
// that storaged's pool with experimental.SetDefaultBufferPool (see
// NewBufferPool), which changes the transport's pool too.
type codec struct {
	proto encoding.CodecV2
	// inflight, when set, holds the reservations of read answers: Marshal
	// releases each once its answer is written (see inflight).
	inflight *inflight
}

// newCodec returns the codec releasing the read reservations of reads
// (nil: none).
func newCodec(reads *inflight) codec {
	return codec{proto: encoding.GetCodecV2(grpcproto.Name), inflight: reads}
}

// Name is the name of grpc-go's proto codec: the codec serves the same
// content-subtype.
func (c codec) Name() string { return c.proto.Name() }

// Marshal encodes a read answer by marshalRead, anything else by grpc-go's
// proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	out, ok, err := marshalRead(v) // read answers: bodies by reference
	if !ok {
		return c.proto.Marshal(v)
	}
	var r *reservation
	if c.inflight != nil {
		r = c.inflight.take(v.(proto.Message)) // ok: one of the read answers
	}
	switch {
	case r == nil:
	case err != nil:
		r.release()
	default:
		out = withRelease(out, r)
	}
	return out, err
}

// Unmarshal is grpc-go's proto codec's.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.proto.Unmarshal(data, v)
}
