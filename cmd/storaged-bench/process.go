package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/storaged/storaged/server"
)

// Bounds on waits for a server process. Nothing polls: these bound reads of
// its stderr, its health Watch stream and its exit.
const (
	procStartTimeout = 60 * time.Second
	procStopTimeout  = 60 * time.Second
)

// proc is a server process under test: storaged, or this binary's floor
// subcommand. Both print a JSON log line with "message":"listening" and
// the bound "grpc" (and "metrics") addresses on stderr.
type proc struct {
	name    string
	cmd     *exec.Cmd
	grpc    string
	metrics string // "" without a metrics listener
	exited  chan struct{}
	waitErr error
	cleanup func()
	peer    *peer // a peer target (peers.go): its own client loads it
}

// startProc starts bin with args, copies its stderr to logw, and waits
// for its listening line and for the health of MessageStoreService to be
// SERVING.
func startProc(ctx context.Context, name, bin string, args []string, logw io.Writer, cleanup func()) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logw
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), cleanup: cleanup}
	listening := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Bytes()
			fmt.Fprintf(logw, "%s\n", line)
			if found {
				continue
			}
			var m map[string]any
			if json.Unmarshal(line, &m) == nil && m["message"] == "listening" {
				found = true
				listening <- m
			}
		}
		io.Copy(io.Discard, stderr)
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	t := time.NewTimer(procStartTimeout)
	defer t.Stop()
	select {
	case m := <-listening:
		p.grpc, _ = m["grpc"].(string)
		p.metrics, _ = m["metrics"].(string)
	case <-p.exited:
		p.cleanupOnce()
		return nil, fmt.Errorf("%s exited before listening: %v", name, p.waitErr)
	case <-t.C:
		p.Stop()
		return nil, fmt.Errorf("%s: no listening line after %v", name, procStartTimeout)
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
	if p.grpc == "" {
		p.Stop()
		return nil, fmt.Errorf("%s: listening line without a grpc address", name)
	}
	wctx, cancel := context.WithTimeout(ctx, procStartTimeout)
	defer cancel()
	if err := waitServing(wctx, p.grpc); err != nil {
		p.Stop()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// waitServing watches the health of MessageStoreService at addr until it
// is SERVING (storaged listens before its store has recovered).
func waitServing(ctx context.Context, addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: server.ServiceName})
	if err != nil {
		return fmt.Errorf("health watch: %w", err)
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			return fmt.Errorf("health watch: %w", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// metricsURL is the Prometheus endpoint of the process ("" without one).
func (p *proc) metricsURL() string {
	if p.metrics == "" {
		return ""
	}
	return "http://" + p.metrics + "/metrics"
}

// Stop sends SIGTERM, waits for the exit (SIGKILL after procStopTimeout)
// and runs the cleanup.
func (p *proc) Stop() error {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(procStopTimeout)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.cleanupOnce()
	if p.waitErr != nil {
		return fmt.Errorf("%s: %w", p.name, p.waitErr)
	}
	return nil
}

func (p *proc) cleanupOnce() {
	if p.cleanup != nil {
		p.cleanup()
		p.cleanup = nil
	}
}

// selfBinary is this executable, for starting floor subprocesses.
func selfBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	return exe, nil
}
