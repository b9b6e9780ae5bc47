package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/testcert"
)

// writePeerCerts writes a CA and one certificate for 127.0.0.1 (server and
// client use, as every member presents it both ways) into dir, returning
// the cert, key and CA paths.
func writePeerCerts(t *testing.T, dir string) (cert, key, ca string) {
	t.Helper()
	auth := testcert.NewCA(t, "group ca")
	certPEM, keyPEM := auth.Issue(t, testcert.Leaf{Name: "member", Usage: testcert.Both, IPs: []string{"127.0.0.1"}})
	return testcert.WriteFile(t, dir, "peer.pem", certPEM), testcert.WriteFile(t, dir, "peer-key.pem", keyPEM),
		testcert.WriteFile(t, dir, "ca.pem", auth.PEM)
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
