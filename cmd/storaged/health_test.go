package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/storaged/storaged/internal/metricstest"
	"github.com/storaged/storaged/server"
)

// healthServer serves grpc.health.v1 on 127.0.0.1:0 until the test ends:
// "" SERVING, the store service NOT_SERVING.
func healthServer(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus(server.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil {
			t.Errorf("health server: %v", err)
		}
	})
	return lis.Addr().String()
}

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "storaged test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"storaged.test"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestHealthCommand(t *testing.T) {
	plain := healthServer(t)
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir)
	withTLS := healthServer(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
	// Client certificates required: the same self-signed cert is the CA.
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	withMTLS := healthServer(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	})))
	closed := func() string { // a port nobody listens on (any more)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}()
	// A listener that accepts and never speaks HTTP/2: only -timeout ends
	// the check.
	hungLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hungDone := make(chan struct{})
	var hungConns []net.Conn // closed at the end; only the accept goroutine appends before hungDone
	go func() {
		defer close(hungDone)
		for {
			c, err := hungLis.Accept()
			if err != nil {
				return
			}
			hungConns = append(hungConns, c)
		}
	}()
	t.Cleanup(func() {
		hungLis.Close()
		<-hungDone
		for _, c := range hungConns {
			c.Close()
		}
	})
	hung := hungLis.Addr().String()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name       string
		args       []string
		want       int
		wantStdout string
		wantStderr string
	}{
		{"liveness SERVING", []string{"-addr", plain}, exitHealthServing, "status: SERVING\n", ""},
		{"readiness NOT_SERVING", []string{"-addr", plain, "-service", server.ServiceName}, exitHealthUnhealthy, "status: NOT_SERVING\n", ""},
		{"unknown service", []string{"-addr", plain, "-service", "nope"}, exitHealthNoAnswer, "", "NotFound"},
		{"nobody listening", []string{"-addr", closed}, exitHealthNoAnswer, "", "connection refused"},
		{"plaintext to a TLS server", []string{"-addr", withTLS}, exitHealthNoAnswer, "", "Unavailable"},
		{"TLS, CA given", []string{"-addr", withTLS, "-tls", "-tls-ca-cert", certFile}, exitHealthServing, "status: SERVING\n", ""},
		{"TLS, server name checked", []string{"-addr", withTLS, "-tls", "-tls-ca-cert", certFile, "-tls-server-name", "other.test"},
			exitHealthNoAnswer, "", "other.test"},
		{"TLS, unknown CA", []string{"-addr", withTLS, "-tls"}, exitHealthNoAnswer, "", "unknown authority"},
		{"TLS, no verify", []string{"-addr", withTLS, "-tls", "-tls-no-verify"}, exitHealthServing, "status: SERVING\n", ""},
		{"mTLS without a client cert", []string{"-addr", withMTLS, "-tls", "-tls-ca-cert", certFile}, exitHealthNoAnswer, "", "Unavailable"},
		{"mTLS", []string{"-addr", withMTLS, "-tls", "-tls-ca-cert", certFile, "-tls-client-cert", certFile, "-tls-client-key", keyFile},
			exitHealthServing, "status: SERVING\n", ""},
		{"client cert without key", []string{"-addr", plain, "-tls", "-tls-client-cert", certFile}, exitUsage, "", "only one of"},
		{"CA file not PEM", []string{"-addr", plain, "-tls", "-tls-ca-cert", notPEM}, exitUsage, "", "no PEM certificate"},
		{"CA file missing", []string{"-addr", plain, "-tls", "-tls-ca-cert", filepath.Join(dir, "missing")}, exitUsage, "", "no such file"},
		{"bad timeout", []string{"-addr", plain, "-timeout", "0s"}, exitUsage, "", "non-positive"},
		{"hung server: the timeout", []string{"-addr", hung, "-timeout", "200ms"}, exitHealthNoAnswer, "", "DeadlineExceeded"},
		{"extra argument", []string{"-addr", plain, "now"}, exitUsage, "", "unexpected arguments"},
		{"unknown flag", []string{"-bogus"}, exitUsage, "", "bogus"},
		{"help", []string{"-h"}, exitOK, "", "usage: storaged health"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := runHealth(tc.args, &stdout, &stderr); got != tc.want {
				t.Errorf("exit %d, want %d; stdout %q stderr %q", got, tc.want, stdout.String(), stderr.String())
			}
			if stdout.String() != tc.wantStdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}

// TestStampedBinary: the binary TestMain stamped with -ldflags -X says so
// in --version, in its log lines and in storaged_build_info on /metrics,
// and its health command answers for the running server: what the image's
// HEALTHCHECK runs.
func TestStampedBinary(t *testing.T) {
	out, err := exec.Command(binary, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	if want := "storaged " + stampVersion + " (revision " + stampRevision + ", go"; !strings.HasPrefix(string(out), want) {
		t.Errorf("--version prints %q, want the prefix %q", out, want)
	}

	p := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	listening := p.logs.waitFor(t, "listening")
	if v := listening.str("version"); v != stampVersion {
		t.Errorf("log line version %q, want %q", v, stampVersion)
	}
	grpcAddr := listening.str("grpc")
	waitServing(t, dial(t, grpcAddr))

	mfs, _ := metricstest.Scrape(t, listening.str("metrics"))
	var labels map[string]string
	if mf := mfs["storaged_build_info"]; mf != nil && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge().GetValue() == 1 {
		labels = map[string]string{}
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
	}
	if labels["version"] != stampVersion || labels["revision"] != stampRevision || !strings.HasPrefix(labels["goversion"], "go1.") {
		t.Errorf("storaged_build_info labels %v, want version %s revision %s", labels, stampVersion, stampRevision)
	}

	for _, service := range []string{"", server.ServiceName} {
		out, err := exec.Command(binary, "health", "-addr", grpcAddr, "-service", service).CombinedOutput()
		if err != nil || string(out) != "status: SERVING\n" {
			t.Errorf("storaged health -service %q: %v %q", service, err, out)
		}
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
}
