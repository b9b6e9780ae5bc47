package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// The failover subcommand measures how long a local r3 group takes no
// writes when its leader goes away (issue 13's targets: kill -9, writes
// accepted again within 2.5 s p99; SIGTERM with leadership transfer,
// at most 0.5 s without writes). Writers put through
// client.LeaderTracker without pause (--keyed: each put keyed, so the
// tracker retries unknown outcomes); each round signals the current
// leader, waits until writes flow again and --settle has passed, restarts
// the stopped member on its data dir (--signal stop: resumes it with
// SIGCONT), lets it catch up for --settle, and
// records the longest time between two consecutive acks from the signal
// on (an ack before the signal opens the first interval). Before the
// first round it waits, up to --dirty-wait, until the host's dirty and
// writeback pages fall below --dirty-limit-mib: the members' first commitlog
// files are populated with dirty zeros (1 GiB each), and all of them on
// one disk made every sync of the first rounds wait behind their
// writeback (BENCHMARKS.md, "Population at a restart"). Each round
// records the dirty bytes at its signal.

type failoverOptions struct {
	storaged      string
	storagedArgs  string
	signal        string
	keyed         bool
	attempt       time.Duration
	leaderCheck   time.Duration
	rounds        int
	writers       int
	bodySize      int
	settle        time.Duration
	dirtyLimitMiB uint64
	dirtyWait     time.Duration
	dataRoot      string
	out           string
	logPath       string
}

// FailoverResult is the JSON the failover subcommand writes.
type FailoverResult struct {
	Date    string      `json:"date"`
	Machine MachineInfo `json:"machine"`
	Command string      `json:"command"`
	Signal  string      `json:"signal"`
	// Keyed: every put carried a UNIQ_KEY (client.UniqKeysStamped),
	// with AttemptTimeoutMs per call (0: the tracker's default).
	Keyed            bool    `json:"keyed"`
	AttemptTimeoutMs float64 `json:"attempt_timeout_ms,omitempty"`
	// LeaderCheckAfterMs is client.Options.LeaderCheckAfter (0: the
	// tracker's default; negative: no checks).
	LeaderCheckAfterMs float64 `json:"leader_check_after_ms,omitempty"`
	Writers            int     `json:"writers"`
	BodySize           int     `json:"body_size"`
	// GapsMs are the rounds' longest times without an ack, from the signal on.
	GapsMs        []float64 `json:"gaps_ms"`
	P50Ms         float64   `json:"p50_ms"`
	P99Ms         float64   `json:"p99_ms"`
	MaxMs         float64   `json:"max_ms"`
	Acked         int64     `json:"acked"`
	Unknown       int64     `json:"unknown"`        // outcome unknown (puts in flight at a kill)
	Refused       int64     `json:"refused"`        // nothing stored after the client's attempts
	HostLoad1     []float64 `json:"host_load1"`     // per round, at its end
	HostDirtyMB   []float64 `json:"host_dirty_mb"`  // per round, dirty + writeback pages at the signal
	LeaderChanges []string  `json:"leader_changes"` // n1->n2 per round
}

