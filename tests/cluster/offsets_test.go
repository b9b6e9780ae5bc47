package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// commitTo commits group's offset of queue q of the test topic on p.
func commitTo(p *proctest.Process, group string, q int32, off int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).CommitOffset(ctx, &storagedv1.CommitOffsetRequest{
		ConsumerGroup: group, Topic: "Group", QueueId: q, Offset: off})
	return err
}

// commitRetrying commits on p, again while p answers UNAVAILABLE or an
// unknown outcome (a new leader refuses with IN_SYNC_REPLICAS_NOT_ENOUGH
// until it hears from its followers; a commit is idempotent), for 30 s.
func commitRetrying(t *testing.T, p *proctest.Process, group string, q int32, off int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := commitTo(p, group, q, off)
		if err == nil {
			return
		}
		if c := status.Code(err); (c != codes.Unavailable && c != codes.DeadlineExceeded) || time.Now().After(deadline) {
			t.Fatalf("commit %s = %d: %v", group, off, err)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// offsetOn is group's committed offset of queue q on p (linearizable: the
// leader after its quorum check).
func offsetOn(p *proctest.Process, group string, q int32, linearizable bool) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).GetOffset(ctx, &storagedv1.GetOffsetRequest{
		ConsumerGroup: group, Topic: "Group", QueueId: q, Linearizable: linearizable})
	return resp.GetOffset(), err
}

// waitOffsets polls member p until it serves every committed offset in
// want (a follower applies a commit once it learns it committed).
func waitOffsets(t *testing.T, name string, p *proctest.Process, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var bad string
		for group, w := range want {
			if got, err := offsetOn(p, group, 0, false); err != nil || got != w {
				bad = fmt.Sprintf("group %s: %d, %v; want %d", group, got, err, w)
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after 30 s, %s", name, bad)
		}
		<-tick.C
	}
}

// TestGroupOffsetsFailover: consumer offsets committed on the leader of a
// group of three storaged processes are acknowledged once committed on a
// majority; a follower refuses a commit naming the leader and serves the
// committed offsets; after kill -9 of the leader the new leader and the
// other follower serve every acknowledged commit and the new leader takes
// more; the killed member comes back with the same offsets.
func TestGroupOffsetsFailover(t *testing.T) {
	g := newGroup(t)
	leader := g.Leader(t)
	for k := range 30 {
		if _, err := putTo(leader, fmt.Sprintf("m-%d", k)); err != nil {
			t.Fatalf("put %d: %v", k, err)
		}
	}
	want := map[string]int64{}
	for k := range 20 {
		group := fmt.Sprintf("cg%d", k%4)
		off := int64(k + 1)
		if err := commitTo(leader, group, 0, off); err != nil {
			t.Fatalf("commit %s = %d on the leader %s: %v", group, off, g.Name(leader), err)
		}
		want[group] = off
	}
	for group, w := range want {
		if got, err := offsetOn(leader, group, 0, true); err != nil || got != w {
			t.Fatalf("linearizable GetOffset %s on the leader: %d, %v; want %d", group, got, err, w)
		}
	}

	var follower *proctest.Process
	for _, p := range g.nodes {
		if p != leader {
			follower = p
			break
		}
	}
	err := commitTo(follower, "cg0", 0, 1)
	st := status.Convert(err)
	var ei *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			ei = i
		}
	}
	if st.Code() != codes.Unavailable || ei.GetMetadata()["cause"] != "NOT_LEADER" || ei.GetMetadata()["leader_addr"] != leader.Addr() {
		t.Fatalf("commit on follower %s: %v (%v), want UNAVAILABLE, NOT_LEADER, leader_addr %s", g.Name(follower), err, ei, leader.Addr())
	}
	for _, p := range g.nodes {
		waitOffsets(t, g.Name(p), p, want)
	}

	leader.Kill(t)
	newLeader := g.Leader(t)
	if newLeader == leader {
		t.Fatal("the killed node is the leader")
	}
	for _, p := range g.nodes {
		if p != leader {
			waitOffsets(t, g.Name(p), p, want)
		}
	}
	commitRetrying(t, newLeader, "cg0", 0, 30)
	want["cg0"] = 30
	if got, err := offsetOn(newLeader, "cg0", 0, true); err != nil || got != 30 {
		t.Fatalf("linearizable GetOffset on the new leader: %d, %v; want 30", got, err)
	}

	g.Heal(t)
	for _, p := range g.nodes {
		waitOffsets(t, g.Name(p), p, want)
	}
}
