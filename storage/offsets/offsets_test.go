package offsets

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCodecRoundTrip(t *testing.T) {
	for _, es := range [][]Entry{
		{{Key: Key{"g", "T", 0}, Offset: 0}},
		{{Key: Key{strings.Repeat("g", 255), strings.Repeat("t", 127), 1023}, Offset: 1<<62 + 5},
			{Key: Key{"%RETRY%g", "a|b", 7}, Offset: 42}},
		{{Key: Key{"g", "T", 3}, Offset: 9, Rewrite: true, From: 0},
			{Key: Key{"h", "U", 0}, Offset: 1, Rewrite: true, From: 1<<40 + 3}},
	} {
		b := Encode(es)
		if len(b) != EncodedLen(es) {
			t.Fatalf("EncodedLen %d, encoded %d", EncodedLen(es), len(b))
		}
		got, err := Decode(b)
		if err != nil || !reflect.DeepEqual(got, es) {
			t.Fatalf("Decode(Encode(%v)) = %v, %v", es, got, err)
		}
	}
}

// TestEncodeGolden pins the wire format of offset records.
func TestEncodeGolden(t *testing.T) {
	got := Encode([]Entry{{Key: Key{"g", "T", 2}, Offset: 258}})
	want := []byte{1, 0, 1, 1, 'g', 1, 'T', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 2}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	got = Encode([]Entry{{Key: Key{"g", "T", 2}, Offset: 258, Rewrite: true, From: 513}})
	want = []byte{2, 0, 1, 1, 'g', 1, 'T', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 2, 1}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode(rewrite) = %v, want %v", got, want)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode([]Entry{{Key: Key{"g", "T", 2}, Offset: 258}})
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short":          {1, 0},
		"version":        append([]byte{3}, good[1:]...),
		"v2, v1 entries": append([]byte{2}, good[1:]...),
		"negative from":  {2, 0, 1, 1, 'g', 1, 'T', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 2, 0x80, 0, 0, 0, 0, 0, 0, 0},
		"zero entries":   {1, 0, 0},
		"count too high": append([]byte{1, 0, 2}, good[3:]...),
		"truncated":      good[:len(good)-1],
		"trailing":       append(append([]byte{}, good...), 0),
		"empty group":    {1, 0, 1, 0, 1, 'T', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 2, 0},
		"negative queue": {1, 0, 1, 1, 'g', 1, 'T', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 1, 2},
		"negative off":   {1, 0, 1, 1, 'g', 1, 'T', 0, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 1, 2},
	} {
		if _, err := Decode(b); !errors.Is(err, ErrDecode) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode([]Entry{{Key: Key{"g", "T", 2}, Offset: 258}}))
	f.Add(Encode([]Entry{{Key: Key{"a", "b", 0}}, {Key: Key{"c", "d", 1}, Offset: 9}}))
	f.Add(Encode([]Entry{{Key: Key{"a", "b", 0}, Rewrite: true, From: 7}, {Key: Key{"c", "d", 1}, Offset: 9, Rewrite: true}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := Decode(b)
		if err != nil {
			return
		}
		if again := Encode(es); !bytes.Equal(again, b) {
			t.Fatalf("decoded %v re-encodes to %v, not %v", es, again, b)
		}
	})
}

func TestTable(t *testing.T) {
	tb := New(2)
	a, b, c := Key{"a", "T", 0}, Key{"b", "T", 0}, Key{"c", "T", 0}
	tb.Apply([]Entry{{Key: a, Offset: 1}}, 100)
	tb.Apply([]Entry{{Key: b, Offset: 2}}, 50)
	if _, err := tb.Reserve(c); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third key admitted: %v", err)
	}
	rel, err := tb.Reserve(a)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if at, ok := tb.OldestAt(); !ok || at != 50 {
		t.Fatalf("OldestAt %d %v", at, ok)
	}
	if got := tb.Below(100); len(got) != 1 || got[0].Key != b || got[0].At != 50 {
		t.Fatalf("Below(100) = %v", got)
	}
	tb.Delete(b)
	if _, ok := tb.Get(b); ok || tb.Len() != 1 {
		t.Fatal("Delete")
	}
}

