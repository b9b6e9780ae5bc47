// Package tlsclient builds the TLS configuration of storaged's own gRPC
// clients (storaged health, storaged replica, storaged-bench) from the
// files their flags name, so that each command keeps only its flag names.
package tlsclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Config returns a client configuration (TLS 1.2 at least) that verifies
// the server against the CAs of caFile (the system roots when empty) under
// serverName (the dialled host when empty), presents the key pair of
// certFile and keyFile when they are set (the caller checks that both or
// neither are), and skips the verification with noVerify. Its errors name
// the file and what is wrong with it.
func Config(caFile, certFile, keyFile, serverName string, noVerify bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, InsecureSkipVerify: noVerify}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate", caFile)
		}
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
