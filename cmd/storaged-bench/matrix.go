package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// defaultCases is the case list of the matrix subcommand: the unary
// concurrency sweep (the chart; unary-c64 and the p99 at 16 are issue 7
// targets; unary-c256 is where the server heap is read), the batch target,
// and streams with as many messages in flight as unary-c64 (s1-c64), four
// times as many over four streams (s4-c64) and over one stream (s1-c256,
// the server's window).
const defaultCases = "unary-c1,unary-c4,unary-c16,unary-c64,unary-c256,batch100-c16,stream-s1-c64,stream-s4-c64,stream-s1-c256"

// Targets of the matrix. floor, bare and edge are this binary's floor
// subcommand; async and sync are storaged with that --flush-mode, and
// base-async and base-sync the same with the --base binary (an A/B of two
// storaged builds in one run); r3 is a local group of three storaged
// (group.go); the peers are in peers.go.
var knownTargets = append([]string{"floor", "bare", "edge", "async", "sync", "base-async", "base-sync", targetR3, targetR3Keyed}, peerTargets...)

// storagedTarget reports whether t is a storaged process, and with which
// --flush-mode.
func storagedTarget(t string) (mode string, ok bool) {
	switch t {
	case "async", "sync":
		return t, true
	case "base-async", "base-sync":
		return strings.TrimPrefix(t, "base-"), true
	}
	return "", false
}

// caseSpec is one load shape of the matrix, named unary-cN, batchB-cN or
// stream-sS-cN.
type caseSpec struct {
	Name        string `json:"name"`
	Method      string `json:"method"`
	BatchSize   int    `json:"batch_size"`
	Concurrency int    `json:"concurrency"`
	Streams     int    `json:"streams,omitempty"`
}

func parseCase(name string) (caseSpec, error) {
	c := caseSpec{Name: name, BatchSize: 1, Streams: 1}
	bad := fmt.Errorf("case %q: want unary-cN, batchB-cN or stream-sS-cN", name)
	parts := strings.Split(name, "-")
	num := func(s, prefix string) (int, bool) {
		v, ok := strings.CutPrefix(s, prefix)
		if !ok {
			return 0, false
		}
		n, err := strconv.Atoi(v)
		return n, err == nil && n > 0
	}
	var ok bool
	switch {
	case len(parts) == 2 && parts[0] == "unary":
		c.Method = methodUnary
		c.Concurrency, ok = num(parts[1], "c")
	case len(parts) == 2 && strings.HasPrefix(parts[0], "batch"):
		c.Method = methodBatch
		if c.BatchSize, ok = num(parts[0], "batch"); ok {
			c.Concurrency, ok = num(parts[1], "c")
		}
	case len(parts) == 3 && parts[0] == "stream":
		c.Method = methodStream
		if c.Streams, ok = num(parts[1], "s"); ok {
			c.Concurrency, ok = num(parts[2], "c")
		}
	}
	if !ok {
		return caseSpec{}, bad
	}
	return c, nil
}

