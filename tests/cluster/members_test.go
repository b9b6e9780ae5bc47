package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// memberGroup is a group whose members serve the admin service at known
// addresses (admin[p]), for membership changes.
type memberGroup struct {
	*group
	admin map[*proctest.Process]string
}

// adminClient dials addr; closed when the test ends.
func adminClient(t *testing.T, addr string) storagedv1.AdminServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return storagedv1.NewAdminServiceClient(conn)
}

// leaderOf waits (60 s at most) for one of ps to be the ready leader.
func leaderOf(t *testing.T, ps []*proctest.Process) *proctest.Process {
	t.Helper()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range ps {
			if !p.Running() {
				continue
			}
			if ri := info(p); ri != nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady() {
				return p
			}
		}
		select {
		case <-deadline:
			t.Fatal("no ready leader within 60 s")
		case <-tick.C:
		}
	}
}

// change sends a membership change to the current leader among ps until
// done(membership) holds: a refusal that changed nothing and will clear
// (UNAVAILABLE: not the leader, leadership moving; ABORTED: a change
// pending; the retry causes) is retried, as is an unknown outcome
// (DEADLINE_EXCEEDED) after reading the membership; anything else fails
// the test. 90 s at most.
func (g *memberGroup) change(t *testing.T, what string, ps []*proctest.Process, retryCauses []string,
	call func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error),
	done func(*storagedv1.ReplicaMembership) bool) *storagedv1.ReplicaMembership {
	t.Helper()
	deadline := time.After(90 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		leader := leaderOf(t, ps)
		if ri := info(leader); ri != nil && done(ri.GetMembership()) {
			return ri.GetMembership()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		m, err := call(ctx, adminClient(t, g.admin[leader]))
		cancel()
		if err == nil {
			if !done(m) {
				t.Fatalf("%s: answered %v", what, m)
			}
			return m
		}
		last = err
		st := status.Convert(err)
		cause := ""
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				cause = info.GetMetadata()["cause"]
			}
		}
		switch {
		case st.Code() == codes.Unavailable, st.Code() == codes.Aborted, st.Code() == codes.DeadlineExceeded:
		case st.Code() == codes.FailedPrecondition && slices.Contains(retryCauses, cause):
		default:
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-deadline:
			t.Fatalf("%s: not done within 90 s; last answer %v", what, last)
		case <-tick.C:
		}
	}
}

// newMemberGroup starts a group of 3 whose members serve the admin
// service too (at three free ports).
func newMemberGroup(t *testing.T) *memberGroup {
	t.Helper()
	admins := freePorts(t, 3)
	g := &memberGroup{group: newGroupWith(t, 3, 1, func(id int) []string {
		return []string{"--admin-listen", admins[id-1]}
	}), admin: map[*proctest.Process]string{}}
	for i, p := range g.nodes {
		g.admin[p] = admins[i]
	}
	return g
}

// TestGroupReplaceMember: the leader of a group of 3 is replaced by a new
// member 4 under write load: member 4 starts empty with --raft-join (the
// cluster id GetReplicaInfo shows), is added as a learner, catches up, is
// promoted once caught up, and the leader is removed in one call (it
// hands its leadership over first) and stopped; then the new leader is
// killed with -9. The two survivors elect a leader, writes resume, and
// every acknowledged put is readable on both.
func TestGroupReplaceMember(t *testing.T) {
	g := newMemberGroup(t)
	n1, n2, n3 := g.nodes[0], g.nodes[1], g.nodes[2]
	ports := freePorts(t, 3) // member 4's peer, client and admin listeners
	peer4, client4, admin4 := ports[0], ports[1], ports[2]
	leader := g.Leader(t)
	// The writers know the first three members' client addresses only, as
	// a client configured before the replacement does: they must follow
	// the leadership to member 4 through the refusals' leader hints.
	w := startWritersAt(t, []string{n1.Addr(), n2.Addr(), n3.Addr()}, 4)
	w.waitAcks(t, 50)

	ri := mustReplicaInfo(t, leader)
	cid := ri.GetClusterId()
	if len(cid) != 32 || ri.GetGroup() != "default" || !slices.Equal(ri.GetMembership().GetVoters(), []uint64{1, 2, 3}) {
		t.Fatalf("the leader's replica info: %v", ri)
	}
	var peers []string
	peers = append(peers, "4="+peer4)
	for i, a := range g.peerAddrs {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	n4 := proctest.Start(t, proctest.Options{Binary: binary, Name: "n4", DataDir: filepath.Join(t.TempDir(), "n4"), Listen: client4,
		Flags: []string{"--raft-id", "4", "--raft-join", cid, "--raft-peers", strings.Join(peers, ","), "--peer-listen", peer4,
			"--file-size", "256KiB", "--admin-listen", admin4}})
	g.admin[n4] = admin4
	voters3 := []*proctest.Process{n1, n2, n3}

	g.change(t, "add member 4", voters3, nil, func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
		resp, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: peer4})
		if err == nil && resp.GetClusterId() != cid {
			t.Errorf("AddReplicaMember's cluster id %s, want %s", resp.GetClusterId(), cid)
		}
		return resp.GetMembership(), err
	}, func(m *storagedv1.ReplicaMembership) bool { return slices.Contains(m.GetLearners(), 4) })
	w.waitAcks(t, 50)

	// Caught up: it serves what was acked so far; then the promotion,
	// retried while the leader finds it behind.
	w.mu.Lock()
	ackedSoFar := make(map[int64]string, len(w.acked))
	for k, v := range w.acked {
		ackedSoFar[k] = v
	}
	w.mu.Unlock()
	waitAcked(t, "n4", n4, ackedSoFar)
	if ri := mustReplicaInfo(t, n4); ri.GetRole() != storagedv1.ReplicaRole_REPLICA_ROLE_LEARNER || ri.GetClusterId() != cid {
		t.Fatalf("member 4 while a learner: %v", ri)
	}
	g.change(t, "promote member 4", voters3, []string{"LEARNER_BEHIND"},
		func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
			resp, err := c.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{Id: 4})
			return resp.GetMembership(), err
		}, func(m *storagedv1.ReplicaMembership) bool { return slices.Equal(m.GetVoters(), []uint64{1, 2, 3, 4}) })
	w.waitAcks(t, 50)

	// Remove the leader (one of the first three): it hands its leadership
	// over and has the new leader propose its removal, in one call. (Were
	// member 4 leading already, member 3 goes.)
	all := []*proctest.Process{n1, n2, n3, n4}
	names := map[*proctest.Process]string{n1: "n1", n2: "n2", n3: "n3", n4: "n4"}
	ids := map[*proctest.Process]uint64{n1: 1, n2: 2, n3: 3, n4: 4}
	victim := leaderOf(t, all)
	if victim == n4 {
		victim = n3
	}
	t.Logf("removing %s (leader %s)", names[victim], names[leaderOf(t, all)])
	survivors := slices.DeleteFunc(slices.Clone(all), func(p *proctest.Process) bool { return p == victim })
	var wantVoters []uint64
	for _, p := range survivors {
		wantVoters = append(wantVoters, ids[p])
	}
	m := g.change(t, "remove "+names[victim], all, nil,
		func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
			resp, err := c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: ids[victim]})
			return resp.GetMembership(), err
		}, func(m *storagedv1.ReplicaMembership) bool {
			return slices.Equal(m.GetVoters(), wantVoters) && slices.Contains(m.GetRemoved(), ids[victim])
		})
	if m.GetPeerAddrs()[4] != peer4 {
		t.Errorf("membership after the removal: %v, want member 4 at %s", m, peer4)
	}
	if ri := info(victim); ri != nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER {
		t.Fatalf("the removed %s still leads: %v", names[victim], ri)
	}
	victim.Kill(t)
	w.waitAcks(t, 50)

	// kill -9 the leader: two of the three voters remain.
	dead := leaderOf(t, survivors)
	dead.Kill(t)
	survivors = slices.DeleteFunc(survivors, func(p *proctest.Process) bool { return p == dead })
	t.Logf("killed the leader %s; %s leads now", names[dead], names[leaderOf(t, survivors)])
	w.waitAcks(t, 50)
	w.close()
	if len(w.bad) > 0 {
		t.Fatalf("unexpected put answers: %v", w.bad)
	}
	for _, p := range survivors {
		waitAcked(t, names[p], p, w.acked)
	}
	t.Logf("acked %d, unknown outcome %d (e.g. %v), refused (nothing stored) %d", len(w.acked), w.unknown, w.unknowns, w.refused)
}

// TestGroupMemberMissedLeader: member 1 of a group of 3 is down while
// members 4 and 5 join and are promoted and members 2 and 3 are removed,
// so the group's leader (4 or 5) is a member that 1, restarted with its
// old membership, has never heard of. 1 takes that leader's heartbeats
// and appends all the same (the peer transport admits it as a stranger
// that names its address, raft steps a leader's messages from a member
// not removed), catches up with the membership it missed, and serves
// every put acked while it was down. Before, it refused the leader
// ("not a member") and campaigned alone for ever.
func TestGroupMemberMissedLeader(t *testing.T) { missedLeader(t, false) }

// TestGroupMemberMissedLeaderVotes is TestGroupMemberMissedLeader with the
// leader paused (SIGSTOP) while member 1 restarts: the other of 4 and 5
// can then be elected only with the vote of member 1, which has heard of
// neither; 1 grants it (a candidate's vote request from a member not
// removed is stepped like a leader's messages), follows it and catches
// up, and writes go on before the old leader is resumed.
func TestGroupMemberMissedLeaderVotes(t *testing.T) { missedLeader(t, true) }

