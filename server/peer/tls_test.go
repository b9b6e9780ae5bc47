package peer

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/testcert"
)

// leaf issues a member certificate from ca, for server and client use,
// naming ips; it returns the tls.Certificate and its cert and key PEM.
func leaf(t *testing.T, ca *testcert.CA, ips ...string) (tls.Certificate, []byte, []byte) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, testcert.Leaf{Name: "member", Usage: testcert.Both, IPs: ips})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c, certPEM, keyPEM
}

// Two members with certificates from one CA (loaded from PEM files, as the
// flags do) exchange messages over TLS 1.3; a client whose certificate
// comes from another CA, a client without a certificate, a plaintext
// client, and a client whose certificate does not name the member it
// claims to be, are all refused and step nothing.
func TestMutualTLS(t *testing.T) {
	ca := testcert.NewCA(t, "group ca")
	dir := t.TempDir()
	_, certPEM, keyPEM := leaf(t, ca, "127.0.0.1")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tlsCfg, err := LoadTLS(write("cert.pem", certPEM), write("key.pem", keyPEM), write("ca.pem", ca.PEM))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTLS(write("c2.pem", certPEM), write("k2.pem", keyPEM), write("bad-ca.pem", []byte("no pem"))); err == nil {
		t.Fatal("a CA file without a certificate loaded")
	}
	lis, peers := listeners(t, 2)
	l3, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l3.Addr().String())
	l3.Close()
	peers[3] = net.JoinHostPort("localhost", port) // member 3's certificate must name "localhost"
	r1, r2 := &recorder{}, &recorder{}
	o1, o2 := testOptions(1, peers), testOptions(2, peers)
	o1.TLS, o2.TLS = tlsCfg, tlsCfg
	t1, err := New(lis[0], r1, o1)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	t2, err := New(lis[1], r2, o2)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	t1.Send(2, []byte("over tls"))
	t2.Send(1, []byte("back"))
	waitFor(t, "messages over TLS", 10*time.Second, func() bool { return r2.has("over tls") && r1.has("back") })

	// TLS servers never see a plaintext listener rule: a wildcard listener
	// with TLS is accepted (non-loopback production setups).
	wild := newWildcardListener(t)
	ow := testOptions(1, map[uint64]string{1: "127.0.0.1:1", 2: "10.1.2.3:9191"})
	ow.TLS = tlsCfg
	tw, err := New(wild, nil, ow)
	if err != nil {
		t.Fatalf("TLS on a wildcard listener with a remote peer: %v", err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	wrongCA := testcert.NewCA(t, "other ca")
	wrongCert, _, _ := leaf(t, wrongCA, "127.0.0.1")
	goodCert, _, _ := leaf(t, ca, "127.0.0.1")
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		from  uint64
		code  codes.Code
		msg   string
	}{
		{"wrong CA", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{wrongCert},
			RootCAs: ca.Pool(), ServerName: "127.0.0.1"}), 1, codes.Unavailable, ""},
		{"no client cert", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca.Pool(),
			ServerName: "127.0.0.1"}), 1, codes.Unavailable, ""},
		{"plaintext", insecure.NewCredentials(), 1, codes.Unavailable, ""},
		{"cert not naming the member", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{goodCert},
			RootCAs: ca.Pool(), ServerName: "127.0.0.1"}), 3, codes.PermissionDenied, "member 3's certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient("passthrough:///"+t2.Addr().String(), grpc.WithTransportCredentials(tc.creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before := r2.count()
			st, err := peerv1.NewRaftClient(conn).Send(ctx)
			if err == nil {
				_ = st.Send(&peerv1.RaftBatch{Group: "g1", ClusterId: "c1", From: tc.from, To: 2, Msgs: [][]byte{[]byte("intruder")}})
				_, err = st.CloseAndRecv()
			}
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
			if r2.has("intruder") || r2.count() != before {
				t.Fatal("a refused client's message was stepped")
			}
		})
	}
}
