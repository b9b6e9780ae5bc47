package server

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

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
// frames, write buffers) and of its proto codec (a request spread over
// several frames is copied into one buffer before it is decoded). It
// differs from grpc-go's default pool (google.golang.org/grpc@v1.85.0
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
//     114-115), the codec marshals the whole message in (Marshal below),
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

// protoCodec is grpc-go's proto codec (google.golang.org/grpc@v1.85.0
// encoding/proto/proto.go, codecV2) with its buffers from pool instead of
// mem.DefaultBufferPool(), which the proto codec uses whatever pool the
// server was given (proto.go:74 and :91; experimental.BufferPool changes
// the transport's pool only). The server gets it through
// grpc.ForceServerCodecV2.
type protoCodec struct {
	pool mem.BufferPool
	// inflight, when set, holds the reservations of read answers: Marshal
	// releases each once its answer is written (see inflight).
	inflight *inflight
}

// Name is the name of grpc-go's proto codec: the codec serves the same
// content-subtype.
func (protoCodec) Name() string { return "proto" }

// Marshal encodes v into a pooled buffer (small messages into their own
// slice), as grpc-go's codec does.
func (c protoCodec) Marshal(v any) (mem.BufferSlice, error) {
	m := protoMessage(v)
	if m == nil {
		return nil, fmt.Errorf("server: codec: cannot marshal %T, want proto.Message", v)
	}
	if out, ok, err := marshalRead(m); ok { // read answers: bodies by reference
		var r *reservation
		if c.inflight != nil {
			r = c.inflight.take(m)
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
	size := proto.Size(m)
	// UseCachedSize reuses what proto.Size just computed; m is not
	// mutated in between.
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := c.pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		c.pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// Unmarshal decodes data into v. A message in several buffers (one per
// HTTP/2 frame) is first copied into one pooled buffer.
func (c protoCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m := protoMessage(v)
	if m == nil {
		return fmt.Errorf("server: codec: cannot unmarshal into %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func protoMessage(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	case protoadapt.MessageV2:
		return v
	}
	return nil
}
