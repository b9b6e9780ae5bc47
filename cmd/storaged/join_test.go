package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// TestUnlistedMemberJoins: the Helm chart's flow with real processes. Every
// member gets the same --raft-peers (the bootstrap members) and
// --raft-join-unlisted: member 1, listed, ignores it and leads its group;
// member 3, not listed, joins it on --peer-listen, is added as a learner at
// that address, catches up from the leader's log (a message put before it
// was added), is promoted, and acknowledges the next put; its membership
// shows its own peer address.
func TestUnlistedMemberJoins(t *testing.T) {
	p1, p2, p3 := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	bootstrap := []string{"--raft-peers", "1=" + p1 + ",2=" + p2, "--raft-tick", "10ms", "--raft-election-timeout", "100ms",
		"--listen", "127.0.0.1:0", "--metrics-listen", "", "--file-size", "64KiB"}
	// Member 1 leads alone: member 2 is a learner that never runs.
	boot, err := parseConfig(append([]string{"--raft-id", "1", "--raft-learners", "2"}, bootstrap...), env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cid := boot.Replication.clusterID()
	m1 := startProc(t, append([]string{"--raft-id", "1", "--raft-learners", "2", "--raft-join-unlisted", cid,
		"--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, bootstrap...)...)
	if c := m1.logs.waitFor(t, "effective configuration"); c.str("raft_join") != "" {
		t.Fatalf("member 1 (listed) joins %q", c.str("raft_join"))
	}
	l1 := m1.logs.waitFor(t, "listening")
	grpc1, admin1 := l1.str("grpc"), l1.str("admin")
	c1 := storagedv1.NewMessageStoreServiceClient(dial(t, grpc1))
	waitFor(t, "member 1 leads", func() bool {
		ri, err := c1.GetReplicaInfo(t.Context(), &storagedv1.GetReplicaInfoRequest{})
		return err == nil && ri.GetReady() && ri.GetClusterId() == cid
	})
	put := func(body string) {
		t.Helper()
		resp, err := c1.PutMessage(t.Context(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "grow", QueueId: 0, Body: []byte(body)}})
		if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("put %s: %v %v", body, resp, err)
		}
	}
	put("before")

	m3 := startProc(t, append([]string{"--raft-id", "3", "--raft-join-unlisted", cid, "--peer-listen", p3,
		"--data-dir", t.TempDir()}, bootstrap...)...)
	if c := m3.logs.waitFor(t, "effective configuration"); c.str("raft_join") != cid {
		t.Fatalf("member 3 (not listed) joins %q, want %s", c.str("raft_join"), cid)
	}
	grpc3 := m3.logs.waitFor(t, "listening").str("grpc")
	if tr := m3.logs.waitFor(t, "peer transport listening"); tr.str("cluster_id") != cid || tr.str("peer") != p3 {
		t.Fatalf("member 3's transport: %v", tr)
	}
	c3 := storagedv1.NewMessageStoreServiceClient(dial(t, grpc3))

	replica := func(args ...string) (membersOutput, string, int) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := runReplica(args, env(), &stdout, &stderr)
		var out membersOutput
		if code == exitOK {
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("storaged replica %v: %q: %v", args, stdout.String(), err)
			}
		}
		return out, stderr.String(), code
	}
	if _, stderr, code := replica("add", "--addr", admin1, "--id", "3", "--peer-addr", p3); code != exitOK {
		t.Fatalf("add: exit %d: %s", code, stderr)
	}
	waitFor(t, "member 3 promoted", func() bool {
		_, stderr, code := replica("promote", "--addr", admin1, "--id", "3")
		if code != exitOK && !strings.Contains(stderr, "LEARNER_BEHIND") {
			t.Fatalf("promote: exit %d: %s", code, stderr)
		}
		return code == exitOK
	})
	put("after") // committed by members 1 and 3, the voters now
	waitFor(t, "member 3 holds both messages", func() bool {
		qi, err := c3.GetQueueInfo(t.Context(), &storagedv1.GetQueueInfoRequest{Topic: "grow"})
		return err == nil && qi.GetMaxOffset() == 2
	})
	m, stderr, code := replica("members", "--addr", grpc3)
	if code != exitOK || m.ID != 3 || m.ClusterID != cid || !slices.Equal(m.Voters, []uint64{1, 3}) || m.PeerAddrs[3] != p3 ||
		m.PeerAddrs[1] != p1 {
		t.Fatalf("members on member 3: %+v (exit %d: %s)", m, code, stderr)
	}
	for _, p := range []*proc{m1, m3} {
		p.signal(t, syscall.SIGTERM)
		if code := p.exitCode(t); code != 0 {
			t.Fatalf("exit status %d:\n%s", code, p.logs.String())
		}
	}
}

// waitFor polls cond every 10 ms until it holds, failing after startTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll, deadline := time.NewTicker(10*time.Millisecond), time.After(startTimeout)
	defer poll.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("%s: not within %v", what, startTimeout)
		case <-poll.C:
		}
	}
}
