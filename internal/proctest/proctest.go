// Package proctest runs real storaged processes for process-level tests
// (the kill -9 suite in tests/crash, the nemesis scenarios in
// tests/cluster): build the binary once per test binary, start it on a
// loopback port with a data dir, wait until its message store is SERVING,
// and then kill -9, pause (SIGSTOP/SIGCONT), stop (SIGTERM) and restart it
// on the same data dir and port. Each process's stderr goes to a file that
// is named, with its last lines, when the test fails.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// StoreService is the health service name that turns SERVING once
// recovery is done.
const StoreService = "storaged.v1.MessageStoreService"

// Build compiles cmd/storaged into dir and returns the binary's path. Call
// it once from TestMain (a build per test costs seconds on 2 cores).
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "storaged")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/storaged/storaged/cmd/storaged").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("proctest: build storaged: %w\n%s", err, out)
	}
	// The module's files the binary comes from, for New to open (sources).
	out, err = exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}`+
			`{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{.Module.GoMod}}{{"\n"}}{{end}}{{end}}`,
		"github.com/storaged/storaged/cmd/storaged").Output()
	if err != nil {
		return "", fmt.Errorf("proctest: list the sources of storaged: %w", err)
	}
	seen := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		if !seen[f] {
			seen[f] = true
			sources = append(sources, f)
		}
		if sum := filepath.Join(filepath.Dir(f), "go.sum"); filepath.Base(f) == "go.mod" && !seen[sum] {
			seen[sum] = true // beside go.mod: the versions of the dependencies
			sources = append(sources, sum)
		}
	}
	return bin, nil
}

// sources are the module's files (Go files, embedded files, go.mod and
// go.sum) of the binary Build made. The first New of a test binary opens
// them all: go test caches a passing result keyed by the test binary and
// the files the test opened, and the storaged binary is built outside the
// test binary's own dependencies, so without them a change to the store
// would be answered with a cached pass of the code before it.
var (
	sources     []string
	sourcesOnce sync.Once
)

// touchSources opens every file of sources once (go test records the
// files a test opens, and hashes them to validate a cached result).
func touchSources() {
	sourcesOnce.Do(func() {
		for _, f := range sources {
			if fd, err := os.Open(f); err == nil {
				fd.Close()
			}
		}
	})
}

// Options says how to run one storaged.
type Options struct {
	// Binary is the path Build returned. Required.
	Binary string
	// DataDir is the --data-dir. Required; it survives restarts.
	DataDir string
	// Name labels the process in logs and file names. Default "storaged".
	Name string
	// Listen is the gRPC --listen address. Default "127.0.0.1:0": the
	// kernel picks a free port at the first start, and restarts reuse it.
	Listen string
	// Flags come after the defaults (no metrics or admin listener, JSON
	// info logs, no reflection), so they override them.
	Flags []string
	// StartTimeout bounds the wait for SERVING. Default 60 s (recovery of
	// a large data dir under -race on a busy 2-core machine).
	StartTimeout time.Duration
}

// Process is one storaged, started and restarted on the same data dir
// and address. Its methods are for the test goroutine; Addr, Conn and
// Counters may be read from any goroutine.
type Process struct {
	opts   Options
	stderr string // path of the stderr file, appended across restarts

	mu   sync.Mutex
	cmd  *exec.Cmd
	conn *grpc.ClientConn
	addr string
	done chan error // the current run's exit status, once

	tornTails atomic.Int64
	starts    int
}

// Start runs storaged and waits until it is SERVING. The test fails if it
// does not get there; the process is killed when the test ends.
func Start(t testing.TB, opts Options) *Process {
	t.Helper()
	p := New(t, opts)
	p.Restart(t)
	return p
}

// New is a Process not started yet: Restart starts it, StartRefused runs
// a start expected to be refused (a flag check, a data dir that does not
// open). It is killed when the test ends, if running.
func New(t testing.TB, opts Options) *Process {
	t.Helper()
	touchSources()
	if opts.Name == "" {
		opts.Name = "storaged"
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	p := &Process{opts: opts, addr: opts.Listen, stderr: filepath.Join(t.TempDir(), opts.Name+".stderr")}
	t.Cleanup(func() {
		p.Kill(t)
		if t.Failed() {
			t.Logf("%s stderr in %s; last lines:\n%s", opts.Name, p.stderr, tail(p.stderr, 20))
		}
	})
	return p
}

// Restart starts the process again on the same data dir and address (it
// must not be running) and waits until it is SERVING; it returns how long
// that took.
func (p *Process) Restart(t testing.TB) time.Duration {
	t.Helper()
	began := time.Now()
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		t.Fatalf("%s: restart while running", p.opts.Name)
	}
	addr := p.addr
	p.starts++
	p.mu.Unlock()
	f, err := os.OpenFile(p.stderr, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "---- start %d at %s\n", p.starts, began.Format(time.RFC3339Nano))
	args := append([]string{"--listen", addr, "--metrics-listen", "", "--admin-listen", "", "--data-dir", p.opts.DataDir,
		"--log-level", "info", "--reflection=false"}, p.opts.Flags...)
	cmd := exec.Command(p.opts.Binary, args...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("%s: %v", p.opts.Name, err)
	}
	done := make(chan error, 1)
	addrc := make(chan string, 1)
	go func() {
		defer f.Close()
		sc := bufio.NewScanner(io.TeeReader(pipe, f))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				GRPC string `json:"grpc"`
				Msg  string `json:"message"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			if line.Msg == "listening" && line.GRPC != "" {
				select {
				case addrc <- line.GRPC:
				default:
				}
			}
			if strings.HasPrefix(line.Msg, "storage: torn tail") {
				p.tornTails.Add(1)
			}
		}
		io.Copy(io.Discard, pipe)
		done <- cmd.Wait()
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.NewTimer(p.opts.StartTimeout)
	defer deadline.Stop()
	select {
	case addr = <-addrc:
	case err := <-done:
		p.exited()
		t.Fatalf("%s exited before listening: %v (stderr %s)\n%s", p.opts.Name, err, p.stderr, tail(p.stderr, 20))
	case <-deadline.C:
		t.Fatalf("%s did not listen within %v", p.opts.Name, p.opts.StartTimeout)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.addr, p.conn = addr, conn
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.StartTimeout)
	defer cancel()
	if err := WaitServing(ctx, conn, StoreService); err != nil {
		t.Fatalf("%s: %v", p.opts.Name, err)
	}
	return time.Since(began)
}

