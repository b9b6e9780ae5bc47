// Package proxytest runs a real L7 HTTP/2 proxy, haproxy, on loopback in
// front of a gRPC server, standing in for a service-mesh sidecar: it
// terminates the client's HTTP/2 connection, opens its own h2c connections
// to the backend and, like a mesh's retry policy, re-sends a request by
// itself when the backend's connection fails or closes without an answer.
// Tests use it to check what storaged promises to clients behind such a
// proxy (README, "Behind a proxy that retries").
//
// haproxy comes from the Debian package haproxy, which .ci/run installs.
// When it is missing, Start fails the test under CI=true and skips it
// otherwise, saying why.
package proxytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/storaged/storaged/internal/testenv"
)

// Options configures the proxy. The zero value retries as a mesh would.
type Options struct {
	// Retries is how many times haproxy re-sends a request after a
	// failure listed in RetryOn (haproxy "retries"). Between two attempts
	// that could not connect it waits min(ConnectTimeout, 1 s), so a
	// backend that restarts within about Retries seconds gets the
	// request. Default 30; negative disables retries.
	Retries int
	// RetryOn is haproxy's "retry-on" list. Default
	// "conn-failure empty-response junk-response response-timeout
	// 0rtt-rejected": the backend's connection failed or closed before an
	// answer, the failures a mesh retries on its own (Envoy
	// "reset,connect-failure", Istio's default retryOn).
	RetryOn string
	// ConnectTimeout bounds one connection attempt to the backend (and is
	// the wait between two attempts, at most 1 s). Default 1 s.
	ConnectTimeout time.Duration
	// Timeout is haproxy's client and server inactivity timeout. Default
	// 60 s: longer than any long poll of the tests.
	Timeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Retries == 0 {
		o.Retries = 30
	}
	if o.Retries < 0 {
		o.Retries = 0
	}
	if o.RetryOn == "" {
		o.RetryOn = "conn-failure empty-response junk-response response-timeout 0rtt-rejected"
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	return o
}

// config is haproxy's configuration. The frontend listens on the socket
// the test opened (fd@3: no port to pick, no race), speaks HTTP/2 to the
// client and h2c to the backend; haproxy logs every request to stderr.
var config = template.Must(template.New("haproxy").Parse(`global
	nbthread 1
	log stderr format raw local0 info
	tune.h2.max-concurrent-streams 100

defaults
	mode http
	log global
	log-format "retries=%rc status=%ST term=%tsc time=%Ta %{+Q}r"
	timeout connect {{.ConnectTimeout}}
	timeout client {{.Timeout}}
	timeout server {{.Timeout}}
	retries {{.Retries}}
	{{if .Retries}}retry-on {{.RetryOn}}{{end}}

frontend grpc
	bind fd@3 proto h2
	default_backend storaged

backend storaged
	server storaged {{.Backend}} proto h2
`))

// Proxy is a running haproxy.
type Proxy struct {
	// Addr is the proxy's listening address (127.0.0.1:port): dial it as
	// the server.
	Addr string
	// Config is the configuration haproxy runs with.
	Config string

	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	mu   sync.Mutex
	log  bytes.Buffer // haproxy's stderr
}

// Path returns the haproxy binary, or fails (CI=true) or skips the test
// when it is not installed.
func Path(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("haproxy")
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin"} {
			if _, serr := os.Stat(filepath.Join(dir, "haproxy")); serr == nil {
				return filepath.Join(dir, "haproxy")
			}
		}
		testenv.Need(t, false, fmt.Sprintf("haproxy (Debian package haproxy, installed by .ci/run) is not installed: %v", err))
	}
	return p
}

// Start runs haproxy in front of backend (host:port, h2c) until the test
// ends, and returns once it answers on Addr. The backend need not be up.
func Start(t testing.TB, backend string, opts Options) *Proxy {
	t.Helper()
	bin := Path(t)
	opts = opts.withDefaults()
	var cfg bytes.Buffer
	if err := config.Execute(&cfg, struct {
		Options
		ConnectTimeout, Timeout string
		Backend                 string
	}{opts, ms(opts.ConnectTimeout), ms(opts.Timeout), backend}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, cfg.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := lis.(*net.TCPListener).File()
	lis.Close() // the process keeps its copy of the socket
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	p := &Proxy{Addr: lis.Addr().String(), Config: cfg.String(), done: make(chan struct{})}
	// -db: stay in the foreground; -f: the configuration.
	p.cmd = exec.Command(bin, "-db", "-f", cfgPath)
	p.cmd.ExtraFiles = []*os.File{f} // fd 3
	p.cmd.Stdout = (*lockedWriter)(p)
	p.cmd.Stderr = (*lockedWriter)(p)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("haproxy configuration:\n%s\nhaproxy log:\n%s", p.Config, p.Log())
		}
	})
	if err := p.waitReady(10 * time.Second); err != nil {
		t.Fatalf("haproxy: %v\nlog:\n%s", err, p.Log())
	}
	return p
}

// waitReady waits until haproxy has taken its socket: it answers an
// HTTP/1.1 request (the frontend is HTTP/2 only, so the answer is an
// error or a closed connection, but only a running haproxy answers).
// A connection alone proves nothing: the kernel accepts into the
// inherited socket's backlog before haproxy runs.
func (p *Proxy) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-p.done:
			return errors.New("exited at start")
		default:
		}
		if answered(p.Addr) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %s within %v", p.Addr, limit)
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func answered(addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return false
	}
	var b [1]byte
	_, err = c.Read(b[:])
	// An answer, or the connection closed by haproxy (EOF, reset): running.
	// A timeout: nobody has read the request yet.
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// Log returns what haproxy wrote to stderr so far (one line per request,
// with its retries).
func (p *Proxy) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Retried counts the requests haproxy sent more than once (its log's
// retries field, %rc, above 0; "+N" when redispatched).
func (p *Proxy) Retried() int {
	n := 0
	for _, l := range strings.Split(p.Log(), "\n") {
		for _, f := range strings.Fields(l) {
			if r, ok := strings.CutPrefix(f, "retries="); ok {
				if r = strings.TrimPrefix(r, "+"); r != "0" && r != "" && r != "-1" {
					n++
				}
			}
		}
	}
	return n
}

type lockedWriter Proxy

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.Write(b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }
