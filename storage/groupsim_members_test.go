package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/storaged/storaged/storage/replica"
	"github.com/storaged/storaged/storage/vfs"
)

// Membership changes in the simulation. A member step walks the group
// through the cycle an operator runs to replace a member, one change at a
// time, with every fault of the driver around it: a new node (the next
// id, an empty MemFS, GroupOptions.Join) joins and is added as a learner
// by the ready leader, promoted once it caught up, and then a voter (the
// leader itself in about one cycle in four) is removed, which brings the
// group back to three voters for the next cycle. Refusals (not caught up, too few active voters, a
// change pending, no leader) and unknown outcomes are normal: the next
// member step tries again from what the group applied.
//
// Checks, after every step: every node reports, for a raft index, the
// same membership as every other node ever did for it (across crashes and
// snapshots); no membership has fewer than three voters, nor contains an
// id removed earlier; a node that the group's newest membership no longer
// lists is closed for good, and no node ever counts it again. The other
// checks (committed bytes, acknowledged puts, convergence with every
// member) cover the nodes that joined as they cover the first three.

// simConf is a membership change in flight.
type simConf struct {
	op   replica.ConfOp
	what string // op, or remove-leader (counted apart)
	id   uint64
	on   uint64
	done chan struct{}
	m    GroupMembership
	err  error
}

// isMember: id is in m (a voter or a learner).
func (g *groupSim) isMember(m GroupMembership, id uint64) bool {
	return slices.Contains(m.Members(), id)
}

// newest is the membership with the highest index any live node applied
// (each is committed: a node applies only committed entries).
func (g *groupSim) newest() GroupMembership {
	var best GroupMembership
	found := false
	for _, id := range g.ids {
		if n := g.nodes[id]; n.s != nil {
			if m := n.s.ReplicaInfo().Membership; !found || m.Index > best.Index {
				best, found = m, true
			}
		}
	}
	return best
}

// member starts the next membership change of the cycle on the ready
// leader.
func (g *groupSim) member() {
	if g.confOp != nil {
		return
	}
	l := g.leader()
	if l == 0 {
		return
	}
	m := g.nodes[l].s.ReplicaInfo().Membership
	c := &simConf{on: l, done: make(chan struct{})}
	switch {
	case g.joiner != 0 && !g.isMember(m, g.joiner):
		c.op, c.id = replica.AddLearner, g.joiner
	case g.joiner != 0 && slices.Contains(m.Learners, g.joiner):
		c.op, c.id = replica.Promote, g.joiner
	case len(m.Voters) > 3:
		// Any voter, the leader too: it hands its leadership over and
		// asks the next leader for its removal.
		c.op, c.id = replica.Remove, m.Voters[g.rng.IntN(len(m.Voters))]
	case g.joiner == 0:
		id := g.nextID
		g.nextID++
		n := &simNode{id: id, fs: vfs.NewMem(), join: true}
		g.nodes[id] = n
		g.ids = append(g.ids, id)
		g.open(n)
		g.joiner = id
		g.note("node %d joins", id)
		c.op, c.id = replica.AddLearner, id
	default:
		return // the joiner is a voter already: the removal comes next
	}
	c.what = c.op.String()
	if c.op == replica.Remove && c.id == l {
		c.what = "remove-leader"
	}
	g.count("member " + c.what)
	g.note("member %s %d on leader %d", c.op, c.id, l)
	s := g.nodes[l].s
	g.confOp = c
	go func() {
		defer close(c.done)
		switch c.op {
		case replica.AddLearner:
			c.m, c.err = s.AddLearner(context.Background(), c.id, fmt.Sprintf("127.0.0.1:%d", 7000+c.id))
		case replica.Promote:
			c.m, c.err = s.PromoteLearner(context.Background(), c.id)
		default:
			c.m, c.err = s.RemoveMember(context.Background(), c.id)
		}
	}()
}

// checkMembership answers the membership change in flight, checks what
// every node applied, and closes the nodes the group removed.
func (g *groupSim) checkMembership() {
	if c := g.confOp; c != nil {
		select {
		case <-c.done:
			g.confOp = nil
			var nl *NotLeaderError
			switch {
			case c.err == nil:
				g.count("member " + c.what + " ok")
				g.confLog = append(g.confLog, fmt.Sprintf("%s %d at %d", c.what, c.id, c.m.Index))
				g.checkMembershipAt(0, c.m)
			case errors.As(c.err, &nl), errors.Is(c.err, ErrInSyncReplicasNotEnough), errors.Is(c.err, ErrConfChangePending),
				errors.Is(c.err, ErrLearnerBehind), errors.Is(c.err, ErrQuorumAfterChange), errors.Is(c.err, ErrBadConfChange),
				errors.Is(c.err, replica.ErrProposalDropped), errors.Is(c.err, ErrRemoveLeader), errors.Is(c.err, ErrTransferTimeout):
				g.count("member refused")
			case errors.Is(c.err, ErrReplicationTimeout), errors.Is(c.err, ErrClosed), errors.Is(c.err, replica.ErrClosed):
				g.count("member unknown")
			default:
				g.fatalf("membership change %s %d on node %d: %v", c.op, c.id, c.on, c.err)
			}
		default:
		}
	}
	for _, id := range g.ids {
		if n := g.nodes[id]; n.s != nil {
			g.checkMembershipAt(id, n.s.ReplicaInfo().Membership)
		}
	}
	newest := g.newest()
	if g.joiner != 0 && slices.Contains(newest.Voters, g.joiner) {
		g.joiner = 0 // promoted: the next cycle needs a new one
	}
	for _, id := range slices.Clone(g.ids) {
		if id == g.joiner || g.isMember(newest, id) || newest.Index == 0 {
			continue
		}
		// Removed: closed for good, its data dir gone with it.
		g.note("node %d removed (membership at %d: voters %v learners %v)", id, newest.Index, newest.Voters, newest.Learners)
		g.closeNode(g.nodes[id])
		g.ids = slices.DeleteFunc(g.ids, func(x uint64) bool { return x == id })
		g.gone[id] = newest.Index
		g.count("member node removed")
	}
}

// checkMembershipAt checks one reported membership (node 0: a change's
// answer) against what was reported for its index before, the bound on
// voters and the removed ids.
func (g *groupSim) checkMembershipAt(node uint64, m GroupMembership) {
	if m.Index == 0 {
		return
	}
	if prev, ok := g.confAt[m.Index]; !ok {
		g.confAt[m.Index] = m.Clone()
	} else if !slices.Equal(prev.Voters, m.Voters) || !slices.Equal(prev.Learners, m.Learners) {
		g.fatalf("node %d: membership at raft index %d is voters %v learners %v; before, voters %v learners %v",
			node, m.Index, m.Voters, m.Learners, prev.Voters, prev.Learners)
	}
	if len(m.Voters) < 3 {
		g.fatalf("node %d: membership at %d has %d voters %v", node, m.Index, len(m.Voters), m.Voters)
	}
	for _, id := range m.Members() {
		if at, ok := g.gone[id]; ok && m.Index >= at {
			g.fatalf("node %d: membership at %d counts node %d, removed by %d", node, m.Index, id, at)
		}
	}
}
