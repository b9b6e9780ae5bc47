package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLimitsAgainstStoraged runs every scenario of the limits subcommand
// at tiny sizes against the real storaged binary, so that the harness of
// BENCHMARKS.md cannot rot. It checks that each figure was measured and is
// sane, never how fast or how small it is.
func TestLimitsAgainstStoraged(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts storaged")
	}
	dir := t.TempDir()
	bin := buildStoraged(t, dir)
	out := filepath.Join(dir, "limits.json")
	const topics, idle, tagged, producer, pulls, waves = 10, 20, 2, 200, 2, 2
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"limits", "--storaged", bin, "--storaged-args", "--file-size 4MiB",
		"--data-root", dir, "--out", out,
		"--topics", fmt.Sprint(topics),
		"--polls-rounds", "1", "--idle-polls", fmt.Sprint(idle), "--idle-poll-queues", "4", "--tag-polls", fmt.Sprint(tagged),
		"--tag-queue-messages", "2000", "--producer-messages", fmt.Sprint(producer), "--producer-warmup", "0", "--poll-connections", "2",
		"--pulls", fmt.Sprint(pulls), "--pull-waves", fmt.Sprint(waves), "--pull-max-bytes", "262144", "--pull-fill-bytes", "524288",
		"--pull-body-size", "8192"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res LimitsResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Machine.NProc <= 0 || res.Date == "" || !strings.Contains(res.Command, "--topics 10") {
		t.Errorf("header: %+v", res)
	}

	tr := res.Topics
	if tr == nil {
		t.Fatal("no topics result")
	}
	if tr.PutOK != topics || len(tr.PutErrors) != 0 || tr.Found != topics || len(tr.TouchErrors) != 0 {
		t.Errorf("topics: %d PUT_OK (errors %v), %d found after the restart (errors %v)", tr.PutOK, tr.PutErrors, tr.Found, tr.TouchErrors)
	}
	if tr.ConsumeQueue.AllocatedBytes <= 0 || tr.ConsumeQueue.Files <= 0 || tr.CQBytesPerTopic <= 0 || tr.ConsumeQueueAfter.Files <= 0 {
		t.Errorf("topics: consume-queue disk %+v, after the restart %+v", tr.ConsumeQueue, tr.ConsumeQueueAfter)
	}
	for name, s := range map[string]procSample{"empty store": tr.EmptyAtServing, "before stop": tr.BeforeStop, "at SERVING": tr.AtServing, "touch peak": tr.TouchPeak, "after touch": tr.AfterTouch} {
		checkSample(t, "topics "+name, s)
	}
	if tr.AfterTouch.CommitLogRSSBytes == 0 {
		t.Errorf("topics: no commitlog mapping resident after reading every queue: %+v", tr.AfterTouch)
	}
	if tr.RestartSeconds <= 0 || tr.TouchSeconds <= 0 {
		t.Errorf("topics: restart %.3fs, reading every queue %.3fs", tr.RestartSeconds, tr.TouchSeconds)
	}

	pr := res.Polls
	if pr == nil || len(pr.Phases) != len(pollsPhases) {
		t.Fatalf("polls: %+v", pr)
	}
	for i, ph := range pr.Phases {
		s := ph.Producer
		checkConsistent(t, s)
		if ph.Name != pollsPhases[i] || s.Messages != producer || s.Errors != 0 || len(ph.PollErrors) != 0 {
			t.Errorf("polls phase %d %s: %d messages, errors %v, poll errors %v", i, ph.Name, s.Messages, s.ErrorsByCode, ph.PollErrors)
		}
		want := map[string]int{phaseAlone: 0, phaseIdle: idle, phaseTagged: tagged}[ph.Name]
		if ph.Polls != want || (want > 0) != (ph.P50Ratio > 0 && ph.P99Ratio > 0 && ph.ThroughputRatio > 0) {
			t.Errorf("polls phase %s: %d polls (want %d), ratios %v %v", ph.Name, ph.Polls, want, ph.P50Ratio, ph.P99Ratio)
		}
	}
	if pr.IdleP50Ratio.Median <= 0 || pr.TaggedP99Ratio.Median <= 0 {
		t.Errorf("polls: ratios %+v %+v", pr.IdleP50Ratio, pr.TaggedP99Ratio)
	}

	pl := res.Pulls
	if pl == nil {
		t.Fatal("no pulls result")
	}
	var failed int64
	for _, n := range pl.Failed {
		failed += n
	}
	if pl.OK+failed != pulls*waves || len(pl.WaveSeconds) != waves || pl.StoredMessages != 64 {
		t.Errorf("pulls: %d answered, failed %v, waves %v, %d stored", pl.OK, pl.Failed, pl.WaveSeconds, pl.StoredMessages)
	}
	if pl.OK > 0 && (pl.MaxAnswerBytes <= 0 || pl.MaxAnswerMsgs <= 0) {
		t.Errorf("pulls: largest answer %d bytes, %d messages", pl.MaxAnswerBytes, pl.MaxAnswerMsgs)
	}
	if pl.SettleSeconds <= 0 || !pl.HWMReset {
		t.Errorf("pulls: settled after %.2fs (%v), VmHWM reset %v", pl.SettleSeconds, pl.Settled, pl.HWMReset)
	}
	checkSample(t, "pulls baseline", pl.Baseline)
	checkSample(t, "pulls end", pl.End)
	if pl.End.HWMBytes < pl.Baseline.RSSBytes || pl.GoalBytes != 2*pulls*262144+64<<20 {
		t.Errorf("pulls: VmHWM %d below the baseline RSS %d, or goal %d", pl.End.HWMBytes, pl.Baseline.RSSBytes, pl.GoalBytes)
	}

	md, err := os.ReadFile(strings.TrimSuffix(out, ".json") + ".md")
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	if err := run(context.Background(), []string{"report", "--limits", "--in", out}, &report, &stderr); err != nil || report.String() != string(md) {
		t.Errorf("report --limits: %v\n%s\nwant\n%s", err, report.String(), md)
	}
	for _, want := range []string{"| 10 topics: restart, start to SERVING |", "idle polls: p50 ratio", "VmHWM - RSS before the pulls"} {
		if !bytes.Contains(md, []byte(want)) || !strings.Contains(stdout.String(), strings.Trim(want, "| ")) {
			t.Errorf("summary lacks %q:\n%s\n%s", want, md, stdout.String())
		}
	}
}

