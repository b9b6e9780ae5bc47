package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
)

// readMatrixResult reads the results file of a matrix run.
func readMatrixResult(path string) (*MatrixResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var res MatrixResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &res, nil
}

// runReportCommand is the report subcommand: the results of a matrix (or,
// with --limits, of the limits subcommand) as a Markdown table, for
// BENCHMARKS.md.
func runReportCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("storaged-bench report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "bench-results.json", "matrix results `file`")
	limits := fs.Bool("limits", false, "the file is the results of the limits subcommand: print its table of figures and goals")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *limits {
		b, err := os.ReadFile(*in)
		if err != nil {
			return err
		}
		var res LimitsResult
		if err := json.Unmarshal(b, &res); err != nil {
			return fmt.Errorf("%s: %w", *in, err)
		}
		printLimits(stdout, &res, true)
		return nil
	}
	res, err := readMatrixResult(*in)
	if err != nil {
		return err
	}
	writeMarkdown(stdout, res)
	writeFlushMarkdown(stdout, res)
	return nil
}

// writeFlushMarkdown writes the flusher figures of the storaged targets:
// msync rounds, messages per round and the time puts waited for a flush.
func writeFlushMarkdown(w io.Writer, res *MatrixResult) {
	header := false
	for _, c := range res.Cases {
		for _, t := range res.Targets {
			tr := c.Targets[t]
			if tr == nil || tr.SyncMeanUs.Max == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(w, "\n| case | target | msync round, mean (median of runs) | messages per round | sync-mode flush wait per put, mean | flusher busy |")
				fmt.Fprintln(w, "|---|---|---|---|---|---|")
				header = true
			}
			wait := "-"
			if tr.FlushWaitUs.Max > 0 {
				wait = fmtLatency(int64(tr.FlushWaitUs.Median))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.1f | %s | %.0f %% |\n", c.Name, t, fmtLatency(int64(tr.SyncMeanUs.Median)), tr.MsgsPerSync.Median, wait, tr.FlushBusy.Median*100)
		}
	}
}

// writeMarkdown writes one row per case and target: median msgs/s with
// its min-max range, the median p50 and p99, the run-by-run ratios to the
// floor (median and range), and the largest server heap seen.
func writeMarkdown(w io.Writer, res *MatrixResult) {
	fmt.Fprintln(w, "| case | target | msgs/s median (min-max, spread) | p50 | p99 | x floor throughput (range) | x floor p99 (range) | server CPU µs/msg (x floor) | server heap in use, max |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, c := range res.Cases {
		for _, t := range res.Targets {
			tr := c.Targets[t]
			if tr == nil {
				continue
			}
			thr, p99 := "-", "-"
			cpu := fmt.Sprintf("%.1f", tr.ServerCPUPerMsgUs.Median)
			if r := c.VsFloor[t]; r != nil {
				thr = fmt.Sprintf("**%.2f** (%.2f-%.2f)", r.Throughput.Median, r.Throughput.Min, r.Throughput.Max)
				p99 = fmt.Sprintf("%.2f (%.2f-%.2f)", r.P99.Median, r.P99.Min, r.P99.Max)
				cpu += fmt.Sprintf(" (%.2f)", r.ServerCPU.Median)
			}
			heap := "-"
			if tr.HeapBytes.Max > 0 {
				heap = fmt.Sprintf("%.1f MiB", tr.HeapBytes.Max/(1<<20))
			}
			errs := ""
			if tr.Errors > 0 || tr.Degraded > 0 {
				errs = fmt.Sprintf(" (%d errors, %d degraded)", tr.Errors, tr.Degraded)
			}
			fmt.Fprintf(w, "| %s | %s | %.0f (%.0f-%.0f, %.0f%%)%s | %s | %s | %s | %s | %s | %s |\n", c.Name, t,
				tr.MsgsPerSec.Median, tr.MsgsPerSec.Min, tr.MsgsPerSec.Max, tr.MsgsPerSec.SpreadPct, errs,
				fmtLatency(int64(tr.P50Us.Median)), fmtLatency(int64(tr.P99Us.Median)), thr, p99, cpu, heap)
		}
	}
}
