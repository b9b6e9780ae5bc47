package main

import (
	"bytes"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// freeAddr is a 127.0.0.1 address nothing listens on (a moment ago).
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// TestReplicaMembershipCommands: `storaged replica members|add|promote|
// remove` against a real storaged process, member 1 of a group whose only
// voter it is (member 2, a learner, never runs): members shows the
// membership and cluster id, add prints the new member's flags, a promote
// of a learner never heard from and the leader's own removal are refused
// (exit 1, the cause printed), a learner's removal is shown; usage errors
// exit 2.
func TestReplicaMembershipCommands(t *testing.T) {
	p1, p2, p3 := freeAddr(t), freeAddr(t), freeAddr(t)
	p := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--file-size", "64KiB", "--raft-id", "1", "--raft-peers", "1="+p1+",2="+p2,
		"--raft-learners", "2", "--raft-tick", "10ms", "--raft-election-timeout", "100ms")
	listening := p.logs.waitFor(t, "listening")
	grpcAddr, adminAddr := listening.str("grpc"), listening.str("admin")
	conn := dial(t, grpcAddr)
	waitServing(t, conn)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	poll, deadline := time.NewTicker(10*time.Millisecond), time.After(startTimeout)
	defer poll.Stop()
	for {
		ri, err := client.GetReplicaInfo(t.Context(), &storagedv1.GetReplicaInfoRequest{})
		if err == nil && ri.GetReady() {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("member 1 is not a ready leader: %v %v", ri, err)
		case <-poll.C:
		}
	}
	run := func(want int, args ...string) (membersOutput, string) {
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
	run(exitUsage, "add", "--addr", adminAddr, "--id", "0", "--peer-addr", p3)
	run(exitUsage, "add", "--addr", adminAddr, "--id", "3")
	run(exitUsage, "add", "--addr", adminAddr, "--id", "3", "--peer-addr", "nope")
	run(exitUsage, "promote", "--addr", adminAddr)

	m, _ := run(exitOK, "members", "--addr", grpcAddr)
	if m.ID != 1 || m.Role != "leader" || m.LeaderID != 1 || len(m.ClusterID) != 32 || m.Group != "default" ||
		!slices.Equal(m.Voters, []uint64{1}) || !slices.Equal(m.Learners, []uint64{2}) || m.PeerAddrs[1] != p1 || m.PeerAddrs[2] != p2 {
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
	if _, stderr := run(exitRefused, "remove", "--addr", adminAddr, "--id", "1"); !strings.Contains(stderr, "cause=REMOVE_LEADER") ||
		!strings.Contains(stderr, "FailedPrecondition") {
		t.Fatalf("remove of the leader: %s", stderr)
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
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, p.logs.String())
	}
}
