package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// leader1 is member 1 of a group whose only voter it is (member 2, a
// learner, never runs), a storaged process started by startLeader1.
type leader1 struct {
	p                   *proc
	grpcAddr, adminAddr string // its client and admin gRPC addresses
	metricsAddr         string // its /metrics address, "" unless args set --metrics-listen
	peer1, peer2        string // the peer addresses of members 1 and 2
}

// startLeader1 starts member 1 with args added to its flags (--tls-cert …)
// and returns once it is the ready leader, as seen through a connection
// made with opts (its transport credentials).
func startLeader1(t *testing.T, opts []grpc.DialOption, args ...string) leader1 {
	t.Helper()
	l := leader1{peer1: proctest.FreeAddr(t), peer2: proctest.FreeAddr(t)}
	l.p = startProc(t, append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--file-size", "64KiB", "--raft-id", "1", "--raft-peers", "1=" + l.peer1 + ",2=" + l.peer2,
		"--raft-learners", "2", "--raft-tick", "10ms", "--raft-election-timeout", "100ms"}, args...)...)
	listening := l.p.logs.waitFor(t, "listening")
	l.grpcAddr, l.adminAddr, l.metricsAddr = listening.str("grpc"), listening.str("admin"), listening.str("metrics")
	conn := dial(t, l.grpcAddr, opts...)
	waitServing(t, conn)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	poll, deadline := time.NewTicker(10*time.Millisecond), time.After(startTimeout)
	defer poll.Stop()
	for {
		ri, err := client.GetReplicaInfo(t.Context(), &storagedv1.GetReplicaInfoRequest{})
		if err == nil && ri.GetReady() {
			return l
		}
		select {
		case <-deadline:
			t.Fatalf("member 1 is not a ready leader: %v %v", ri, err)
		case <-poll.C:
		}
	}
}

// stop ends the process with SIGTERM; it must exit 0.
func (l leader1) stop(t *testing.T) {
	t.Helper()
	l.p.signal(t, syscall.SIGTERM)
	if code := l.p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, l.p.logs.String())
	}
}

// runMembership runs `storaged replica ARGS`, fails the test unless it
// exits want, and returns its JSON output (when want is exitOK) and its
// stderr.
func runMembership(t *testing.T, want int, args ...string) (membersOutput, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := runReplica(args, env(), &stdout, &stderr); code != want {
		t.Fatalf("storaged replica %v: exit %d, want %d; stdout %s stderr %s", args, code, want, stdout.String(), stderr.String())
	}
	var out membersOutput
	if want == exitOK {
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatalf("storaged replica %v: output %q: %v", args, stdout.String(), err)
		}
	}
	return out, stderr.String()
}

// TestReplicaMembershipCommands: `storaged replica members|add|promote|
// remove` against a real storaged process, member 1 of a group whose only
// voter it is (member 2, a learner, never runs): members shows the
// membership and cluster id, add prints the new member's flags, a promote
// of a learner never heard from and the leader's own removal are refused
// (exit 1, the cause printed), a learner's removal is shown; usage errors
// exit 2.
func TestReplicaMembershipCommands(t *testing.T) {
	l := startLeader1(t, nil)
	grpcAddr, adminAddr, p1, p2, p3 := l.grpcAddr, l.adminAddr, l.peer1, l.peer2, proctest.FreeAddr(t)
	run := func(want int, args ...string) (membersOutput, string) {
		t.Helper()
		return runMembership(t, want, args...)
	}
	run(exitUsage, "add", "--addr", adminAddr, "--id", "0", "--peer-addr", p3)
	run(exitUsage, "add", "--addr", adminAddr, "--id", "3")
	run(exitUsage, "add", "--addr", adminAddr, "--id", "3", "--peer-addr", "nope")
	run(exitUsage, "promote", "--addr", adminAddr)

	m, _ := run(exitOK, "members", "--addr", grpcAddr)
	if m.ID != 1 || m.Role != "leader" || m.LeaderID != 1 || len(m.ClusterID) != 32 || m.Group != "default" ||
		!slices.Equal(m.Voters, []uint64{1}) || !slices.Equal(m.Learners, []uint64{2}) || m.PeerAddrs[1] != p1 || m.PeerAddrs[2] != p2 ||
		!maps.Equal(m.ClientAddrs, map[uint64]string{1: grpcAddr}) { // learner 2 never ran: its address is not known
		t.Fatalf("members: %+v", m)
	}
	if _, stderr := run(exitRefused, "add", "--addr", adminAddr, "--id", "3", "--peer-addr", "10.1.2.3:9191"); !strings.Contains(stderr, "InvalidArgument") ||
		!strings.Contains(stderr, "loopback") {
		t.Fatalf("add of a plaintext member off loopback: %s", stderr)
	}
	add, _ := run(exitOK, "add", "--addr", adminAddr, "--id", "3", "--peer-addr", p3)
	wantFlags := "--raft-id 3 --raft-group default --raft-join " + m.ClusterID + " --raft-peers 3=" + p3 + ",1=" + p1 + ",2=" + p2
	if add.StartFlags != wantFlags || !slices.Equal(add.Learners, []uint64{2, 3}) || add.Index == 0 {
		t.Fatalf("add: %+v, want start flags %q", add, wantFlags)
	}
	if _, stderr := run(exitRefused, "promote", "--addr", adminAddr, "--id", "3"); !strings.Contains(stderr, "cause=LEARNER_BEHIND") {
		t.Fatalf("promote of a learner never heard from: %s", stderr)
	}
	if _, stderr := run(exitRefused, "remove", "--addr", adminAddr, "--id", "1"); !strings.Contains(stderr, "cause=QUORUM_AFTER_CHANGE") ||
		!strings.Contains(stderr, "FailedPrecondition") {
		t.Fatalf("remove of the only voter: %s", stderr)
	}
	rm, _ := run(exitOK, "remove", "--addr", adminAddr, "--id", "3")
	if !slices.Equal(rm.Learners, []uint64{2}) || !slices.Equal(rm.Removed, []uint64{3}) || rm.Index <= add.Index {
		t.Fatalf("remove: %+v", rm)
	}
	m, _ = run(exitOK, "members", "--addr", grpcAddr)
	if !slices.Equal(m.Learners, []uint64{2}) || !slices.Equal(m.Removed, []uint64{3}) || m.Index != rm.Index {
		t.Fatalf("members after the removal: %+v", m)
	}
	if _, stderr := run(exitRefused, "add", "--addr", adminAddr, "--id", "3", "--peer-addr", p3); !strings.Contains(stderr, "cause=BAD_CONF_CHANGE") {
		t.Fatalf("add of a removed id: %s", stderr)
	}
	l.stop(t)
}

