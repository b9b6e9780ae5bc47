package record

import (
	"math"
	"testing"
)

// TestParseCRCDigits: the word-at-a-time parse against the digits
// putCRCDigits writes, and against the malformed inputs each of its
// checks exists for.
func TestParseCRCDigits(t *testing.T) {
	for _, c := range []uint32{0, 1, 9, 10, 99, 12345, 1<<31 - 1, 1_000_000_000, 987_654_321} {
		var b [10]byte
		putCRCDigits(b[:], c)
		got, ok := parseCRCDigits(b[:])
		if !ok || got != c {
			t.Errorf("parseCRCDigits(%q) = %d, %v; want %d", b, got, ok, c)
		}
	}
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"above 31 bits", "8463847412"}, // 2147483648 reversed
		{"all nines", "9999999999"},
		{"colon in the word", "00:0000000"},
		{"slash in the word", "000000000/"},
		{"letter in the low pair", "a000000000"},
		{"colon in the low pair", "0:00000000"},
		{"high byte", "0000\xb000000"},
		{"space", "0000 00000"},
		{"digit plus 0x40", "0000p00000"},
	} {
		if got, ok := parseCRCDigits([]byte(tc.in)); ok {
			t.Errorf("%s: parseCRCDigits(%q) = %d, ok; want refused", tc.name, tc.in, got)
		}
		if _, ok := parseCRCDigitsLoop([]byte(tc.in)); ok {
			t.Errorf("%s: the reference loop accepts %q", tc.name, tc.in)
		}
	}
}

// FuzzParseCRCDigits holds the word-at-a-time parse to the plain loop on
// any ten bytes.
func FuzzParseCRCDigits(f *testing.F) {
	f.Add([]byte("0000000000"))
	f.Add([]byte("7463847412"))
	f.Add([]byte("8463847412"))
	f.Add([]byte("00:0000000"))
	f.Add([]byte{0x3f, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 10 {
			return
		}
		b = b[:10]
		got, ok := parseCRCDigits(b)
		want, wok := parseCRCDigitsLoop(b)
		if got != want || ok != wok {
			t.Fatalf("parseCRCDigits(%q) = %d, %v; the loop says %d, %v", b, got, ok, want, wok)
		}
		if ok && got > math.MaxInt32 {
			t.Fatalf("accepted %d above 31 bits", got)
		}
	})
}
