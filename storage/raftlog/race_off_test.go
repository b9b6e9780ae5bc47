//go:build !race

package raftlog

const raceEnabled = false
