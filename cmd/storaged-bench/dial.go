package main

import (
	"errors"
	"flag"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/storaged/storaged/internal/tlsclient"
)

// tlsOptions are the client TLS flags. Any of them turns TLS on.
type tlsOptions struct {
	on         bool
	ca         string
	cert, key  string
	serverName string
}

func (t *tlsOptions) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&t.on, "tls", false, "use TLS with the system roots (implied by the other --tls-* flags)")
	fs.StringVar(&t.ca, "tls-ca", "", "CA `file` (PEM) that signed the server certificate")
	fs.StringVar(&t.cert, "tls-cert", "", "client certificate `file` (PEM) for mTLS, with --tls-key")
	fs.StringVar(&t.key, "tls-key", "", "client private key `file` (PEM)")
	fs.StringVar(&t.serverName, "tls-server-name", "", "expected server `name` in its certificate (default: the --addr host)")
}

func (t *tlsOptions) enabled() bool {
	return t.on || t.ca != "" || t.cert != "" || t.key != "" || t.serverName != ""
}

// credentials returns the transport credentials of the options: insecure
// (h2c) when TLS is off.
func (t *tlsOptions) credentials() (credentials.TransportCredentials, error) {
	if !t.enabled() {
		return insecure.NewCredentials(), nil
	}
	if (t.cert == "") != (t.key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cfg, err := tlsclient.Config(t.ca, t.cert, t.key, t.serverName, false)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca / --tls-cert: %w", err)
	}
	return credentials.NewTLS(cfg), nil
}

// Message size limits of the generator's connections: above the server's
// limits, so that the server is the one that refuses (a batch larger than
// its --max-message-size, a 16 MiB pull with include_raw is about 32 MiB).
const (
	dialSendLimit = 64 << 20
	dialRecvLimit = 64 << 20
)

// dial opens n client connections to addr. grpc.NewClient connects lazily;
// the first call of each connection pays the handshake, which the warmup
// absorbs.
func dial(addr string, n int, creds credentials.TransportCredentials) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, n)
	for range n {
		cc, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(creds),
			// The server accepts requests up to its message size limit
			// plus overhead; the client must not refuse large batches first.
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(dialSendLimit), grpc.MaxCallRecvMsgSize(dialRecvLimit)))
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		conns = append(conns, cc)
	}
	return conns, nil
}

// dialPlain is dial without TLS, for the servers this binary starts on
// loopback.
func dialPlain(addr string, n int) ([]*grpc.ClientConn, error) {
	return dial(addr, n, insecure.NewCredentials())
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		c.Close()
	}
}