// TestReserveCountsPending: commits of new keys under way count against
// the bound until released, so concurrent commits cannot overshoot it.
func TestReserveCountsPending(t *testing.T) {
	tb := New(2)
	a, b, c := Key{"a", "T", 0}, Key{"b", "T", 0}, Key{"c", "T", 0}
	relA, err := tb.Reserve(a)
	if err != nil {
		t.Fatal(err)
	}
	relA2, err := tb.Reserve(a) // the same key again: no second slot
	if err != nil {
		t.Fatal(err)
	}
	relB, err := tb.Reserve(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Reserve(c); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third new key while two are reserved: %v", err)
	}
	relB() // b's commit stored nothing
	relC, err := tb.Reserve(c)
	if err != nil {
		t.Fatalf("after b's release: %v", err)
	}
	tb.Apply([]Entry{{Key: a, Offset: 1}}, 10)
	relA()
	relA2()
	relC()
	if _, err := tb.Reserve(b); err != nil {
		t.Fatalf("one key applied, none under way: %v", err)
	}
}

// TestApplyRewrite pins the rule every replica and every replay follow: a
// rewrite's entry never overwrites a value written after its source.
func TestApplyRewrite(t *testing.T) {
	k := Key{"g", "T", 0}
	for _, tc := range []struct {
		name      string
		before    []Entry // applied at 100 (nil: the key is absent)
		from      int64   // the rewrite's source
		wantOff   int64
		wantAt    int64
		wantApply int
	}{
		{name: "source is the latest", before: []Entry{{Key: k, Offset: 5}}, from: 100, wantOff: 7, wantAt: 300, wantApply: 1},
		{name: "a newer commit since", before: []Entry{{Key: k, Offset: 5}}, from: 40, wantOff: 5, wantAt: 100, wantApply: 0},
		{name: "key absent (replay past a deleted file)", from: 40, wantOff: 7, wantAt: 300, wantApply: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(10)
			if tc.before != nil {
				tb.Apply(tc.before, 100)
			}
			n := tb.Apply([]Entry{{Key: k, Offset: 7, Rewrite: true, From: tc.from}}, 300)
			off, ok := tb.Get(k)
			at, _ := tb.OldestAt()
			if n != tc.wantApply || !ok || off != tc.wantOff || at != tc.wantAt {
				t.Fatalf("applied %d, offset %d (%v) at %d; want %d, %d at %d", n, off, ok, at, tc.wantApply, tc.wantOff, tc.wantAt)
			}
		})
	}
}

// TestDropTopic: a topic's delete drops its keys of every group whose
// value was written below the delete's offset, and no other key.
func TestDropTopic(t *testing.T) {
	tb := New(10)
	tb.Apply([]Entry{{Key: Key{"a", "Gone", 0}, Offset: 1}, {Key: Key{"b", "Gone", 3}, Offset: 2}}, 100)
	tb.Apply([]Entry{{Key: Key{"a", "Kept", 0}, Offset: 3}}, 110)
	tb.Apply([]Entry{{Key: Key{"c", "Gone", 0}, Offset: 4}}, 300) // after the delete
	if n := tb.DropTopic("Gone", 200); n != 2 {
		t.Fatalf("dropped %d, want 2", n)
	}
	var left []Key
	for _, e := range tb.Entries() {
		left = append(left, e.Key)
	}
	if len(left) != 2 || left[0] != (Key{"a", "Kept", 0}) || left[1] != (Key{"c", "Gone", 0}) {
		t.Fatalf("left %v", left)
	}
	tb.Reset()
	if tb.Len() != 0 {
		t.Fatal("Reset left keys")
	}
}
