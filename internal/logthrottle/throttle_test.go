package logthrottle

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeNow is a clock the test moves by hand.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time { return f.t }

func TestAllow(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	type step struct {
		at             time.Duration // since start
		key            string
		ok             bool
		suppressedWant uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first at once, repeats suppressed, then one line with the count", []step{
			{0, "a", true, 0},
			{time.Second, "a", false, 0},
			{2 * time.Second, "a", false, 0},
			{9 * time.Second, "a", false, 0},
			{10 * time.Second, "a", true, 3},
			{11 * time.Second, "a", false, 0},
			{25 * time.Second, "a", true, 1},
			{40 * time.Second, "a", true, 0},
		}},
		{"keys are independent", []step{
			{0, "a", true, 0},
			{time.Second, "b", true, 0},
			{2 * time.Second, "a", false, 0},
			{3 * time.Second, "b", false, 0},
			{10 * time.Second, "a", true, 1},
		}},
		{"clock set back logs rather than stays silent", []step{
			{time.Hour, "a", true, 0},
			{time.Hour + time.Second, "a", false, 0},
			{0, "a", true, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &fakeNow{}
			th := New(10*time.Second, clk.now)
			for i, s := range tt.steps {
				clk.t = start.Add(s.at)
				ok, n := th.Allow(s.key)
				if ok != s.ok || n != s.suppressedWant {
					t.Fatalf("step %d (%v %q): Allow = %v, %d; want %v, %d", i, s.at, s.key, ok, n, s.ok, s.suppressedWant)
				}
			}
		})
	}
}

// TestEvent: 1,000 occurrences within one interval log one line; the next
// line after the interval carries the count of the 999 left out.
func TestEvent(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1_700_000_000, 0)}
	th := New(time.Second, clk.now)
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	for range 1000 {
		th.Event("disk", log.Error()).Str("why", "full").Msg("write failed")
	}
	clk.t = clk.t.Add(time.Second)
	th.Event("disk", log.Error()).Str("why", "full").Msg("write failed")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines logged, want 2:\n%s", len(lines), buf.String())
	}
	var second map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if second[SuppressedKey] != float64(999) || second["why"] != "full" {
		t.Fatalf("second line %s: want suppressed 999", lines[1])
	}
	// A disabled level neither logs nor counts.
	quiet := zerolog.New(&buf).Level(zerolog.Disabled)
	if ev := th.Event("other", quiet.Error()); ev != nil {
		t.Fatal("event for a disabled level")
	}
}

// TestBoundedKeys: more distinct keys than maxKeys do not grow the table
// past it.
func TestBoundedKeys(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1_700_000_000, 0)}
	th := New(time.Second, clk.now)
	for i := range 3 * maxKeys {
		th.Allow(strings.Repeat("k", 1+i%7) + string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if n := len(th.keys); n > maxKeys {
		t.Fatalf("%d keys held, bound %d", n, maxKeys)
	}
}
