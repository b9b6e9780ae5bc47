package gctune

import (
	"runtime/debug"
	"strconv"
	"testing"
)

func TestApplyDefaultGOGC(t *testing.T) {
	const before = 123
	prev := debug.SetGCPercent(before)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	// GOGC in the environment: the runtime applied it; it is left alone.
	if got := ApplyDefaultGOGC(env(map[string]string{"GOGC": "off"})); got != "off" {
		t.Errorf("with GOGC=off: reported %q", got)
	}
	if p := debug.SetGCPercent(before); p != before {
		t.Errorf("with GOGC set: GC percent changed to %d", p)
	}
	// No GOGC: the default applies.
	if got := ApplyDefaultGOGC(env(nil)); got != strconv.Itoa(DefaultGOGC) {
		t.Errorf("without GOGC: reported %q", got)
	}
	if p := debug.SetGCPercent(before); p != DefaultGOGC {
		t.Errorf("without GOGC: GC percent %d, want %d", p, DefaultGOGC)
	}
}

func TestApplyDefaultMemoryLimit(t *testing.T) {
	const before = 1 << 40
	prev := debug.SetMemoryLimit(before)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	// GOMEMLIMIT in the environment: the runtime applied it; left alone.
	if got := ApplyDefaultMemoryLimit(env(map[string]string{"GOMEMLIMIT": "1TiB"}), 256<<20); got != before {
		t.Errorf("with GOMEMLIMIT: limit %d, want %d", got, int64(before))
	}
	// None: twice the in-flight read bound plus 256 MiB.
	if got := ApplyDefaultMemoryLimit(env(nil), 256<<20); got != 768<<20 {
		t.Errorf("without GOMEMLIMIT: limit %d, want %d", got, 768<<20)
	}
}
