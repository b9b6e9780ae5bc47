package txn

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/storaged/storaged/storage/internal/base"
)

// sampleSnapshot is a table's cut after halves, checks and ends, heads
// filled in as the store fills them.
func sampleSnapshot() Snapshot {
	t := New(3)
	for i := int64(0); i < 6; i++ {
		t.AddHalf(Half{Offset: i, Phys: 100 * i, StoreMS: 1000 + i, ImmunityMS: 60_000 * (i % 2), Topic: "Orders", Queue: int32(i % 4)})
		t.HalfRecord(100 * i)
	}
	t.ApplyOp(Op{Kind: Check, Offsets: []int64{1, 2}}, 2000)
	t.OpRecord(700)
	t.ApplyOp(Op{Kind: Commit, Offsets: []int64{0}}, 2001)
	t.OpRecord(800)
	t.ApplyOp(Op{Kind: Rollback, Offsets: []int64{3, 4}}, 2002)
	t.OpRecord(900)
	s, _ := t.Cut()
	s.Sort()
	s.Half.QueueOffset, s.Half.BodyCRC = 5, 0xfeed
	s.Op.QueueOffset, s.Op.BodyCRC = 2, 0xbeef
	return s
}

// TestSnapshotCodec: a cut round-trips through the file, absent op head
// included; every malformed file is ErrBadSnapshot.
func TestSnapshotCodec(t *testing.T) {
	s := sampleSnapshot()
	if len(s.Pending) != 3 || len(s.Done) != 3 || s.Half.At != 500 || s.Op.At != 900 {
		t.Fatalf("sample cut: %+v", s)
	}
	noOp := s
	noOp.Op = base.SnapshotHead{At: -1}
	for _, in := range []Snapshot{s, noOp, {Half: base.SnapshotHead{At: 0}, Op: base.SnapshotHead{At: -1}, Pending: []Half{}, Done: []Ended{}}} {
		got, err := DecodeSnapshot(EncodeSnapshot(in))
		if err != nil || !reflect.DeepEqual(got, in) {
			t.Errorf("round trip of %+v: %+v, %v", in, got, err)
		}
	}
	good := EncodeSnapshot(s)
	bad := map[string]func(s *Snapshot){
		"a half twice":               func(s *Snapshot) { s.Pending[1].Offset = s.Pending[0].Offset },
		"a half at another's offset": func(s *Snapshot) { s.Pending[1].Phys = s.Pending[0].Phys },
		"a half after the record":    func(s *Snapshot) { s.Pending[2].Phys = s.Half.At + 1 },
		"a half past the queue":      func(s *Snapshot) { s.Pending[2].Offset = s.Half.QueueOffset + 1 },
		"a negative queue":           func(s *Snapshot) { s.Pending[0].Queue = -1 },
		"a negative check count":     func(s *Snapshot) { s.Pending[0].Checks = -1 },
		"an immunity past a day":     func(s *Snapshot) { s.Pending[0].ImmunityMS = maxImmunityMS + 1 },
		"an end that is a check":     func(s *Snapshot) { s.Done[0].Kind = Check },
		"an end of a pending half":   func(s *Snapshot) { s.Done[0].Phys = s.Pending[0].Phys },
		"an end twice":               func(s *Snapshot) { s.Done[1].Phys = s.Done[0].Phys },
		"an end after the record":    func(s *Snapshot) { s.Done[0].Phys = s.Half.At + 1 },
	}
	for name, mutate := range bad {
		m := sampleSnapshot()
		mutate(&m)
		if got, err := DecodeSnapshot(EncodeSnapshot(m)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: decoded %+v, %v", name, got, err)
		}
	}
	for i := range good {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("byte %d flipped: %v", i, err)
		}
	}
	for n := range len(good) {
		if _, err := DecodeSnapshot(good[:n]); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("cut to %d bytes: %v", n, err)
		}
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(EncodeSnapshot(Snapshot{Op: base.SnapshotHead{At: -1}}))
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
// original (pending halves with their checks, ends remembered, the
// records last applied) and goes on as it does under the same records,
// its ring of ends included, also when the ring had wrapped and when the
// restored table remembers fewer ends.
func TestTableCutRestore(t *testing.T) {
	a := New(3)
	if s, _ := a.Cut(); s.Half.At != -1 || s.Op.At != -1 {
		t.Fatalf("a new table names records %d, %d", s.Half.At, s.Op.At)
	}
	feed := func(tb *Table, from, to int64) {
		for i := from; i < to; i++ {
			tb.AddHalf(Half{Offset: i, Phys: 10 * i, StoreMS: i, Topic: "T"})
			tb.HalfRecord(10 * i)
			if i%3 == 2 { // end the two before, check this one
				tb.ApplyOp(Op{Kind: Commit, Offsets: []int64{i - 2}}, i)
				tb.ApplyOp(Op{Kind: Rollback, Offsets: []int64{i - 1}}, i)
				tb.ApplyOp(Op{Kind: Check, Offsets: []int64{i}}, i)
				tb.OpRecord(10*i + 5)
			}
		}
	}
	feed(a, 0, 9) // 6 ends: the ring of 3 wrapped
	s, applied := a.Cut()
	if applied != a.Applied() || applied != 9+3 {
		t.Fatalf("applied %d (table %d), want 12", applied, a.Applied())
	}
	b := New(3)
	b.Restore(s)
	same := func(x, y *Table) {
		t.Helper()
		xs, _ := x.Cut()
		ys, _ := y.Cut()
		xs.Sort()
		ys.Sort()
		if !reflect.DeepEqual(xs, ys) {
			t.Fatalf("restored table differs:\n%+v\n%+v", xs, ys)
		}
		for p := int64(0); p < 200; p += 10 {
			xk, xok := x.Ended(p)
			yk, yok := y.Ended(p)
			xh, xp := x.ByPhys(p)
			yh, yp := y.ByPhys(p)
			if xk != yk || xok != yok || xh != yh || xp != yp {
				t.Fatalf("at %d: ended %v %v / %v %v, pending %+v %v / %+v %v", p, xk, xok, yk, yok, xh, xp, yh, yp)
			}
		}
	}
	same(a, b)
	if len(s.Done) != 3 || s.Done[0].Phys != 40 || s.Done[1].Phys != 60 || s.Done[2].Phys != 70 {
		t.Fatalf("ends oldest first: %+v", s.Done)
	}
	feed(a, 9, 15)
	feed(b, 9, 15)
	same(a, b)
	small := New(2)
	small.Restore(s)
	if _, ok := small.Ended(40); ok {
		t.Fatal("a table remembering 2 ends kept the oldest of 3")
	}
	if k, ok := small.Ended(70); !ok || k != Rollback {
		t.Fatalf("newest end: %v %v", k, ok)
	}
	a.Reset()
	if s, _ := a.Cut(); s.Half.At != -1 || s.Op.At != -1 || len(s.Pending)+len(s.Done) != 0 {
		t.Fatalf("after Reset: %+v", s)
	}
}
