//go:build race

package raftlog

// raceEnabled scales the random suites down under the race detector;
// .ci/run's heavy step runs them at full size without it.
const raceEnabled = true
