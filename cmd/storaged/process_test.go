package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/buildinfo"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// acked is a put the server answered OK: it must survive the shutdown.
type acked struct {
	msgID       string
	offset      int64
	queueOffset int64
	topic       string
	queueID     int32
	body        []byte
}

// TestSIGTERMDuringSyncPuts: SIGTERM while sync puts are in flight. Every
// call is either answered OK or fails cleanly (UNAVAILABLE: nothing
// stored); the process exits 0; the data dir reopens, and every
// acknowledged message is in the commitlog where its msgId says.
func TestSIGTERMDuringSyncPuts(t *testing.T) {
	dir := t.TempDir()
	const fileSize = 64 << 10 // small files: the acknowledged puts span several
	p := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir,
		"--flush-mode", "sync", "--file-size", "64KiB", "--max-message-size", "16KiB", "--shutdown-timeout", "30s")
	addr := p.logs.waitFor(t, "listening").str("grpc")
	conn := dial(t, addr)
	waitServing(t, conn)
	client := storagedv1.NewMessageStoreServiceClient(conn)

	const workers, signalAfter = 8, 400
	var (
		mu      sync.Mutex
		acks    []acked
		failed  = map[codes.Code]int{}
		bad     []string
		enough  = make(chan struct{})
		trigger sync.Once
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				topic, queue := fmt.Sprintf("sig%d", w%3), int32(w)
				body := fmt.Appendf(nil, "w%d-m%d-%s", w, i, strings.Repeat("x", 64+(i*37)%700))
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
					Topic: topic, QueueId: queue, Body: body,
				}})
				cancel()
				mu.Lock()
				if err == nil {
					r := resp.GetResult()
					acks = append(acks, acked{r.GetMsgId(), r.GetWroteOffset(), r.GetQueueOffset(), topic, queue, body})
					if st := resp.GetStatus(); st != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK &&
						st != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT {
						bad = append(bad, "OK response with status "+st.String())
					}
					if len(acks) >= signalAfter {
						trigger.Do(func() { close(enough) })
					}
				} else {
					st := status.Convert(err)
					failed[st.Code()]++
					if st.Code() != codes.Unavailable {
						bad = append(bad, fmt.Sprintf("%v: %s", st.Code(), st.Message()))
					}
				}
				mu.Unlock()
				if err != nil {
					return // the server is going away
				}
			}
		})
	}
	select {
	case <-enough:
	case <-time.After(startTimeout):
		t.Fatalf("fewer than %d puts acknowledged within %v:\n%s", signalAfter, startTimeout, p.logs.String())
	}
	mu.Lock()
	atSignal := len(acks)
	mu.Unlock()
	p.signal(t, syscall.SIGTERM)
	wg.Wait()
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0:\n%s", code, p.logs.String())
	}
	for _, b := range bad {
		t.Errorf("unclean outcome: %s", b)
	}
	t.Logf("%d puts acknowledged (%d after SIGTERM), failures by code: %v", len(acks), len(acks)-atSignal, failed)
	logs := p.logs.String()
	for _, want := range []string{`"message":"signal received"`, `"message":"store closed after its final flush"`, `"graceful":true`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}

	// The data dir reopens (the lock is released, recovery succeeds) …
	st, err := storage.Open(storage.Options{Dir: dir, FileSize: fileSize, MaxMessageSize: 64 << 10})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	stats := st.Stats()
	maxOffset := stats.MaxOffset
	if stats.Files < 2 {
		t.Errorf("the acknowledged puts fit in %d commitlog file(s); the test wants several", stats.Files)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// … and every acknowledged message is where its msgId points.
	recs := readCommitlog(t, dir)
	for _, a := range acks {
		_, off, err := storage.ParseMsgID(a.msgID)
		if err != nil || off != a.offset {
			t.Errorf("msgId %s: offset %d (%v), response said %d", a.msgID, off, err, a.offset)
			continue
		}
		rec := recs[a.offset]
		switch {
		case rec == nil:
			t.Errorf("acknowledged message at %d (%s) is missing after restart (recovered max offset %d)", a.offset, a.msgID, maxOffset)
		case !bytes.Equal(rec.Body, a.body) || rec.Topic != a.topic || rec.QueueID != a.queueID || rec.QueueOffset != a.queueOffset:
			t.Errorf("record at %d: %s/%d@%d %q; acknowledged %s/%d@%d %q", a.offset, rec.Topic, rec.QueueID, rec.QueueOffset,
				rec.Body, a.topic, a.queueID, a.queueOffset, a.body)
		}
	}
}

