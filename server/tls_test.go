package server

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/testcert"
)

// issue returns a PEM certificate and key signed by ca, for a server on
// 127.0.0.1 or for a client.
func issue(t *testing.T, ca *testcert.CA, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	if server {
		return ca.Issue(t, testcert.Leaf{Name: name, Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPs: []string{"127.0.0.1"}})
	}
	return ca.Issue(t, testcert.Leaf{Name: name, Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

func clientTLS(t *testing.T, ca *testcert.CA, certPEM, keyPEM []byte) credentials.TransportCredentials {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
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
	ca := testcert.NewCA(t, "storaged test CA")
	other := testcert.NewCA(t, "someone else's CA")
	srvCert, srvKey := issue(t, ca, "storaged", true)
	certFile := testcert.WriteFile(t, dir, "server.crt", srvCert)
	keyFile := testcert.WriteFile(t, dir, "server.key", srvKey)
	caFile := testcert.WriteFile(t, dir, "ca.crt", ca.PEM)
	cliCert, cliKey := issue(t, ca, "client", false)
	strangerCert, strangerKey := issue(t, other, "stranger", false)

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
		pool.AddCert(ca.Cert)
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
			"key does not match": {certFile, testcert.WriteFile(t, dir, "other.key", strangerKey), ""},
			"CA not PEM":         {certFile, keyFile, testcert.WriteFile(t, dir, "junk", []byte("junk"))},
		} {
			if _, err := LoadTLSConfig(args[0], args[1], args[2]); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
	})
}