// checkSample checks that a /proc sample of a live server was taken.
func checkSample(t *testing.T, name string, s procSample) {
	t.Helper()
	if s.RSSBytes == 0 || s.HWMBytes < s.RSSBytes || s.AnonBytes > s.RSSBytes || s.FDs <= 3 {
		t.Errorf("%s: %+v", name, s)
	}
}

func TestParseLimitsOptions(t *testing.T) {
	for name, args := range map[string][]string{
		"no storaged":      {},
		"unknown scenario": {"--storaged", "x", "--scenarios", "topics,other"},
		"no topics":        {"--storaged", "x", "--topics", "0"},
		"fill below pull":  {"--storaged", "x", "--pull-max-bytes", "2048", "--pull-fill-bytes", "1024"},
		"no wait":          {"--storaged", "x", "--poll-wait", "0s"},
		"no producer":      {"--storaged", "x", "--producer-concurrency", "0"},
		"extra argument":   {"--storaged", "x", "more"},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseLimitsOptions(args, &stderr)
			var uerr usageError
			if !errors.As(err, &uerr) {
				t.Errorf("parseLimitsOptions(%q) = %v, want a usage error", args, err)
			}
		})
	}
	o, err := parseLimitsOptions([]string{"--storaged", "x", "--scenarios", "pulls,topics", "--producer-messages", "50"}, &bytes.Buffer{})
	if err != nil || len(o.scenarios) != 2 || o.scenarios[0] != scenarioPulls || o.polls.Producer.Duration != 0 || o.polls.Producer.Messages != 50 {
		t.Errorf("parseLimitsOptions = %+v, %v", o, err)
	}
}

