package storage

import (
	"errors"
	"maps"
	"testing"

	"github.com/storaged/storaged/storage/record"
)

func TestDelayProgressCmd(t *testing.T) {
	for _, next := range [][]int64{{}, {0}, {3, 0, 17}, {1 << 40, 5}} {
		b := encodeDelayProgress(next)
		if record.HasMagic(b) {
			t.Fatalf("%v: a command that looks like a record", next)
		}
		got, err := decodeDelayProgress(b)
		if err != nil {
			t.Fatalf("%v: %v", next, err)
		}
		want := map[int]int64{}
		for i, off := range next {
			want[i+1] = off
		}
		if !maps.Equal(got, want) {
			t.Fatalf("decoded %v, want %v", got, want)
		}
	}
	good := encodeDelayProgress([]int64{1, 2})
	for name, mod := range map[string]func(b []byte) []byte{
		"short":         func(b []byte) []byte { return b[:len(b)-1] },
		"length field":  func(b []byte) []byte { b[3]++; return b },
		"magic":         func(b []byte) []byte { b[4] ^= 1; return b },
		"kind":          func(b []byte) []byte { b[8] = 2; return b },
		"count":         func(b []byte) []byte { b[10] = 3; return b },
		"level order":   func(b []byte) []byte { b[cmdHeader+2+10+1] = 1; return b },
		"level zero":    func(b []byte) []byte { b[cmdHeader+2+1] = 0; return b },
		"negative next": func(b []byte) []byte { b[cmdHeader+2+2] = 0x80; return b },
		"empty":         func([]byte) []byte { return nil },
	} {
		b := mod(append([]byte(nil), good...))
		if _, err := decodeDelayProgress(b); !errors.Is(err, errBadCmd) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeDelayProgress: the decoder never panics, allocates by the
// entry's length only, and what it accepts encodes back to the same bytes.
func FuzzDecodeDelayProgress(f *testing.F) {
	f.Add(encodeDelayProgress(nil))
	f.Add(encodeDelayProgress([]int64{1, 2, 3}))
	f.Add([]byte{0, 0, 0, 9, 0x53, 0x44, 0x4D, 0x43, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeDelayProgress(b)
		if err != nil {
			return
		}
		next := make([]int64, len(m))
		for level, off := range m {
			if level < 1 || level > len(m) {
				return // sparse levels decode, but do not round-trip through the dense encoder
			}
			next[level-1] = off
		}
		if got := encodeDelayProgress(next); string(got) != string(b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}
