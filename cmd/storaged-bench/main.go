// Command storaged-bench is the load generator of storaged: it drives a
// storaged.v1.MessageStoreService with unary PutMessage, batched PutMessages
// or streamed PutMessageStream calls, prints a progress line every second
// and a final summary built from an HDR histogram of call latencies.
//
// Subcommands:
//
//	storaged-bench [run] --addr HOST:PORT [flags]   load one server
//	storaged-bench [run] --floor [flags]            load an in-process no-op server (the floor)
//	storaged-bench floor --listen 127.0.0.1:0       serve the no-op server until SIGTERM
//	storaged-bench matrix --storaged BIN [flags]    floor, async and sync side by side, N runs each
//	storaged-bench limits --storaged BIN [flags]    issue 11's hostile-client figures (see limits.go)
//	storaged-bench failover --storaged BIN [flags]  write unavailability of a local r3 group per leader kill or SIGTERM
//	storaged-bench chart --in results.json --out chart.png
//	storaged-bench report --in results.json           the results as a Markdown table
//	storaged-bench pullmem --storaged BIN [flags]   server memory of concurrent maximal pulls
//	storaged-bench syncprim --dir DIR [flags]       msync vs fdatasync latency per size on this disk
//	storaged-bench soak --targets ADDRS [flags]     put through a running deployment, then check every ack on every member
//
// The floor is a MessageStoreService that stores nothing: it answers PUT_OK
// with a plausible AppendResult, behind the same gRPC server options and
// interceptors as storaged (see floor.go). Measuring it in the same run as
// storaged gives the ratios of issue 7 without comparing numbers taken at
// different times on a noisy machine.
//
// Exit status: 0 on success, 1 on a runtime error, 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"google.golang.org/grpc/experimental"

	"github.com/storaged/storaged/server"
)

func main() {
	installBufferPool()
	ctx, stop := signalContext()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(mainExit(err))
}

// installBufferPool makes storaged's buffer pool gRPC's default, as
// storaged's main does (server.NewBufferPool), so that the floors pay what
// storaged pays; the load generator's client runs with it too. It is
// process-wide: main calls it before anything runs.
func installBufferPool() { experimental.SetDefaultBufferPool(server.NewBufferPool()) }

// signalContext is cancelled by SIGTERM or SIGINT: a load run stops and
// prints what it measured, a floor stops serving.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// mainExit is the exit status for run's error; runtime errors are printed.
func mainExit(err error) int {
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &uerr):
		return 2
	default:
		fmt.Fprintln(os.Stderr, "storaged-bench:", err)
		return 1
	}
}

// generatorGOGC is the GC percent of the load generator when GOGC is not
// set. The generator's live heap is a few MiB, so with the default of 100
// it collects tens of times a second; on a 2-core machine shared with the
// server under test that CPU is taken from the server. The servers (floor
// subprocesses and storaged) apply gctune.DefaultGOGC themselves, also 400.
// The in-process floor of --floor shares the generator's setting.
const generatorGOGC = 400

// leanGC applies generatorGOGC unless the environment sets GOGC.
func leanGC() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(generatorGOGC)
	}
}

// parseFlags parses a subcommand's flags: -h comes back as flag.ErrHelp
// (exit 0), anything else wrong as a usageError (exit 2).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}

// usageError is a mistake on the command line: main exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// run dispatches to a subcommand. Without one (the first argument is a
// flag, or there is none) it runs the load generator.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		leanGC()
		return runLoadCommand(ctx, args, stdout, stderr)
	case "floor":
		return runFloorCommand(ctx, args, stderr)
	case "matrix":
		leanGC()
		return runMatrixCommand(ctx, args, stdout, stderr)
	case "limits":
		leanGC()
		return runLimitsCommand(ctx, args, stdout, stderr)
	case "failover":
		leanGC()
		return runFailoverCommand(ctx, args, stdout, stderr)
	case "chart":
		return runChartCommand(args, stderr)
	case "report":
		return runReportCommand(args, stdout, stderr)
	case "pullmem":
		leanGC()
		return runPullMemCommand(ctx, args, stdout, stderr)
	case "syncprim":
		return runSyncPrimCommand(args, stdout, stderr)
	case "soak":
		leanGC()
		return runSoakCommand(ctx, args, stdout, stderr)
	default:
		err := fmt.Errorf("unknown subcommand %q (run, floor, matrix, limits, failover, chart, report, pullmem, syncprim, soak)", cmd)
		fmt.Fprintln(stderr, "storaged-bench:", err)
		return usageError{err}
	}
}
