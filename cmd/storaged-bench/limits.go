package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The limits subcommand measures what hostile clients cost the real
// storaged binary (issue 11, "Tests and figures"): many topics with one
// message each (consume-queue disk and the restart after them), producer
// latency under idle and tag-filtered long polls, and server memory under
// concurrent maximal pulls. Each scenario runs its own storaged process on
// a temporary data dir; the figures come from /proc, the data dir and the
// public gRPC API, never from the server's own account of itself.

// Scenarios of the limits subcommand.
const (
	scenarioTopics = "topics"
	scenarioPolls  = "polls"
	scenarioPulls  = "pulls"
)

var knownScenarios = []string{scenarioTopics, scenarioPolls, scenarioPulls}

// Goals of issue 11 for the figures of the limits subcommand.
const (
	goalCQBytes        = 100 << 20 // consume-queue disk for 10,000 one-message topics
	goalCQTopics       = 10000
	goalRestart        = 2 * time.Second
	goalRSSBytes       = 256 << 20
	goalRestartWrites  = 64 << 20
	goalProducerRatio  = 1.5
	goalPullHeadroom   = 64 << 20 // pull memory goal: 2 × pulls × max_bytes + this
	goalPullAnswerMult = 2
)

// Bounds on waits of the limits scenarios; nothing here waits unbounded.
const (
	inflightTimeout = 2 * time.Minute       // polls reaching the server, or leaving it
	inflightPoll    = 50 * time.Millisecond // period of the /metrics reads while waiting
	procSamplePoll  = 20 * time.Millisecond // period of the /proc reads during a phase
)

// limitsOptions is the command line of the limits subcommand.
type limitsOptions struct {
	storaged     string
	storagedArgs string
	scenarios    []string
	dataRoot     string
	out          string
	logPath      string
	note         string
	topics       topicsConfig
	polls        pollsConfig
	pulls        pullsConfig
}

