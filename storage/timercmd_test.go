package storage

import (
	"errors"
	"math"
	"testing"

	"github.com/storaged/storaged/storage/record"
)

func TestTimerProgressCmd(t *testing.T) {
	for _, p := range []TimerProgress{{}, {Low: 3, Ingested: 9, DueMS: 1700000000000, Phys: 4096}, {Low: 5, Ingested: 5, DueMS: math.MaxInt64}} {
		b := encodeTimerProgress(p)
		if record.HasMagic(b) || isDelayProgress(b) || !isTimerProgress(b) {
			t.Fatalf("%+v: classified wrong", p)
		}
		got, err := decodeTimerProgress(b)
		if err != nil || got != p {
			t.Fatalf("decoded %+v %v, want %+v", got, err, p)
		}
	}
	good := encodeTimerProgress(TimerProgress{Low: 1, Ingested: 2, DueMS: 3, Phys: 4})
	for name, mod := range map[string]func(b []byte) []byte{
		"short":          func(b []byte) []byte { return b[:len(b)-1] },
		"long":           func(b []byte) []byte { return append(b, 0) },
		"length field":   func(b []byte) []byte { b[3]++; return b },
		"magic":          func(b []byte) []byte { b[4] ^= 1; return b },
		"kind":           func(b []byte) []byte { b[8] = cmdDelayProgress; return b },
		"version":        func(b []byte) []byte { b[9] = 2; return b },
		"negative low":   func(b []byte) []byte { b[10] = 0x80; return b },
		"low past read":  func(b []byte) []byte { b[17] = 9; return b },
		"negative phys":  func(b []byte) []byte { b[34] = 0x80; return b },
		"empty":          func([]byte) []byte { return nil },
		"header only":    func(b []byte) []byte { return b[:cmdHeader] },
		"delay progress": func([]byte) []byte { return encodeDelayProgress([]int64{1}) },
	} {
		b := mod(append([]byte(nil), good...))
		if _, err := decodeTimerProgress(b); !errors.Is(err, errBadCmd) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeTimerProgress: the decoder never panics, and what it accepts
// is a usable progress that encodes back to the same bytes.
func FuzzDecodeTimerProgress(f *testing.F) {
	f.Add(encodeTimerProgress(TimerProgress{}))
	f.Add(encodeTimerProgress(TimerProgress{Low: 1, Ingested: 2, DueMS: 3, Phys: 4}))
	f.Add([]byte{0, 0, 0, 9, 0x53, 0x44, 0x4D, 0x43, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeTimerProgress(b)
		if err != nil {
			return
		}
		if p.Check() != nil {
			t.Fatalf("accepted an unusable progress %+v", p)
		}
		if got := encodeTimerProgress(p); string(got) != string(b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}
