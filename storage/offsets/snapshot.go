package offsets

import (
	"encoding/binary"
	"fmt"

	"github.com/storaged/storaged/storage/internal/base"
)

// Snapshot is the table as one offset record left it, so that a start
// applies only the records after that one instead of every offset record
// in the retained log (storage.openOffsets). It is a cache: the store
// keeps it beside the log and checks it against the log before use (the
// record it names must be where it says, with the body it says), and
// replays from the start of the log when it cannot use it.
type Snapshot struct {
	// At is the commitlog offset of the last offset record the entries
	// reflect, QueueOffset its offset in the offset topic's queue and
	// BodyCRC the CRC-32C of its body.
	At          int64
	QueueOffset int64
	BodyCRC     uint32
	// Entries are the keys' values, each with the commitlog offset of the
	// record that wrote it (At): what Table.Cut returns.
	Entries []Entry
}

const (
	snapshotVersion = 1
	snapshotHeader  = base.SnapshotHeadLen + 4 // head, entries
	snapshotFixed   = 1 + 1 + 4 + 8 + 8        // name lengths, queue, offset, at
	snapshotMinLen  = snapshotFixed + 2        // names of one byte each
)

// Head is the record s reflects, as the store checks it against the log.
func (s Snapshot) Head() base.SnapshotHead {
	return base.SnapshotHead{At: s.At, QueueOffset: s.QueueOffset, BodyCRC: s.BodyCRC}
}

// EncodeSnapshot returns the file body of s: a header, the entries, and a
// CRC-32C of everything before it.
func EncodeSnapshot(s Snapshot) []byte {
	n := snapshotHeader + 4
	for _, e := range s.Entries {
		n += snapshotFixed + len(e.Key.Group) + len(e.Key.Topic)
	}
	b := base.AppendSnapshotHead(make([]byte, 0, n), snapshotVersion,
		base.SnapshotHead{At: s.At, QueueOffset: s.QueueOffset, BodyCRC: s.BodyCRC})
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Entries)))
	for _, e := range s.Entries {
		b = appendKey(b, e.Key)
		b = binary.BigEndian.AppendUint64(b, uint64(e.Offset))
		b = binary.BigEndian.AppendUint64(b, uint64(e.At))
	}
	return base.SealSnapshot(b)
}

// DecodeSnapshot parses a snapshot file. The CRC is checked first and
// every length against the input, so no input panics or allocates more
// than its own size; a key twice, a negative value or an entry written
// after the snapshot's own record is ErrDecode.
func DecodeSnapshot(b []byte) (Snapshot, error) {
	h, body, err := base.OpenSnapshot(b, snapshotVersion)
	if err != nil || len(body) < snapshotHeader {
		return Snapshot{}, fmt.Errorf("%w: %v (%d bytes)", ErrDecode, err, len(b))
	}
	s := Snapshot{At: h.At, QueueOffset: h.QueueOffset, BodyCRC: h.BodyCRC}
	n := uint64(binary.BigEndian.Uint32(body[base.SnapshotHeadLen:]))
	if n*snapshotMinLen > uint64(len(body)-snapshotHeader) {
		return Snapshot{}, fmt.Errorf("%w: snapshot at %d, queue offset %d, %d entries in %d bytes", ErrDecode, s.At, s.QueueOffset, n, len(body))
	}
	s.Entries = make([]Entry, 0, n)
	seen := make(map[Key]struct{}, n)
	p := snapshotHeader
	for i := range n {
		g, ok := base.ReadName(body, &p)
		if !ok {
			return Snapshot{}, fmt.Errorf("%w: snapshot entry %d: group", ErrDecode, i)
		}
		t, ok := base.ReadName(body, &p)
		if !ok || p+snapshotFixed-2 > len(body) {
			return Snapshot{}, fmt.Errorf("%w: snapshot entry %d: topic", ErrDecode, i)
		}
		e := Entry{Key: Key{Group: g, Topic: t, Queue: int32(binary.BigEndian.Uint32(body[p:]))},
			Offset: int64(binary.BigEndian.Uint64(body[p+4:])), At: int64(binary.BigEndian.Uint64(body[p+12:]))}
		p += snapshotFixed - 2
		if e.Key.Queue < 0 || e.Offset < 0 || e.At < 0 || e.At > s.At {
			return Snapshot{}, fmt.Errorf("%w: snapshot entry %d: queue %d, offset %d, at %d (snapshot at %d)",
				ErrDecode, i, e.Key.Queue, e.Offset, e.At, s.At)
		}
		if _, dup := seen[e.Key]; dup {
			return Snapshot{}, fmt.Errorf("%w: snapshot entry %d: key %v twice", ErrDecode, i, e.Key)
		}
		seen[e.Key] = struct{}{}
		s.Entries = append(s.Entries, e)
	}
	if p != len(body) {
		return Snapshot{}, fmt.Errorf("%w: %d bytes after the snapshot's entries", ErrDecode, len(body)-p)
	}
	return s, nil
}
