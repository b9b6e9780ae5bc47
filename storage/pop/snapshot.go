package pop

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/storaged/storaged/storage/internal/base"
)

// Snapshot is the table as one POP record left it, so that a start
// applies only the records after that one instead of every POP record in
// the retained log (storage.openPop). Like the offset table's
// (storage/offsets.Snapshot) it is a cache the store checks against the
// log before use, and replaces by a whole replay when it cannot use it.
type Snapshot struct {
	// At is the commitlog offset of the last POP record the state
	// reflects, QueueOffset its offset in the POP topic's queue and
	// BodyCRC the CRC-32C of its body.
	At          int64
	QueueOffset int64
	BodyCRC     uint32
	// Gen is the last generation handed out.
	Gen      uint64
	Cursors  []CursorState
	Inflight []InflightState
}

// CursorState is one queue's cursor and the record that wrote it (-1: a
// cursor moved in memory only, Advance).
type CursorState struct {
	Key  QueueKey
	Next int64
	At   int64
}

// InflightState is one message in flight and the record that put it in
// flight.
type InflightState struct {
	Key         Key
	Deadline    int64
	Gen         uint64
	Redelivered uint32
	At          int64
}

// Head is the record s reflects, as the store checks it against the log.
func (s Snapshot) Head() base.SnapshotHead {
	return base.SnapshotHead{At: s.At, QueueOffset: s.QueueOffset, BodyCRC: s.BodyCRC}
}

// Applied is the count of Apply calls since New. REQUIRES: Mu.
func (t *Table) Applied() uint64 { return t.applied }

// Size is the cursors and messages in flight the table holds. REQUIRES: Mu.
func (t *Table) Size() int { return len(t.cursors) + len(t.inflight) }

// Cut returns the table's state as the record of the last Apply (At, -1
// when none since New or Reset) left it, in no order (Sort it outside the
// lock: at the default bound of 200,000 messages in flight the sort costs
// several times the copy, BenchmarkTableCut), and the count of Apply calls
// since New; the caller fills in the record's QueueOffset and BodyCRC.
// REQUIRES: Mu.
func (t *Table) Cut() (s Snapshot, applied uint64) {
	s = Snapshot{At: t.last, Gen: t.gen, Cursors: make([]CursorState, 0, len(t.cursors)),
		Inflight: make([]InflightState, 0, len(t.inflight))}
	for k, c := range t.cursors {
		s.Cursors = append(s.Cursors, CursorState{Key: k, Next: c.next, At: c.at})
	}
	for k, e := range t.inflight {
		s.Inflight = append(s.Inflight, InflightState{Key: k, Deadline: e.deadline, Gen: e.gen, Redelivered: e.redeliv, At: e.at})
	}
	return s, t.applied
}

// Sort orders the cursors and messages in flight by key, so that equal
// states have equal snapshots.
func (s *Snapshot) Sort() {
	sort.Slice(s.Cursors, func(i, j int) bool { return lessQueue(s.Cursors[i].Key, s.Cursors[j].Key) })
	sort.Slice(s.Inflight, func(i, j int) bool { return lessKey(s.Inflight[i].Key, s.Inflight[j].Key) })
}

// Restore replaces the table's state with s's, as its record (s.At) left
// it: Open, from a snapshot, before it applies the records after that
// one. The generation only grows. REQUIRES: Mu.
func (t *Table) Restore(s Snapshot) {
	t.Reset()
	for _, c := range s.Cursors {
		t.cursors[c.Key] = cursor{next: c.Next, at: c.At}
	}
	for _, it := range s.Inflight {
		t.add(&entry{key: it.Key, deadline: it.Deadline, gen: it.Gen, redeliv: it.Redelivered, at: it.At})
	}
	t.gen = max(t.gen, s.Gen)
	t.last = s.At
	t.stats.Lock()
	t.statN = t.total
	t.stats.Unlock()
}

func lessKey(a, b Key) bool {
	if a.QueueKey != b.QueueKey {
		return lessQueue(a.QueueKey, b.QueueKey)
	}
	return a.Offset < b.Offset
}

const (
	snapshotVersion = 1
	snapshotHeader  = base.SnapshotHeadLen + 8 + 4 + 4 // head, gen, cursors, in flight
	cursorFixed     = 1 + 1 + 4 + 8 + 8                // name lengths, queue, next, at
	inflightFixed   = 1 + 1 + 4 + 8 + 8 + 8 + 4 + 8
)

// appendQueueKey appends k as the record and snapshot codecs lay it out:
// group and topic behind their lengths, then the queue.
func appendQueueKey(b []byte, k QueueKey) []byte {
	b = base.AppendName(b, k.Group)
	b = base.AppendName(b, k.Topic)
	return binary.BigEndian.AppendUint32(b, uint32(k.Queue))
}

