package main

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseCase(t *testing.T) {
	for name, want := range map[string]caseSpec{
		"unary-c64":     {Name: "unary-c64", Method: methodUnary, BatchSize: 1, Concurrency: 64, Streams: 1},
		"batch100-c16":  {Name: "batch100-c16", Method: methodBatch, BatchSize: 100, Concurrency: 16, Streams: 1},
		"stream-s4-c64": {Name: "stream-s4-c64", Method: methodStream, BatchSize: 1, Concurrency: 64, Streams: 4},
	} {
		got, err := parseCase(name)
		if err != nil || got != want {
			t.Errorf("parseCase(%q) = %+v, %v; want %+v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "unary", "unary-64", "batch-c1", "stream-c4", "unary-c0", "other-c1"} {
		if _, err := parseCase(bad); err == nil {
			t.Errorf("parseCase(%q) succeeded", bad)
		}
	}
}

func TestStat(t *testing.T) {
	s := newStat([]float64{30, 10, 20})
	if s != (Stat{Median: 20, Min: 10, Max: 30, SpreadPct: 100}) {
		t.Errorf("odd: %+v", s)
	}
	if s := newStat([]float64{4, 1, 2, 3}); s.Median != 2.5 {
		t.Errorf("even: %+v", s)
	}
}

// TestMatrixAndChart runs the matrix against floor subprocesses (this test
// binary acting as storaged-bench) for a fixed message count, then draws
// the chart from its results.
func TestMatrixAndChart(t *testing.T) {
	t.Setenv(asMainEnv, "1")
	dir := t.TempDir()
	out := filepath.Join(dir, "results.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"matrix", "--targets", "floor,bare", "--runs", "2", "--messages", "200",
		"--warmup", "0", "--cases", "unary-c1,unary-c4,batch10-c2,stream-s2-c4", "--body-size", "32", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	res, err := readMatrixResult(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cases) != 4 || res.Runs != 2 || res.Machine.NProc <= 0 {
		t.Fatalf("results: %d cases, %d runs, machine %+v", len(res.Cases), res.Runs, res.Machine)
	}
	for _, c := range res.Cases {
		for _, target := range []string{"floor", "bare"} {
			tr := c.Targets[target]
			if tr == nil || len(tr.Runs) != 2 {
				t.Fatalf("%s on %s: %+v", c.Name, target, tr)
			}
			for _, s := range tr.Runs {
				checkConsistent(t, s)
				if s.Messages != 200 || s.Errors != 0 || s.Label != target {
					t.Errorf("%s on %s: %d messages, %d errors, label %q", c.Name, target, s.Messages, s.Errors, s.Label)
				}
				if s.ServerHeapInuseMaxBytes < 0 {
					t.Errorf("heap %d", s.ServerHeapInuseMaxBytes)
				}
			}
			if tr.MsgsPerSec.Min > tr.MsgsPerSec.Median || tr.MsgsPerSec.Median > tr.MsgsPerSec.Max {
				t.Errorf("%s on %s: stat %+v", c.Name, target, tr.MsgsPerSec)
			}
		}
		r := c.VsFloor["bare"]
		if r == nil || r.Throughput.Median <= 0 || c.VsFloor["floor"] != nil {
			t.Errorf("%s: ratios %+v", c.Name, c.VsFloor)
		}
	}

	stdout.Reset()
	if err := run(context.Background(), []string{"report", "--in", out}, &stdout, &stderr); err != nil {
		t.Fatalf("report: %v", err)
	}
	if md := stdout.String(); !strings.Contains(md, "| unary-c4 | bare |") || strings.Count(md, "\n") != 2+4*2 {
		t.Errorf("report:\n%s", md)
	}

	png1 := filepath.Join(dir, "chart.png")
	if err := run(context.Background(), []string{"chart", "--in", out, "--out", png1}, &stdout, &stderr); err != nil {
		t.Fatalf("chart: %v\n%s", err, stderr.String())
	}
	f, err := os.Open(png1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != chartW || b.Dy() != chartH {
		t.Errorf("chart is %v", b)
	}
	ss, _ := chartSeries(res, methodUnary)
	if len(ss) != 2 || len(ss[0].points) != 2 || ss[0].points[0].x != 1 || ss[0].points[1].x != 4 {
		t.Errorf("unary series %+v", ss)
	}
}

func TestScrapeGauge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("# HELP go_memstats_heap_inuse_bytes x\n# TYPE go_memstats_heap_inuse_bytes gauge\n" +
			"go_memstats_heap_inuse_bytes_other 1\ngo_memstats_heap_inuse_bytes 1.2345e+07\n"))
	}))
	defer srv.Close()
	h := newHeapWatch()
	defer h.close()
	v, err := h.sample(context.Background(), srv.URL, true)
	if err != nil || v != 12345000 || h.max.Load() != 12345000 {
		t.Errorf("sample = %d, %v; max %d", v, err, h.max.Load())
	}
}

