package server

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// Field numbers of the bytes fields marshalRead references instead of
// copying (proto/storaged/v1/message_store.proto).
const (
	fieldStoredBody      protowire.Number = 6  // StoredMessage.body
	fieldStoredRaw       protowire.Number = 19 // StoredMessage.raw
	fieldPullMessages    protowire.Number = 1  // PullMessagesResponse.messages
	fieldGetMessageValue protowire.Number = 1  // GetMessageResponse.message
)

// zeroCopyMin is the smallest bytes field marshalRead references rather
// than copies: below it a separate buffer costs more than the copy.
const zeroCopyMin = 1 << 10

// releaseTailCap is the capacity of the empty buffer that carries an
// answer's release (withRelease).
const releaseTailCap = 4 << 10

// marshalRead encodes a read answer (a *PullMessagesResponse or a
// *GetMessageResponse) as a BufferSlice whose bodies and raw records are
// the records' own bytes, not copies: grpc-go writes a BufferSlice buffer
// by buffer into its HTTP/2 frames, so the answer is held once (the copy
// the store made out of its mapping) instead of twice, three times with
// include_raw, where body and raw are one array. The bytes on the wire
// are a valid encoding of the same message (fields in number order, the
// referenced ones after the others of their message, which parsers
// accept: TestMarshalReadRoundTrip). ok is false for any other message.
//
// The messages are briefly modified (a field set aside while the rest is
// marshalled) and restored before it returns; grpc-go marshals a
// response on the handler's goroutine and nothing else touches it then.
func marshalRead(v any) (out mem.BufferSlice, ok bool, err error) {
	w := sliceWriter{}
	switch m := v.(type) {
	case *storagedv1.PullMessagesResponse:
		for _, sm := range m.Messages {
			w.cur = protowire.AppendTag(w.cur, fieldPullMessages, protowire.BytesType)
			w.cur = protowire.AppendVarint(w.cur, uint64(storedSize(sm)))
			if err := w.stored(sm); err != nil {
				return nil, true, err
			}
		}
		msgs := m.Messages
		m.Messages = nil
		w.cur, err = proto.MarshalOptions{}.MarshalAppend(w.cur, m)
		m.Messages = msgs
	case *storagedv1.GetMessageResponse:
		if m.Message != nil {
			w.cur = protowire.AppendTag(w.cur, fieldGetMessageValue, protowire.BytesType)
			w.cur = protowire.AppendVarint(w.cur, uint64(storedSize(m.Message)))
			err = w.stored(m.Message)
		}
	default:
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	w.flush()
	return w.out, true, nil
}

// sliceWriter builds a BufferSlice: small encoded pieces go to cur, large
// bytes fields become buffers of their own.
type sliceWriter struct {
	out mem.BufferSlice
	cur []byte
}

func (w *sliceWriter) flush() {
	if len(w.cur) > 0 {
		w.out = append(w.out, mem.SliceBuffer(w.cur))
		w.cur = nil
	}
}

// bytesField appends field num holding b, by reference when b is large.
// Empty fields are left out, as proto3 marshalling does.
func (w *sliceWriter) bytesField(num protowire.Number, b []byte) {
	if len(b) == 0 {
		return
	}
	w.cur = protowire.AppendTag(w.cur, num, protowire.BytesType)
	w.cur = protowire.AppendVarint(w.cur, uint64(len(b)))
	if len(b) < zeroCopyMin {
		w.cur = append(w.cur, b...)
		return
	}
	w.flush()
	w.out = append(w.out, mem.SliceBuffer(b))
}

// stored appends the encoding of m: its small fields, then body and raw.
func (w *sliceWriter) stored(m *storagedv1.StoredMessage) error {
	body, raw := m.Body, m.Raw
	m.Body, m.Raw = nil, nil
	var err error
	w.cur, err = proto.MarshalOptions{}.MarshalAppend(w.cur, m)
	m.Body, m.Raw = body, raw
	if err != nil {
		return err
	}
	w.bytesField(fieldStoredBody, body)
	w.bytesField(fieldStoredRaw, raw)
	return nil
}

// storedSize is the encoded size of m.
func storedSize(m *storagedv1.StoredMessage) int {
	body, raw := m.Body, m.Raw
	m.Body, m.Raw = nil, nil
	n := proto.Size(m)
	m.Body, m.Raw = body, raw
	return n + bytesFieldSize(fieldStoredBody, body) + bytesFieldSize(fieldStoredRaw, raw)
}

func bytesFieldSize(num protowire.Number, b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(b))
}

// releasing is the mem.BufferPool of an answer's last buffer: grpc-go
// frees each buffer once it has copied it into frames, and the last one
// is freed last, so its Put is when the answer's bytes are no longer
// needed and the reservation goes back.
type releasing struct{ r *reservation }

func (p releasing) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p releasing) Put(*[]byte)       { p.r.release() }

// withRelease appends to out an empty last buffer whose release gives r
// back. grpc-go frees every buffer of a message once it is written (or the
// stream is gone), an empty last one when it closes the message's reader.
// mem.NewBuffer reference-counts (and so calls Put) only buffers above
// the pooling threshold (1 KiB in grpc-go 1.85), hence the capacity;
// TestPullInflightLimit fails if a release is ever lost.
func withRelease(out mem.BufferSlice, r *reservation) mem.BufferSlice {
	tail := make([]byte, 0, releaseTailCap)
	return append(out, mem.NewBuffer(&tail, releasing{r}))
}
