package cluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/nemesis"
	"github.com/storaged/storaged/internal/proctest"
)

// group is the Fixture of a 3-member replication group: three storaged
// processes on 127.0.0.1 with --raft-peers, each with its own data dir.
// Clients dial the nodes directly (no client proxies yet), and peer links
// have no proxies yet either: Proxy returns nil.
type group struct {
	nodes     []*proctest.Process
	names     map[*proctest.Process]string
	peerAddrs []string // the members' --raft-peers addresses, by id-1
}

// freePorts reserves n loopback ports for the peer listeners (listen on
// :0, note the port, close). The members must know each other's addresses
// before any starts.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return addrs
}

func newGroup(t *testing.T, flags ...string) *group {
	t.Helper()
	peerAddrs := freePorts(t, 3)
	var peers []string
	for i, a := range peerAddrs {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	g := &group{names: map[*proctest.Process]string{}, peerAddrs: peerAddrs}
	dir := t.TempDir()
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		p := proctest.Start(t, proctest.Options{Binary: binary, Name: name, DataDir: filepath.Join(dir, name),
			Flags: append([]string{"--raft-id", fmt.Sprint(i + 1), "--raft-peers", strings.Join(peers, ","),
				"--file-size", "256KiB"}, flags...)})
		g.nodes = append(g.nodes, p)
		g.names[p] = name
	}
	return g
}

func (g *group) Nodes() []*proctest.Process            { return g.nodes }
func (g *group) Name(p *proctest.Process) string       { return g.names[p] }
func (g *group) ClientAddr(p *proctest.Process) string { return p.Addr() }
func (g *group) Proxy(a, b string) *nemesis.Proxy      { return nil }

// Leader waits (30 s at most) for one running node to report itself the
// ready leader.
func (g *group) Leader(t testing.TB) *proctest.Process {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range g.nodes {
			if !p.Running() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ri, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
			cancel()
			if err == nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady() {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready leader within 30 s")
		}
		<-tick.C
	}
}

func (g *group) Heal(t testing.TB) {
	t.Helper()
	for _, p := range g.nodes {
		if !p.Running() {
			p.Restart(t)
		}
		p.Resume(t)
	}
}

var _ Fixture = (*group)(nil)

// putTo puts one message to p and returns its queue offset, or the error.
func putTo(p *proctest.Process, body string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).PutMessage(ctx, &storagedv1.PutMessageRequest{
		Message: &storagedv1.Message{Topic: "Group", QueueId: 0, Body: []byte(body)}})
	if err != nil {
		return 0, err
	}
	if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		return 0, fmt.Errorf("put status %v", resp.GetStatus())
	}
	return resp.GetResult().GetQueueOffset(), nil
}

// TestGroupFailover: three storaged processes elect a leader; puts to it
// are acknowledged; a follower refuses a put with UNAVAILABLE naming the
// leader's client address; after kill -9 of the leader the other two elect
// a new one that takes puts; every acknowledged message is then readable
// at its offset on the new leader, and on every member once the killed
// one is back.
func TestGroupFailover(t *testing.T) {
	g := newGroup(t)
	leader := g.Leader(t)
	acked := map[int64]string{}
	for k := range 20 {
		body := fmt.Sprintf("first-%d", k)
		off, err := putTo(leader, body)
		if err != nil {
			t.Fatalf("put %d to the leader %s: %v", k, g.Name(leader), err)
		}
		acked[off] = body
	}

	// A follower: UNAVAILABLE, nothing stored, the leader's address.
	var follower *proctest.Process
	for _, p := range g.nodes {
		if p != leader {
			follower = p
			break
		}
	}
	_, err := putTo(follower, "to a follower")
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("put to follower %s: %v, want UNAVAILABLE", g.Name(follower), err)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetReason() != "SERVICE_NOT_AVAILABLE" || info.GetMetadata()["cause"] != "NOT_LEADER" ||
		info.GetMetadata()["leader_addr"] != leader.Addr() {
		t.Fatalf("follower's refusal %v: ErrorInfo %v, want SERVICE_NOT_AVAILABLE, NOT_LEADER, leader_addr %s", err, info, leader.Addr())
	}

	// kill -9 the leader; a new one takes puts.
	leader.Kill(t)
	newLeader := g.Leader(t)
	if newLeader == leader {
		t.Fatal("the killed node is the leader")
	}
	for k := range 20 {
		body := fmt.Sprintf("second-%d", k)
		off, err := putTo(newLeader, body)
		if err != nil {
			t.Fatalf("put %d to the new leader %s: %v", k, g.Name(newLeader), err)
		}
		if prev, dup := acked[off]; dup {
			t.Fatalf("queue offset %d acked twice (%q, then %q)", off, prev, body)
		}
		acked[off] = body
	}
	checkAcked(t, g.Name(newLeader), newLeader, acked)

	// The killed node comes back and catches up.
	g.Heal(t)
	for _, p := range g.nodes {
		waitAcked(t, g.Name(p), p, acked)
	}
}

// readAll pulls queue 0 of the test topic from p.
func readAll(p *proctest.Process) (map[int64]string, error) {
	got := map[int64]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := proctest.PullQueue(ctx, storagedv1.NewMessageStoreServiceClient(p.Conn()), "Group", 0, func(m *storagedv1.StoredMessage) {
		got[m.GetQueueOffset()] = string(m.GetBody())
	})
	return got, err
}

func missing(got, acked map[int64]string) []int64 {
	var miss []int64
	for off, body := range acked {
		if got[off] != body {
			miss = append(miss, off)
		}
	}
	return miss
}

func checkAcked(t *testing.T, name string, p *proctest.Process, acked map[int64]string) {
	t.Helper()
	got, err := readAll(p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if miss := missing(got, acked); len(miss) > 0 {
		t.Fatalf("%s: %d acked messages missing or different, e.g. offset %d", name, len(miss), miss[0])
	}
}

// waitAcked polls a member (a follower learns the commit point from the
// leader's next message) until it serves every acked message.
func waitAcked(t *testing.T, name string, p *proctest.Process, acked map[int64]string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := readAll(p)
		miss := missing(got, acked)
		if err == nil && len(miss) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after 30 s, %d acked messages missing (%v)", name, len(miss), err)
		}
		<-tick.C
	}
}