// TestSecondProcessSameDataDir: a second storaged on a data dir in use
// exits 1 with a clear message; the first keeps serving.
func TestSecondProcessSameDataDir(t *testing.T) {
	dir := t.TempDir()
	first := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir)
	conn := dial(t, first.logs.waitFor(t, "listening").str("grpc"))
	waitServing(t, conn)

	second := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", dir)
	if code := second.exitCode(t); code != 1 {
		t.Errorf("second process exit status %d, want 1", code)
	}
	if out := second.logs.String(); !strings.Contains(out, "is in use by another storaged process") ||
		!strings.Contains(out, `"level":"error"`) {
		t.Errorf("second process output lacks a clear error:\n%s", out)
	}

	resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: server.ServiceName})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("first process after the second failed: %v %v", resp, err)
	}
	first.signal(t, syscall.SIGINT)
	if code := first.exitCode(t); code != 0 {
		t.Errorf("first process exit status %d after SIGINT:\n%s", code, first.logs.String())
	}
}

// TestUsageErrorExit2: a configuration mistake exits 2 before anything
// listens.
func TestUsageErrorExit2(t *testing.T) {
	p := startProc(t, "--flush-mode", "sometimes")
	if code := p.exitCode(t); code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
	if !strings.Contains(p.logs.String(), "unknown flush mode") {
		t.Errorf("output: %s", p.logs.String())
	}
}

// TestRunInProcess drives run directly: config from the environment,
// startup log lines, a put, shutdown on context cancel, data on disk.
func TestRunInProcess(t *testing.T) {
	dir := t.TempDir()
	pr, pw := io.Pipe()
	logs := newLogSink()
	go logs.consume(pr)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
			env("STORAGED_DATA_DIR", dir, "STORAGED_FILE_SIZE", "64KiB", "STORAGED_MAX_MESSAGE_SIZE", "4KiB",
				"STORAGED_FLUSH_MODE", "sync"), pw)
		pw.Close()
	}()

	cfgLine := logs.waitFor(t, "effective configuration")
	if cfgLine.str("service") != "storaged" || cfgLine.str("version") != buildinfo.Get().Version || cfgLine.str("data_dir") != dir ||
		cfgLine.str("flush_mode") != "sync" || cfgLine.str("file_size") != "64KiB" {
		t.Errorf("effective configuration line: %v", cfgLine)
	}
	listening := logs.waitFor(t, "listening")
	addr := listening.str("grpc")
	if listening.str("store_host") != addr || listening.str("metrics") == "" {
		t.Errorf("listening line: %v", listening)
	}
	conn := dial(t, addr)
	waitServing(t, conn)
	// The metrics port serves the health over HTTP too, next to /metrics.
	for _, path := range []string{server.LivezPath, server.ReadyzPath, "/metrics"} {
		r, err := http.Get("http://" + listening.str("metrics") + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("GET %s on the metrics port: %s, want 200 once SERVING", path, r.Status)
		}
	}
	resp, err := storagedv1.NewMessageStoreServiceClient(conn).PutMessage(t.Context(), &storagedv1.PutMessageRequest{
		Message: &storagedv1.Message{Topic: "inproc", Body: []byte("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := storage.ParseMsgID(resp.GetResult().GetMsgId())
	if err != nil || host.String() != addr {
		t.Errorf("msgId host %v (%v), want the gRPC address %s", host, err, addr)
	}

	// A second store on the same dir fails while run holds it.
	if _, err := storage.Open(storage.Options{Dir: dir, FileSize: 64 << 10, MaxMessageSize: 4 << 10}); err == nil {
		t.Error("storage.Open succeeded while run holds the data dir")
	}

	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	recs := readCommitlog(t, dir)
	if rec := recs[resp.GetResult().GetWroteOffset()]; rec == nil || string(rec.Body) != "hello" {
		t.Errorf("record after shutdown: %+v", rec)
	}
}

// TestRunLockedDataDir: run reports a data dir held by someone else as an
// error (main exits 1), after bringing its listeners down again.
func TestRunLockedDataDir(t *testing.T) {
	dir := t.TempDir()
	st, err := storage.Open(storage.Options{Dir: dir, FileSize: 64 << 10, MaxMessageSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var stderr syncWriter
	err = run(t.Context(), []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--admin-listen", "", "--data-dir", dir}, env(), &stderr)
	if err == nil || !strings.Contains(err.Error(), "in use by another storaged process") {
		t.Fatalf("run: %v, want the data dir lock error", err)
	}
	if !strings.Contains(stderr.String(), `"message":"shutdown complete"`) {
		t.Errorf("listeners not drained:\n%s", stderr.String())
	}
}

// TestRunEarlyExitStopsServers: run that fails on a listener, before it
// serves, leaves no goroutine behind (the gRPC servers' stream workers
// start when a server is made) and reports the listener.
func TestRunEarlyExitStopsServers(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name, want string
		flags      []string
	}{
		{"gRPC", "gRPC listener", []string{"--listen", busy.Addr().String(), "--metrics-listen", "", "--admin-listen", "127.0.0.1:0"}},
		{"metrics", "metrics listener", []string{"--listen", "127.0.0.1:0", "--metrics-listen", busy.Addr().String(), "--admin-listen", "127.0.0.1:0"}},
		{"admin", "admin listener", []string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", busy.Addr().String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			var stderr syncWriter
			err := run(t.Context(), append(tc.flags, "--data-dir", t.TempDir()), env(), &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("run: %v, want the %s's error", err, tc.want)
			}
		})
	}
}

type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
