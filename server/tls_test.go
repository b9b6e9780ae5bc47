package server

import (
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
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key signed by ca, for a server on
// 127.0.0.1 or for a client.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func clientTLS(t *testing.T, ca *testCA, certPEM, keyPEM []byte) credentials.TransportCredentials {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg)
}

func TestTLSAndMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "storaged test CA")
	other := newCA(t, "someone else's CA")
	srvCert, srvKey := ca.issue(t, "storaged", true)
	certFile := writeFile(t, dir, "server.crt", srvCert)
	keyFile := writeFile(t, dir, "server.key", srvKey)
	caFile := writeFile(t, dir, "ca.crt", ca.pem)
	cliCert, cliKey := ca.issue(t, "client", false)
	strangerCert, strangerKey := other.issue(t, "stranger", false)

	put := func(t *testing.T, addr string, creds credentials.TransportCredentials) error {
		t.Helper()
		c := storagedv1.NewMessageStoreServiceClient(dial(t, addr, creds))
		_, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "tls", Body: []byte("b")}})
		return err
	}

	t.Run("TLS", func(t *testing.T) {
		cfg, err := LoadTLSConfig(certFile, keyFile, "")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MinVersion != tls.VersionTLS13 || cfg.ClientAuth != tls.NoClientCert {
			t.Errorf("min version %x client auth %v", cfg.MinVersion, cfg.ClientAuth)
		}
		st, _ := openStore(t, nil)
		srv := startServer(t, New(st, zerologNop()), GRPCConfig{TLS: cfg})
		if err := put(t, srv.addr, clientTLS(t, ca, nil, nil)); err != nil {
			t.Errorf("TLS client: %v", err)
		}
		if err := put(t, srv.addr, nil); codeOf(err) != codes.Unavailable {
			t.Errorf("plaintext client against TLS: %v, want Unavailable", err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.cert)
		tls12 := credentials.NewTLS(&tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12})
		if err := put(t, srv.addr, tls12); codeOf(err) != codes.Unavailable {
			t.Errorf("TLS 1.2 client: %v, want Unavailable", err)
		}
	})

	t.Run("mTLS", func(t *testing.T) {
		cfg, err := LoadTLSConfig(certFile, keyFile, caFile)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("client auth %v", cfg.ClientAuth)
		}
		st, _ := openStore(t, nil)
		srv := startServer(t, New(st, zerologNop()), GRPCConfig{TLS: cfg})
		if err := put(t, srv.addr, clientTLS(t, ca, cliCert, cliKey)); err != nil {
			t.Errorf("client with a certificate: %v", err)
		}
		if err := put(t, srv.addr, clientTLS(t, ca, nil, nil)); codeOf(err) != codes.Unavailable {
			t.Errorf("client without a certificate: %v, want Unavailable", err)
		}
		if err := put(t, srv.addr, clientTLS(t, ca, strangerCert, strangerKey)); codeOf(err) != codes.Unavailable {
			t.Errorf("client with a certificate of another CA: %v, want Unavailable", err)
		}
		if s := st.Stats(); s.Puts["PUT_OK"] != 1 {
			t.Errorf("store took %d puts, want only the authenticated one", s.Puts["PUT_OK"])
		}
	})

	t.Run("config errors", func(t *testing.T) {
		if cfg, err := LoadTLSConfig("", "", ""); cfg != nil || err != nil {
			t.Errorf("no TLS: %v %v", cfg, err)
		}
		for name, args := range map[string][3]string{
			"cert without key":   {certFile, "", ""},
			"CA without cert":    {"", "", caFile},
			"missing file":       {filepath.Join(dir, "nope"), keyFile, ""},
			"key does not match": {certFile, writeFile(t, dir, "other.key", strangerKey), ""},
			"CA not PEM":         {certFile, keyFile, writeFile(t, dir, "junk", []byte("junk"))},
		} {
			if _, err := LoadTLSConfig(args[0], args[1], args[2]); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
	})
}
