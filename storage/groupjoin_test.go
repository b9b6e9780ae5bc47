package storage

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
)

// TestGroupWipedFollowerWithholdsVote (issue 14): entries committed by
// members 1 and 2 while 3 was cut off; member 2's data dir is then wiped
// and member 1 stopped. Member 2 comes back empty: it has forgotten the
// entries it acknowledged, so with 3 alone it must not elect 3, whose log
// lacks them (an empty log would vote for any candidate). Member 2
// withholds its vote, no leader is elected, nothing committed is lost; once
// member 1 is back, the group elects a leader holding every acknowledged
// put, member 2 catches up and votes again, and all three serve every put.
func TestGroupWipedFollowerWithholdsVote(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	// A new group's members join at its first entries.
	g.poll("members 2 and 3 caught up", func() bool {
		return !g.m[2].s.ReplicaInfo().Joining && !g.m[3].s.ReplicaInfo().Joining
	}, 1)
	g.net.setCut(3, true)
	want := map[int64]string{}
	for i := range 10 {
		body := fmt.Sprintf("w-%d", i)
		res, err := g.put(1, body)
		if err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
		want[res.Append.QueueOffset] = body
	}
	g.converge(1, 1, 2)

	g.closeMember(2)
	if err := os.RemoveAll(g.m[2].opts.Dir); err != nil {
		t.Fatal(err)
	}
	g.closeMember(1)
	g.open(2)
	if info := g.m[2].s.ReplicaInfo(); !info.Joining {
		t.Fatalf("member 2 reopened empty is not joining: %+v", info)
	}
	g.net.setCut(3, false)
	// Member 3 campaigns again and again; member 2 drops its requests.
	g.poll("member 2 withholding its vote from 3 several times", func() bool {
		if g.m[3].s.ReplicaInfo().Role == "leader" || g.m[2].s.ReplicaInfo().Role == "leader" {
			t.Fatal("a leader was elected without member 1, whose log alone holds the committed puts")
		}
		return g.m[2].s.ReplicaInfo().VotesWithheld >= 5
	}, 2, 3)
	if info := g.m[2].s.ReplicaInfo(); !info.Joining {
		t.Fatalf("member 2 stopped joining without a leader: %+v", info)
	}

	g.open(1)
	var leader uint64
	g.poll("a ready leader", func() bool { leader = g.readyLeader(1, 2, 3); return leader != 0 }, 1, 2, 3)
	if leader != 1 {
		t.Fatalf("member %d leads; only member 1 holds the committed puts", leader)
	}
	res, err := g.put(leader, "after")
	if err != nil || res.Status != PutOK {
		t.Fatalf("put after the heal: %v %v", res.Status, err)
	}
	want[res.Append.QueueOffset] = "after"
	g.converge(leader, 1, 2, 3)
	g.checkQueue(want, int64(len(want)), 1, 2, 3)
	// The raft loop clears joining at the end of the Ready whose entries
	// caught it up, after that Ready's Sync: the queue it applied first
	// may be visible a moment before.
	g.poll("member 2 to stop joining once caught up", func() bool { return !g.m[2].s.ReplicaInfo().Joining })
	// The marker is gone for good: a restart does not make it join again.
	g.closeMember(2)
	g.open(2)
	if info := g.m[2].s.ReplicaInfo(); info.Joining {
		t.Fatalf("member 2 joining again after a restart: %+v", info)
	}
}

// TestGroupWipedFollowerRejoins: a follower wiped while the leader keeps
// its old match index (raft never moves one back, so that leader could
// never catch it up) rejoins: the leader sees the rejection below the
// match, hands leadership to the other follower, whose fresh progress
// catches the wiped member up from index 1; nothing acknowledged is lost
// and the member stops joining.
func TestGroupWipedFollowerRejoins(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	want := map[int64]string{}
	put := func(body string) {
		t.Helper()
		var res PutResult
		var err error
		g.poll("a put acknowledged", func() bool {
			leader := g.readyLeader(1, 2, 3)
			if leader == 0 {
				return false
			}
			res, err = g.put(leader, body)
			return err == nil
		}, 1, 2, 3)
		if res.Status != PutOK {
			t.Fatalf("put %q: %v %v", body, res.Status, err)
		}
		want[res.Append.QueueOffset] = body
	}
	for i := range 10 {
		put(fmt.Sprintf("r-%d", i))
	}
	g.converge(1, 1, 2, 3)
	g.closeMember(2)
	if err := os.RemoveAll(g.m[2].opts.Dir); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	put("after the wipe")
	var leader uint64
	g.poll("member 2 caught up", func() bool {
		leader = g.readyLeader(1, 2, 3)
		return leader != 0 && !g.m[2].s.ReplicaInfo().Joining && g.m[2].s.ReplicaInfo().CommitEnd == g.m[leader].s.ReplicaInfo().CommitEnd
	}, 1, 2, 3)
	if leader == 1 {
		t.Fatal("member 1 still leads: it kept member 2's stale match and could not have caught it up")
	}
	g.converge(leader, 1, 2, 3)
	g.checkQueue(want, int64(len(want)), 1, 2, 3)
}

