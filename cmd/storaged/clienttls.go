package main

import (
	"errors"
	"flag"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/storaged/storaged/internal/tlsclient"
)

// clientTLS is how a storaged command that calls a server (storaged
// health, storaged replica members|add|promote|remove) connects: its -tls
// flags, and the gRPC credentials they make. Without -tls it connects in
// plaintext, whatever the other flags say.
type clientTLS struct {
	on         bool
	caFile     string
	certFile   string
	keyFile    string
	serverName string
	noVerify   bool
}

// register adds the -tls flags to fs.
func (c *clientTLS) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "tls", false, "connect with TLS (storaged --tls-cert)")
	fs.StringVar(&c.caFile, "tls-ca-cert", "", "PEM `file` of the CAs that verify the server (default: the system roots)")
	fs.StringVar(&c.certFile, "tls-client-cert", "", "client certificate PEM `file`, when storaged has --tls-client-ca")
	fs.StringVar(&c.keyFile, "tls-client-key", "", "client key PEM `file`")
	fs.StringVar(&c.serverName, "tls-server-name", "", "name to verify the server certificate against (default: the host of -addr)")
	fs.BoolVar(&c.noVerify, "tls-no-verify", false, "do not verify the server certificate (a loopback check of a pod's own cert)")
}

// creds returns the transport credentials the flags ask for. Its
// errors are usage errors: only one of -tls-client-cert/-tls-client-key,
// or a file that cannot be read or holds no PEM certificate.
func (c *clientTLS) creds() (credentials.TransportCredentials, error) {
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, errors.New("only one of -tls-client-cert/-tls-client-key: give both or neither")
	}
	if !c.on {
		return insecure.NewCredentials(), nil
	}
	cfg, err := tlsclient.Config(c.caFile, c.certFile, c.keyFile, c.serverName, c.noVerify)
	if err != nil {
		return nil, fmt.Errorf("-tls-ca-cert / -tls-client-cert: %w", err)
	}
	return credentials.NewTLS(cfg), nil
}