func parseFailoverOptions(args []string, stderr io.Writer) (failoverOptions, error) {
	o := failoverOptions{signal: "kill", rounds: 10, writers: 16, bodySize: 1024, settle: 2 * time.Second,
		dirtyLimitMiB: 64, dirtyWait: 2 * time.Minute, dataRoot: os.TempDir(), out: "failover.json"}
	fs := flag.NewFlagSet("storaged-bench failover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.storaged, "storaged", "", "storaged `binary` (required)")
	fs.StringVar(&o.storagedArgs, "storaged-args", "", "extra storaged `flags`, space-separated")
	fs.StringVar(&o.signal, "signal", o.signal, "how the leader goes: kill (SIGKILL), term (SIGTERM: leadership transfer) or stop (SIGSTOP: paused, resumed with SIGCONT)")
	fs.BoolVar(&o.keyed, "keyed", false, "key every put (client.UniqKeysStamped, the client's default; without it client.UniqKeysAsGiven): the tracker retries unknown outcomes, within the dedup window")
	fs.DurationVar(&o.attempt, "attempt-timeout", 0, "client.Options.AttemptTimeout for keyed puts (0: the tracker's default)")
	fs.DurationVar(&o.leaderCheck, "leader-check-after", 0, "client.Options.LeaderCheckAfter for keyed puts (0: the tracker's default; negative: no leader checks)")
	fs.IntVar(&o.rounds, "rounds", o.rounds, "leader failures to measure")
	fs.IntVar(&o.writers, "writers", o.writers, "concurrent unary writers")
	fs.IntVar(&o.bodySize, "body-size", o.bodySize, "message body size in `bytes`")
	fs.DurationVar(&o.settle, "settle", o.settle, "load after writes resume, and after the restart, before the next round")
	fs.Uint64Var(&o.dirtyLimitMiB, "dirty-limit-mib", o.dirtyLimitMiB, "before the first round, wait until the host's dirty + writeback pages are below this many `MiB`")
	fs.DurationVar(&o.dirtyWait, "dirty-wait", o.dirtyWait, "longest wait for --dirty-limit-mib (0: do not wait)")
	fs.StringVar(&o.dataRoot, "data-root", o.dataRoot, "`directory` for the members' temporary data dirs")
	fs.StringVar(&o.out, "out", o.out, "results JSON `file` (- for stdout)")
	fs.StringVar(&o.logPath, "log", "", "server logs `file` (default: --out with .log)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	var errs []error
	if o.storaged == "" {
		errs = append(errs, errors.New("--storaged is required"))
	}
	if o.signal != "kill" && o.signal != "term" && o.signal != "stop" {
		errs = append(errs, fmt.Errorf("--signal %q: want kill, term or stop", o.signal))
	}
	if o.rounds < 1 || o.rounds > 1000 || o.writers < 1 || o.writers > 1024 || o.bodySize < 0 || o.bodySize > 4<<20 || o.settle < 0 || o.dirtyWait < 0 ||
		o.attempt < 0 {
		errs = append(errs, errors.New("--rounds 1-1000, --writers 1-1024, --body-size 0-4MiB, --settle >= 0, --dirty-wait >= 0, --attempt-timeout >= 0"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(stderr, "storaged-bench failover:", err)
		return o, usageError{err}
	}
	if o.logPath == "" {
		o.logPath = strings.TrimSuffix(o.out, ".json") + ".log"
		if o.out == "-" {
			o.logPath = "failover.log"
		}
	}
	return o, nil
}

// ackLog records when puts were acked.
type ackLog struct {
	mu      sync.Mutex
	at      []time.Time // since the last reset
	acked   int64
	unknown int64
	refused int64
}

func (a *ackLog) add(err error) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		a.acked++
		a.at = append(a.at, now)
	case client.Classify(err).NothingStored || errors.Is(err, client.ErrNoLeader):
		a.refused++
	default:
		a.unknown++
	}
}

// mark drops the acks before the last one: the log then holds the last
// ack before the signal and everything after.
func (a *ackLog) mark() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := len(a.at); n > 1 {
		a.at = append(a.at[:0], a.at[n-1])
	}
}

// gap is the longest interval between consecutive acks since mark, and
// the number of acks after since.
func (a *ackLog) gap(since time.Time) (time.Duration, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var longest time.Duration
	after := 0
	for i, t := range a.at {
		if i > 0 {
			longest = max(longest, t.Sub(a.at[i-1]))
		}
		if t.After(since) {
			after++
		}
	}
	if len(a.at) > 0 && a.at[0].After(since) { // no ack before the signal
		longest = max(longest, a.at[0].Sub(since))
	}
	return longest, after
}

func runFailoverCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFailoverOptions(args, stderr)
	if err != nil {
		return err
	}
	logf, err := os.Create(o.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	g, err := startGroup(ctx, o.storaged, o.dataRoot, o.storagedArgs, &lockedWriter{w: logf})
	if err != nil {
		return err
	}
	defer g.Stop()
	tr, err := client.New(client.Options{Addrs: g.addrs(), UniqKeys: uniqKeys(o.keyed), AttemptTimeout: o.attempt,
		LeaderCheckAfter: o.leaderCheck})
	if err != nil {
		return err
	}
	defer tr.Close()

	acks := &ackLog{}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	body := randomBody(o.bodySize)
	for i := range o.writers {
		wg.Go(func() {
			req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Failover", QueueId: int32(i % 4), Body: body}}
			for wctx.Err() == nil {
				cctx, cancel := context.WithTimeout(wctx, 30*time.Second)
				_, err := tr.PutMessage(cctx, req)
				cancel()
				if wctx.Err() != nil {
					return
				}
				acks.add(err)
			}
		})
	}
	defer func() {
		stop()
		wg.Wait()
	}()

	res := &FailoverResult{Date: time.Now().UTC().Format(time.RFC3339), Machine: machineInfo(),
		Command: "storaged-bench failover " + strings.Join(args, " "), Signal: o.signal, Writers: o.writers, BodySize: o.bodySize,
		Keyed: o.keyed, AttemptTimeoutMs: float64(o.attempt.Microseconds()) / 1000,
		LeaderCheckAfterMs: float64(o.leaderCheck.Microseconds()) / 1000}
	if err := hold(ctx, o.settle); err != nil {
		return err
	}
	if err := waitDirty(ctx, o.dirtyLimitMiB<<20, o.dirtyWait, stderr); err != nil {
		return err
	}
	for round := range o.rounds {
		lead, err := g.leader(ctx)
		if err != nil {
			return err
		}
		p := g.members[lead]
		res.HostDirtyMB = append(res.HostDirtyMB, math.Round(float64(dirtyBytes())/(1<<20)))
		acks.mark()
		signalled := time.Now()
		switch o.signal {
		case "kill":
			p.kill()
		case "stop":
			p.cmd.Process.Signal(syscall.SIGSTOP)
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
		// Writes flow again: the writers got acks after the signal, and
		// settle has passed since the new leader was found.
		next, err := g.leaderOtherThan(ctx, lead)
		if err != nil {
			return err
		}
		found := time.Now()
		if err := hold(ctx, o.settle); err != nil {
			return err
		}
		// Writes flow again once a put is acked after the new leader was
		// found: acks just after the signal may be answers the old leader
		// had sent already, and unkeyed puts in flight to a paused leader
		// end only at their deadline (30 s), holding the writers that long.
		_, after := acks.gap(found)
		for after == 0 && time.Since(signalled) < time.Minute {
			if err := hold(ctx, 100*time.Millisecond); err != nil {
				return err
			}
			_, after = acks.gap(found)
		}
		if after == 0 {
			return fmt.Errorf("round %d: no ack in %v after the leader %s went away", round+1, time.Since(signalled), p.name)
		}
		gap, _ := acks.gap(signalled)
		if o.signal == "term" {
			// Wait for the drain's exit: a second SIGTERM (Stop) would
			// kill the process.
			t := time.NewTimer(procStopTimeout)
			select {
			case <-p.exited:
			case <-t.C:
			}
			t.Stop()
			if err := p.Stop(); err != nil {
				fmt.Fprintf(stderr, "round %d: %s after SIGTERM: %v\n", round+1, p.name, err)
			}
		}
		res.GapsMs = append(res.GapsMs, float64(gap.Microseconds())/1000)
		res.LeaderChanges = append(res.LeaderChanges, fmt.Sprintf("%s->%s", p.name, g.members[next].name))
		res.HostLoad1 = append(res.HostLoad1, loadAverage())
		fmt.Fprintf(stderr, "round %d/%d: %s of %s, leader now %s: %v without an ack\n", round+1, o.rounds, o.signal, p.name,
			g.members[next].name, gap.Round(time.Millisecond))
		if o.signal == "stop" {
			// Resumed, it finds a newer term and follows.
			if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				return fmt.Errorf("round %d: resume %s: %w", round+1, p.name, err)
			}
		} else if err := g.start(ctx, lead); err != nil {
			return err
		}
		if err := hold(ctx, o.settle); err != nil {
			return err
		}
	}
	acks.mu.Lock()
	res.Acked, res.Unknown, res.Refused = acks.acked, acks.unknown, acks.refused
	acks.mu.Unlock()
	s := slices.Sorted(slices.Values(res.GapsMs))
	res.P50Ms, res.P99Ms, res.MaxMs = quantile(s, 0.50), quantile(s, 0.99), s[len(s)-1]
	fmt.Fprintf(stderr, "%d rounds of %s: without an ack p50 %.0f ms, p99 %.0f ms, max %.0f ms; acked %d, unknown %d, refused %d\n",
		o.rounds, o.signal, res.P50Ms, res.P99Ms, res.MaxMs, res.Acked, res.Unknown, res.Refused)
	return writeJSON(o.out, stdout, res)
}

// quantile of sorted values, nearest rank (with 10 values, p99 is the max).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// waitDirty waits until the host's dirty + writeback bytes are below
// limit, at most wait; it says so on stderr when it gives up.
func waitDirty(ctx context.Context, limit uint64, wait time.Duration, stderr io.Writer) error {
	deadline := time.Now().Add(wait)
	for {
		d := dirtyBytes()
		if d < limit {
			return nil
		}
		if !time.Now().Before(deadline) {
			fmt.Fprintf(stderr, "still %d MiB dirty after %v; measuring anyway\n", d>>20, wait)
			return nil
		}
		if err := hold(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// hold waits d or until ctx ends.
func hold(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
