package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestLogTimeMilliseconds: every log line carries its time once, in UTC
// with milliseconds, in both formats (whole seconds cannot order the
// events of one failover across the members' logs).
func TestLogTimeMilliseconds(t *testing.T) {
	var buf bytes.Buffer
	before := time.Now().UTC().Truncate(time.Millisecond)
	l := newLogger(config{LogLevel: zerolog.InfoLevel, LogFormat: "json"}, &buf)
	l.Info().Str("component", "x").Msg("hello")
	after := time.Now().UTC()
	line := strings.TrimSpace(buf.String())
	if n := strings.Count(line, `"time":`); n != 1 {
		t.Fatalf("%d time fields in %s", n, line)
	}
	var d map[string]any
	if err := json.Unmarshal([]byte(line), &d); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	s, _ := d["time"].(string)
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(s) {
		t.Fatalf("time %q: want RFC 3339 in UTC with milliseconds", s)
	}
	at, err := time.Parse(logTimeLayout, s)
	if err != nil || at.Before(before) || at.After(after) {
		t.Fatalf("time %q (%v): not between %v and %v", s, err, before, after)
	}

	buf.Reset()
	l = newLogger(config{LogLevel: zerolog.InfoLevel, LogFormat: "console"}, &buf)
	l.Info().Msg("hello")
	if line := buf.String(); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INF hello`).MatchString(line) {
		t.Fatalf("console line %q: want it to start with the time in milliseconds", line)
	}
}
