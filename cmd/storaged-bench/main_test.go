package main

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// asMainEnv makes the test binary act as storaged-bench itself, so that
// the matrix test can start floor subprocesses from os.Executable().
const asMainEnv = "STORAGED_BENCH_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	installBufferPool() // as main
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(mainExit(run(contextForMain(), os.Args[1:], os.Stdout, os.Stderr)))
	}
	goleak.VerifyTestMain(m)
}

// contextForMain is main's signal context, for the subprocess mode.
func contextForMain() context.Context {
	ctx, _ := signalContext()
	return ctx
}
