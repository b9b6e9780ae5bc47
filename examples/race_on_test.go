//go:build race

package examples_test

// raceEnabled: the tests were built with -race, so the storaged under test is too.
const raceEnabled = true
