package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/nemesis"
	"github.com/storaged/storaged/internal/proctest"
)

// group is the Fixture of a replication group of 3 (or 5) storaged
// processes on 127.0.0.1 with --raft-peers, each with its own data dir.
// Every directed peer link goes through its own nemesis proxy: member i is
// started with a --raft-peers list in which member j's address is the
// proxy i->j, which forwards to j's real --peer-listen. The cluster id
// digests only the member ids and the peer handshake checks ids, group and
// cluster (plus, with TLS, the certificate against the listed host, which
// stays 127.0.0.1), so each member may see its own list of addresses.
// Clients dial the members directly.
type group struct {
	nodes     []*proctest.Process
	names     map[*proctest.Process]string
	peerAddrs []string // the members' real peer listeners, by id-1
	// proxies[i][j] carries member i+1's raft traffic to member j+1
	// (Tx: i's messages; Rx: the stream's acks back); nil for i == j.
	proxies [][]*nemesis.Proxy

	mu  sync.Mutex
	cut map[[2]int]bool // links cut by Cut, reset again by Mend and Heal
}

// freePorts picks n free loopback ports for the members' listeners, which
// must be known before any member starts and are reused across restarts:
// proctest.FreeAddr's, from below the kernel's ephemeral range, so that
// no listener on :0 and no outgoing connection takes one while its member
// is down or not started yet ("address already in use" when they came
// from :0), and handed out once per test binary (two calls of one test,
// a group's admin ports then its client and peer ports, picked the same
// one before).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = proctest.FreeAddr(t)
	}
	return addrs
}

// newGroup starts a group of 3 with proxied peer links.
func newGroup(t *testing.T, flags ...string) *group { return newGroupN(t, 3, 1, flags...) }

// newGroupN starts a group of n members (ids 1..n); seed seeds the
// proxies' delay jitter.
func newGroupN(t *testing.T, n int, seed uint64, flags ...string) *group {
	t.Helper()
	return newGroupWith(t, n, seed, nil, flags...)
}

