package tlsclient

import (
	"crypto/x509"
	"strings"
	"testing"

	"github.com/storaged/storaged/internal/testcert"
)

// TestConfig: the CA file becomes the root pool, the key pair the client
// certificate, the server name and noVerify are kept; an unreadable or
// non-PEM CA file and a bad key pair are errors naming what is wrong.
func TestConfig(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "test-ca")
	caFile := testcert.WriteFile(t, dir, "ca.pem", ca.PEM)
	certPEM, keyPEM := ca.Issue(t, testcert.Leaf{Name: "client", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	certFile := testcert.WriteFile(t, dir, "c.pem", certPEM)
	keyFile := testcert.WriteFile(t, dir, "k.pem", keyPEM)
	notPEM := testcert.WriteFile(t, dir, "x.pem", []byte("not a certificate"))

	cfg, err := Config(caFile, certFile, keyFile, "storaged.example", true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || !cfg.RootCAs.Equal(ca.Pool()) || len(cfg.Certificates) != 1 || cfg.ServerName != "storaged.example" ||
		!cfg.InsecureSkipVerify {
		t.Fatalf("config %+v", cfg)
	}
	if cfg, err := Config("", "", "", "", false); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 || cfg.InsecureSkipVerify {
		t.Fatalf("no files: %+v %v (want the system roots, no client certificate)", cfg, err)
	}
	for name, tc := range map[string]struct {
		ca, cert, key, want string
	}{
		"CA missing":     {ca: dir + "/missing.pem", want: "CA file"},
		"CA not PEM":     {ca: notPEM, want: "no PEM certificate"},
		"key pair wrong": {cert: certFile, key: notPEM, want: "client certificate"},
	} {
		if _, err := Config(tc.ca, tc.cert, tc.key, "", false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}
