package peer

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// codecBatches are the batches the codec tests encode: no msgs, small
// ones (copied beside their tags), large ones (by reference), empty ones,
// and every header field set.
func codecBatches() map[string]*peerv1.RaftBatch {
	rnd := rand.New(rand.NewPCG(1, 2))
	msg := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}
	head := func() *peerv1.RaftBatch {
		return &peerv1.RaftBatch{Group: "g", ClusterId: "c1", From: 1, To: 2, FromClientAddr: "127.0.0.1:9000", FromPeerAddr: "127.0.0.1:9100"}
	}
	out := map[string]*peerv1.RaftBatch{"empty": {}, "header only": head()}
	b := head()
	b.Msgs = [][]byte{msg(10), msg(0), msg(smallMsg - 1)}
	out["small msgs"] = b
	b = head()
	b.Msgs = [][]byte{msg(smallMsg), msg(100 << 10)}
	out["large msgs"] = b
	b = head()
	b.Msgs = [][]byte{msg(3), msg(70 << 10), msg(20), msg(600), msg(1), msg(1 << 20)}
	out["mixed"] = b
	b = &peerv1.RaftBatch{Msgs: [][]byte{msg(2000)}}
	out["msgs only"] = b
	return out
}

// TestBatchCodecWire: what the codec sends is a RaftBatch to grpc-go's
// codec (proto.Unmarshal), and what grpc-go's codec sends (proto.Marshal)
// the codec reads, both into the batch that was sent.
func TestBatchCodecWire(t *testing.T) {
	c := newCodec()
	for name, want := range codecBatches() {
		t.Run(name, func(t *testing.T) {
			out, err := c.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			wire := out.Materialize()
			var std peerv1.RaftBatch
			if err := proto.Unmarshal(wire, &std); err != nil {
				t.Fatalf("proto.Unmarshal of the codec's bytes: %v", err)
			}
			if !proto.Equal(&std, want) {
				t.Errorf("proto.Unmarshal of the codec's bytes = %v, sent %v", &std, want)
			}
			stdWire, err := proto.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			for src, w := range map[string][]byte{"codec": wire, "proto.Marshal": stdWire} {
				var rb recvBatch
				if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(w)}, &rb); err != nil {
					t.Fatalf("codec.Unmarshal of %s's bytes: %v", src, err)
				}
				if !proto.Equal(&rb.RaftBatch, want) {
					t.Errorf("codec.Unmarshal of %s's bytes = %v, sent %v", src, &rb.RaftBatch, want)
				}
				rb.free()
				var plain peerv1.RaftBatch
				if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(w)}, &plain); err != nil {
					t.Fatalf("codec.Unmarshal of %s's bytes into a RaftBatch: %v", src, err)
				}
				if !proto.Equal(&plain, want) {
					t.Errorf("codec.Unmarshal of %s's bytes into a RaftBatch = %v, sent %v", src, &plain, want)
				}
			}
		})
	}
}

// TestBatchCodecEveryField: marshalBatch copies the header field by field,
// so a field added to RaftBatch must be added there: a batch with every
// field set (by reflection, whatever the message holds today) comes
// through whole.
func TestBatchCodecEveryField(t *testing.T) {
	want := &peerv1.RaftBatch{}
	r := want.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		var v protoreflect.Value
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.BytesKind:
			l := r.Mutable(fd).List()
			l.Append(protoreflect.ValueOfBytes(bytes.Repeat([]byte{7}, 2*smallMsg)))
			l.Append(protoreflect.ValueOfBytes([]byte{1, 2, 3}))
			continue
		case fd.Kind() == protoreflect.StringKind:
			v = protoreflect.ValueOfString("field " + string(fd.Name()))
		case fd.Kind() == protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(uint64(1000 + fd.Number()))
		default:
			t.Fatalf("RaftBatch field %s of kind %v: teach this test (and marshalBatch) about it", fd.Name(), fd.Kind())
		}
		r.Set(fd, v)
	}
	out, err := marshalBatch(want)
	if err != nil {
		t.Fatal(err)
	}
	var got peerv1.RaftBatch
	if err := proto.Unmarshal(out.Materialize(), &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("marshalBatch lost a field: got %v, sent %v", &got, want)
	}
}