// WaitServing watches the health of service on conn until it is SERVING
// or ctx ends.
func WaitServing(ctx context.Context, conn *grpc.ClientConn, service string) error {
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("proctest: health watch: %w", err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			return fmt.Errorf("proctest: health watch: %w", err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// Addr is the process's gRPC address (stable across restarts).
func (p *Process) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Conn is the client connection of the current run (nil when stopped).
func (p *Process) Conn() *grpc.ClientConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

// TornTails counts the torn tails its recoveries logged cutting.
func (p *Process) TornTails() int64 { return p.tornTails.Load() }

// StderrPath is the file holding the stderr of every run.
func (p *Process) StderrPath() string { return p.stderr }

// DataDir is the process's data dir.
func (p *Process) DataDir() string { return p.opts.DataDir }

// Running reports whether a run was started and not yet waited for.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

func (p *Process) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		t.Fatalf("%s: %v while not running", p.opts.Name, sig)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v: %v", p.opts.Name, sig, err)
	}
}

// exited forgets the current run after its exit status was read.
func (p *Process) exited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		p.conn.Close()
	}
	p.cmd, p.conn, p.done = nil, nil, nil
}

// Kill sends SIGKILL and waits for the exit. A stopped process is killed
// too (SIGKILL needs no SIGCONT). Killing a process that is not running
// does nothing.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
	p.exited()
}

// Pause sends SIGSTOP: the process keeps its sockets and state but runs
// no code, like a long GC pause or a frozen VM.
func (p *Process) Pause(t testing.TB) { t.Helper(); p.signal(t, syscall.SIGSTOP) }

// Resume sends SIGCONT.
func (p *Process) Resume(t testing.TB) { t.Helper(); p.signal(t, syscall.SIGCONT) }

// Term sends SIGTERM and waits up to timeout for the drain and exit; it
// returns the exit error (nil for a clean exit) and fails the test if the
// process outlives timeout (it is then killed).
func (p *Process) Term(t testing.TB, timeout time.Duration) error {
	t.Helper()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	p.signal(t, syscall.SIGTERM)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		p.exited()
		return err
	case <-timer.C:
		p.Kill(t)
		t.Fatalf("%s did not exit within %v of SIGTERM", p.opts.Name, timeout)
		return nil
	}
}