// EncodeSnapshot returns the file body of s: a header, the cursors, the
// messages in flight, and a CRC-32C of everything before it.
func EncodeSnapshot(s Snapshot) []byte {
	n := snapshotHeader + 4
	for _, c := range s.Cursors {
		n += cursorFixed + len(c.Key.Group) + len(c.Key.Topic)
	}
	for _, it := range s.Inflight {
		n += inflightFixed + len(it.Key.Group) + len(it.Key.Topic)
	}
	b := base.AppendSnapshotHead(make([]byte, 0, n), snapshotVersion,
		base.SnapshotHead{At: s.At, QueueOffset: s.QueueOffset, BodyCRC: s.BodyCRC})
	b = binary.BigEndian.AppendUint64(b, s.Gen)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Cursors)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Inflight)))
	for _, c := range s.Cursors {
		b = appendQueueKey(b, c.Key)
		b = binary.BigEndian.AppendUint64(b, uint64(c.Next))
		b = binary.BigEndian.AppendUint64(b, uint64(c.At))
	}
	for _, it := range s.Inflight {
		b = appendQueueKey(b, it.Key.QueueKey)
		b = binary.BigEndian.AppendUint64(b, uint64(it.Key.Offset))
		b = binary.BigEndian.AppendUint64(b, uint64(it.Deadline))
		b = binary.BigEndian.AppendUint64(b, it.Gen)
		b = binary.BigEndian.AppendUint32(b, it.Redelivered)
		b = binary.BigEndian.AppendUint64(b, uint64(it.At))
	}
	return base.SealSnapshot(b)
}

// readQueueKey reads a QueueKey and the fixed-size tail after it (rest
// bytes), or reports false when b ends first.
func readQueueKey(b []byte, p *int, rest int) (QueueKey, bool) {
	g, ok := base.ReadName(b, p)
	if !ok {
		return QueueKey{}, false
	}
	t, ok := base.ReadName(b, p)
	if !ok || *p+4+rest > len(b) {
		return QueueKey{}, false
	}
	k := QueueKey{Group: g, Topic: t, Queue: int32(binary.BigEndian.Uint32(b[*p:]))}
	*p += 4
	return k, true
}

// DecodeSnapshot parses a snapshot file. The CRC is checked first and
// every count and length against the input, so no input panics or
// allocates more than its own size; a key twice, a negative queue,
// offset or cursor, or state written after the snapshot's own record is
// ErrDecode.
func DecodeSnapshot(b []byte) (Snapshot, error) {
	h, body, err := base.OpenSnapshot(b, snapshotVersion)
	if err != nil || len(body) < snapshotHeader {
		return Snapshot{}, fmt.Errorf("%w: %v (%d bytes)", ErrDecode, err, len(b))
	}
	const head = base.SnapshotHeadLen
	s := Snapshot{At: h.At, QueueOffset: h.QueueOffset, BodyCRC: h.BodyCRC, Gen: binary.BigEndian.Uint64(body[head:])}
	nc, ni := uint64(binary.BigEndian.Uint32(body[head+8:])), uint64(binary.BigEndian.Uint32(body[head+12:]))
	if nc*(cursorFixed+2)+ni*(inflightFixed+2) > uint64(len(body)-snapshotHeader) {
		return Snapshot{}, fmt.Errorf("%w: snapshot at %d, queue offset %d, %d cursors and %d in flight in %d bytes",
			ErrDecode, s.At, s.QueueOffset, nc, ni, len(body))
	}
	p := snapshotHeader
	s.Cursors = make([]CursorState, 0, nc)
	seenQ := make(map[QueueKey]struct{}, nc)
	for i := range nc {
		k, ok := readQueueKey(body, &p, 16)
		if !ok {
			return Snapshot{}, fmt.Errorf("%w: snapshot cursor %d", ErrDecode, i)
		}
		c := CursorState{Key: k, Next: int64(binary.BigEndian.Uint64(body[p:])), At: int64(binary.BigEndian.Uint64(body[p+8:]))}
		p += 16
		if _, dup := seenQ[k]; dup || k.Queue < 0 || c.Next < 0 || c.At < -1 || c.At > s.At {
			return Snapshot{}, fmt.Errorf("%w: snapshot cursor %d: %+v (twice: %v; snapshot at %d)", ErrDecode, i, c, dup, s.At)
		}
		seenQ[k] = struct{}{}
		s.Cursors = append(s.Cursors, c)
	}
	s.Inflight = make([]InflightState, 0, ni)
	seen := make(map[Key]struct{}, ni)
	for i := range ni {
		qk, ok := readQueueKey(body, &p, 36)
		if !ok {
			return Snapshot{}, fmt.Errorf("%w: snapshot message in flight %d", ErrDecode, i)
		}
		it := InflightState{Key: Key{QueueKey: qk, Offset: int64(binary.BigEndian.Uint64(body[p:]))},
			Deadline: int64(binary.BigEndian.Uint64(body[p+8:])), Gen: binary.BigEndian.Uint64(body[p+16:]),
			Redelivered: binary.BigEndian.Uint32(body[p+24:]), At: int64(binary.BigEndian.Uint64(body[p+28:]))}
		p += 36
		if _, dup := seen[it.Key]; dup || qk.Queue < 0 || it.Key.Offset < 0 || it.At < 0 || it.At > s.At || it.Gen > s.Gen {
			return Snapshot{}, fmt.Errorf("%w: snapshot message in flight %d: %+v (twice: %v; snapshot at %d, gen %d)",
				ErrDecode, i, it, dup, s.At, s.Gen)
		}
		seen[it.Key] = struct{}{}
		s.Inflight = append(s.Inflight, it)
	}
	if p != len(body) {
		return Snapshot{}, fmt.Errorf("%w: %d bytes after the snapshot's state", ErrDecode, len(body)-p)
	}
	return s, nil
}
