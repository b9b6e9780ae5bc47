package txn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/storaged/storaged/storage/internal/base"
)

// Snapshot is the table as the last half and op records it applied left
// it, so that a start applies only the records of each topic after those
// instead of every half and op record in the retained log
// (storage.openTxn). Like the consumer offset and POP tables' snapshots it
// is a cache the store checks against the log before use (both records
// must be where it says, with the bodies it says), and replaces by a
// whole replay when it cannot use it.
//
// Two records, one per topic, pin one point of the log: the table
// applies half and op records in log order, so at a Cut every half
// record up to Half and every op record up to Op are applied and none
// after either. An op record follows the halves it names in the log, so
// the op records after Op name only halves the snapshot holds or halves
// after Half, which the replay applies first, as a whole replay does.
type Snapshot struct {
	// Half is the last half record applied: commitlog offset, queue
	// offset in the half topic and body CRC.
	Half base.SnapshotHead
	// Op is the last op record applied; At is -1 when there was none.
	Op base.SnapshotHead
	// Pending are the pending halves, by queue offset once sorted.
	Pending []Half
	// Done are the ends remembered, oldest first.
	Done []Ended
}

// Ended is one end the table remembers: the half at commitlog offset
// Phys ended as Kind.
type Ended struct {
	Phys int64
	Kind Kind
}

// ErrBadSnapshot: a snapshot file that does not decode.
var ErrBadSnapshot = errors.New("txn: malformed snapshot")

// Head is the half record s reflects, as the store checks it against the
// log (Op is checked beside it).
func (s Snapshot) Head() base.SnapshotHead { return s.Half }

// HalfRecord notes that the half record at commitlog offset at was
// applied, whether or not it made a pending half (AddHalf). REQUIRES: Mu.
func (t *Table) HalfRecord(at int64) {
	t.halfAt = at
	t.applied++
}

// OpRecord notes that the op record at commitlog offset at was applied,
// or skipped for not decoding (ApplyOp). REQUIRES: Mu.
func (t *Table) OpRecord(at int64) {
	t.opAt = at
	t.applied++
}

// Applied is the half and op records noted since New. REQUIRES: Mu.
func (t *Table) Applied() uint64 { return t.applied }

// Size is the pending halves and remembered ends the table holds.
// REQUIRES: Mu.
func (t *Table) Size() int { return len(t.pending) + len(t.done) }

// Cut returns the table's state as the last half and op records noted
// left it (their At only, -1 for none; the caller fills in the rest of
// each head), with the pending halves in no order (Sort them outside
// the lock), and Applied. REQUIRES: Mu.
func (t *Table) Cut() (s Snapshot, applied uint64) {
	s = Snapshot{Half: base.SnapshotHead{At: t.halfAt}, Op: base.SnapshotHead{At: t.opAt},
		Pending: t.All(), Done: make([]Ended, 0, len(t.doneOrder))}
	// The ring's oldest is at doneHead once it is full, at 0 before.
	for i := range t.doneOrder {
		phys := t.doneOrder[(t.doneHead+i)%len(t.doneOrder)]
		s.Done = append(s.Done, Ended{Phys: phys, Kind: t.done[phys]})
	}
	return s, t.applied
}

// Sort orders the pending halves by queue offset, so that equal states
// have equal snapshots.
func (s *Snapshot) Sort() {
	sort.Slice(s.Pending, func(i, j int) bool { return s.Pending[i].Offset < s.Pending[j].Offset })
}

// Restore replaces the table's state with s's, as its records left it:
// Open, from a snapshot, before it applies the records after them. Of
// the ends, the newest the table remembers are kept. REQUIRES: Mu.
func (t *Table) Restore(s Snapshot) {
	t.Reset()
	for _, h := range s.Pending {
		t.AddHalf(h)
	}
	for _, e := range s.Done[max(len(s.Done)-t.maxDone, 0):] {
		t.remember(e.Phys, e.Kind)
	}
	t.halfAt, t.opAt = s.Half.At, s.Op.At
}

const (
	snapshotVersion = 1
	opHeadLen       = 1 + 8 + 8 + 4                            // present, at, queue offset, body CRC
	snapshotHeader  = base.SnapshotHeadLen + opHeadLen + 4 + 4 // heads, pending, done
	pendingFixed    = 1 + 4 + 8 + 8 + 8 + 8 + 4 + 8            // topic length, queue, offset, phys, store, immunity, checks, last check
	endedLen        = 8 + 1                                    // phys, kind
	maxImmunityMS   = 86400 * 1000                             // halfOf's bound
)

// EncodeSnapshot returns the file body of s: the heads, the pending
// halves, the ends, and a CRC-32C of everything before it.
func EncodeSnapshot(s Snapshot) []byte {
	n := snapshotHeader + len(s.Done)*endedLen + 4
	for _, h := range s.Pending {
		n += pendingFixed + len(h.Topic)
	}
	b := base.AppendSnapshotHead(make([]byte, 0, n), snapshotVersion, s.Half)
	if s.Op.At < 0 {
		b = append(b, make([]byte, opHeadLen)...)
	} else {
		b = append(b, 1)
		b = binary.BigEndian.AppendUint64(b, uint64(s.Op.At))
		b = binary.BigEndian.AppendUint64(b, uint64(s.Op.QueueOffset))
		b = binary.BigEndian.AppendUint32(b, s.Op.BodyCRC)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Pending)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Done)))
	for _, h := range s.Pending {
		b = base.AppendName(b, h.Topic)
		b = binary.BigEndian.AppendUint32(b, uint32(h.Queue))
		b = binary.BigEndian.AppendUint64(b, uint64(h.Offset))
		b = binary.BigEndian.AppendUint64(b, uint64(h.Phys))
		b = binary.BigEndian.AppendUint64(b, uint64(h.StoreMS))
		b = binary.BigEndian.AppendUint64(b, uint64(h.ImmunityMS))
		b = binary.BigEndian.AppendUint32(b, uint32(h.Checks))
		b = binary.BigEndian.AppendUint64(b, uint64(h.LastCheckMS))
	}
	for _, e := range s.Done {
		b = binary.BigEndian.AppendUint64(b, uint64(e.Phys))
		b = append(b, byte(e.Kind))
	}
	return base.SealSnapshot(b)
}

