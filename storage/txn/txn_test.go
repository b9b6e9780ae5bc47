package txn

import (
	"errors"
	"slices"
	"testing"
)

// TestOpCodec: every kind and offset list round-trips; malformed records
// are ErrBadOp.
func TestOpCodec(t *testing.T) {
	for _, op := range []Op{
		{Kind: Commit, Offsets: []int64{0}},
		{Kind: Rollback, Offsets: []int64{7, 1 << 40}},
		{Kind: Discard, Offsets: []int64{3, 2, 1}},
		{Kind: Check, Offsets: []int64{9223372036854775807}},
	} {
		tags, res, body := Encode(op)
		got, err := Decode(tags, res, body)
		if err != nil || got.Kind != op.Kind || !slices.Equal(got.Offsets, op.Offsets) {
			t.Errorf("%+v: encoded %q %q %q, decoded %+v %v", op, tags, res, body, got, err)
		}
	}
	long := make([]byte, 0, 4*MaxOpOffsets)
	for i := 0; i <= MaxOpOffsets; i++ {
		if i > 0 {
			long = append(long, ',')
		}
		long = append(long, '1')
	}
	for _, c := range []struct{ tags, res, body string }{
		{"d", "COMMIT", ""}, {"d", "MAYBE", "1"}, {"x", "", "1"}, {"c", "COMMIT", "1"}, {"d", "COMMIT", "1,,2"},
		{"d", "COMMIT", "-1"}, {"d", "COMMIT", "01"}, {"d", "COMMIT", "1 "}, {"d", "COMMIT", "99999999999999999999"},
		{"d", "COMMIT", "9223372036854775808"}, {"c", "", string(long)},
	} {
		if op, err := Decode(c.tags, c.res, []byte(c.body)); !errors.Is(err, ErrBadOp) {
			t.Errorf("%q %q %.40q: %+v %v, want ErrBadOp", c.tags, c.res, c.body, op, err)
		}
	}
}

// TestTableApply: halves enter, checks count, ends remove and are
// remembered up to the bound, ops of unknown halves change nothing.
func TestTableApply(t *testing.T) {
	tb := New(2)
	for i := int64(0); i < 4; i++ {
		tb.AddHalf(Half{Offset: i, Phys: 100 * i, Topic: "T"})
	}
	tb.AddHalf(Half{Offset: 0, Phys: 0, Topic: "dup"})
	tb.ApplyOp(Op{Kind: Check, Offsets: []int64{1, 1, 9}}, 55)
	if h, _ := tb.ByPhys(100); h.Checks != 2 || h.LastCheckMS != 55 || tb.Pending() != 4 {
		t.Fatalf("after checks: %+v, pending %d", h, tb.Pending())
	}
	if h, _ := tb.ByPhys(0); h.Topic != "T" {
		t.Fatalf("a repeated half replaced the first: %+v", h)
	}
	tb.ApplyOp(Op{Kind: Commit, Offsets: []int64{0}}, 1)
	tb.ApplyOp(Op{Kind: Rollback, Offsets: []int64{1, 0}}, 2) // 0 ended already: stays a commit
	tb.ApplyOp(Op{Kind: Discard, Offsets: []int64{2}}, 3)
	if tb.Pending() != 1 {
		t.Fatalf("pending %d, want 1", tb.Pending())
	}
	if lo, ok := tb.OldestPhys(); !ok || lo != 300 {
		t.Fatalf("oldest %d %v", lo, ok)
	}
	if _, ok := tb.Ended(0); ok {
		t.Fatalf("the oldest end is remembered beyond the bound")
	}
	for phys, want := range map[int64]Kind{100: Rollback, 200: Discard} {
		if k, ok := tb.Ended(phys); !ok || k != want {
			t.Errorf("ended %d: %v %v, want %v", phys, k, ok, want)
		}
	}
	tb.Reset()
	if tb.Pending() != 0 {
		t.Fatal("reset kept halves")
	}
}

// FuzzOpDecode: Decode never panics, and what it accepts encodes back to
// the same record.
func FuzzOpDecode(f *testing.F) {
	f.Add("d", "COMMIT", []byte("1,2,3"))
	f.Add("c", "", []byte("0"))
	f.Add("d", "DISCARD", []byte("9223372036854775807"))
	f.Fuzz(func(t *testing.T, tags, res string, body []byte) {
		op, err := Decode(tags, res, body)
		if err != nil {
			if !errors.Is(err, ErrBadOp) {
				t.Fatalf("error %v does not wrap ErrBadOp", err)
			}
			return
		}
		tags2, res2, body2 := Encode(op)
		if tags2 != tags || res2 != res || string(body2) != string(body) {
			t.Fatalf("decoded %+v re-encodes as %q %q %q", op, tags2, res2, body2)
		}
	})
}
