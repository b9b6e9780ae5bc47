package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/replica"
)

// membershipLog records what OnMembership told each member.
type membershipLog struct {
	mu  sync.Mutex
	got map[uint64][]MembershipUpdate
}

func (l *membershipLog) hook(id uint64) func(MembershipUpdate) {
	return func(u MembershipUpdate) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.got[id] = append(l.got[id], u)
	}
}

func (l *membershipLog) last(id uint64) (MembershipUpdate, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.got[id]) == 0 {
		return MembershipUpdate{}, 0
	}
	return l.got[id][len(l.got[id])-1], len(l.got[id])
}

// newMemberGroup is a group of three whose members send snapshots
// (snapLoop) and record what OnMembership tells them.
func newMemberGroup(t *testing.T) (*testGroup, map[uint64]*snapLoop, *membershipLog) {
	ml := &membershipLog{got: map[uint64][]MembershipUpdate{}}
	loops := map[uint64]*snapLoop{}
	t.Cleanup(func() {
		for _, l := range loops {
			l.wg.Wait() // after the stores closed (cleanups run last in, first out)
		}
	})
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		l := &snapLoop{testTransport: o.Group.Transport.(testTransport)}
		loops[o.Group.ID] = l
		o.Group.Transport = l
		o.Group.OnMembership = ml.hook(o.Group.ID)
	})
	return g, loops, ml
}

// joinMember opens a new member id that joins the group (Join), with the
// group's options but its own data dir, on the network, with a snapshot
// transport like the others'.
func (g *testGroup) joinMember(id uint64, loops map[uint64]*snapLoop, ml *membershipLog) {
	g.t.Helper()
	g.net.add(id)
	ref := g.m[g.ids[0]].opts
	mb := &member{id: id, opts: ref}
	mb.opts.Dir = g.t.TempDir()
	gopts := *ref.Group
	gopts.ID, gopts.Join, gopts.Peers, gopts.Learners = id, true, nil, nil
	l := &snapLoop{testTransport: testTransport{g.net, id}}
	loops[id] = l
	gopts.Transport = l
	gopts.OnMembership = ml.hook(id)
	mb.opts.Group = &gopts
	g.m[id] = mb
	g.ids = append(g.ids, id)
	g.open(id)
}

// change runs a membership change on the leader while ticking it (the
// change waits for its commit), returning its outcome.
func (g *testGroup) change(leader uint64, what string, f func(context.Context, *Store) (GroupMembership, error)) (GroupMembership, error) {
	g.t.Helper()
	return g.changeTicking(leader, what, f, nil, leader)
}

// changeTicking is change ticking ids between looks, and calling each
// (when set) before every look that finds the change still running.
func (g *testGroup) changeTicking(leader uint64, what string, f func(context.Context, *Store) (GroupMembership, error),
	each func(), ids ...uint64) (GroupMembership, error) {
	g.t.Helper()
	type res struct {
		m   GroupMembership
		err error
	}
	done := make(chan res, 1)
	go func() {
		m, err := f(context.Background(), g.m[leader].s)
		done <- res{m, err}
	}()
	var r res
	g.poll(what, func() bool {
		select {
		case r = <-done:
			return true
		default:
			if each != nil {
				each()
			}
			return false
		}
	}, ids...)
	return r.m, r.err
}

