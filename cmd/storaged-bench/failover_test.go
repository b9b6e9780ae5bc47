package main

import (
	"errors"
	"io"
	"testing"
	"time"
)

func TestFailoverOptions(t *testing.T) {
	o, err := parseFailoverOptions([]string{"--storaged", "bin", "--signal", "term", "--rounds", "10", "--dirty-limit-mib", "64"}, io.Discard)
	if err != nil || o.dirtyLimitMiB != 64 || o.keyed {
		t.Fatalf("%+v, %v", o, err)
	}
	o, err = parseFailoverOptions([]string{"--storaged", "bin", "--signal", "stop", "--keyed", "--attempt-timeout", "500ms", "--leader-check-after", "-1ms"}, io.Discard)
	if err != nil || o.signal != "stop" || !o.keyed || o.attempt != 500*time.Millisecond || o.leaderCheck != -time.Millisecond {
		t.Fatalf("%+v, %v", o, err)
	}
	for name, args := range map[string][]string{
		"no binary":  {"--signal", "kill"},
		"bad signal": {"--storaged", "bin", "--signal", "hup"},
		"no rounds":  {"--storaged", "bin", "--rounds", "0"},
		"writers":    {"--storaged", "bin", "--writers", "5000"},
		"extra":      {"--storaged", "bin", "x"},
		"dirty wait": {"--storaged", "bin", "--dirty-wait", "-1s"},
		"attempt":    {"--storaged", "bin", "--attempt-timeout", "-1s"},
	} {
		var uerr usageError
		if _, err := parseFailoverOptions(args, io.Discard); !errors.As(err, &uerr) {
			t.Errorf("%s: %v, want a usage error", name, err)
		}
	}
	for _, tg := range []string{"r3", "r3-keyed"} {
		if _, _, _, err := parseMatrixOptions([]string{"--targets", tg}, io.Discard); err == nil {
			t.Errorf("matrix --targets %s without --storaged: accepted", tg)
		}
		if _, _, _, err := parseMatrixOptions([]string{"--targets", tg, "--storaged", "bin"}, io.Discard); err != nil {
			t.Errorf("matrix --targets %s --storaged bin: %v", tg, err)
		}
	}
}

// TestAckLogGap: the longest interval between consecutive acks from the
// last ack before the signal on.
func TestAckLogGap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		acks  []time.Time
		want  time.Duration
		after int
	}{
		{"steady", at(-2, -1, 1, 2, 3), 2 * time.Millisecond, 3},
		{"a hole after the signal", at(-1, 5, 900, 901), 895 * time.Millisecond, 3},
		{"no ack before", at(300, 301), 300 * time.Millisecond, 2},
		{"nothing after", at(-5, -1), 4 * time.Millisecond, 0},
	} {
		a := &ackLog{at: tc.acks}
		if got, after := a.gap(t0); got != tc.want || after != tc.after {
			t.Errorf("%s: gap %v with %d after, want %v with %d", tc.name, got, after, tc.want, tc.after)
		}
	}
	a := &ackLog{at: at(-3, -2, -1)}
	a.mark()
	if len(a.at) != 1 || !a.at[0].Equal(t0.Add(-time.Millisecond)) {
		t.Fatalf("mark kept %v", a.at)
	}
	if q := quantile([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.99); q != 10 {
		t.Fatalf("p99 of 10 values: %v", q)
	}
	if q := quantile([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.5); q != 5 {
		t.Fatalf("p50 of 10 values: %v", q)
	}
}
