package cluster

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/storaged/storaged/internal/proctest"
)

// TestGroupEmptyDirFollower (issue 14): a follower restarted with an
// empty data dir has forgotten its votes and its log, the entries it
// acknowledged among them. It starts as a joining member (it withholds
// its vote from candidates with a log until it has caught up; the storage
// test TestGroupWipedFollowerWithholdsVote shows why), the leader, whose
// match index for it is stale, hands leadership on so that a new leader
// catches it up from index 1; the group keeps taking puts, nothing
// acknowledged is lost, no member serves a wrong body, and the member
// does not crash (etcd-raft alone panics on the stale leader's heartbeat).
func TestGroupEmptyDirFollower(t *testing.T) {
	g := newGroup(t)
	acked := map[int64]string{}
	rc := newReadCheck() // every background read checked, the wiped member's too
	stopReads := rc.run(g)
	t.Cleanup(func() { stopReads() })
	put := func(body string) { t.Helper(); rc.put(t, g, acked, body) }
	for k := range 30 {
		put(fmt.Sprintf("empty-%04d", k))
	}
	leader := g.Leader(t)
	var follower *proctest.Process
	for _, p := range g.nodes {
		if p != leader {
			follower = p
			break
		}
	}
	name := g.Name(follower)
	waitAcked(t, name, follower, acked)
	follower.Kill(t)
	if err := os.RemoveAll(follower.DataDir()); err != nil {
		t.Fatal(err)
	}
	follower.Restart(t)
	for k := 30; k < 40; k++ {
		put(fmt.Sprintf("empty-%04d", k))
	}
	for _, p := range g.nodes {
		waitAcked(t, g.Name(p), p, acked)
		noWrongRead(t, g.Name(p), p, acked)
	}
	if reads, bad := stopReads(); bad != "" {
		t.Fatal(bad)
	} else if reads == 0 {
		t.Fatal("the background reader read nothing")
	}
	if !follower.Running() {
		t.Fatalf("%s exited after rejoining empty", name)
	}
	if b, err := os.ReadFile(follower.StderrPath()); err != nil || !bytes.Contains(b, []byte("caught up with the leader")) {
		t.Fatalf("%s never logged catching up (%v)", name, err)
	}
}