// StartRefused runs the process (it must not be running) with its usual
// arguments and expects it to exit on its own within timeout without ever
// serving, as a store that refuses to open does: it returns the exit
// error (non-nil) and what that run wrote to stderr, stderr first. The test fails if
// the process exits 0 or is still running at timeout (it is then killed).
func (p *Process) StartRefused(t testing.TB, timeout time.Duration) (string, error) {
	t.Helper()
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		t.Fatalf("%s: start while running", p.opts.Name)
	}
	addr := p.addr
	p.starts++
	p.mu.Unlock()
	args := append([]string{"--listen", addr, "--metrics-listen", "", "--admin-listen", "", "--data-dir", p.opts.DataDir,
		"--log-level", "info", "--reflection=false"}, p.opts.Flags...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, p.opts.Binary, args...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	if f, ferr := os.OpenFile(p.stderr, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
		fmt.Fprintf(f, "---- start %d (expected to be refused)\n%s", p.starts, stderr.Bytes())
		f.Close()
	}
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s: still running %v after a start that should have been refused", p.opts.Name, timeout)
	case err == nil:
		t.Fatalf("%s: exited 0, want a refused start", p.opts.Name)
	}
	return stderr.String(), err
}

// Flags are the process's flags (Options.Flags).
func (p *Process) Flags() []string { return append([]string(nil), p.opts.Flags...) }

// SetFlags replaces the process's flags for its next starts (a member
// restarted with a changed flag). It must not be running.
func (p *Process) SetFlags(t testing.TB, flags []string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		t.Fatalf("%s: flags changed while running", p.opts.Name)
	}
	p.opts.Flags = append([]string(nil), flags...)
}

// tail returns the last n lines of a file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// PullQueue reads every message of topic/q from queue offset 0 on through
// the public API, checks that the offsets are dense, and hands each
// message to fn in order. A queue that was never written (NotFound) has
// none.
func PullQueue(ctx context.Context, client storagedv1.MessageStoreServiceClient, topic string, q int32, fn func(*storagedv1.StoredMessage)) error {
	for next := int64(0); ; {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := client.PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: next, MaxMessages: 1000})
		cancel()
		if err != nil {
			if next == 0 && status.Code(err) == codes.NotFound {
				return nil
			}
			return fmt.Errorf("proctest: pull %s/%d at %d: %w", topic, q, next, err)
		}
		for _, m := range res.Messages {
			if m.QueueOffset != next {
				return fmt.Errorf("proctest: %s/%d: offset %d where %d was expected (not dense)", topic, q, m.QueueOffset, next)
			}
			next++
			fn(m)
		}
		if len(res.Messages) == 0 || next >= res.MaxOffset {
			return nil
		}
	}
}

// Main is a TestMain for packages that run storaged: it builds the binary
// once into a temporary dir, stores its path in *binary, runs the tests,
// checks that they left no goroutine behind (goleak: client connections,
// proxies, stderr readers), removes the dir and exits with the tests' code.
func Main(m *testing.M, binary *string) {
	dir, err := os.MkdirTemp("", "storaged-proctest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binary, err = Build(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := RunLeakChecked(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// RunLeakChecked runs the tests and, when they pass, fails the run
// (exit code 1) if a goroutine is left behind: for a TestMain that does
// more than goleak.VerifyTestMain allows (building a binary first,
// removing it after).
func RunLeakChecked(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// FreeAddr is a 127.0.0.1 address nothing listened on a moment ago: for a
// process that must be told its address before it starts (a group
// member's peer address in --raft-peers). Its port is below the kernel's
// ephemeral range (ip_local_port_range), where no listener on port 0 and
// no outgoing connection is ever given a port: a port the kernel handed
// out for a moment could be handed out again before the process binds it
// (a member's --listen 127.0.0.1:0 took its own peer port once). Ports are
// never handed out twice in one test binary; another program may still
// take one in between.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lo := 32768 // Linux's default start of the ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	if lo <= 10000 {
		t.Fatalf("the ephemeral port range starts at %d: no room below it for listeners named in advance", lo)
	}
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	for range 1000 {
		port := 10000 + rand.IntN(lo-10000)
		if handedOut.ports[port] {
			continue
		}
		handedOut.ports[port] = true
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken
		}
		l.Close()
		return addr
	}
	t.Fatalf("no free port in [10000, %d) in 1000 tries", lo)
	return ""
}

// handedOut holds the ports FreeAddr has handed out in this test binary.
var handedOut = struct {
	mu    sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}
