package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Exit statuses of storaged health.
const (
	exitHealthServing   = 0
	exitHealthUnhealthy = 1 // answered, but not SERVING (NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN)
	// exitUsage (2) for bad flags, as for every storaged command
	exitHealthNoAnswer = 3 // no answer: not listening, timeout, TLS failure, unknown service, RPC error
)

// runHealth is `storaged health`: one grpc.health.v1.Health/Check call,
// like grpc-health-probe, so that the image needs no second binary for its
// HEALTHCHECK (Docker) or an exec probe (Kubernetes with in-process TLS,
// where the native gRPC probe cannot connect). It prints the status on
// stdout and exits 0 only for SERVING.
func runHealth(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: storaged health [-addr HOST:PORT] [-service NAME] [-timeout D] [-tls ...]")
		fmt.Fprintln(stderr, "Asks grpc.health.v1.Health/Check; exit 0 SERVING, 1 not serving, 2 usage, 3 no answer.")
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:9090", "gRPC `address` of the storaged to ask")
	service := fs.String("service", "", "health `service`: \"\" is the process (liveness), storaged.v1.MessageStoreService takes writes (readiness)")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on connecting and asking")
	var tlsFlags clientTLS
	tlsFlags.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *timeout <= 0 {
		fmt.Fprintln(stderr, "storaged health: unexpected arguments or a non-positive -timeout")
		return exitUsage
	}
	creds, err := tlsFlags.creds()
	if err != nil {
		fmt.Fprintf(stderr, "storaged health: %v\n", err)
		return exitUsage
	}

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "storaged health: %s: %v\n", *addr, err)
		return exitUsage
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// Fail fast (no WaitForReady): the answer comes from the first
	// connection attempt, so a refused connection or a TLS failure is
	// reported as such at once; the prober (Docker, Kubernetes) retries.
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		fmt.Fprintf(stderr, "storaged health: %s service %q: %v\n", *addr, *service, err)
		return exitHealthNoAnswer
	}
	fmt.Fprintf(stdout, "status: %s\n", resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return exitHealthUnhealthy
	}
	return exitHealthServing
}