// Stat is the median, minimum and maximum of repeated measurements, and
// the spread (max-min)/median in percent.
type Stat struct {
	Median    float64 `json:"median"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	SpreadPct float64 `json:"spread_pct"`
}

func newStat(vs []float64) Stat {
	if len(vs) == 0 {
		return Stat{}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	var med float64
	if n := len(s); n%2 == 1 {
		med = s[n/2]
	} else {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	st := Stat{Median: med, Min: s[0], Max: s[len(s)-1]}
	if med != 0 {
		st.SpreadPct = (st.Max - st.Min) / med * 100
	}
	return st
}

// targetResult is the runs of one case against one target.
type targetResult struct {
	Runs       []*Summary `json:"runs"`
	MsgsPerSec Stat       `json:"msgs_per_sec"`
	P50Us      Stat       `json:"p50_us"`
	P99Us      Stat       `json:"p99_us"`
	HeapBytes  Stat       `json:"server_heap_inuse_max_bytes"`
	// ServerCPUPerMsgUs is the server's CPU time per PUT_OK message, µs.
	ServerCPUPerMsgUs Stat `json:"server_cpu_per_msg_us"`
	// SyncMeanUs, MsgsPerSync and FlushWaitUs summarize the runs' Flush
	// (zero for targets without flusher metrics).
	SyncMeanUs  Stat  `json:"sync_mean_us"`
	MsgsPerSync Stat  `json:"msgs_per_sync"`
	FlushWaitUs Stat  `json:"flush_wait_mean_us"`
	FlushBusy   Stat  `json:"flush_busy_fraction"`
	Errors      int64 `json:"errors"`
	Degraded    int64 `json:"degraded"`
}

// ratio compares a target with the floor run by run: run i of the target
// ran right after run i of the floor.
type ratio struct {
	Throughput Stat `json:"throughput"` // target msgs/s ÷ floor msgs/s
	P99        Stat `json:"p99"`        // target p99 ÷ floor p99
	// ServerCPU is target server CPU per message ÷ the floor's.
	ServerCPU Stat `json:"server_cpu_per_msg"`
}

type caseResult struct {
	caseSpec
	Targets map[string]*targetResult `json:"targets"`
	// VsFloor holds, for every target but the floor, its ratios to the
	// floor (present when "floor" is a target).
	VsFloor map[string]*ratio `json:"vs_floor,omitempty"`
}

// MachineInfo describes where the matrix ran.
type MachineInfo struct {
	NProc      int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPU        string `json:"cpu"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
}

// MatrixResult is the JSON file the matrix writes and the chart reads.
type MatrixResult struct {
	Date            string      `json:"date"`
	Machine         MachineInfo `json:"machine"`
	Command         string      `json:"command"`
	Note            string      `json:"note,omitempty"`
	Runs            int         `json:"runs"`
	DurationSeconds float64     `json:"duration_seconds"`
	Messages        int64       `json:"messages,omitempty"` // per run, instead of a duration
	WarmupSeconds   float64     `json:"warmup_seconds"`
	BodySize        int         `json:"body_size"`
	Connections     int         `json:"connections"`
	Targets         []string    `json:"targets"`
	StoragedArgs    []string    `json:"storaged_args,omitempty"`
	// GOGCEnv is GOGC in the matrix's environment, which the servers
	// inherit ("" = their default, gctune.DefaultGOGC); GeneratorGOGC is the
	// generator's own setting (see leanGC).
	GOGCEnv       string        `json:"gogc_env,omitempty"`
	GeneratorGOGC string        `json:"generator_gogc"`
	Cases         []*caseResult `json:"cases"`
}

