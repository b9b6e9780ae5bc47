//go:build race

package main

// raceEnabled: the tests were built with -race, so the binary under test is too.
const raceEnabled = true
