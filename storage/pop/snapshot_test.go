package pop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"sort"
	"testing"
)

func reseal(b []byte) []byte {
	body := b[:len(b)-4]
	return binary.BigEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, castagnoli))
}

func sampleSnapshot() Snapshot {
	return Snapshot{At: 5000, QueueOffset: 12, BodyCRC: 0xabcdef01, Gen: 99,
		Cursors: []CursorState{{Key: QueueKey{"g", "T", 0}, Next: 7, At: 4000}, {Key: QueueKey{"g", "T", 1}, Next: 3, At: -1}},
		Inflight: []InflightState{{Key: Key{QueueKey{"g", "T", 0}, 5}, Deadline: 1 << 41, Gen: 98, Redelivered: 2, At: 4000},
			{Key: Key{QueueKey{"%RETRY%g", "x", 0}, 0}, Deadline: 7, Gen: 1, At: 5000}}}
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, s := range []Snapshot{{Cursors: []CursorState{}, Inflight: []InflightState{}}, sampleSnapshot()} {
		got, err := DecodeSnapshot(EncodeSnapshot(s))
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if !reflect.DeepEqual(got, s) {
			t.Fatalf("decoded %+v, want %+v", got, s)
		}
	}
}

func TestDecodeSnapshotRejects(t *testing.T) {
	good := EncodeSnapshot(sampleSnapshot())
	mod := func(f func(*Snapshot)) []byte {
		s := sampleSnapshot()
		f(&s)
		return EncodeSnapshot(s)
	}
	flipped := append([]byte(nil), good...)
	flipped[40] ^= 1
	counts := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(counts[33:], 1<<30)
	for name, b := range map[string][]byte{
		"empty":            nil,
		"crc":              flipped,
		"count past size":  reseal(counts),
		"cut":              reseal(good[:len(good)-9]),
		"cursor twice":     mod(func(s *Snapshot) { s.Cursors[1].Key = s.Cursors[0].Key }),
		"message twice":    mod(func(s *Snapshot) { s.Inflight[1].Key = s.Inflight[0].Key }),
		"cursor after it":  mod(func(s *Snapshot) { s.Cursors[0].At = 5001 }),
		"message after it": mod(func(s *Snapshot) { s.Inflight[0].At = 5001 }),
		"gen above":        mod(func(s *Snapshot) { s.Inflight[0].Gen = 100 }),
		"negative offset":  mod(func(s *Snapshot) { s.Inflight[0].Key.Offset = -1 }),
		"cursor at -2":     mod(func(s *Snapshot) { s.Cursors[0].At = -2 }),
	} {
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrDecode) {
			t.Errorf("%s: %v, want ErrDecode", name, err)
		}
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(EncodeSnapshot(Snapshot{}))
	f.Add(EncodeSnapshot(sampleSnapshot()))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b)
		if err != nil {
			return
		}
		if again := EncodeSnapshot(s); !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v re-encodes to %v, not %v", s, again, b)
		}
	})
}

