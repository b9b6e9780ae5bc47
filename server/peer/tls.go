package peer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// LoadTLS builds the peer TLS configuration from PEM files: this member's
// certificate and key, presented both as a server and as a client, and the
// CA that signs every member's certificate. TLS 1.3 only; the server
// requires and verifies a client certificate, the client verifies the
// server against the CA and the host of its --raft-peers address.
func LoadTLS(certFile, keyFile, caFile string) (*TLS, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("peer: TLS needs a certificate, a key and a CA")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("peer: load TLS key pair: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("peer: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("peer: no PEM certificate in CA file %s", caFile)
	}
	return NewTLS(cert, pool), nil
}

// NewTLS is LoadTLS from a loaded certificate and CA pool.
func NewTLS(cert tls.Certificate, ca *x509.CertPool) *TLS {
	return &TLS{
		Server: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca,
		},
		Client: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{cert},
			RootCAs:      ca,
		},
	}
}