// TestReplicaTransferCommand: `storaged replica transfer` against a real
// storaged process, member 1 of a group whose only voter it is (member 2,
// a learner, never runs): a transfer to itself prints it as the leader
// with its client address and the membership; to the learner it is
// refused (exit 1, cause NOT_VOTER), without --id (no other voter) cause
// NO_TRANSFEREE; member 1 leads after each. Usage errors exit 2. (Moves
// between members: tests/cluster's TestGroupTransferLeadership.)
func TestReplicaTransferCommand(t *testing.T) {
	l := startLeader1(t, nil)
	run := func(want int, args ...string) (membersOutput, string) {
		t.Helper()
		return runMembership(t, want, args...)
	}
	run(exitUsage, "transfer", "--addr", l.adminAddr, "--id", "0")
	run(exitUsage, "transfer", "--addr", l.adminAddr, "--id", "x")
	run(exitUsage, "transfer", "--addr", l.adminAddr, "2")
	out, _ := run(exitOK, "transfer", "--addr", l.adminAddr, "--id", "1")
	if out.LeaderID != 1 || out.LeaderAddr != l.grpcAddr || !slices.Equal(out.Voters, []uint64{1}) ||
		!slices.Equal(out.Learners, []uint64{2}) || out.PeerAddrs[2] != l.peer2 {
		t.Fatalf("transfer to the leader itself: %+v", out)
	}
	for _, tc := range []struct {
		args  []string
		cause string
	}{
		{[]string{"--id", "2"}, "cause=NOT_VOTER"},
		{nil, "cause=NO_TRANSFEREE"},
	} {
		_, stderr := run(exitRefused, append([]string{"transfer", "--addr", l.adminAddr}, tc.args...)...)
		if !strings.Contains(stderr, tc.cause) || !strings.Contains(stderr, "FailedPrecondition") {
			t.Errorf("transfer %v: %s, want FailedPrecondition %s", tc.args, stderr, tc.cause)
		}
		if m, _ := run(exitOK, "members", "--addr", l.grpcAddr); m.Role != "leader" || m.LeaderID != 1 {
			t.Fatalf("after transfer %v: %+v", tc.args, m)
		}
	}
	l.stop(t)
}