func machineInfo() MachineInfo {
	m := MachineInfo{NProc: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

type matrixOptions struct {
	storaged     string
	base         string
	storagedArgs string
	peers        peerBinaries
	targets      string
	cases        string
	runs         int
	dataRoot     string
	out          string
	logPath      string
	note         string
	load         loadConfig
}

func parseMatrixOptions(args []string, stderr io.Writer) (matrixOptions, []caseSpec, []string, error) {
	o := matrixOptions{targets: "floor,async,sync", cases: defaultCases, runs: 3, out: "bench-results.json", load: defaultLoadConfig()}
	o.load.Duration = 5 * time.Second
	fs := flag.NewFlagSet("storaged-bench matrix", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.storaged, "storaged", "", "storaged `binary` (needed for the async and sync targets)")
	fs.StringVar(&o.base, "base", "", "storaged `binary` of the base-async and base-sync targets (an A/B in one run)")
	fs.StringVar(&o.peers.natsServer, "nats-server", "", "nats-server `binary` (targets nats, nats-always)")
	fs.StringVar(&o.peers.nats, "nats", "", "natscli `binary` whose bench loads the NATS targets")
	fs.StringVar(&o.peers.redisServer, "redis-server", "", "redis-server `binary` (targets redis-everysec, redis-always)")
	fs.StringVar(&o.peers.redisBenchmark, "redis-benchmark", "", "redis-benchmark `binary` that loads the Redis targets")
	fs.StringVar(&o.storagedArgs, "storaged-args", "", "extra storaged `flags`, space-separated (e.g. \"--file-size 256MiB\")")
	fs.StringVar(&o.targets, "targets", o.targets, "comma-separated `targets`: floor, bare, edge (no-op servers), async, sync (storaged), "+
		"r3 (a local group of three storaged, loaded through client.LeaderTracker; stream cases through a client.Stream per stream), "+
		"r3-keyed (the same group, every message keyed: client.UniqKeysStamped)")
	fs.StringVar(&o.cases, "cases", o.cases, "comma-separated `cases`: unary-cN, batchB-cN (B per call), stream-sS-cN (S streams, N in flight each)")
	fs.IntVar(&o.runs, "runs", o.runs, "runs of each case on each target (the median is reported)")
	fs.StringVar(&o.dataRoot, "data-root", os.TempDir(), "`directory` for the temporary storaged data dirs")
	fs.StringVar(&o.out, "out", o.out, "results JSON `file`")
	fs.StringVar(&o.logPath, "log", "", "server logs `file` (default: --out with .log)")
	fs.StringVar(&o.note, "note", "", "free-form note recorded in the results (e.g. the storaged revision)")
	fs.IntVar(&o.load.BodySize, "body-size", o.load.BodySize, "message body size in `bytes`")
	fs.IntVar(&o.load.Connections, "connections", o.load.Connections, "gRPC client connections per run")
	fs.DurationVar(&o.load.Duration, "duration", o.load.Duration, "measured phase of each run")
	fs.Int64Var(&o.load.Messages, "messages", 0, "send this many measured messages per run instead of running for --duration")
	fs.DurationVar(&o.load.Warmup, "warmup", o.load.Warmup, "warmup of each run")
	fs.IntVar(&o.load.Queues, "queues", o.load.Queues, "queue ids per run")
	fs.StringVar(&o.load.Topic, "topic", o.load.Topic, "topic")
	if err := parseFlags(fs, args); err != nil {
		return o, nil, nil, err
	}
	fail := func(err error) (matrixOptions, []caseSpec, []string, error) {
		fmt.Fprintln(stderr, "storaged-bench matrix:", err)
		return o, nil, nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	resolveBound(fs, &o.load)
	if o.runs <= 0 {
		return fail(errors.New("--runs must be positive"))
	}
	if err := o.load.validate(); err != nil {
		return fail(err)
	}
	var cases []caseSpec
	for _, n := range strings.Split(o.cases, ",") {
		c, err := parseCase(strings.TrimSpace(n))
		if err != nil {
			return fail(err)
		}
		cases = append(cases, c)
	}
	var targets []string
	for _, t := range strings.Split(o.targets, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(knownTargets, t) {
			return fail(fmt.Errorf("unknown target %q (want %s)", t, strings.Join(knownTargets, ", ")))
		}
		if (t == "async" || t == "sync" || isGroupTarget(t)) && o.storaged == "" {
			return fail(fmt.Errorf("target %s needs --storaged", t))
		}
		if strings.HasPrefix(t, "base-") && o.base == "" {
			return fail(fmt.Errorf("target %s needs --base", t))
		}
		if isPeer(t) {
			if err := o.peers.need(t); err != nil {
				return fail(err)
			}
		}
		targets = append(targets, t)
	}
	if o.logPath == "" {
		o.logPath = strings.TrimSuffix(o.out, ".json") + ".log"
	}
	return o, cases, targets, nil
}

// runMatrixCommand is the matrix subcommand. Every target runs as its own
// process for the whole matrix; for each case and each run the targets are
// loaded one after the other, so the runs a ratio compares are seconds
// apart, and noise that lasts longer than a case hits all targets alike.
func runMatrixCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, cases, targets, err := parseMatrixOptions(args, stderr)
	if err != nil {
		return err
	}
	logf, err := os.Create(o.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	logw := &lockedWriter{w: logf}
	self, err := selfBinary()
	if err != nil {
		return err
	}

	procs := map[string]*proc{}
	groups := map[string]*benchGroup{}
	defer func() {
		for _, t := range targets {
			if p := procs[t]; p != nil {
				if err := p.Stop(); err != nil {
					fmt.Fprintln(stderr, "storaged-bench matrix: stop:", err)
				}
			}
			if g := groups[t]; g != nil && !(t == targetR3Keyed && groups[targetR3] == g) { // one group for both
				if err := g.Stop(); err != nil {
					fmt.Fprintln(stderr, "storaged-bench matrix: stop:", err)
				}
			}
		}
	}()
	for _, t := range targets {
		if isGroupTarget(t) {
			if g := groups[targetR3]; g != nil { // r3-keyed after r3: the same processes
				groups[t] = g
				continue
			}
			if g := groups[targetR3Keyed]; g != nil {
				groups[t] = g
				continue
			}
			g, err := startGroup(ctx, o.storaged, o.dataRoot, o.storagedArgs, logw)
			if err != nil {
				return err
			}
			groups[t] = g
			fmt.Fprintf(stderr, "%s: %s --raft-peers %s (grpc %s)\n", t, o.storaged, g.peers, strings.Join(g.addrs(), ", "))
			continue
		}
		var bin string
		var pargs []string
		var cleanup func()
		mode, isStoraged := storagedTarget(t)
		switch {
		case isPeer(t):
			p, err := startPeer(ctx, t, o.peers, o.dataRoot, &prefixWriter{w: logw, prefix: t + ": "})
			if err != nil {
				return err
			}
			procs[t] = p
			fmt.Fprintf(stderr, "%s: %s (listening on %s)\n", t, strings.Join(p.cmd.Args, " "), p.grpc)
			continue
		case isStoraged:
			dir, err := os.MkdirTemp(o.dataRoot, "storaged-bench-"+t+"-")
			if err != nil {
				return err
			}
			cleanup = func() { os.RemoveAll(dir) }
			bin = o.storaged
			if strings.HasPrefix(t, "base-") {
				bin = o.base
			}
			pargs = storagedArgs(bin, dir, o.storagedArgs, "--flush-mode", mode)
		default:
			kind := t
			if t == "floor" {
				kind = floorGRPC
			}
			bin = self
			pargs = []string{"floor", "--floor-kind", kind, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}
		}
		p, err := startProc(ctx, t, bin, pargs, &prefixWriter{w: logw, prefix: t + ": "}, cleanup)
		if err != nil {
			return err
		}
		procs[t] = p
		fmt.Fprintf(stderr, "%s: %s %s (grpc %s, metrics %s)\n", t, bin, strings.Join(pargs, " "), p.grpc, p.metrics)
	}

	res := &MatrixResult{
		Date:            time.Now().UTC().Format(time.RFC3339),
		Machine:         machineInfo(),
		Command:         "storaged-bench matrix " + strings.Join(args, " "),
		Note:            o.note,
		Runs:            o.runs,
		DurationSeconds: o.load.Duration.Seconds(),
		Messages:        o.load.Messages,
		WarmupSeconds:   o.load.Warmup.Seconds(),
		BodySize:        o.load.BodySize,
		Connections:     o.load.Connections,
		Targets:         targets,
		StoragedArgs:    strings.Fields(o.storagedArgs),
		GOGCEnv:         os.Getenv("GOGC"),
		GeneratorGOGC:   strconv.Itoa(generatorGOGC),
	}
	if res.GOGCEnv != "" {
		res.GeneratorGOGC = res.GOGCEnv
	}
	for _, c := range cases {
		cr := &caseResult{caseSpec: c, Targets: map[string]*targetResult{}}
		res.Cases = append(res.Cases, cr)
		for run := range o.runs {
			for _, t := range targets {
				p, grp := procs[t], groups[t]
				cfg := o.load
				cfg.Method, cfg.BatchSize, cfg.Concurrency, cfg.Streams = c.Method, c.BatchSize, c.Concurrency, c.Streams
				cfg.Label = t
				var pids []int
				if grp != nil {
					// The leader's heap; the CPU of all three members.
					lead, err := grp.leader(ctx)
					if err != nil {
						return err
					}
					cfg.MetricsURL, pids = grp.members[lead].metricsURL(), grp.pids()
					p = &proc{name: t} // no flusher metrics, no peer
				} else {
					cfg.MetricsURL, pids = p.metricsURL(), []int{p.cmd.Process.Pid}
				}
				fmt.Fprintf(stderr, "%s run %d/%d on %s ... ", c.Name, run+1, o.runs, t)
				m0, t0 := p.storeMetrics(ctx), time.Now()
				srv0, err1 := procsCPU(pids)
				cli0, err2 := procCPU(os.Getpid())
				var s *Summary
				var err error
				switch {
				case grp != nil:
					s, err = grp.load(ctx, c, cfg, t == targetR3Keyed)
				case p.peer != nil:
					s, err = p.peer.load(ctx, c, cfg)
				default:
					s, err = loadOnce(ctx, cfg, p.grpc)
				}
				if err != nil && p.peer != nil && ctx.Err() == nil {
					// A peer's client that fails (an ack timeout on a
					// loaded machine) loses its run, not the matrix.
					fmt.Fprintf(stderr, "failed, run skipped: %v\n", err)
					fmt.Fprintf(logw, "%s: %s run %d failed: %v\n", t, c.Name, run+1, err)
					continue
				}
				if err != nil {
					fmt.Fprintln(stderr)
					return fmt.Errorf("%s on %s: %w", c.Name, t, err)
				}
				if s == nil {
					fmt.Fprintln(stderr, "no such case for this target")
					continue
				}
				srv1, err3 := procsCPU(pids)
				cli1, err4 := procCPU(os.Getpid())
				if m0 != nil {
					if m1 := p.storeMetrics(ctx); m1 != nil {
						s.Flush = flushStats(m0, m1, s.Messages, time.Since(t0))
					}
				}
				s.Target = t
				s.HostLoad1 = loadAverage()
				if err := errors.Join(err1, err2, err3, err4); err == nil && s.Messages > 0 {
					// The warmup's messages are not counted, its CPU is:
					// scale the CPU to the measured phase.
					frac := s.DurationSeconds / (s.DurationSeconds + s.WarmupSeconds)
					s.ServerCPUSeconds = (srv1 - srv0).Seconds()
					s.ServerCPUPerMsgUs = s.ServerCPUSeconds * frac / float64(s.Messages) * 1e6
					if p.peer == nil { // a peer's client reports its own
						s.ClientCPUPerMsgUs = (cli1 - cli0).Seconds() * frac / float64(s.Messages) * 1e6
					}
				}
				fmt.Fprintf(stderr, "%.0f msgs/s, p99 %s, errors %d\n", s.MsgsPerSec, fmtLatency(s.Latency.P99Us), s.Errors)
				tr := cr.Targets[t]
				if tr == nil {
					tr = &targetResult{}
					cr.Targets[t] = tr
				}
				tr.Runs = append(tr.Runs, s)
			}
		}
		cr.summarize()
		// Write after every case: a long matrix that fails late keeps
		// what it measured.
		if err := writeJSON(o.out, stdout, res); err != nil {
			return err
		}
	}
	printMatrix(stdout, res)
	return nil
}

// storeMetrics reads the flusher metrics of a storaged target; nil for a
// floor or on failure.
func (p *proc) storeMetrics(ctx context.Context) map[string]float64 {
	if _, ok := storagedTarget(p.name); p.metrics == "" || !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	m, err := scrapeMetrics(ctx, client, p.metricsURL(), syncSecondsSum, syncSecondsCount, flushWaitSecondsSum, flushWaitCount)
	if err != nil {
		return nil
	}
	return m
}

// loadOnce runs one load against addr on a fresh connection set.
func loadOnce(ctx context.Context, cfg loadConfig, addr string) (*Summary, error) {
	conns, err := dialPlain(addr, cfg.Connections)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	return runLoad(ctx, cfg, conns, io.Discard)
}

func (cr *caseResult) summarize() {
	col := func(runs []*Summary, f func(*Summary) float64) []float64 {
		out := make([]float64, len(runs))
		for i, s := range runs {
			out[i] = f(s)
		}
		return out
	}
	for _, tr := range cr.Targets {
		tr.MsgsPerSec = newStat(col(tr.Runs, func(s *Summary) float64 { return s.MsgsPerSec }))
		tr.P50Us = newStat(col(tr.Runs, func(s *Summary) float64 { return float64(s.Latency.P50Us) }))
		tr.P99Us = newStat(col(tr.Runs, func(s *Summary) float64 { return float64(s.Latency.P99Us) }))
		tr.HeapBytes = newStat(col(tr.Runs, func(s *Summary) float64 { return float64(s.ServerHeapInuseMaxBytes) }))
		tr.ServerCPUPerMsgUs = newStat(col(tr.Runs, func(s *Summary) float64 { return s.ServerCPUPerMsgUs }))
		flush := func(f func(*FlushStats) float64) func(*Summary) float64 {
			return func(s *Summary) float64 {
				if s.Flush == nil {
					return 0
				}
				return f(s.Flush)
			}
		}
		tr.SyncMeanUs = newStat(col(tr.Runs, flush(func(f *FlushStats) float64 { return f.SyncMeanUs })))
		tr.MsgsPerSync = newStat(col(tr.Runs, flush(func(f *FlushStats) float64 { return f.MsgsPerSync })))
		tr.FlushWaitUs = newStat(col(tr.Runs, flush(func(f *FlushStats) float64 { return f.FlushWaitMean })))
		tr.FlushBusy = newStat(col(tr.Runs, flush(func(f *FlushStats) float64 { return f.Busy })))
		tr.Errors, tr.Degraded = 0, 0
		for _, s := range tr.Runs {
			tr.Errors += s.Errors
			tr.Degraded += s.Degraded
		}
	}
	floor := cr.Targets["floor"]
	if floor == nil {
		return
	}
	cr.VsFloor = map[string]*ratio{}
	for name, tr := range cr.Targets {
		if name == "floor" {
			continue
		}
		var thr, p99, cpu []float64
		for i := range min(len(tr.Runs), len(floor.Runs)) {
			f, t := floor.Runs[i], tr.Runs[i]
			if f.MsgsPerSec > 0 {
				thr = append(thr, t.MsgsPerSec/f.MsgsPerSec)
			}
			if f.Latency.P99Us > 0 {
				p99 = append(p99, float64(t.Latency.P99Us)/float64(f.Latency.P99Us))
			}
			if f.ServerCPUPerMsgUs > 0 {
				cpu = append(cpu, t.ServerCPUPerMsgUs/f.ServerCPUPerMsgUs)
			}
		}
		cr.VsFloor[name] = &ratio{Throughput: newStat(thr), P99: newStat(p99), ServerCPU: newStat(cpu)}
	}
}

// printMatrix writes the results as a table.
func printMatrix(w io.Writer, res *MatrixResult) {
	fmt.Fprintf(w, "\n%s, %d CPU (%s), %d runs of %.0fs (+%.0fs warmup), body %d B\n",
		res.Date, res.Machine.NProc, res.Machine.CPU, res.Runs, res.DurationSeconds, res.WarmupSeconds, res.BodySize)
	fmt.Fprintf(w, "%-16s %-6s %10s %7s %9s %9s %16s %12s %9s %11s\n",
		"case", "target", "msgs/s", "spread", "p50", "p99", "x floor (range)", "p99 x floor", "heap MiB", "srv µs/msg")
	for _, c := range res.Cases {
		for _, t := range res.Targets {
			tr := c.Targets[t]
			if tr == nil {
				continue
			}
			vs, p99 := "", ""
			if r := c.VsFloor[t]; r != nil {
				vs = fmt.Sprintf("%.2f (%.2f-%.2f)", r.Throughput.Median, r.Throughput.Min, r.Throughput.Max)
				p99 = fmt.Sprintf("%.2f", r.P99.Median)
			}
			heap := ""
			if tr.HeapBytes.Max > 0 {
				heap = fmt.Sprintf("%.1f", tr.HeapBytes.Median/(1<<20))
			}
			fmt.Fprintf(w, "%-16s %-6s %10.0f %6.0f%% %9s %9s %16s %12s %9s %11.1f\n", c.Name, t, tr.MsgsPerSec.Median, tr.MsgsPerSec.SpreadPct,
				fmtLatency(int64(tr.P50Us.Median)), fmtLatency(int64(tr.P99Us.Median)), vs, p99, heap, tr.ServerCPUPerMsgUs.Median)
		}
	}
}

// prefixWriter writes each Write (one log line) with a prefix, in one
// Write of w.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte(p.prefix), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// lockedWriter serializes the writes of several processes' log copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
