package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// TestGroupTransferLeadership: an operator moves the leadership of a
// group of 3 under write load to a follower they choose, once through the
// admin RPC (TransferReplicaLeadership) and once through the CLI
// (`storaged replica transfer`): the answer names the new leader and its
// client address, every member's GetReplicaInfo names it, puts are
// acknowledged by it, and every acked put is readable on every member. A
// follower asked answers NOT_LEADER with the leader's address, and a move
// to an id that is no member is refused (NOT_VOTER), the leader unmoved.
func TestGroupTransferLeadership(t *testing.T) {
	g := newMemberGroup(t)
	id := map[*proctest.Process]uint64{}
	for i, p := range g.nodes {
		id[p] = uint64(i + 1)
	}
	w := startWriters(t, g.group, 4)
	w.waitAcks(t, 50)

	// Through the admin RPC, to a follower.
	leader := g.Leader(t)
	to := g.follower(leader, nil)
	moveOnce(t, fmt.Sprintf("move %s -> %s", g.names[leader], g.names[to]), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := adminClient(t, g.admin[g.Leader(t)]).TransferReplicaLeadership(ctx,
			&storagedv1.TransferReplicaLeadershipRequest{Id: id[to]})
		if err == nil && (resp.GetLeaderId() != id[to] || resp.GetLeaderAddr() != to.Addr() || len(resp.GetMembership().GetVoters()) != 3) {
			t.Fatalf("TransferReplicaLeadership(%d) answered %v, want member %d at %s", id[to], resp, id[to], to.Addr())
		}
		return err
	})
	g.ledBy(t, to, id[to])
	w.waitAcks(t, 50)
	if w.tr.Leader() != to.Addr() {
		t.Fatalf("the writers put to %s, want the new leader %s", w.tr.Leader(), to.Addr())
	}
	if _, err := putTo(to, "to the new leader"); err != nil {
		t.Fatalf("a put to the new leader %s: %v", g.names[to], err)
	}

	// A follower (the old leader) answers NOT_LEADER naming the leader.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := adminClient(t, g.admin[leader]).TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: id[leader]})
	if md := errorInfo(err); status.Code(err) != codes.Unavailable || md["cause"] != "NOT_LEADER" || md["leader_addr"] != to.Addr() {
		t.Fatalf("a transfer asked of follower %s: %v (%v), want UNAVAILABLE, NOT_LEADER, leader_addr %s", g.names[leader], err, md, to.Addr())
	}
	// A member id that is no member.
	_, err = adminClient(t, g.admin[to]).TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: 9})
	if md := errorInfo(err); status.Code(err) != codes.FailedPrecondition || md["cause"] != "NOT_VOTER" {
		t.Fatalf("a transfer to id 9: %v (%v), want FAILED_PRECONDITION, NOT_VOTER", err, md)
	}
	if ri := mustReplicaInfo(t, to); ri.GetRole() != storagedv1.ReplicaRole_REPLICA_ROLE_LEADER || !ri.GetReady() {
		t.Fatalf("after the refused transfer %s is %v", g.names[to], ri)
	}

	// Through the CLI, to the member that led neither time.
	next := g.follower(to, leader)
	moveOnce(t, fmt.Sprintf("storaged replica transfer %s -> %s", g.names[to], g.names[next]), func() error {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(binary, "replica", "transfer", "--addr", g.admin[g.Leader(t)], "--id", fmt.Sprint(id[next]))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, stderr.String())
		}
		var out struct {
			LeaderID   uint64 `json:"leader_id"`
			LeaderAddr string `json:"leader_addr"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || out.LeaderID != id[next] || out.LeaderAddr != next.Addr() {
			t.Fatalf("storaged replica transfer printed %s (%v), want leader %d at %s", stdout.String(), err, id[next], next.Addr())
		}
		return nil
	})
	g.ledBy(t, next, id[next])
	w.waitAcks(t, 50)
	w.close()
	if len(w.bad) > 0 {
		t.Fatalf("unexpected put answers: %v", w.bad)
	}
	for _, p := range g.nodes {
		waitAcked(t, g.names[p], p, w.acked)
	}
	t.Logf("acked %d, unknown outcome %d (e.g. %v), refused (nothing stored) %d", len(w.acked), w.unknown, w.unknowns, w.refused)
}

// moveOnce runs a move until it succeeds: an answer UNAVAILABLE (the
// leader gave the transfer up in time, TRANSFER_TIMEOUT, or an election
// moved it meanwhile) is tried again, 5 times at most; anything else
// fails the test.
func moveOnce(t *testing.T, what string, move func() error) {
	t.Helper()
	var err error
	for range 5 {
		if err = move(); err == nil {
			return
		}
		if status.Code(err) != codes.Unavailable && !strings.Contains(err.Error(), "Unavailable") {
			break
		}
		t.Logf("%s: %v; again", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}

// follower is a member other than leader and not, unless it must be, avoid.
func (g *memberGroup) follower(leader, avoid *proctest.Process) *proctest.Process {
	var pick *proctest.Process
	for _, p := range g.nodes {
		if p != leader && (pick == nil || pick == avoid) {
			pick = p
		}
	}
	return pick
}

// ledBy waits (60 s at most) until p is the ready leader and every member
// names it (id) in GetReplicaInfo.
func (g *memberGroup) ledBy(t *testing.T, p *proctest.Process, id uint64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for _, q := range g.nodes {
			ri := info(q)
			ok = ok && ri != nil && ri.GetLeaderId() == id && (q != p || ri.GetReady())
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every member names %s (%d) the leader within 60 s", g.names[p], id)
		}
		<-tick.C
	}
}

// errorInfo is the metadata of err's google.rpc.ErrorInfo (nil: none).
func errorInfo(err error) map[string]string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()
		}
	}
	return nil
}

// moveLeader makes p the group's ready leader: TransferReplicaLeadership
// on the leader's admin listener, unless p leads already.
func (g *memberGroup) moveLeader(t *testing.T, p *proctest.Process) {
	t.Helper()
	id := uint64(g.idOf(p))
	if g.Leader(t) != p {
		moveOnce(t, "move to "+g.names[p], func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := adminClient(t, g.admin[g.Leader(t)]).TransferReplicaLeadership(ctx,
				&storagedv1.TransferReplicaLeadershipRequest{Id: id})
			return err
		})
	}
	g.ledBy(t, p, id)
}
