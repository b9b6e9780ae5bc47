package peer

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// batchMsgsField is RaftBatch.msgs' field number.
const batchMsgsField = 6

// codec is the gRPC codec of the raft stream, both ends: grpc-go's proto
// codec for every message but RaftBatch, whose msgs (marshalled raft
// messages, an append's entries among them: up to MaxSizePerMsg each) it
// does not copy. grpc-go's codec copies a batch's msgs once into the
// encoded batch on the sender and once out of it on the receiver, beside
// the copies the transport and raft make anyway: for a 100 KiB append,
// 69 µs against 19 µs to encode and decode (BenchmarkBatchCodec), some 4 %
// of the group's CPU at batch100-c16 (BENCHMARKS.md "What this VM
// charges, member by member, and the raft stream's copies"). The wire
// format is protobuf's, so a member with grpc-go's codec reads and writes
// the same bytes.
//
//   - Marshal sends the header fields marshalled as usual and then each
//     msg by reference, behind its tag and length. gRPC may write them
//     after Send returns: the link never changes a queued message (each is
//     a fresh proto.Marshal of replica.Node.send).
//   - Unmarshal into a *recvBatch takes the batch as one buffer (gRPC's
//     own when it came in one piece, else a copy into a buffer of gRPC's
//     pool) and points msgs into it; the handler steps them (raft's own
//     decoding copies what it keeps) and then frees the buffer. Into
//     anything else, a *peerv1.RaftBatch included, it is grpc-go's.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(grpcproto.Name)} }

// Name is grpc-go's proto codec's: the codec serves the same
// content-subtype.
func (c codec) Name() string { return c.proto.Name() }

// Marshal encodes a RaftBatch by marshalBatch, anything else by grpc-go's
// proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*peerv1.RaftBatch); ok {
		return marshalBatch(b)
	}
	return c.proto.Marshal(v)
}

// Unmarshal decodes into a *recvBatch by unmarshalBatch, into anything
// else by grpc-go's proto codec.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*recvBatch)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	if err := unmarshalBatch(buf.ReadOnlyData(), &r.RaftBatch); err != nil {
		buf.Free()
		return err
	}
	r.buf = buf
	return nil
}

// recvBatch is a RaftBatch received by the codec: its msgs point into buf
// until free.
type recvBatch struct {
	peerv1.RaftBatch
	buf mem.Buffer
}

// free returns the buffer msgs point into; the batch is empty after it.
func (r *recvBatch) free() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	r.Reset()
}

// marshalBatch encodes b as proto.Marshal does, but for the order of its
// fields (msgs come last; a decoder takes fields in any order) and without
// copying its large msgs: the header, every msg's tag and length and the
// small msgs are in one array, and each large msg follows its length by
// reference.
func marshalBatch(b *peerv1.RaftBatch) (mem.BufferSlice, error) {
	msgs := b.Msgs
	head := &peerv1.RaftBatch{
		Group: b.Group, ClusterId: b.ClusterId, From: b.From, To: b.To,
		FromClientAddr: b.FromClientAddr, FromPeerAddr: b.FromPeerAddr,
	}
	// One backing array for the header and every tag, length and small
	// msg: the buffers before the large msgs are slices of it.
	n := proto.Size(head)
	for _, m := range msgs {
		n += protowire.SizeTag(batchMsgsField) + protowire.SizeVarint(uint64(len(m)))
		if len(m) < smallMsg {
			n += len(m)
		}
	}
	buf, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, n), head)
	if err != nil {
		return nil, err
	}
	out := make(mem.BufferSlice, 0, 1+2*len(msgs))
	from := 0 // buf[from:] is not in out yet
	for _, m := range msgs {
		buf = protowire.AppendTag(buf, batchMsgsField, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(len(m)))
		if len(m) < smallMsg {
			buf = append(buf, m...) // a heartbeat or an answer: not worth a buffer of its own
			continue
		}
		out = append(out, mem.SliceBuffer(buf[from:len(buf):len(buf)]), mem.SliceBuffer(m))
		from = len(buf)
	}
	if len(buf) > from {
		out = append(out, mem.SliceBuffer(buf[from:]))
	}
	return out, nil
}

// smallMsg: a msg shorter than this is copied into the buffer before it
// rather than sent by reference.
const smallMsg = 512

// unmarshalBatch decodes in (protobuf wire format) into b, as
// proto.Unmarshal does, except that b.Msgs point into in. Every field but
// msgs (and a msgs field of another wire type, which proto.Unmarshal keeps
// as an unknown field) is decoded by proto.Unmarshal from a copy of its
// bytes, so what a batch's header may hold is checked as before (UTF-8,
// wire types).
func unmarshalBatch(in []byte, b *peerv1.RaftBatch) error {
	b.Reset()
	var rest []byte // the fields but msgs, in their order
	msgs := make([][]byte, 0, 8)
	for off := 0; off < len(in); {
		num, typ, n := protowire.ConsumeTag(in[off:])
		if n < 0 {
			return fmt.Errorf("peer: raft batch at byte %d: %w", off, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, in[off+n:])
		if m < 0 {
			return fmt.Errorf("peer: raft batch field %d at byte %d: %w", num, off, protowire.ParseError(m))
		}
		if num == batchMsgsField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(in[off+n:]) // checked by ConsumeFieldValue
			msgs = append(msgs, v[:len(v):len(v)])
		} else {
			rest = append(rest, in[off:off+n+m]...)
		}
		off += n + m
	}
	if err := proto.Unmarshal(rest, b); err != nil {
		return fmt.Errorf("peer: raft batch: %w", err)
	}
	b.Msgs = msgs
	return nil
}
