package storage

import (
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"
)

var measureQueues = flag.Int("cq.measure", 0,
	"TestMeasureManyQueues: put one message to each of this many queues (topics), then measure a restart")

// TestMeasureManyQueues reports (it asserts nothing timed) what N queues
// holding one message each cost: consume-queue disk, the time Open takes to
// reopen them, the bytes the reopen writes (/proc/self/io) and the RSS
// after it. Run: go test ./storage -run TestMeasureManyQueues -cq.measure 10000 -v
func TestMeasureManyQueues(t *testing.T) {
	n := *measureQueues
	if n == 0 {
		t.Skip("set -cq.measure N to run")
	}
	o := Options{Dir: t.TempDir(), FileSize: 64 << 20, MaxMessageSize: 1024}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	putTopics(t, s, n)
	indexAll(t, s)
	t.Logf("%d puts to new queues, indexed: %v", n, time.Since(start))
	start = time.Now()
	err = s.index.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the checkpoint that makes them durable: %v", time.Since(start))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	disk := diskBytes(t, filepath.Join(o.Dir, "consumequeue"))
	t.Logf("consume-queue disk: %d bytes (%.1f MiB, %d per queue)", disk, float64(disk)/(1<<20), disk/int64(n))

	w0, r0 := procIO(t), rssKiB(t, "VmRSS")
	start = time.Now()
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	w1, r1 := procIO(t), rssKiB(t, "VmRSS")
	t.Logf("reopen: %v; wrote %d bytes by syscall (wchar), %d to storage (write_bytes); RSS %d KiB -> %d KiB (HWM %d KiB); open queue files %d",
		took, w1["wchar"]-w0["wchar"], w1["write_bytes"]-w0["write_bytes"], r0, r1, rssKiB(t, "VmHWM"), s.index.OpenFiles())
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if p := os.Getenv("CQ_HEAP_PROFILE"); p != "" {
		f, _ := os.Create(p)
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	t.Logf("heap in use after the reopen and a GC: %d KiB (%d bytes per queue)", ms.HeapInuse>>10, ms.HeapInuse/uint64(n))
	if len(s.Queues()) != n {
		t.Fatalf("%d queues after the reopen", len(s.Queues()))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func procIO(t *testing.T) map[string]int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			out[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return out
}

func rssKiB(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
