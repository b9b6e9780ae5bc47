package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// writePeerCerts writes a CA and one certificate for 127.0.0.1 (server and
// client use, as every member presents it both ways) into dir, returning
// the cert, key and CA paths.
func writePeerCerts(t *testing.T, dir string) (cert, key, ca string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "group ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "member"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("peer.pem", "CERTIFICATE", leafDER), write("peer-key.pem", "EC PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER)
}

// TestGroupPeerTLS: the same group with --peer-tls-cert/-key/-ca (mutual
// TLS 1.3 between the members) elects a leader, and its acked puts reach
// every member.
func TestGroupPeerTLS(t *testing.T) {
	cert, key, ca := writePeerCerts(t, t.TempDir())
	g := newGroup(t, "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca)
	leader := g.Leader(t)
	acked := map[int64]string{}
	for k := range 10 {
		body := fmt.Sprintf("tls-%d", k)
		off, err := putTo(leader, body)
		if err != nil {
			t.Fatalf("put %d to the leader %s: %v", k, g.Name(leader), err)
		}
		acked[off] = body
	}
	for _, p := range g.Nodes() {
		waitAcked(t, g.Name(p), p, acked)
	}
	// The peer port speaks TLS only: a plaintext client gets nowhere.
	conn, err := grpc.NewClient("passthrough:///"+g.peerAddrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := peerv1.NewRaftClient(conn).Send(ctx)
	if err == nil {
		_ = st.Send(&peerv1.RaftBatch{From: 2, To: 1})
		_, err = st.CloseAndRecv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client on a TLS peer port: %v, want UNAVAILABLE", err)
	}
}