// DecodeSnapshot parses a snapshot file. The CRC is checked first and
// every count and length against the input, so no input panics or
// allocates more than its own size. A half or an end twice (by queue
// offset or commitlog offset), a negative field, a half or an end after
// the snapshot's half record, an end that is not COMMIT, ROLLBACK or
// DISCARD, or a pending half also among the ends is ErrBadSnapshot.
func DecodeSnapshot(b []byte) (Snapshot, error) {
	h, body, err := base.OpenSnapshot(b, snapshotVersion)
	if err != nil || len(body) < snapshotHeader {
		return Snapshot{}, fmt.Errorf("%w: %v (%d bytes)", ErrBadSnapshot, err, len(b))
	}
	be := binary.BigEndian
	s := Snapshot{Half: h, Op: base.SnapshotHead{At: -1}}
	p := base.SnapshotHeadLen
	switch body[p] {
	case 0:
		if [opHeadLen - 1]byte(body[p+1:p+opHeadLen]) != [opHeadLen - 1]byte{} {
			return Snapshot{}, fmt.Errorf("%w: an absent op head with bytes", ErrBadSnapshot)
		}
	case 1:
		s.Op = base.SnapshotHead{At: int64(be.Uint64(body[p+1:])), QueueOffset: int64(be.Uint64(body[p+9:])), BodyCRC: be.Uint32(body[p+17:])}
		if s.Op.At < 0 || s.Op.QueueOffset < 0 {
			return Snapshot{}, fmt.Errorf("%w: op record at %d, queue offset %d", ErrBadSnapshot, s.Op.At, s.Op.QueueOffset)
		}
	default:
		return Snapshot{}, fmt.Errorf("%w: op head flag %d", ErrBadSnapshot, body[p])
	}
	p += opHeadLen
	np, nd := uint64(be.Uint32(body[p:])), uint64(be.Uint32(body[p+4:]))
	p += 8
	if np*(pendingFixed+1)+nd*endedLen > uint64(len(body)-p) {
		return Snapshot{}, fmt.Errorf("%w: %d pending and %d ended in %d bytes", ErrBadSnapshot, np, nd, len(body))
	}
	s.Pending = make([]Half, 0, np)
	offsets := make(map[int64]struct{}, np)
	phys := make(map[int64]bool, np+nd) // true: pending
	for i := range np {
		topic, ok := base.ReadName(body, &p)
		if !ok || p+pendingFixed-1 > len(body) {
			return Snapshot{}, fmt.Errorf("%w: pending half %d", ErrBadSnapshot, i)
		}
		x := Half{Topic: topic, Queue: int32(be.Uint32(body[p:])), Offset: int64(be.Uint64(body[p+4:])),
			Phys: int64(be.Uint64(body[p+12:])), StoreMS: int64(be.Uint64(body[p+20:])), ImmunityMS: int64(be.Uint64(body[p+28:])),
			Checks: int32(be.Uint32(body[p+36:])), LastCheckMS: int64(be.Uint64(body[p+40:]))}
		p += pendingFixed - 1
		_, dupOff := offsets[x.Offset]
		_, dupPhys := phys[x.Phys]
		if dupOff || dupPhys || x.Queue < 0 || x.Offset < 0 || x.Offset > h.QueueOffset || x.Phys < 0 || x.Phys > h.At ||
			x.StoreMS < 0 || x.ImmunityMS < 0 || x.ImmunityMS > maxImmunityMS || x.Checks < 0 || x.LastCheckMS < 0 {
			return Snapshot{}, fmt.Errorf("%w: pending half %d: %+v (twice: %v; half record at %d, queue offset %d)",
				ErrBadSnapshot, i, x, dupOff || dupPhys, h.At, h.QueueOffset)
		}
		offsets[x.Offset] = struct{}{}
		phys[x.Phys] = true
		s.Pending = append(s.Pending, x)
	}
	s.Done = make([]Ended, 0, nd)
	for i := range nd {
		e := Ended{Phys: int64(be.Uint64(body[p:])), Kind: Kind(body[p+8])}
		p += endedLen
		_, dup := phys[e.Phys]
		if dup || e.Phys < 0 || e.Phys > h.At || (e.Kind != Commit && e.Kind != Rollback && e.Kind != Discard) {
			return Snapshot{}, fmt.Errorf("%w: end %d: %+v (twice or pending: %v; half record at %d)", ErrBadSnapshot, i, e, dup, h.At)
		}
		phys[e.Phys] = false
		s.Done = append(s.Done, e)
	}
	if p != len(body) {
		return Snapshot{}, fmt.Errorf("%w: %d bytes after the snapshot's state", ErrBadSnapshot, len(body)-p)
	}
	return s, nil
}
