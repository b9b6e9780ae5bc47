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
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode([]Entry{{Key: Key{"g", "T", 2}, Offset: 258}})
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short":          {1, 0},
		"version":        append([]byte{2}, good[1:]...),
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
	tb.Set(a, 1, 100)
	tb.Set(b, 2, 50)
	if err := tb.Admit(c); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third key admitted: %v", err)
	}
	if err := tb.Admit(a); err != nil {
		t.Fatal(err)
	}
	if at, ok := tb.OldestAt(); !ok || at != 50 {
		t.Fatalf("OldestAt %d %v", at, ok)
	}
	if got := tb.Below(100); len(got) != 1 || got[0].Key != b {
		t.Fatalf("Below(100) = %v", got)
	}
	tb.Delete(b)
	if _, ok := tb.Get(b); ok || tb.Len() != 1 {
		t.Fatal("Delete")
	}
}
