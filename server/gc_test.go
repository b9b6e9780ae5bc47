package server

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
