package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Peers as matrix targets (issue 16): NATS JetStream and Redis with an
// append-only file, each at two durability settings, loaded by their own
// benchmark clients (`nats bench`, `redis-benchmark`) with the matrix's
// cases, so that their figures sit beside storaged's from the same run and
// take turns with storaged and the floor exactly as those do.
//
//	nats            nats-server, JetStream R1 file stream, default sync_interval
//	                (2 min: acked from the page cache, like storaged async)
//	nats-always     the same with sync_interval: always (fsync before the ack)
//	redis-everysec  redis-server, appendonly yes, appendfsync everysec
//	redis-always    appendfsync always (fsync before the reply)
//
// Case mapping: unary-cN is N clients each with one publish (NATS `pub
// sync`) or one SET (Redis) in flight; batchB-cN is N clients each sending B
// at a time (NATS `pub async --batch B`, which waits for the B acks before
// the next B; Redis pipelining `-P B`). Streams have no peer counterpart and
// are skipped. The peers' clients count messages, not time: each run first
// calibrates a count that takes about --warmup (unmeasured, and it warms the
// server), then measures a count that takes about --duration at the rate
// the warm-up reached.
//
// The clients differ from storaged-bench, and on a 2-core machine a client's
// CPU per message moves the server's throughput; the client's CPU per
// message is recorded beside the server's for that reason.
var peerTargets = []string{"nats", "nats-always", "redis-everysec", "redis-always"}

func isPeer(t string) bool { return slices.Contains(peerTargets, t) }

// peerBinaries are the programs the peer targets run.
type peerBinaries struct {
	natsServer, nats            string
	redisServer, redisBenchmark string
}