// TestReplicaMembershipTLS: the membership commands reach a member whose
// client and admin services have TLS (--tls-cert) with --tls and the CA,
// and fail without them (exit 1, the cause printed); with mTLS
// (--tls-client-ca) only with a client certificate the member's client
// CA signed; a bad combination of the -tls flags is a usage error (exit 2)
// found before any call.
func TestReplicaMembershipTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir) // the members' certificate, its own CA, and the client's for mTLS
	strangerCert, strangerKey, _ := selfSigned(t, t.TempDir())
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	withTLS := startLeader1(t, []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots}))},
		"--tls-cert", certFile, "--tls-key", keyFile)
	withMTLS := startLeader1(t, []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots,
		Certificates: []tls.Certificate{cert}}))}, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", certFile)

	isLeader1 := func(m membersOutput) bool { return m.ID == 1 && m.Role == "leader" && len(m.ClusterID) == 32 }
	added3 := func(m membersOutput) bool { return slices.Equal(m.Learners, []uint64{2, 3}) && m.StartFlags != "" }
	removed3 := func(m membersOutput) bool {
		return slices.Equal(m.Learners, []uint64{2}) && slices.Equal(m.Removed, []uint64{3})
	}
	tlsArgs := []string{"--tls", "--tls-ca-cert", certFile}
	args := func(parts ...[]string) []string { return slices.Concat(parts...) }
	mtlsArgs := args(tlsArgs, []string{"--tls-client-cert", certFile, "--tls-client-key", keyFile})
	// In order: each remove takes out the learner the add before it added.
	for _, tc := range []struct {
		name       string
		args       []string
		want       int
		check      func(membersOutput) bool // the output of a command that succeeds
		wantStderr []string
	}{
		{"TLS: members", args([]string{"members", "--addr", withTLS.grpcAddr}, tlsArgs), exitOK, isLeader1, nil},
		{"TLS: members, plaintext", []string{"members", "--addr", withTLS.grpcAddr}, exitRefused, nil,
			[]string{"Unavailable", "this call was plaintext", "--tls --tls-ca-cert"}},
		{"TLS: members, unknown CA", []string{"members", "--addr", withTLS.grpcAddr, "--tls"}, exitRefused, nil,
			[]string{"Unavailable", "unknown authority"}},
		{"TLS: add, plaintext", []string{"add", "--addr", withTLS.adminAddr, "--id", "3", "--peer-addr", proctest.FreeAddr(t)}, exitRefused, nil,
			[]string{"Unavailable", "this call was plaintext"}},
		{"TLS: add", args([]string{"add", "--addr", withTLS.adminAddr, "--id", "3", "--peer-addr", proctest.FreeAddr(t)}, tlsArgs), exitOK, added3, nil},
		{"TLS: remove", args([]string{"remove", "--addr", withTLS.adminAddr, "--id", "3"}, tlsArgs), exitOK, removed3, nil},
		{"mTLS: members, no client cert", args([]string{"members", "--addr", withMTLS.grpcAddr}, tlsArgs), exitRefused, nil,
			[]string{"Unavailable"}},
		{"mTLS: members, client cert of another CA", args([]string{"members", "--addr", withMTLS.grpcAddr}, tlsArgs,
			[]string{"--tls-client-cert", strangerCert, "--tls-client-key", strangerKey}), exitRefused, nil, []string{"Unavailable"}},
		{"mTLS: members", args([]string{"members", "--addr", withMTLS.grpcAddr}, mtlsArgs), exitOK, isLeader1, nil},
		{"mTLS: add, no client cert", args([]string{"add", "--addr", withMTLS.adminAddr, "--id", "3", "--peer-addr", proctest.FreeAddr(t)}, tlsArgs),
			exitRefused, nil, []string{"Unavailable"}},
		{"mTLS: add", args([]string{"add", "--addr", withMTLS.adminAddr, "--id", "3", "--peer-addr", proctest.FreeAddr(t)}, mtlsArgs), exitOK, added3, nil},
		{"mTLS: remove", args([]string{"remove", "--addr", withMTLS.adminAddr, "--id", "3"}, mtlsArgs), exitOK, removed3, nil},
		{"client cert without key", args([]string{"members", "--addr", withMTLS.grpcAddr}, tlsArgs, []string{"--tls-client-cert", certFile}),
			exitUsage, nil, []string{"only one of"}},
		{"client key without cert", args([]string{"remove", "--addr", withMTLS.adminAddr, "--id", "2"}, tlsArgs, []string{"--tls-client-key", keyFile}),
			exitUsage, nil, []string{"only one of"}},
		{"CA file not PEM", []string{"members", "--addr", withTLS.grpcAddr, "--tls", "--tls-ca-cert", notPEM}, exitUsage, nil,
			[]string{"no PEM certificate"}},
		{"client cert missing", args([]string{"promote", "--addr", withMTLS.adminAddr, "--id", "2"}, tlsArgs,
			[]string{"--tls-client-cert", filepath.Join(dir, "missing"), "--tls-client-key", keyFile}), exitUsage, nil, []string{"no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr := runMembership(t, tc.want, tc.args...)
			if tc.check != nil && !tc.check(out) {
				t.Errorf("storaged replica %v: %+v", tc.args, out)
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
			if slices.Contains(tc.args, "--tls") && strings.Contains(stderr, "plaintext") {
				t.Errorf("stderr of a TLS call speaks of plaintext: %q", stderr)
			}
		})
	}
	withTLS.stop(t)
	withMTLS.stop(t)
}
