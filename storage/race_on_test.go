//go:build race

package storage

// raceEnabled scales down the heaviest suites under the race detector
// (5-10x slower); .ci/run also runs them at full size without it.
const raceEnabled = true