func (b peerBinaries) need(target string) error {
	var missing []string
	if strings.HasPrefix(target, "nats") {
		if b.natsServer == "" {
			missing = append(missing, "--nats-server")
		}
		if b.nats == "" {
			missing = append(missing, "--nats")
		}
	} else {
		if b.redisServer == "" {
			missing = append(missing, "--redis-server")
		}
		if b.redisBenchmark == "" {
			missing = append(missing, "--redis-benchmark")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("target %s needs %s", target, strings.Join(missing, " and "))
	}
	return nil
}

// peer is a running peer server and the client that loads it.
type peer struct {
	target string
	bins   peerBinaries
	addr   string // host:port
}

// startPeer starts the server of a peer target on a fresh data dir under
// dataRoot and waits until it answers.
func startPeer(ctx context.Context, target string, bins peerBinaries, dataRoot string, logw io.Writer) (*proc, error) {
	dir, err := os.MkdirTemp(dataRoot, "storaged-bench-"+target+"-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	port, err := freePort()
	if err != nil {
		cleanup()
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var bin string
	var args []string
	ready := ""
	switch target {
	case "nats", "nats-always":
		sync := ""
		if target == "nats-always" {
			sync = "sync_interval: always\n"
		}
		conf := fmt.Sprintf("listen: %q\njetstream {\n  store_dir: %q\n  %s}\n", addr, filepath.Join(dir, "js"), sync)
		cf := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
			cleanup()
			return nil, err
		}
		bin, args, ready = bins.natsServer, []string{"-c", cf}, "Server is ready"
	case "redis-everysec", "redis-always":
		fsync := strings.TrimPrefix(target, "redis-")
		// No RDB snapshots and no AOF rewrites: the store only appends,
		// as storaged's commitlog does.
		bin, args = bins.redisServer, []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--auto-aof-rewrite-percentage", "0",
			"--daemonize", "no", "--protected-mode", "no"}
		ready = "Ready to accept connections"
	default:
		cleanup()
		return nil, fmt.Errorf("unknown peer %q", target)
	}
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		cleanup()
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		cleanup()
		return nil, fmt.Errorf("start %s: %w", target, err)
	}
	p := &proc{name: target, cmd: cmd, grpc: addr, exited: make(chan struct{}), cleanup: cleanup,
		peer: &peer{target: target, bins: bins, addr: addr}}
	readyc := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		seen := false
		for sc.Scan() {
			fmt.Fprintf(logw, "%s\n", sc.Bytes())
			if !seen && strings.Contains(sc.Text(), ready) {
				seen = true
				close(readyc)
			}
		}
		io.Copy(io.Discard, out)
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t := time.NewTimer(procStartTimeout)
	defer t.Stop()
	select {
	case <-readyc:
		return p, nil
	case <-p.exited:
		p.cleanupOnce()
		return nil, fmt.Errorf("%s exited before it was ready: %v", target, p.waitErr)
	case <-t.C:
		p.Stop()
		return nil, fmt.Errorf("%s: not ready after %v", target, procStartTimeout)
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

// freePort asks the kernel for a free loopback port. The port is free
// again when the server binds it; another process could take it in
// between, and the server would then fail to start (an error, not a wrong
// measurement).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// peerResult is what one run of a peer's client reported.
type peerResult struct {
	msgs    int64
	elapsed time.Duration // wall clock of the client process
	rate    float64       // msgs/s as the client reports it
	p50Us   int64
	p99Us   int64
	cpu     time.Duration // the client process's CPU time
}

// load runs case c against the peer: a calibrating warm-up, then the
// measured run. It returns nil for a case the peer has no counterpart for.
func (p *peer) load(ctx context.Context, c caseSpec, cfg loadConfig) (*Summary, error) {
	if c.Method != methodUnary && c.Method != methodBatch {
		return nil, nil
	}
	started := time.Now()
	inflight := c.Concurrency * c.BatchSize
	n := int64(max(1000, 20*inflight))
	var warm *peerResult
	var warmed time.Duration // all warm-up runs: the matrix scales the server's CPU by it
	warmDur := max(cfg.Warmup, 500*time.Millisecond)
	for i := 0; i < 5; i++ {
		r, err := p.runClient(ctx, c, cfg.BodySize, n)
		if err != nil {
			return nil, err
		}
		warm, warmed = r, warmed+r.elapsed
		if r.elapsed >= warmDur/2 || r.rate <= 0 {
			break
		}
		n = int64(math.Ceil(r.rate * warmDur.Seconds()))
	}
	target := int64(10 * inflight)
	if warm.rate > 0 {
		target = max(target, int64(warm.rate*cfg.Duration.Seconds()))
	}
	target = min(target, 50_000_000)
	r, err := p.runClient(ctx, c, cfg.BodySize, target)
	if err != nil {
		return nil, err
	}
	s := &Summary{
		Label: cfg.Label, Target: p.target, Method: c.Method, BodySize: cfg.BodySize, BatchSize: c.BatchSize,
		Concurrency: c.Concurrency, Connections: c.Concurrency, InFlight: inflight,
		Started:       started.UTC().Format(time.RFC3339Nano),
		WarmupSeconds: warmed.Seconds(), DurationSeconds: r.elapsed.Seconds(),
		Messages: r.msgs, OKCalls: r.msgs / int64(c.BatchSize), Calls: r.msgs / int64(c.BatchSize),
		Bytes: r.msgs * int64(cfg.BodySize), MsgsPerSec: r.rate,
		Latency: Latency{Count: r.msgs / int64(c.BatchSize), P50Us: r.p50Us, P99Us: r.p99Us},
	}
	s.CallsPerSec = s.MsgsPerSec / float64(c.BatchSize)
	s.MBPerSec = s.MsgsPerSec * float64(cfg.BodySize) / 1e6
	if r.msgs > 0 {
		s.ClientCPUPerMsgUs = r.cpu.Seconds() / float64(r.msgs) * 1e6
	}
	return s, nil
}

// runClient runs the peer's benchmark client for n messages.
func (p *peer) runClient(ctx context.Context, c caseSpec, bodySize int, n int64) (*peerResult, error) {
	var cmd *exec.Cmd
	var parse func(string) (*peerResult, error)
	if strings.HasPrefix(p.target, "nats") {
		// --timeout: a JetStream ack waits for fsync with sync_interval
		// always; natscli's 5 s default fails batches of 100 on a slow disk.
		args := []string{"-s", "nats://" + p.addr, "--timeout", "60s", "bench", "js", "pub"}
		if c.Method == methodBatch {
			args = append(args, "async", "--batch", strconv.Itoa(c.BatchSize))
		} else {
			args = append(args, "sync")
		}
		// --maxbytes: natscli's default stream limit (1 GB) is smaller than
		// a run of batches at 750 k msgs/s; the stream is purged every run,
		// so room for the run's messages twice over is enough.
		maxBytes := max(1<<30, 2*n*int64(bodySize+128))
		args = append(args, "storaged.bench", "--clients", strconv.Itoa(c.Concurrency), "--size", strconv.Itoa(bodySize),
			"--msgs", strconv.FormatInt(n, 10), "--maxbytes", strconv.FormatInt(maxBytes, 10),
			"--create", "--purge", "--storage", "file", "--replicas", "1", "--no-progress")
		cmd = exec.CommandContext(ctx, p.bins.nats, args...)
		parse = parseNatsBench
	} else {
		host, port, _ := net.SplitHostPort(p.addr)
		cmd = exec.CommandContext(ctx, p.bins.redisBenchmark, "-h", host, "-p", port, "-t", "set", "-d", strconv.Itoa(bodySize),
			"-c", strconv.Itoa(c.Concurrency), "-n", strconv.FormatInt(n, 10), "-P", strconv.Itoa(c.BatchSize),
			"-r", "1000000", "--csv")
		parse = parseRedisBenchmark
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, tail(out.String(), 2000))
	}
	r, err := parse(out.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	r.msgs, r.elapsed = n, elapsed
	if st := cmd.ProcessState; st != nil {
		r.cpu = st.UserTime() + st.SystemTime()
	}
	return r, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

var (
	natsRate    = regexp.MustCompile(`publisher (?:aggregated )?stats: ([0-9,.]+) msgs/sec`)
	natsLatency = regexp.MustCompile(`P50:? ([0-9,.]+)us .*?P99:? ([0-9,.]+)us`)
)

// parseNatsBench reads the summary of `nats bench js pub`: with several
// clients the aggregated lines,
//
//	NATS JetStream synchronous publisher aggregated stats: 587 msgs/sec ~ 588 KiB/sec
//	 latencies per operation min 612.23us | avg ... | P50 4,550.51us | P90 ... | P99 33,359.86us | P99.9: ...
//
// (after one such line per client), with one client a single line,
//
//	NATS JetStream synchronous publisher stats: 5,136 msgs/sec ~ 5.0 MiB/sec ~ min: ... ~ P50: 164.57us ~ P90: ... ~ P99: 642.73us ~ ...
//
// The latencies are the first after the summary's rate.
func parseNatsBench(out string) (*peerResult, error) {
	loc := natsRate.FindStringSubmatchIndex(out)
	if loc == nil {
		return nil, errors.New("no publisher stats line in the output: " + tail(out, 2000))
	}
	r := &peerResult{}
	var err error
	if r.rate, err = parseNumber(out[loc[2]:loc[3]]); err != nil {
		return nil, err
	}
	if m := natsLatency.FindStringSubmatch(out[loc[1]:]); m != nil {
		p50, err1 := parseNumber(m[1])
		p99, err2 := parseNumber(m[2])
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		r.p50Us, r.p99Us = int64(p50), int64(p99)
	}
	return r, nil
}

// parseRedisBenchmark reads redis-benchmark --csv:
//
//	"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
//	"SET","41152.26","1.477","0.232","1.359","2.295","3.335","9.223"
func parseRedisBenchmark(out string) (*peerResult, error) {
	var header []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, `"`) {
			continue
		}
		f := strings.Split(strings.ReplaceAll(line, `"`, ""), ",")
		if f[0] == "test" {
			header = f
			continue
		}
		if f[0] != "SET" || len(header) != len(f) {
			continue
		}
		col := func(name string) (float64, error) {
			for i, h := range header {
				if h == name {
					return parseNumber(f[i])
				}
			}
			return 0, fmt.Errorf("no %s column", name)
		}
		rps, err1 := col("rps")
		p50, err2 := col("p50_latency_ms")
		p99, err3 := col("p99_latency_ms")
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, err
		}
		return &peerResult{rate: rps, p50Us: int64(p50 * 1000), p99Us: int64(p99 * 1000)}, nil
	}
	return nil, errors.New("no SET row in the CSV output: " + tail(out, 2000))
}

func parseNumber(s string) (float64, error) {
	return strconv.ParseFloat(strings.ReplaceAll(strings.TrimSpace(s), ",", ""), 64)
}