// TestTableCutRestore: a table restored from a cut answers as the
// original (cursors, messages in flight, what is due and when, the room
// left, progress) and goes on as it does under the same ops, its due heap
// included; the cut names the record of the last Apply, and Reset
// forgets it.
func TestTableCutRestore(t *testing.T) {
	lim := Limits{Inflight: 100, InflightPerGroup: 10, Cursors: 100}
	a := New(lim)
	if s, _ := a.Cut(); s.At != -1 {
		t.Fatalf("a new table names record %d", s.At)
	}
	q0, q1 := QueueKey{"g", "T", 0}, QueueKey{"g", "T", 1}
	ops := []struct {
		op Op
		at int64
	}{
		{Op{Kind: Set, Key: q0, Cursor: 4, Items: []Item{{Offset: 0, Deadline: 50, Gen: 1}, {Offset: 1, Deadline: 30, Gen: 2},
			{Offset: 2, Deadline: 40, Gen: 3}, {Offset: 3, Deadline: 60, Gen: 4}}}, 100},
		{Op{Kind: Drop, Key: q0, Items: []Item{{Offset: 2, Gen: 3}}}, 200},
		{Op{Kind: Set, Key: q1, Cursor: 1, Items: []Item{{Offset: 0, Deadline: 20, Gen: 5, Redelivered: 1}}}, 300},
		{Op{Kind: Set, Key: q0, Cursor: NoCursor, Items: []Item{{Offset: 3, Deadline: 10, Gen: 6}}}, 400}, // a renewal
	}
	for _, o := range ops {
		a.Apply(o.op, o.at)
	}
	a.Advance(QueueKey{"h", "T", 0}, 9) // memory only: At -1
	cut, applied := a.Cut()
	cut.Sort()
	if cut.At != 400 || applied != 4 || a.Applied() != 4 || a.Size() != 3+4 {
		t.Fatalf("cut at %d, applied %d, size %d; want 400, 4, 7", cut.At, applied, a.Size())
	}
	b := New(lim)
	b.Restore(cut)
	same := func(when string) {
		t.Helper()
		ca, _ := a.Cut()
		cb, _ := b.Cut()
		ca.Sort()
		cb.Sort()
		if !reflect.DeepEqual(ca.Cursors, cb.Cursors) || !reflect.DeepEqual(ca.Inflight, cb.Inflight) || ca.Gen != cb.Gen {
			t.Fatalf("%s: restored %+v, original %+v", when, cb, ca)
		}
		for _, now := range []int64{0, 15, 25, 45, 70} {
			// Due walks the heap as a tree: the same set, in the order of
			// each heap's layout.
			da, db := a.Due("g", now, 10), b.Due("g", now, 10)
			sort.Slice(da, func(i, j int) bool { return lessKey(da[i], da[j]) })
			sort.Slice(db, func(i, j int) bool { return lessKey(db[i], db[j]) })
			if !reflect.DeepEqual(da, db) {
				t.Fatalf("%s: due at %d: restored %v, original %v", when, now, db, da)
			}
		}
		na, oka := a.NextDeadline("g")
		nb, okb := b.NextDeadline("g")
		if na != nb || oka != okb || a.Room("g") != b.Room("g") || a.Inflight("") != b.Inflight("") ||
			!reflect.DeepEqual(a.Progress(), b.Progress()) || a.Stats() != b.Stats() {
			t.Fatalf("%s: next deadline %d/%v room %d in flight %d, original %d/%v %d %d", when, nb, okb, b.Room("g"),
				b.Inflight(""), na, oka, a.Room("g"), a.Inflight(""))
		}
	}
	same("restored")
	for _, o := range []Op{
		{Kind: Drop, Key: q0, Items: []Item{{Offset: 1, Gen: 2}}},
		{Kind: Set, Key: q0, Cursor: NoCursor, Items: []Item{{Offset: 0, Deadline: 5, Gen: 7}}},
		{Kind: Drop, Key: q1, Items: []Item{{Offset: 0, Gen: 4}}}, // a stale generation: nothing
	} {
		a.Apply(o, 500)
		b.Apply(o, 500)
	}
	same("after more ops")
	b.Reset()
	if s, _ := b.Cut(); s.At != -1 || len(s.Cursors)+len(s.Inflight) != 0 {
		t.Fatalf("after Reset: %+v", s)
	}
}

// BenchmarkTableCut: the copy a POP snapshot takes under the table's
// lock, of a table at the store's default bound (200,000 messages in
// flight, over 1,000 queues).
func BenchmarkTableCut(b *testing.B) {
	t := New(Limits{Inflight: 200_000, InflightPerGroup: 200_000, Cursors: 1000})
	for q := range 1000 {
		items := make([]Item, 200)
		for i := range items {
			items[i] = Item{Offset: int64(i), Deadline: int64(i * 7 % 1000), Gen: uint64(q*200 + i + 1)}
		}
		t.Apply(Op{Kind: Set, Key: QueueKey{"g", "T", int32(q)}, Cursor: 200, Items: items}, int64(q))
	}
	for b.Loop() {
		t.Cut()
	}
}
