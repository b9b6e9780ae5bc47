package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/storaged/storaged/internal/proctest"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// binary is the storaged binary built by TestMain for the process tests.
var binary string

// The build stamp of binary.
const (
	buildinfoPkg  = "github.com/storaged/storaged/internal/buildinfo"
	stampVersion  = "v0.0.0-test.1"
	stampRevision = "0123456789abcdef0123456789abcdef01234567"
)

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "storaged-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "storaged")
	// Stamped as a release build is (the Dockerfile's -ldflags -X), so
	// TestStampedBinary can see the stamp in --version and /metrics.
	args := []string{"build", "-o", binary, "-ldflags=-X " + buildinfoPkg + ".Version=" + stampVersion +
		" -X " + buildinfoPkg + ".Revision=" + stampRevision}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building storaged:", err)
		return 1
	}
	// Some tests run parts of the command in this process (health and
	// replication checks, servers on 127.0.0.1:0): none may leave a
	// goroutine behind.
	return proctest.RunLeakChecked(m)
}

// Deadlines around external processes. Nothing sleeps: these bound waits on
// channels fed by the process's output and exit.
const (
	startTimeout = 60 * time.Second
	exitTimeout  = 90 * time.Second
)

// logLine is one JSON log line of the process.
type logLine map[string]any

func (l logLine) str(k string) string {
	s, _ := l[k].(string)
	return s
}

// logSink collects stderr lines: all of them as text, and the JSON ones on
// a channel for waitFor.
type logSink struct {
	mu    sync.Mutex
	text  bytes.Buffer
	lines chan logLine
}

func newLogSink() *logSink { return &logSink{lines: make(chan logLine, 4096)} }

func (s *logSink) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		s.mu.Lock()
		s.text.Write(sc.Bytes())
		s.text.WriteByte('\n')
		s.mu.Unlock()
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			select {
			case s.lines <- l:
			default: // nobody is waiting for that many lines; the text keeps it
			}
		}
	}
	close(s.lines)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text.String()
}

// waitFor returns the first line (from now on) whose message is msg.
func (s *logSink) waitFor(t *testing.T, msg string) logLine {
	t.Helper()
	timeout := time.NewTimer(startTimeout)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				t.Fatalf("output ended before %q:\n%s", msg, s.String())
			}
			if l.str("message") == msg {
				return l
			}
		case <-timeout.C:
			t.Fatalf("no %q line after %v:\n%s", msg, startTimeout, s.String())
		}
	}
}

// proc is a storaged process started by a test.
type proc struct {
	cmd  *exec.Cmd
	logs *logSink
	done chan struct{} // closed once stderr is drained and the process reaped
	err  error         // cmd.Wait's result, valid after done
}

// startProc starts the binary with args. It is killed (by its pid) if it
// is still running when the test ends.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	if !slices.Contains(args, "--admin-listen") {
		// Never the default 127.0.0.1:9092: tests (and other checkouts)
		// run storaged processes side by side.
		args = append(args, "--admin-listen", "")
	}
	return startCmd(t, exec.Command(binary, args...))
}

// startCmd starts cmd (the binary, or a wrapper running it) as startProc
// does, in the test's environment plus cmd.Env.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	cmd.Env = append(append(os.Environ(), "GORACE=halt_on_error=1"), cmd.Env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: newLogSink(), done: make(chan struct{})}
	go func() {
		p.logs.consume(stderr)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
			t.Logf("killed storaged pid %d; its output:\n%s", cmd.Process.Pid, p.logs.String())
		}
	})
	return p
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// exitCode waits for the process to end and returns its exit status.
func (p *proc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		t.Fatalf("storaged did not exit within %v:\n%s", exitTimeout, p.logs.String())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("wait: %v", p.err)
	return -1
}

// dial connects to a storaged gRPC address; closed when the test ends.
// Plaintext unless opts say otherwise (grpc.WithTransportCredentials).
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing blocks on a health Watch until the MessageStoreService is
// SERVING (the store is open).
func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	if err := proctest.WaitServing(ctx, conn, server.ServiceName); err != nil {
		t.Fatal(err)
	}
}

// readCommitlog decodes every record of the commitlog files in dir/commitlog
// from offset 0, file by file, up to the first blank or invalid bytes of
// each file. It returns the records by commitlog offset.
func readCommitlog(t *testing.T, dir string) map[int64]*storage.Record {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "commitlog"))
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names) // 20-digit zero-padded start offsets sort numerically
	recs := map[int64]*storage.Record{}
	for _, name := range names {
		var from int64
		if _, err := fmt.Sscanf(name, "%020d", &from); err != nil || len(name) != 20 {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, "commitlog", name))
		if err != nil {
			t.Fatal(err)
		}
		for pos := 0; pos+storage.BlankLen <= len(data) && !storage.IsBlank(data[pos:]); {
			rec, n, err := storage.DecodeRecord(data[pos:])
			if err != nil {
				break // the end of the log in this file (zeroed tail)
			}
			recs[from+int64(pos)] = rec
			pos += n
		}
	}
	return recs
}