// TestGroupRolledBackFollowerStops: a follower whose data dir is put back
// to an older copy (a restored backup) holds fewer entries than its leader
// counts as acknowledged; the leader's heartbeat reveals it and the
// replica stops with ErrLostEntries instead of voting or serving with
// that log (etcd-raft alone would panic).
func TestGroupRolledBackFollowerStops(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	for i := range 5 {
		if res, err := g.put(1, fmt.Sprintf("a-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put: %v %v", res.Status, err)
		}
	}
	g.converge(1, 1, 2, 3)
	g.closeMember(2)
	backup := t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(g.m[2].opts.Dir)); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	for i := range 5 {
		if res, err := g.put(1, fmt.Sprintf("b-%d", i)); err != nil || res.Status != PutOK {
			t.Fatalf("put: %v %v", res.Status, err)
		}
	}
	g.converge(1, 1, 2, 3)
	g.closeMember(2)
	if err := os.RemoveAll(g.m[2].opts.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(g.m[2].opts.Dir, os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	g.open(2)
	g.poll("member 2 stopped on its lost entries", func() bool { return errors.Is(g.m[2].s.WriteErr(), ErrLostEntries) }, 1, 2)
	if res, err := g.put(1, "c"); err != nil || res.Status != PutOK {
		t.Fatalf("the group (1 and 3) stopped taking puts: %v %v", res.Status, err)
	}
	// Its close reports the sticky error; the cleanup must not.
	g.net.setStore(2, nil)
	if err := g.m[2].s.Close(); !errors.Is(err, ErrLostEntries) {
		t.Fatalf("close of the stopped member: %v", err)
	}
	g.m[2].s = nil
}

// TestGroupOfflineToolsKeepUncommitted: on a group member's data dir the
// standalone cut (Repair --truncate-at) is refused, and a rebuilt
// checkpoint calls flushed only the raft log's commit end, not the end of
// the valid commitlog: an uncommitted entry the member holds may still be
// truncated by the next leader, and a flushed offset past it would make
// the next start call that truncation damage.
func TestGroupOfflineToolsKeepUncommitted(t *testing.T) {
	g := newTestGroup(t, 200*time.Millisecond)
	g.elect(1)
	g.putOK(1, "committed")
	g.converge(1, 1, 2, 3)
	committedEnd := g.m[1].s.ReplicaInfo().CommitEnd
	g.net.setCut(1, true)
	if res, err := g.put(1, "never committed"); !errors.Is(err, ErrReplicationTimeout) {
		t.Fatalf("put on the cut-off leader: %v %v", res.Status, err)
	}
	g.closeMember(1)
	opts := g.m[1].opts
	opts.Group = nil // what the offline tools see: flags only
	if err := Repair(opts, committedEnd); !errors.Is(err, ErrGroupUnsupported) {
		t.Fatalf("Repair --truncate-at on a member's dir: %v", err)
	}
	rep, err := Check(opts)
	if err != nil || rep.End <= committedEnd {
		t.Fatalf("check: %+v %v; want the uncommitted entry past %d", rep, err, committedEnd)
	}
	if _, err := RebuildCheckpoint(opts); err != nil {
		t.Fatal(err)
	}
	cp, _, err := consumequeue.ReadCheckpoint(opts.withDefaults().FS, opts.Dir)
	if err != nil || cp.Flushed != committedEnd {
		t.Fatalf("rebuilt checkpoint flushed %d (%v), want the commit end %d (the valid log ends at %d)", cp.Flushed, err, committedEnd, rep.End)
	}
	// Members 2 and 3 elect, commit over the entry; member 1 comes back,
	// truncates it, and starts again afterwards.
	var leader uint64
	g.poll("a leader among 2 and 3", func() bool { leader = g.readyLeader(2, 3); return leader != 0 }, 2, 3)
	g.putOK(leader, "new")
	g.open(1)
	g.net.setCut(1, false)
	end := g.converge(leader, 1, 2, 3)
	g.sameBytes(end, 1, 2, 3)
	g.closeMember(1)
	g.open(1)
}
