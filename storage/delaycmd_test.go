package storage

import (
	"errors"
	"maps"
	"strings"
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

func TestTopicCmd(t *testing.T) {
	for _, c := range []struct {
		name   string
		queues int32
	}{{"A", 1}, {"orders-eu_1", 16}, {"retry|g", MaxQueues}} {
		b := encodeTopicCmd(c.name, c.queues)
		if record.HasMagic(b) || !isTopicCmd(b) || isDelayProgress(b) {
			t.Fatalf("%v: a topic command that looks like a record or another command", c)
		}
		name, queues, err := decodeTopicCmd(b)
		if err != nil || name != c.name || queues != c.queues {
			t.Fatalf("decoded %q %d (%v), want %q %d", name, queues, err, c.name, c.queues)
		}
	}
	good := encodeTopicCmd("T", 8)
	for name, mod := range map[string]func(b []byte) []byte{
		"short":          func(b []byte) []byte { return b[:len(b)-1] },
		"length field":   func(b []byte) []byte { b[3]++; return b },
		"kind":           func(b []byte) []byte { b[8] = cmdDelayProgress; return b },
		"name length":    func(b []byte) []byte { b[10] = 2; return b },
		"bad name":       func(b []byte) []byte { b[11] = '/'; return b },
		"system topic":   func([]byte) []byte { return encodeTopicCmd(OffsetTopic, 1) },
		"zero queues":    func(b []byte) []byte { b[len(b)-1] = 0; return b },
		"too many":       func([]byte) []byte { return encodeTopicCmd("T", MaxQueues+1) },
		"empty":          func([]byte) []byte { return nil },
		"negative count": func(b []byte) []byte { b[len(b)-4] = 0x80; return b },
	} {
		b := mod(append([]byte(nil), good...))
		if _, _, err := decodeTopicCmd(b); !errors.Is(err, errBadCmd) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeTopicCmd: the decoder never panics and what it accepts
// encodes back to the same bytes.
func FuzzDecodeTopicCmd(f *testing.F) {
	f.Add(encodeTopicCmd("T", 8))
	f.Add(encodeTopicCmd("orders", MaxQueues))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, queues, err := decodeTopicCmd(b)
		if err != nil {
			return
		}
		if again := encodeTopicCmd(name, queues); string(again) != string(b) {
			t.Fatalf("decoded %q %d re-encodes to %v, not %v", name, queues, again, b)
		}
	})
}

func TestTopicDeleteCmd(t *testing.T) {
	for _, name := range []string{"A", "orders-eu_1", "retry|g", strings.Repeat("n", 127)} {
		b := encodeTopicDeleteCmd(name)
		if record.HasMagic(b) || !isTopicDeleteCmd(b) || isTopicCmd(b) || isDelayProgress(b) || isTimerProgress(b) {
			t.Fatalf("%q: a topic delete that looks like a record or another command", name)
		}
		got, err := decodeTopicDeleteCmd(b)
		if err != nil || got != name {
			t.Fatalf("decoded %q (%v), want %q", got, err, name)
		}
	}
	good := encodeTopicDeleteCmd("T1")
	for name, mod := range map[string]func(b []byte) []byte{
		"short":        func(b []byte) []byte { return b[:len(b)-1] },
		"long":         func(b []byte) []byte { return append(b, 'x') },
		"length field": func(b []byte) []byte { b[3]++; return b },
		"kind":         func(b []byte) []byte { b[8] = cmdTopic; return b },
		"name length":  func(b []byte) []byte { b[10] = 3; return b },
		"bad name":     func(b []byte) []byte { b[11] = '/'; return b },
		"system topic": func([]byte) []byte { return encodeTopicDeleteCmd(OffsetTopic) },
		"schedule":     func([]byte) []byte { return encodeTopicDeleteCmd(ScheduleTopic) },
		"empty name":   func([]byte) []byte { return encodeTopicDeleteCmd("") },
		"empty":        func([]byte) []byte { return nil },
	} {
		b := mod(append([]byte(nil), good...))
		if _, err := decodeTopicDeleteCmd(b); !errors.Is(err, errBadCmd) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeTopicDeleteCmd: the decoder never panics and what it accepts
// encodes back to the same bytes.
func FuzzDecodeTopicDeleteCmd(f *testing.F) {
	f.Add(encodeTopicDeleteCmd("T"))
	f.Add(encodeTopicDeleteCmd(strings.Repeat("n", 127)))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := decodeTopicDeleteCmd(b)
		if err != nil {
			return
		}
		if again := encodeTopicDeleteCmd(name); string(again) != string(b) {
			t.Fatalf("decoded %q re-encodes to %v, not %v", name, again, b)
		}
	})
}