func TestShortNumber(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 950: "950", 1500: "1.5K", 20000: "20K", 1.25e6: "1.2M"} {
		if got := shortNumber(v); got != want {
			t.Errorf("shortNumber(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestMatrixAgainstStoraged builds storaged and runs a small matrix
// against it in both flush modes: the subprocess start (listening line,
// health), the loads and the flusher figures. Every put must be PUT_OK:
// storaged runs with --sync-flush-timeout 1m, not the default 5 s, so a
// sync that a loaded machine stalls for seconds is not a degraded put
// (FLUSH_DISK_TIMEOUT). The load's 30 s call deadline is then the bound:
// a put still waiting at it fails the test as an error.
func TestMatrixAgainstStoraged(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts storaged")
	}
	t.Setenv(asMainEnv, "1")
	dir := t.TempDir()
	bin := buildStoraged(t, dir)
	out := filepath.Join(dir, "results.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"matrix", "--storaged", bin, "--storaged-args", "--file-size 4MiB --sync-flush-timeout 1m",
		"--data-root", dir, "--targets", "floor,async,sync", "--runs", "1", "--messages", "300", "--warmup", "0",
		"--cases", "unary-c4,batch10-c2,stream-s2-c8", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	res, err := readMatrixResult(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Cases {
		for _, target := range []string{"floor", "async", "sync"} {
			s := c.Targets[target].Runs[0]
			checkConsistent(t, s)
			if s.Messages != 300 || s.Errors != 0 || s.Degraded != 0 {
				t.Errorf("%s on %s: %d messages, errors %v, degraded %v", c.Name, target, s.Messages, s.ErrorsByCode, s.DegradedBy)
			}
			if target == "floor" && s.Flush != nil {
				t.Errorf("%s on the floor: flush stats %+v", c.Name, s.Flush)
			}
		}
		if f := c.Targets["sync"].Runs[0].Flush; f == nil || f.FlushWaits == 0 || f.Syncs == 0 {
			t.Errorf("%s on sync: flush stats %+v, want waits and syncs", c.Name, f)
		}
	}
	stdout.Reset()
	if err := run(context.Background(), []string{"report", "--in", out}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "| unary-c4 | sync |") || !strings.Contains(stdout.String(), "messages per round") {
		t.Errorf("report:\n%s", stdout.String())
	}
}

// buildStoraged builds the storaged binary into dir and returns its path.
func buildStoraged(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "storaged")
	build := exec.Command("go", "build", "-o", bin, "github.com/storaged/storaged/cmd/storaged")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build storaged: %v\n%s", err, out)
	}
	return bin
}

func TestFlushStats(t *testing.T) {
	before := map[string]float64{syncSecondsSum: 1, syncSecondsCount: 10, flushWaitSecondsSum: 2, flushWaitCount: 100}
	after := map[string]float64{syncSecondsSum: 1.5, syncSecondsCount: 110, flushWaitSecondsSum: 4, flushWaitCount: 1100}
	f := flushStats(before, after, 2000, 2*time.Second)
	if f == nil || f.Syncs != 100 || f.SyncMeanUs != 5000 || f.MsgsPerSync != 20 || f.FlushWaits != 1000 || f.FlushWaitMean != 2000 || f.Busy != 0.25 {
		t.Errorf("flushStats = %+v", f)
	}
	if f := flushStats(before, before, 10, time.Second); f != nil {
		t.Errorf("no syncs: %+v", f)
	}
}
