package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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
	useTLS := fs.Bool("tls", false, "connect with TLS (storaged --tls-cert)")
	caFile := fs.String("tls-ca-cert", "", "PEM `file` of the CAs that verify the server (default: the system roots)")
	certFile := fs.String("tls-client-cert", "", "client certificate PEM `file`, when storaged has --tls-client-ca")
	keyFile := fs.String("tls-client-key", "", "client key PEM `file`")
	serverName := fs.String("tls-server-name", "", "name to verify the server certificate against (default: the host of -addr)")
	noVerify := fs.Bool("tls-no-verify", false, "do not verify the server certificate (a loopback check of a pod's own cert)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *timeout <= 0 || (*certFile == "") != (*keyFile == "") {
		fmt.Fprintln(stderr, "storaged health: unexpected arguments, a non-positive -timeout, or only one of -tls-client-cert/-tls-client-key")
		return exitUsage
	}

	creds := insecure.NewCredentials()
	if *useTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: *serverName, InsecureSkipVerify: *noVerify}
		if *caFile != "" {
			pem, err := os.ReadFile(*caFile)
			if err != nil {
				fmt.Fprintf(stderr, "storaged health: -tls-ca-cert: %v\n", err)
				return exitUsage
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				fmt.Fprintf(stderr, "storaged health: -tls-ca-cert %s: no PEM certificate\n", *caFile)
				return exitUsage
			}
		}
		if *certFile != "" {
			cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
			if err != nil {
				fmt.Fprintf(stderr, "storaged health: client certificate: %v\n", err)
				return exitUsage
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
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
