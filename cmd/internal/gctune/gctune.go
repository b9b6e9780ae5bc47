// Package gctune sets the garbage collector's defaults for storaged's binaries:
// process-wide knobs, so they live here, in cmd/, not in a library
// package.
package gctune

import (
	"runtime/debug"
	"strconv"
)

// DefaultGOGC is the garbage collector's target percentage for storaged,
// and for the benchmark floor so that the two stay comparable, when the
// environment does not set GOGC. A busy server's live heap is only 5–12
// MiB, so at the runtime's default of 100 it collects tens of times a
// second and GC was the largest single cost of a call in the profiles. At
// 400, interleaved runs of 2026-11-29 (BENCHMARKS.md, "GC target") cut the
// server CPU per message by 19–30 % for storaged (async and sync, unary and
// batch) and raised throughput 7–21 %, with the heap peaking under 30 MiB.
// GOMEMLIMIT, when set, still bounds the heap as usual.
const DefaultGOGC = 400

// ApplyDefaultGOGC sets the GC target to DefaultGOGC unless lookupEnv finds
// GOGC (which the runtime has already applied), and returns the GOGC in
// effect as the environment would spell it.
func ApplyDefaultGOGC(lookupEnv func(string) (string, bool)) string {
	if v, ok := lookupEnv("GOGC"); ok {
		return v
	}
	debug.SetGCPercent(DefaultGOGC)
	return strconv.Itoa(DefaultGOGC)
}

// DefaultMemoryLimit is the soft memory limit storaged sets when the
// environment does not set GOMEMLIMIT: twice the in-flight read bound plus
// 256 MiB for everything else (a busy server's live heap is 5–12 MiB, see
// DefaultGOGC). With GOGC at 400 the heap may grow to five times what was
// live at the last collection; read answers are the one large live set
// (up to maxPullInflightBytes, server.WithMaxPullInflightBytes), so without a
// limit 256 MiB of answers in flight let the heap reach 1.3 GiB and more
// (BENCHMARKS.md, "Pull memory"). The limit only makes the collector run
// sooner near it; it never fails an allocation.
func DefaultMemoryLimit(maxPullInflightBytes int64) int64 {
	return 2*maxPullInflightBytes + 256<<20
}

// ApplyDefaultMemoryLimit sets DefaultMemoryLimit unless lookupEnv finds
// GOMEMLIMIT (which the runtime has already applied), and returns the limit
// in effect.
func ApplyDefaultMemoryLimit(lookupEnv func(string) (string, bool), maxPullInflightBytes int64) int64 {
	if _, ok := lookupEnv("GOMEMLIMIT"); !ok {
		debug.SetMemoryLimit(DefaultMemoryLimit(maxPullInflightBytes))
	}
	return debug.SetMemoryLimit(-1)
}