// TestStoragedHasFlag reads flags off a fake binary's usage text, as the
// harness does with storaged -h to run against revisions before and after
// a flag (--admin-listen).
func TestStoragedHasFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "storaged")
	usage := "Usage: storaged [flags]\n  -admin-listen address\n    \tadmin gRPC listen address (default \"127.0.0.1:9092\")\n" +
		"  -max-open-queue-files count\n    \tbound (default 1024)\n  -pprof\n    \tserve /debug/pprof\n"
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nprintf '"+usage+"' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"admin-listen": true, "pprof": true, "admin": false, "serve": false, "max-topics": false} {
		if got := storagedHasFlag(bin, name); got != want {
			t.Errorf("storagedHasFlag(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]string{"admin-listen": "127.0.0.1:9092", "max-open-queue-files": "1024", "pprof": ""} {
		if ok, def := storagedFlag(bin, name); !ok || def != want {
			t.Errorf("storagedFlag(%q) = %v, %q; want %q", name, ok, def, want)
		}
	}
	if args := storagedArgs(bin, "d", "--x 1", "--flush-mode", "sync"); strings.Join(args, " ") !=
		"--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir d --admin-listen  --flush-mode sync --x 1" {
		t.Errorf("storagedArgs = %q", args)
	}
}

func TestFlagValue(t *testing.T) {
	args := []string{"--data-dir", "d", "--max-open-queue-files", "256", "-x=1"}
	for name, want := range map[string]string{"max-open-queue-files": "256", "x": "1", "data-dir": "d", "absent": ""} {
		if got := flagValue(args, name); got != want {
			t.Errorf("flagValue(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestDiskUsage checks that diskUsage counts allocated blocks, as du does:
// a sparse file costs less than its size, a written one at least its size.
func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "q", "0")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "full"), bytes.Repeat([]byte{1}, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(sub, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	u, err := diskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Files != 2 || u.Dirs != 3 || u.ApparentBytes != 64<<10+64<<20 || u.AllocatedBytes < 64<<10 || u.AllocatedBytes >= 32<<20 ||
		u.FileAllocatedBytes < 64<<10 || u.FileAllocatedBytes >= u.AllocatedBytes {
		t.Errorf("diskUsage = %+v", u)
	}
	if u, err := diskUsage(filepath.Join(dir, "missing")); err != nil || u != (dirUsage{}) {
		t.Errorf("missing dir: %+v, %v", u, err)
	}
}

func TestSampleProcSelf(t *testing.T) {
	s, err := sampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	checkSample(t, "self", s)
	if _, err := sampleProc(0); err == nil {
		t.Error("sampleProc(0) succeeded")
	}
}

// TestMappedRSS maps a file under a commitlog directory, touches part of
// it and finds that part in mappedRSS, and nothing under consumequeue.
func TestMappedRSS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "commitlog")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "00000000000000000000"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size, touched = 8 << 20, 2 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	for i := 0; i < touched; i += 4096 {
		b[i] = 1
	}
	m, err := mappedRSS(os.Getpid(), "commitlog", "consumequeue")
	if err != nil {
		t.Fatal(err)
	}
	if m["commitlog"] < touched || m["commitlog"] > size || m["consumequeue"] != 0 {
		t.Errorf("mappedRSS = %v, want commitlog in [%d, %d]", m, touched, size)
	}
}

func TestInflightCalls(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `# HELP grpc_server_started_total Total number of RPCs started on the server.
# TYPE grpc_server_started_total counter
grpc_server_started_total{grpc_method="PullMessages",grpc_service="storaged.v1.MessageStoreService",grpc_type="unary"} 25
grpc_server_started_total{grpc_method="PutMessage",grpc_service="storaged.v1.MessageStoreService",grpc_type="unary"} 1000
grpc_server_handled_total{grpc_code="OK",grpc_method="PullMessages",grpc_service="storaged.v1.MessageStoreService",grpc_type="unary"} 4
grpc_server_handled_total{grpc_code="Canceled",grpc_method="PullMessages",grpc_service="storaged.v1.MessageStoreService",grpc_type="unary"} 1
grpc_server_handled_total{grpc_code="OK",grpc_method="PutMessage",grpc_service="storaged.v1.MessageStoreService",grpc_type="unary"} 990
`)
	}))
	defer srv.Close()
	for method, want := range map[string]int64{"PullMessages": 20, "PutMessage": 10, "GetMessage": 0} {
		n, err := inflightCalls(context.Background(), srv.Client(), srv.URL, method)
		if err != nil || n != want {
			t.Errorf("inflightCalls(%s) = %d, %v; want %d", method, n, err, want)
		}
	}
}
