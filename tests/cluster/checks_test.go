package cluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/history"
)

// What TestScenarios and the group scenarios share: the flags that replay
// or stretch a scenario, the fault log a nemesis keeps, and the checks of
// the healed history (package doc).

// healedWithin is the liveness rule after a heal (issue 14 (e)): writes
// succeed within 5 s of healing. A scenario's load runs on this long after
// its final heal, and every heal that stays healed this long is held to it
// (history.WritesAfterHeals).
const healedWithin = 5 * time.Second

// faultLog is what a nemesis did, in history time: when each fault began
// (for write unavailability) and when each was healed (for the liveness
// rule after a heal).
type faultLog struct {
	n      int
	starts []int64
	heals  []int64
}

func (f *faultLog) start(rec *history.Recorder) { f.n++; f.starts = append(f.starts, rec.Now()) }
func (f *faultLog) heal(rec *history.Recorder)  { f.heals = append(f.heals, rec.Now()) }

// scenarioRun is a scenario's seed and load duration after -cluster.seed
// and, when soakable, -cluster.soak; it logs them.
func scenarioRun(t *testing.T, name string, seed uint64, dur time.Duration, soakable bool) (uint64, time.Duration) {
	t.Helper()
	if *seedFlag != 0 {
		seed = *seedFlag
	}
	if *soak > 0 && soakable {
		dur = *soak
	}
	t.Logf("%s: seed %d, %v (-cluster.seed %d replays the nemesis schedule and read offsets, not the timings)", name, seed, dur, seed)
	return seed, dur
}

// drive runs a scenario's faults under a load already running: nemesis
// until dur less healedWithin has passed, then the fixture's Heal (the
// final heal), then healedWithin more of the load, healed, and stopLoad.
// It returns what the nemesis did (with the final heal), the history time
// at which the load stopped, and how long it ran.
func drive(t *testing.T, f Fixture, rec *history.Recorder, dur time.Duration, nemesis func(context.Context, *faultLog),
	stopLoad func()) (log *faultLog, end int64, ran time.Duration) {
	t.Helper()
	began := time.Now()
	log = &faultLog{}
	ctx, cancel := context.WithTimeout(context.Background(), max(dur-healedWithin, 0))
	nemesis(ctx, log)
	cancel()
	f.Heal(t)
	log.heal(rec)
	hold(context.Background(), healedWithin) // the load runs on, healed
	end = rec.Now()
	stopLoad()
	return log, end, time.Since(began)
}

// figures is what checkHistory found, for a scenario's report line.
type figures struct {
	failed                   bool
	acked, duplicates, weak  int
	lost, divergent          string // "0", or "some (above)"
	linearizable             bool
	checked                  history.Checked // how porcupine's check was cut
	unknown, unknownStored   int             // puts of unknown outcome; how many of them the final contents hold
	refused                  int             // puts that ended refused (nothing stored)
	reads, readsFound        int             // ok reads checked by porcupine (not weak), and how many found a message
	rate                     float64
	ackedPerSec, readsPerSec float64
	// healedAckedPerSec: acked puts per second from the final heal to the
	// end of the load (the healthy rate, where the others count faults).
	healedAckedPerSec float64
	// To the first ok put after each heal (history.WritesAfterHeals): its
	// median and maximum, the final heal's, and how many heals stayed
	// healed long enough to be held to healedWithin.
	afterHealP50, afterHealMax, afterFinal time.Duration
	healsHeld, heals                       int
	// Write unavailability per fault (history.Unavailability).
	unavailP50, unavailP99 time.Duration
	unavailN               int
}

// checkHistory runs the checkers on a healed scenario's history: (a) lost
// against stored (the leader's queues), (b) divergence (the caller's
// comparison of replicas, nil for one node), (c) duplicates, (d)
// porcupine (the visualization of a failure under artifacts(t)), (e) the
// liveness floor over the run and writes within healedWithin of every
// heal that stayed healed that long (log.heals; end is when the load
// stopped), and the follower reads' weaker rule. Each problem fails t.
func checkHistory(t *testing.T, ops []history.Op, stored history.Stored, divergence error, log *faultLog, end int64,
	ran time.Duration, floor float64, budget time.Duration) figures {
	t.Helper()
	var f figures
	report := func(err error) {
		if err != nil {
			f.failed = true
			t.Error(err)
		}
	}
	var err error
	var lostErr error
	f.acked, lostErr = history.Lost(ops, stored)
	report(lostErr)
	f.lost, f.divergent = "0", "0"
	if lostErr != nil {
		f.lost = "some (above)"
	}
	if divergence != nil {
		f.divergent = "some (above)"
	}
	report(divergence)
	f.duplicates, err = history.Duplicates(ops, stored)
	report(err)
	f.weak, err = history.WeakReads(ops, stored)
	report(err)
	f.rate, err = history.Liveness(ops, ran, floor)
	report(err)
	afterHeal, held, err := history.WritesAfterHeals(ops, log.heals, log.starts, end, healedWithin)
	report(err)
	f.healsHeld, f.heals = held, len(log.heals)
	if len(log.heals) > 0 {
		f.afterFinal, _ = history.FirstOKAfter(ops, log.heals[len(log.heals)-1])
	}
	f.afterHealP50, f.afterHealMax = history.Percentile(afterHeal, 50), history.Percentile(afterHeal, 100)
	var linErr error
	f.checked, linErr = history.Linearizable(ops, stored, filepath.Join(artifacts(t), "porcupine"), budget)
	report(linErr)
	f.linearizable = linErr == nil
	unavail := history.Unavailability(ops, log.starts)
	f.unavailP50, f.unavailP99, f.unavailN = history.Percentile(unavail, 50), history.Percentile(unavail, 99), len(unavail)

	have := map[string]bool{}
	for _, rs := range stored {
		for _, r := range rs {
			have[r.Value] = true
		}
	}
	for _, o := range ops {
		switch {
		case o.Kind == history.Put && (o.Outcome == history.Unknown || o.Outcome == history.Pending):
			f.unknown++
			if have[o.Value] {
				f.unknownStored++
			}
		case o.Kind == history.Put && o.Outcome == history.Fail:
			f.refused++
		case o.Kind == history.Read && !o.Weak && o.Outcome == history.OK:
			f.reads++
			if o.Found {
				f.readsFound++
			}
		}
	}
	f.ackedPerSec, f.readsPerSec = float64(f.acked)/ran.Seconds(), float64(f.reads)/ran.Seconds()
	if len(log.heals) > 0 {
		final, n := log.heals[len(log.heals)-1], 0
		for _, o := range ops {
			if o.Kind == history.Put && o.Outcome == history.OK && o.Return >= final && o.Return <= end {
				n++
			}
		}
		f.healedAckedPerSec = float64(n) / time.Duration(end-final).Seconds()
	}
	return f
}

// logDirs names each node's data dir and stderr, for a failed scenario.
func logDirs(t *testing.T, f Fixture) {
	t.Helper()
	for _, n := range f.Nodes() {
		t.Logf("%s: data dir %s, stderr %s", f.Name(n), n.DataDir(), n.StderrPath())
	}
}

// artifacts is where a test leaves files for a human: $TEST_ARTIFACTS/<test>
// when set (CI keeps it), else the test's temp dir.
func artifacts(t *testing.T) string {
	if d := os.Getenv("TEST_ARTIFACTS"); d != "" {
		return filepath.Join(d, filepath.FromSlash(t.Name()))
	}
	return t.TempDir()
}