func parseLimitsOptions(args []string, stderr io.Writer) (limitsOptions, error) {
	o := limitsOptions{out: "limits-results.json", topics: defaultTopicsConfig(), polls: defaultPollsConfig(), pulls: defaultPullsConfig()}
	scenarios := strings.Join(knownScenarios, ",")
	fs := flag.NewFlagSet("storaged-bench limits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.storaged, "storaged", "", "storaged `binary` (required)")
	fs.StringVar(&o.storagedArgs, "storaged-args", "", "extra storaged `flags` for every scenario, space-separated (e.g. \"--max-open-queue-files 256\")")
	fs.StringVar(&scenarios, "scenarios", scenarios, "comma-separated `scenarios`: topics, polls, pulls")
	fs.StringVar(&o.dataRoot, "data-root", os.TempDir(), "`directory` for the temporary storaged data dirs")
	fs.StringVar(&o.out, "out", o.out, "results JSON `file` (- for stdout); the Markdown table goes next to it (.md)")
	fs.StringVar(&o.logPath, "log", "", "server logs `file` (default: --out with .log)")
	fs.StringVar(&o.note, "note", "", "free-form note recorded in the results (e.g. the storaged revision)")
	o.topics.addFlags(fs)
	o.polls.addFlags(fs)
	o.pulls.addFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: storaged-bench limits --storaged BIN [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	fail := func(err error) (limitsOptions, error) {
		fmt.Fprintln(stderr, "storaged-bench limits:", err)
		return o, usageError{err}
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if o.storaged == "" {
		return fail(errors.New("--storaged is required"))
	}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(knownScenarios, s) {
			return fail(fmt.Errorf("unknown scenario %q (want %s)", s, strings.Join(knownScenarios, ", ")))
		}
		o.scenarios = append(o.scenarios, s)
	}
	if err := errors.Join(o.topics.validate(), o.polls.validate(), o.pulls.validate()); err != nil {
		return fail(err)
	}
	if o.logPath == "" {
		o.logPath = strings.TrimSuffix(o.out, ".json") + ".log"
	}
	return o, nil
}

// LimitsResult is the JSON file the limits subcommand writes.
type LimitsResult struct {
	Date         string        `json:"date"`
	Machine      MachineInfo   `json:"machine"`
	Command      string        `json:"command"`
	Note         string        `json:"note,omitempty"`
	StoragedArgs []string      `json:"storaged_args,omitempty"`
	Topics       *TopicsResult `json:"topics,omitempty"`
	Polls        *PollsResult  `json:"polls,omitempty"`
	Pulls        *PullsResult  `json:"pulls,omitempty"`
}

// runLimitsCommand is the limits subcommand: the chosen scenarios one
// after the other, the results JSON rewritten after each, then the human
// summary.
func runLimitsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseLimitsOptions(args, stderr)
	if err != nil {
		return err
	}
	logf, err := os.Create(o.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	l := &limitsRun{o: &o, logw: &lockedWriter{w: logf}, progress: stderr}
	res := &LimitsResult{
		Date:         time.Now().UTC().Format(time.RFC3339),
		Machine:      machineInfo(),
		Command:      "storaged-bench limits " + strings.Join(args, " "),
		Note:         o.note,
		StoragedArgs: strings.Fields(o.storagedArgs),
	}
	for _, s := range o.scenarios {
		switch s {
		case scenarioTopics:
			res.Topics, err = l.topics(ctx)
		case scenarioPolls:
			res.Polls, err = l.polls(ctx)
		case scenarioPulls:
			res.Pulls, err = l.pulls(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		// Written after every scenario: a long run that fails late keeps
		// what it measured.
		if err := writeJSON(o.out, stdout, res); err != nil {
			return err
		}
	}
	printLimits(stdout, res, false)
	if o.out == "-" {
		return nil
	}
	md, err := os.Create(strings.TrimSuffix(o.out, ".json") + ".md")
	if err != nil {
		return err
	}
	printLimits(md, res, true)
	return md.Close()
}

// limitsRun is the state shared by the scenarios of one limits run.
type limitsRun struct {
	o        *limitsOptions
	logw     io.Writer
	progress io.Writer
}

func (l *limitsRun) logf(format string, args ...any) {
	fmt.Fprintf(l.progress, format+"\n", args...)
}

// storagedArgs is the command line of the storaged binary bin under test
// on dir: loopback listeners on free ports, the admin listener off where
// bin has one (its default is a fixed port, on which two servers would
// collide; revisions before the admin service lack the flag), then more
// and the extra flags.
func storagedArgs(bin, dir, extra string, more ...string) []string {
	args := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", dir}
	if storagedHasFlag(bin, "admin-listen") {
		args = append(args, "--admin-listen", "")
	}
	args = append(args, more...)
	return append(args, strings.Fields(extra)...)
}

// storagedFlagsCache maps a binary to the usage text of its -h.
var storagedFlagsCache sync.Map

// storagedHasFlag reports whether the usage text of bin -h lists --name,
// so that the harness runs against revisions before and after a flag.
func storagedHasFlag(bin, name string) bool {
	ok, _ := storagedFlag(bin, name)
	return ok
}

// storagedFlag reports whether bin -h lists --name, and the default its
// usage line gives ("" when it gives none).
func storagedFlag(bin, name string) (bool, string) {
	usage, ok := storagedFlagsCache.Load(bin)
	if !ok {
		out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 0 or 2 by revision; the text is what counts
		usage, _ = storagedFlagsCache.LoadOrStore(bin, string(out))
	}
	lines := strings.Split(usage.(string), "\n")
	for i, line := range lines {
		if f := strings.Fields(line); len(f) == 0 || f[0] != "-"+name || !strings.HasPrefix(line, "  -") {
			continue
		}
		// The usage is on the next line, indented by a tab (the flag
		// package's PrintDefaults), and ends with "(default X)" when the
		// default is not the zero value.
		if i+1 < len(lines) {
			u := lines[i+1]
			if j := strings.LastIndex(u, "(default "); j >= 0 && strings.HasSuffix(u, ")") {
				return true, strings.Trim(u[j+len("(default "):len(u)-1], `"`)
			}
		}
		return true, ""
	}
	return false, ""
}

// start starts storaged on dir (which the scenario removes) and returns it
// with the time from the start of the process to SERVING.
func (l *limitsRun) start(ctx context.Context, name, dir string) (*proc, time.Duration, error) {
	args := storagedArgs(l.o.storaged, dir, l.o.storagedArgs)
	t0 := time.Now()
	p, err := startProc(ctx, name, l.o.storaged, args, &prefixWriter{w: l.logw, prefix: name + ": "}, nil)
	if err != nil {
		return nil, 0, err
	}
	d := time.Since(t0)
	l.logf("%s: %s %s (grpc %s, SERVING after %v)", name, l.o.storaged, strings.Join(args, " "), p.grpc, d.Round(time.Millisecond))
	return p, d, nil
}

// dataDir makes a temporary data dir for a scenario; the returned func
// removes it.
func (l *limitsRun) dataDir(name string) (string, func(), error) {
	dir, err := os.MkdirTemp(l.o.dataRoot, "storaged-limits-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// procWatch samples a process's /proc figures every procSamplePoll and
// keeps the peaks, so that a short spike between two reads of the caller
// is not missed (VmHWM is kept by the kernel; RSS and fds are not).
type procWatch struct {
	stopc chan struct{}
	done  chan struct{}
	peak  procSample // each field its maximum
	err   error
}

func watchProc(pid int) *procWatch {
	w := &procWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(procSamplePoll)
		defer t.Stop()
		for {
			s, err := sampleProc(pid)
			if err != nil {
				w.err = err
				return
			}
			w.peak.RSSBytes = max(w.peak.RSSBytes, s.RSSBytes)
			w.peak.AnonBytes = max(w.peak.AnonBytes, s.AnonBytes)
			w.peak.HWMBytes = max(w.peak.HWMBytes, s.HWMBytes)
			w.peak.WriteBytes = max(w.peak.WriteBytes, s.WriteBytes)
			w.peak.FDs = max(w.peak.FDs, s.FDs)
			w.peak.CommitLogRSSBytes = max(w.peak.CommitLogRSSBytes, s.CommitLogRSSBytes)
			w.peak.QueueRSSBytes = max(w.peak.QueueRSSBytes, s.QueueRSSBytes)
			select {
			case <-w.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the peaks.
func (w *procWatch) stop() (procSample, error) {
	close(w.stopc)
	<-w.done
	return w.peak, w.err
}

// waitInflight reads the server's /metrics until ok accepts the number
// of PullMessages calls in flight, for at most inflightTimeout.
func waitInflight(ctx context.Context, p *proc, ok func(n int64) bool) (int64, error) {
	if p.metrics == "" {
		return 0, errors.New("storaged has no metrics listener")
	}
	client := &http.Client{}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, inflightTimeout)
	defer cancel()
	t := time.NewTicker(inflightPoll)
	defer t.Stop()
	for {
		n, err := inflightCalls(ctx, client, p.metricsURL(), "PullMessages")
		if err == nil && ok(n) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("PullMessages in flight: %d after %v (%v)", n, inflightTimeout, err)
		case <-t.C:
		}
	}
}

// codeCounts counts outcomes by name from many goroutines.
type codeCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *codeCounts) add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[name]++
}

func (c *codeCounts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// flagValue returns the value of --name in a storaged command line ("" if
// absent), to record the bound a figure is checked against.
func flagValue(args []string, name string) string {
	for i, a := range args {
		for _, p := range []string{"--" + name, "-" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
	}
	return ""
}

// limitRow is one line of the human summary: a figure and its goal.
type limitRow struct {
	figure, value, goal string
	met                 *bool // nil: no goal to check
}

func check(ok bool) *bool { return &ok }

func mib(b float64) string { return strconv.FormatFloat(b/(1<<20), 'f', 1, 64) + " MiB" }

// printLimits writes the human summary: one table of figures and goals,
// aligned text or (markdown) a Markdown table for BENCHMARKS.md.
func printLimits(w io.Writer, res *LimitsResult, markdown bool) {
	var rows []limitRow
	if t := res.Topics; t != nil {
		rows = append(rows, t.rows()...)
	}
	if p := res.Polls; p != nil {
		rows = append(rows, p.rows()...)
	}
	if p := res.Pulls; p != nil {
		rows = append(rows, p.rows()...)
	}
	line := func(f, v, g, m string) { fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f, v, g, m) }
	if markdown {
		line("figure", "value", "goal", "met")
		line("---", "---", "---", "---")
	} else {
		fmt.Fprintf(w, "\n%s, %d CPU (%s), %s\n", res.Date, res.Machine.NProc, res.Machine.CPU, res.Machine.Go)
		if res.Note != "" {
			fmt.Fprintln(w, res.Note)
		}
		wf, wv, wg := len("figure"), len("value"), len("goal")
		for _, r := range rows {
			wf, wv, wg = max(wf, len(r.figure)), max(wv, len(r.value)), max(wg, len(r.goal))
		}
		line = func(f, v, g, m string) { fmt.Fprintf(w, "%-*s  %-*s  %-*s  %s\n", wf, f, wv, v, wg, g, m) }
		line("figure", "value", "goal", "met")
	}
	for _, r := range rows {
		met := ""
		if r.met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*r.met]
		}
		line(r.figure, r.value, r.goal, met)
	}
}
