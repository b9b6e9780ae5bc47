package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawCPU reads utime + stime of /proc/PID/stat without procfs: the fields
// after the command name, which is in parentheses and may hold any byte.
func rawCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// TestProcCPU: procCPU of this process, which has burnt CPU, lies between
// two raw reads of its utime + stime taken around it (same fields, same
// unit), and a pid that does not exist is an error.
func TestProcCPU(t *testing.T) {
	// Burn CPU until the kernel has counted some (it accounts in 10 ms
	// ticks: a fixed amount of work may fit in one on a fast machine),
	// so that procCPU has a value above zero to report. The deadline only
	// guards against a counter that never moves.
	x, deadline := 0, time.Now().Add(time.Minute)
	for rawCPU(t, os.Getpid()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("utime + stime of this process still 0 after a minute of work")
		}
		for i := range 1_000_000 {
			x += i
		}
	}
	if x < 0 { // keeps the loop's work
		t.Fatal("unreachable")
	}
	before := rawCPU(t, os.Getpid())
	d, err := procCPU(os.Getpid())
	after := rawCPU(t, os.Getpid())
	if err != nil || d <= 0 || d < before || d > after {
		t.Errorf("procCPU(self) = %v, %v; raw reads around it %v and %v", d, err, before, after)
	}
	if _, err := procCPU(0); err == nil {
		t.Error("procCPU of pid 0 succeeded")
	}
	if _, err := procCPU(1 << 30); err == nil { // above pid_max
		t.Error("procCPU of a pid that does not exist succeeded")
	}
}

// TestProcCPUOddCommand: a command name holding ") (" and spaces, as
// /proc/PID/stat prints it between parentheses, does not shift the fields.
func TestProcCPUOddCommand(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "x) 1 2 (y")
	if err := os.Symlink(sleep, link); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, link, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	d, err := procCPU(cmd.Process.Pid)
	raw := rawCPU(t, cmd.Process.Pid)
	// sleep uses almost no CPU: a shifted field (a page count, a pid)
	// would be far from the raw read.
	if err != nil || d < 0 || d > raw || d > time.Second {
		t.Errorf("procCPU(%q) = %v, %v; raw %v", filepath.Base(link), d, err, raw)
	}
}

// TestLoadAverage: loadAverage is the first field of /proc/loadavg, read
// just before or just after it (the kernel updates it every 5 s).
func TestLoadAverage(t *testing.T) {
	read := func() float64 {
		b, err := os.ReadFile("/proc/loadavg")
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := read()
	got := loadAverage()
	after := read()
	if got != before && got != after {
		t.Errorf("loadAverage = %v, /proc/loadavg %v then %v", got, before, after)
	}
}