// TestGroupMembershipChange replaces a member of a running group the way
// an operator does, with puts between every step: a new member 4 joins
// empty (Join) and is added as a learner while it is cut off; the leader
// compacts its log past the change, so member 4 gets a snapshot whose
// membership and peer addresses it records; it catches up byte-identical
// and serves reads as a learner; it is promoted to voter; member 3 is
// removed (never to be added again). Every member's OnMembership hears
// each change with member 4's address. Each refusal leaves the membership
// as it was. A restart of all members finds the membership again, and a
// member that lost raft/conf rebuilds it from the conf entries of its log.
// Every acknowledged put is on every member throughout.
func TestGroupMembershipChange(t *testing.T) {
	g, loops, ml := newMemberGroup(t)
	g.elect(1)
	want := map[int64]string{}
	n := int64(0)
	put := func(leader uint64, body string) {
		t.Helper()
		res, err := g.put(leader, body)
		if err != nil || res.Status != PutOK {
			t.Fatalf("put %q on %d: %v %v", body, leader, res.Status, err)
		}
		if res.Append.QueueOffset != n {
			t.Fatalf("put %q: queue offset %d, want %d", body, res.Append.QueueOffset, n)
		}
		want[n] = body
		n++
	}
	body := strings.Repeat("m", 3000)
	for i := range 20 {
		put(1, fmt.Sprintf("a%02d%s", i, body))
	}
	membersOf := func(id uint64) GroupMembership { return g.m[id].s.ReplicaInfo().Membership }
	if m := membersOf(1); !slices.Equal(m.Voters, []uint64{1, 2, 3}) || len(m.Learners) != 0 || m.Index != 0 {
		t.Fatalf("bootstrap membership %+v", m)
	}

	g.joinMember(4, loops, ml)
	g.net.setCut(4, true)
	if info := g.m[4].s.ReplicaInfo(); len(info.Membership.Members()) != 0 || info.Role != "follower" {
		t.Fatalf("a joining member knows a membership before it is added: %+v", info)
	}
	const addr4 = "127.0.0.1:7004"

	// Refusals: nothing proposed, the membership unchanged.
	refusals := []struct {
		name string
		on   uint64
		f    func(context.Context, *Store) (GroupMembership, error)
		want error
	}{
		{"add on a follower", 2, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.AddLearner(ctx, 4, addr4) }, ErrNotLeader},
		{"add an existing member", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.AddLearner(ctx, 2, addr4) }, ErrBadConfChange},
		{"add id 0", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.AddLearner(ctx, 0, addr4) }, ErrBadConfChange},
		{"add without host:port", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.AddLearner(ctx, 4, "no-port") }, ErrBadConfChange},
		{"promote a non-learner", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.PromoteLearner(ctx, 4) }, ErrBadConfChange},
		{"promote a voter", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.PromoteLearner(ctx, 2) }, ErrBadConfChange},
		{"remove a stranger", 1, func(ctx context.Context, s *Store) (GroupMembership, error) { return s.RemoveMember(ctx, 9) }, ErrBadConfChange},
	}
	for _, r := range refusals {
		if _, err := r.f(context.Background(), g.m[r.on].s); !errors.Is(err, r.want) {
			t.Fatalf("%s: %v, want %v", r.name, err, r.want)
		}
	}
	if m := membersOf(1); !slices.Equal(m.Voters, []uint64{1, 2, 3}) || m.Index != 0 {
		t.Fatalf("a refusal changed the membership: %+v", m)
	}

	// Add member 4 as a learner while it is cut off.
	m, err := g.change(1, "member 4 added", func(ctx context.Context, s *Store) (GroupMembership, error) { return s.AddLearner(ctx, 4, addr4) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Voters, []uint64{1, 2, 3}) || !slices.Equal(m.Learners, []uint64{4}) || m.Index == 0 {
		t.Fatalf("after AddLearner: %+v", m)
	}
	addIndex := m.Index
	if _, err := g.m[1].s.AddLearner(context.Background(), 4, addr4); !errors.Is(err, ErrBadConfChange) {
		t.Fatalf("member 4 added twice: %v", err)
	}
	for i := range 10 {
		put(1, fmt.Sprintf("b%02d%s", i, body))
	}
	g.converge(1, 1, 2, 3)
	for _, id := range []uint64{1, 2, 3} {
		u, _ := ml.last(id)
		if !slices.Equal(u.Membership.Learners, []uint64{4}) || u.PeerAddrs[4] != addr4 {
			t.Fatalf("member %d was told %+v", id, u)
		}
	}
	// The leader compacts past the change: member 4 needs a snapshot.
	leader := g.m[1].s
	var base uint64
	g.poll("the leader compacts its log past the change", func() bool {
		base = leader.ReplicaInfo().Commit
		return base > addIndex && leader.group.rlog.Compact(base) == nil
	}, 1)
	g.net.setCut(4, false)
	g.poll("member 4 installs a snapshot", func() bool {
		sent, _, _, _ := loops[1].stats()
		return sent > 0 && g.m[4].s.ReplicaInfo().Applied >= base
	}, 1, 4)
	if info := g.m[4].s.ReplicaInfo(); info.Role != "learner" || !slices.Equal(info.Membership.Learners, []uint64{4}) ||
		!slices.Equal(info.Membership.Voters, []uint64{1, 2, 3}) {
		t.Fatalf("member 4 after the snapshot: role %s, membership %+v", info.Role, info.Membership)
	}
	if u, _ := ml.last(4); u.PeerAddrs[4] != addr4 || !slices.Equal(u.Membership.Learners, []uint64{4}) {
		t.Fatalf("member 4 was told %+v", u)
	}
	for i := range 5 {
		put(1, fmt.Sprintf("c%02d%s", i, body))
	}
	end := g.converge(1, 1, 2, 3, 4)
	g.sameBytes(end, 1, 4)
	g.checkQueue(want, n, 4)
	if _, err := g.m[4].s.PutMessage(context.Background(), &Message{Topic: "T", Body: []byte("x"), BornHost: DefaultStoreHost}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a put on the learner: %v", err)
	}

	// Promote member 4.
	m, err = g.change(1, "member 4 promoted", func(ctx context.Context, s *Store) (GroupMembership, error) { return s.PromoteLearner(ctx, 4) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Voters, []uint64{1, 2, 3, 4}) || len(m.Learners) != 0 {
		t.Fatalf("after PromoteLearner: %+v", m)
	}
	for i := range 5 {
		put(1, fmt.Sprintf("d%02d%s", i, body))
	}
	g.converge(1, 1, 2, 3, 4)
	g.poll("member 4 applies its promotion", func() bool {
		info := g.m[4].s.ReplicaInfo()
		return info.Role == "follower" && slices.Equal(info.Membership.Voters, []uint64{1, 2, 3, 4})
	}, 1)

	// Remove member 3 (a voter): 1, 2 and 4 remain.
	m, err = g.change(1, "member 3 removed", func(ctx context.Context, s *Store) (GroupMembership, error) { return s.RemoveMember(ctx, 3) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Voters, []uint64{1, 2, 4}) {
		t.Fatalf("after RemoveMember: %+v", m)
	}
	g.closeMember(3)
	if _, err := g.m[1].s.AddLearner(context.Background(), 3, "127.0.0.1:7003"); !errors.Is(err, ErrBadConfChange) {
		t.Fatalf("a removed id added again: %v", err)
	}
	for i := range 5 {
		put(1, fmt.Sprintf("e%02d%s", i, body))
	}
	end = g.converge(1, 1, 2, 4)
	g.sameBytes(end, 1, 2, 4)
	for _, id := range []uint64{1, 2, 4} {
		g.poll(fmt.Sprintf("member %d applies the removal", id), func() bool {
			u, _ := ml.last(id)
			return slices.Equal(u.Membership.Voters, []uint64{1, 2, 4}) && slices.Contains(u.Removed, 3)
		}, 1)
	}

	// Restart 1, 2 and 4; member 2 lost raft/conf and rebuilds it from
	// the conf entries its log still holds (the add it got from the log,
	// not a snapshot).
	for _, id := range []uint64{1, 2, 4} {
		g.closeMember(id)
	}
	if err := os.Remove(filepath.Join(g.m[2].opts.Dir, "raft", "conf")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 2, 4} {
		g.open(id)
		if m := membersOf(id); !slices.Equal(m.Voters, []uint64{1, 2, 4}) || len(m.Learners) != 0 {
			t.Fatalf("member %d after a restart: %+v", id, m)
		}
	}
	u, err := g.m[2].s.Membership()
	if err != nil || u.PeerAddrs[4] != addr4 || !slices.Contains(u.Removed, 3) {
		t.Fatalf("member 2's rebuilt raft/conf: %+v %v", u, err)
	}
	g.elect(2)
	for i := range 5 {
		put(2, fmt.Sprintf("f%02d%s", i, body))
	}
	end = g.converge(2, 1, 2, 4)
	g.sameBytes(end, 1, 2, 4)
	for _, id := range []uint64{1, 2, 4} {
		g.checkQueue(want, n, id)
	}
	// With member 3 gone for good, losing any one more of the three
	// voters still leaves a quorum: 2 and 4 commit without 1.
	g.closeMember(1)
	put(2, "g00")
	g.converge(2, 2, 4)
	g.checkQueue(want, n, 2, 4)
	if got := maps.Collect(maps.All(u.PeerAddrs)); len(got) != 1 {
		t.Fatalf("peer addresses %v, want member 4's only", got)
	}
}

// TestGroupRemoveLeader: the leader removes itself in one call. It hands
// its leadership to another voter first and then asks it for the removal
// (replica's removeSelf), so the call returns the membership without it,
// the new leader takes puts at once, and the removed member refuses puts
// (REMOVED) without failing.
func TestGroupRemoveLeader(t *testing.T) {
	g, loops, ml := newMemberGroup(t)
	g.elect(1)
	for i := range 10 {
		g.mustPut(1, i, fmt.Sprintf("a%02d", i))
	}
	g.joinMember(4, loops, ml)
	if _, err := g.change(1, "add 4", func(ctx context.Context, s *Store) (GroupMembership, error) {
		return s.AddLearner(ctx, 4, "127.0.0.1:7004")
	}); err != nil {
		t.Fatal(err)
	}
	g.converge(1, 1, 2, 3, 4)
	if _, err := g.change(1, "promote 4", func(ctx context.Context, s *Store) (GroupMembership, error) {
		return s.PromoteLearner(ctx, 4)
	}); err != nil {
		t.Fatal(err)
	}

	// Raft gives a transfer up after an election timeout of the leader's
	// ticks: member 1 is ticked only once it handed over (it then resends
	// its request until the new leader is ready to propose it).
	m, err := g.changeTicking(1, "leader 1 removes itself", func(ctx context.Context, s *Store) (GroupMembership, error) {
		return s.RemoveMember(ctx, 1)
	}, func() {
		if info := g.m[1].s.ReplicaInfo(); info.Role != "leader" {
			g.tick(1)
		}
	}, 2, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Voters, []uint64{2, 3, 4}) || len(m.Learners) != 0 || m.Index == 0 {
		t.Fatalf("after the leader removed itself: %+v", m)
	}
	var lead uint64
	g.poll("a ready leader among 2, 3, 4", func() bool { lead = g.readyLeader(2, 3, 4); return lead != 0 }, 2, 3, 4)
	for i := range 5 {
		g.mustPut(lead, 10+i, fmt.Sprintf("b%02d", i))
	}
	end := g.converge(lead, 2, 3, 4)
	g.sameBytes(end, 2, 3, 4)
	want := map[int64]string{}
	for i := range 10 {
		want[int64(i)] = fmt.Sprintf("a%02d", i)
	}
	for i := range 5 {
		want[int64(10+i)] = fmt.Sprintf("b%02d", i)
	}
	g.checkQueue(want, 15, 2, 3, 4)
	for _, id := range []uint64{2, 3, 4} {
		g.poll(fmt.Sprintf("member %d applies the removal", id), func() bool {
			u, _ := ml.last(id)
			return slices.Equal(u.Membership.Voters, []uint64{2, 3, 4}) && slices.Contains(u.Removed, 1)
		}, lead)
	}
	_, err = g.put(1, "after")
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Cause != replica.CauseRemoved {
		t.Fatalf("a put on the removed member: %v", err)
	}
	if info := g.m[1].s.ReplicaInfo(); slices.Contains(info.Membership.Members(), 1) {
		t.Fatalf("member 1 still counts itself: %+v", info.Membership)
	}
}

// TestGroupJoinFromLog: with nothing compacted, a joining member catches
// up from the leader's first entry, not a snapshot. The group's bootstrap
// membership is in no entry (every member bootstrapped from raft/meta),
// so it learns the membership from the first conf change it meets, which
// carries the membership it applied to: after the add of member 4 and the
// removal of member 3, member 5 joins and must see voters 1, 2, 4 and
// itself a learner, also after a restart.
func TestGroupJoinFromLog(t *testing.T) {
	g, loops, ml := newMemberGroup(t)
	g.elect(1)
	for i := range 10 {
		g.mustPut(1, i, fmt.Sprintf("a%02d", i))
	}
	g.joinMember(4, loops, ml)
	for _, step := range []struct {
		what string
		f    func(context.Context, *Store) (GroupMembership, error)
	}{
		{"add 4", func(ctx context.Context, s *Store) (GroupMembership, error) {
			return s.AddLearner(ctx, 4, "127.0.0.1:7004")
		}},
		{"promote 4", func(ctx context.Context, s *Store) (GroupMembership, error) { return s.PromoteLearner(ctx, 4) }},
		{"remove 3", func(ctx context.Context, s *Store) (GroupMembership, error) { return s.RemoveMember(ctx, 3) }},
	} {
		if step.what == "promote 4" {
			g.converge(1, 1, 2, 3, 4) // caught up: no ErrLearnerBehind
		}
		if _, err := g.change(1, step.what, step.f); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
	}
	g.closeMember(3)
	g.joinMember(5, loops, ml)
	if _, err := g.change(1, "add 5", func(ctx context.Context, s *Store) (GroupMembership, error) {
		return s.AddLearner(ctx, 5, "127.0.0.1:7005")
	}); err != nil {
		t.Fatal(err)
	}
	g.mustPut(1, 10, "b")
	end := g.converge(1, 1, 2, 4, 5)
	g.sameBytes(end, 1, 2, 4, 5)
	for id, l := range loops {
		if sent, failed, _, _ := l.stats(); sent+failed != 0 {
			t.Fatalf("member %d sent %d snapshots (%d failed): the joiners were to catch up from the log", id, sent, failed)
		}
	}
	for _, id := range []uint64{1, 2, 4, 5} {
		if m := g.m[id].s.ReplicaInfo().Membership; !slices.Equal(m.Voters, []uint64{1, 2, 4}) || !slices.Equal(m.Learners, []uint64{5}) {
			t.Fatalf("member %d: %+v", id, m)
		}
	}
	g.closeMember(5)
	g.open(5)
	if m := g.m[5].s.ReplicaInfo().Membership; !slices.Equal(m.Voters, []uint64{1, 2, 4}) || !slices.Equal(m.Learners, []uint64{5}) {
		t.Fatalf("member 5 after a restart: %+v", m)
	}
}