// TestBatchCodecNoCopies: a large msg leaves the sender by reference and
// arrives pointing into the receive buffer; free returns the buffer.
func TestBatchCodecNoCopies(t *testing.T) {
	big := bytes.Repeat([]byte{9}, 64<<10)
	out, err := marshalBatch(&peerv1.RaftBatch{Group: "g", Msgs: [][]byte{{1}, big}})
	if err != nil {
		t.Fatal(err)
	}
	shared := false
	for _, b := range out {
		if d := b.ReadOnlyData(); len(d) == len(big) && &d[0] == &big[0] {
			shared = true
		}
	}
	if !shared {
		t.Error("the 64 KiB msg was copied into the encoded batch")
	}
	var rb recvBatch
	if err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(out.Materialize())}, &rb); err != nil {
		t.Fatal(err)
	}
	buf := rb.buf.ReadOnlyData()
	lo, hi := uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[0]))+uintptr(len(buf))
	for i, m := range rb.Msgs {
		if p := uintptr(unsafe.Pointer(&m[0])); p < lo || p >= hi {
			t.Errorf("msg %d was copied out of the receive buffer", i)
		}
		if cap(m) != len(m) {
			t.Errorf("msg %d has capacity %d past its %d bytes: an append would write into the next", i, cap(m), len(m))
		}
	}
	rb.free()
	if rb.buf != nil || len(rb.Msgs) != 0 {
		t.Error("free left the buffer or the msgs")
	}
}

// FuzzUnmarshalBatch: the codec decodes any input as proto.Unmarshal does:
// both refuse it, or both give the same batch.
func FuzzUnmarshalBatch(f *testing.F) {
	for _, b := range codecBatches() {
		if w, err := proto.Marshal(b); err == nil {
			f.Add(w)
		}
	}
	f.Add(protowire.AppendVarint(protowire.AppendTag(nil, batchMsgsField, protowire.VarintType), 5)) // msgs as a varint: unknown
	f.Add(protowire.AppendTag(nil, batchMsgsField, protowire.BytesType))                             // truncated
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})                                                            // group not UTF-8
	f.Fuzz(func(t *testing.T, in []byte) {
		var want peerv1.RaftBatch
		werr := proto.Unmarshal(in, &want)
		var got peerv1.RaftBatch
		gerr := unmarshalBatch(in, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Unmarshal: %v, unmarshalBatch: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("unmarshalBatch = %v, proto.Unmarshal = %v", &got, &want)
		}
	})
}

// BenchmarkBatchCodec encodes a batch and decodes what it sent, as the
// two ends of the raft stream do (without the network): grpc-go's proto
// codec against this codec, for a batch of 64 heartbeat-sized answers, of
// 16 unary appends (1 KiB) and of one append of a 100-message batch
// (100 KiB). BENCHMARKS.md "What this VM charges, member by member, and
// the raft stream's copies".
func BenchmarkBatchCodec(b *testing.B) {
	cases := []struct {
		name string
		msgs [][]byte
	}{
		{"64x40B", repeatMsg(64, 40)},
		{"16x1KiB", repeatMsg(16, 1<<10)},
		{"1x100KiB", repeatMsg(1, 100<<10)},
	}
	std := encoding.GetCodecV2(grpcproto.Name)
	for _, tc := range cases {
		batch := &peerv1.RaftBatch{Group: "g", ClusterId: "c1", From: 1, To: 2, FromPeerAddr: "127.0.0.1:9100", Msgs: tc.msgs}
		size := 0
		for _, m := range tc.msgs {
			size += len(m)
		}
		b.Run("grpc/"+tc.name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				out, err := std.Marshal(batch)
				if err != nil {
					b.Fatal(err)
				}
				var got peerv1.RaftBatch
				if err := std.Unmarshal(out, &got); err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
		b.Run("storaged/"+tc.name, func(b *testing.B) {
			c := newCodec()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				out, err := c.Marshal(batch)
				if err != nil {
					b.Fatal(err)
				}
				var got recvBatch
				if err := c.Unmarshal(out, &got); err != nil {
					b.Fatal(err)
				}
				got.free()
				out.Free()
			}
		})
	}
}

func repeatMsg(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return out
}