// newGroupWith is newGroupN with flags for one member: perMember(id).
func newGroupWith(t *testing.T, n int, seed uint64, perMember func(id int) []string, flags ...string) *group {
	t.Helper()
	ports := freePorts(t, 2*n)
	peerAddrs, clientAddrs := ports[:n], ports[n:]
	g := &group{names: map[*proctest.Process]string{}, peerAddrs: peerAddrs, cut: map[[2]int]bool{}}
	g.proxies = make([][]*nemesis.Proxy, n)
	for i := range n {
		g.proxies[i] = make([]*nemesis.Proxy, n)
		for j := range n {
			if i == j {
				continue
			}
			p, err := nemesis.New(nemesis.Options{Target: peerAddrs[j], Seed: seed*1000 + uint64(i*n+j)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			g.proxies[i][j] = p
		}
	}
	member := func(id int) []string {
		if perMember == nil {
			return nil
		}
		return perMember(id)
	}
	dir := t.TempDir()
	for i := range n {
		var peers []string
		for j := range n {
			addr := peerAddrs[j]
			if j != i {
				addr = g.proxies[i][j].Addr()
			}
			peers = append(peers, fmt.Sprintf("%d=%s", j+1, addr))
		}
		name := fmt.Sprintf("n%d", i+1)
		p := proctest.Start(t, proctest.Options{Binary: binary, Name: name, DataDir: filepath.Join(dir, name), Listen: clientAddrs[i],
			Flags: append(append([]string{"--raft-id", fmt.Sprint(i + 1), "--raft-peers", strings.Join(peers, ","),
				"--peer-listen", peerAddrs[i], "--file-size", "256KiB"}, flags...), member(i+1)...)})
		g.nodes = append(g.nodes, p)
		g.names[p] = name
	}
	return g
}

func (g *group) Nodes() []*proctest.Process            { return g.nodes }
func (g *group) Name(p *proctest.Process) string       { return g.names[p] }
func (g *group) ClientAddr(p *proctest.Process) string { return p.Addr() }

// Proxy is the directed peer link from member a to member b (names n1,
// n2, ...); clients have no proxies in a group (nil).
func (g *group) Proxy(a, b string) *nemesis.Proxy {
	i, j := g.index(a), g.index(b)
	if i < 0 || j < 0 || i == j {
		return nil
	}
	return g.proxies[i][j]
}

func (g *group) index(name string) int {
	for i, p := range g.nodes {
		if g.names[p] == name {
			return i
		}
	}
	return -1
}

// Cut drops everything on the directed link from member i to member j
// (indexes into Nodes): i's raft messages no longer reach j, while j's
// still reach i over the link j->i. The proxy blackholes both directions
// of the link's TCP connections (their acks too) and resets the live ones,
// so no connection carries a gap: the proxy drops bytes mid-stream, which
// TCP never does, and a plaintext HTTP/2 stream resumed after a gap would
// parse garbage. Mend resets them again.
func (g *group) Cut(i, j int) {
	p := g.proxies[i][j]
	p.BlackholeTx()
	p.BlackholeRx()
	p.ResetConns()
	g.mu.Lock()
	g.cut[[2]int{i, j}] = true
	g.mu.Unlock()
}

// Mend undoes Cut (and any other fault on the link).
func (g *group) Mend(i, j int) {
	p := g.proxies[i][j]
	p.Heal()
	p.ResetConns()
	g.mu.Lock()
	delete(g.cut, [2]int{i, j})
	g.mu.Unlock()
}

// Partition cuts every link between the two sides, both ways.
func (g *group) Partition(a, b []int) {
	for _, i := range a {
		for _, j := range b {
			g.Cut(i, j)
			g.Cut(j, i)
		}
	}
}

// MendAll mends every cut link.
func (g *group) MendAll() {
	g.mu.Lock()
	var links [][2]int
	for l := range g.cut {
		links = append(links, l)
	}
	g.mu.Unlock()
	for _, l := range links {
		g.Mend(l[0], l[1])
	}
}

// info asks member p for its GetReplicaInfo (nil if it does not answer
// within a second: down, paused, busy).
func info(p *proctest.Process) *storagedv1.GetReplicaInfoResponse {
	conn := p.Conn()
	if conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ri, err := storagedv1.NewMessageStoreServiceClient(conn).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
	if err != nil {
		return nil
	}
	return ri
}

// Leader waits (60 s at most) for one running node to report itself the
// ready leader.
func (g *group) Leader(t testing.TB) *proctest.Process {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range g.nodes {
			if !p.Running() {
				continue
			}
			if ri := info(p); ri != nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady() {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready leader within 60 s")
		}
		<-tick.C
	}
}

// Heal mends every link, resumes paused members and restarts killed ones.
func (g *group) Heal(t testing.TB) {
	t.Helper()
	g.MendAll()
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
	// A linearizable read: the follower refuses it the same way, the
	// leader serves it with every acked put.
	_, err = linearMax(follower)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(fmt.Sprint(st.Details()), leader.Addr()) {
		t.Fatalf("linearizable read on follower %s: %v %v, want UNAVAILABLE naming %s", g.Name(follower), err, st.Details(), leader.Addr())
	}
	if max, err := linearMax(leader); err != nil || max != int64(len(acked)) {
		t.Fatalf("linearizable read on the leader: max %d, %v; want %d", max, err, len(acked))
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
	if max, err := linearMax(newLeader); err != nil || max != int64(len(acked)) {
		t.Fatalf("linearizable read on the new leader: max %d, %v; want %d", max, err, len(acked))
	}

	// The killed node comes back and catches up.
	g.Heal(t)
	for _, p := range g.nodes {
		waitAcked(t, g.Name(p), p, acked)
	}
}

// linearMax is a linearizable GetQueueInfo of queue 0 of the test topic on p.
func linearMax(p *proctest.Process) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qi, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).GetQueueInfo(ctx,
		&storagedv1.GetQueueInfoRequest{Topic: "Group", Linearizable: true})
	return qi.GetMaxOffset(), err
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

// mustReplicaInfo is replicaInfo that fails the test on an error.
func mustReplicaInfo(t *testing.T, p *proctest.Process) *storagedv1.GetReplicaInfoResponse {
	t.Helper()
	ri, err := replicaInfo(p)
	if err != nil {
		t.Fatal(err)
	}
	return ri
}

// TestGroupLearnerProcess: three voters and a learner (--raft-learners 4
// on every member, --raft-learner on the learner): the learner replicates
// and serves every acked message, says it is a learner, refuses puts
// naming the leader's address, and stays a learner when the leader is
// killed and the voters elect another.
func TestGroupLearnerProcess(t *testing.T) {
	g := newGroupWith(t, 4, 1, func(id int) []string {
		if id == 4 {
			return []string{"--raft-learner"}
		}
		return nil
	}, "--raft-learners", "4")
	learner := g.nodes[3]
	var addrs []string
	for _, p := range g.nodes {
		addrs = append(addrs, p.Addr())
	}
	tr, err := client.New(client.Options{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	acked := map[int64]string{}
	for round := range 2 {
		// Through the tracker: a new leader may refuse a put before it
		// has heard from its followers (nothing stored, retried); the
		// first put after the kill may still go to the dead leader, whose
		// connection looked up, and end unknown (not counted as acked).
		for k, unknown := 0, 0; k < 20; {
			body := fmt.Sprintf("r%d-%d-%d", round, k, unknown)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			resp, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Group", Body: []byte(body)}})
			cancel()
			switch {
			case err == nil && resp.GetStatus() == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
				acked[resp.GetResult().GetQueueOffset()] = body
				k++
			case err != nil && !client.Classify(err).NothingStored && unknown < 3:
				unknown++
			default:
				t.Fatalf("put %s: %v %v", body, resp.GetStatus(), err)
			}
		}
		leader := g.Leader(t)
		if leader == learner || tr.Leader() != leader.Addr() {
			t.Fatalf("the leader is %s, the tracker sends to %s (the learner is %s)", leader.Addr(), tr.Leader(), learner.Addr())
		}
		waitAcked(t, "learner", learner, acked)
		ri := mustReplicaInfo(t, learner)
		if ri.GetRole() != storagedv1.ReplicaRole_REPLICA_ROLE_LEARNER || ri.GetLeaderAddr() != leader.Addr() {
			t.Fatalf("learner's replica info: %v, want LEARNER naming %s", ri, leader.Addr())
		}
		var learnerSeen bool
		for _, pr := range mustReplicaInfo(t, leader).GetPeers() {
			learnerSeen = learnerSeen || (pr.GetId() == 4 && pr.GetLearner())
		}
		if !learnerSeen {
			t.Fatalf("the leader's progress does not list member 4 as a learner: %v", mustReplicaInfo(t, leader).GetPeers())
		}
		_, err = putTo(learner, "to the learner")
		if v := client.Classify(err); !v.NothingStored || v.Cause != "NOT_LEADER" || v.LeaderAddr != leader.Addr() {
			t.Fatalf("put to the learner: %v, want NOT_LEADER naming %s", err, leader.Addr())
		}
		if round == 0 {
			leader.Kill(t) // two voters of three remain: a quorum
		}
	}
	g.Heal(t)
	for _, p := range g.nodes {
		waitAcked(t, g.Name(p), p, acked)
	}
}