func missedLeader(t *testing.T, pauseLeader bool) {
	g := newMemberGroup(t)
	n1, n2, n3 := g.nodes[0], g.nodes[1], g.nodes[2]
	ports := freePorts(t, 6) // members 4 and 5: peer, client and admin each
	cid := mustReplicaInfo(t, g.Leader(t)).GetClusterId()
	// The writers know every client address the test will use (members
	// 4 and 5 answer once started), so that they find the new leader
	// while the old one is paused, when no member it knows can name it.
	w := startWritersAt(t, []string{n1.Addr(), n2.Addr(), n3.Addr(), ports[1], ports[4]}, 4)
	w.waitAcks(t, 50)
	n1.Kill(t)
	t.Log("member 1 killed")
	w.waitAcks(t, 50)

	alive := []*proctest.Process{n2, n3}
	for k, id := range []uint64{4, 5} {
		peer, client, admin := ports[3*k], ports[1+3*k], ports[2+3*k]
		peers := []string{fmt.Sprintf("%d=%s", id, peer)}
		for i, a := range g.peerAddrs {
			peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
		}
		name := fmt.Sprintf("n%d", id)
		p := proctest.Start(t, proctest.Options{Binary: binary, Name: name, DataDir: filepath.Join(t.TempDir(), name), Listen: client,
			Flags: []string{"--raft-id", fmt.Sprint(id), "--raft-join", cid, "--raft-peers", strings.Join(peers, ","), "--peer-listen", peer,
				"--file-size", "256KiB", "--admin-listen", admin}})
		g.admin[p] = admin
		g.names[p] = name
		g.change(t, "add member "+name, alive, nil, func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
			resp, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: id, PeerAddr: peer})
			return resp.GetMembership(), err
		}, func(m *storagedv1.ReplicaMembership) bool { return slices.Contains(m.GetLearners(), id) })
		g.change(t, "promote member "+name, alive, []string{"LEARNER_BEHIND"},
			func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
				resp, err := c.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{Id: id})
				return resp.GetMembership(), err
			}, func(m *storagedv1.ReplicaMembership) bool { return slices.Contains(m.GetVoters(), id) })
		alive = append(alive, p)
		w.waitAcks(t, 20)
	}
	// Members 2 and 3 go: a removed leader hands its leadership over first.
	for _, id := range []uint64{2, 3} {
		victim := g.nodes[id-1]
		g.change(t, fmt.Sprintf("remove member %d", id), alive, nil,
			func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
				resp, err := c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: id})
				return resp.GetMembership(), err
			}, func(m *storagedv1.ReplicaMembership) bool { return slices.Contains(m.GetRemoved(), id) })
		alive = slices.DeleteFunc(alive, func(p *proctest.Process) bool { return p == victim })
		victim.Kill(t)
		w.waitAcks(t, 20)
	}
	leader := leaderOf(t, alive)
	lri := mustReplicaInfo(t, leader)
	if id := lri.GetId(); id != 4 && id != 5 || !slices.Equal(lri.GetMembership().GetVoters(), []uint64{1, 4, 5}) {
		t.Fatalf("the leader after the changes: %v", lri)
	}
	w.waitAcks(t, 50) // under a leader member 1 has not heard of

	if pauseLeader {
		other := alive[0]
		if other == leader {
			other = alive[1]
		}
		leader.Pause(t)
		restart := n1.Restart(t)
		start := time.Now()
		if got := leaderOf(t, []*proctest.Process{other, n1}); got != other {
			t.Fatalf("%s leads with %s paused, want %s", g.names[got], g.names[leader], g.names[other])
		}
		elected := time.Since(start)
		// A put to it is acknowledged on {1, other}: a quorum that needs
		// member 1. (The writers' puts in flight to the paused leader
		// wait for their deadline.)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err := storagedv1.NewMessageStoreServiceClient(other.Conn()).PutMessage(ctx,
			&storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Group", Body: []byte("while paused")}})
		cancel()
		if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("a put to %s, leading with member 1's vote: %v %v", g.names[other], resp, err)
		}
		w.mu.Lock()
		w.acked[resp.GetResult().GetQueueOffset()] = "while paused"
		w.mu.Unlock()
		t.Logf("%s paused; member 1 restarted in %v, %s a ready leader %v later (with member 1's vote), a put acked %v later",
			g.names[leader], restart, g.names[other], elected, time.Since(start)-elected)
		leader.Resume(t)
	} else {
		restart := n1.Restart(t)
		t.Logf("member 1 restarted in %v", restart)
	}
	w.waitAcks(t, 50) // member 1 is a voter: a quorum of 2 of {1, 4, 5} may now include it
	w.close()
	if len(w.bad) > 0 {
		t.Fatalf("unexpected put answers: %v", w.bad)
	}
	waitAcked(t, "n1", n1, w.acked)
	ri := mustReplicaInfo(t, n1)
	if ri.GetLeaderId() != 4 && ri.GetLeaderId() != 5 ||
		!slices.Equal(ri.GetMembership().GetVoters(), []uint64{1, 4, 5}) || len(ri.GetMembership().GetRemoved()) != 2 {
		t.Fatalf("member 1 after its restart: %v", ri)
	}
	for _, p := range alive {
		waitAcked(t, g.names[p], p, w.acked)
	}
	t.Logf("member 1 caught up with leader %d; acked %d, unknown outcome %d, refused (nothing stored) %d",
		ri.GetLeaderId(), len(w.acked), w.unknown, w.refused)
}
