package storage

import (
	"context"
	"fmt"

	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/replica"
)

// Membership changes in group mode (design replication.md §4
// "Membership"). A group grows the way etcd's do: the new member starts
// empty with GroupOptions.Join and is added as a learner (AddLearner), it
// catches up from the leader's log or a snapshot without counting for the
// quorum, then PromoteLearner makes it a voter once it is at most
// replica.MaxPromoteLag entries behind. RemoveMember takes a member out
// for good (its id is never used again; its data dir refuses to start).
// Replacing a member is an add, a promote and a remove. Each change is
// one raft entry in the log, applied by every member in log order: each
// records the membership in raft/conf before it applies anything after
// it, so a restart resumes from it.

// GroupMembership is a group's membership at a raft index: its voters,
// its learners (and, for a joint configuration raft may hand, the
// outgoing voters and next learners).
type GroupMembership = raftlog.Membership

// MembershipUpdate is what GroupOptions.OnMembership is told after each
// applied change: the membership, the peer addresses the changes named
// for the members they added (members of the bootstrap have theirs in the
// flags), and the ids removed from the group.
type MembershipUpdate struct {
	Membership GroupMembership
	PeerAddrs  map[uint64]string
	Removed    []uint64
}

// Errors of membership changes: each means nothing was proposed.
var (
	ErrConfChangePending = replica.ErrConfChangePending
	ErrBadConfChange     = replica.ErrBadConfChange
	ErrLearnerBehind     = replica.ErrLearnerBehind
	ErrRemoveLeader      = replica.ErrRemoveLeader
	ErrQuorumAfterChange = replica.ErrQuorumAfterChange
	// ErrRemoved: this member was removed from its group; it stopped.
	ErrRemoved = replica.ErrRemoved
)

// Membership returns the group's membership as this member applied it,
// with the peer addresses and removals raft/conf holds.
func (s *Store) Membership() (MembershipUpdate, error) {
	if s.group == nil || s.group.node == nil {
		return MembershipUpdate{}, ErrNotGroup
	}
	conf := s.group.rlog.Conf()
	return MembershipUpdate{Membership: s.group.node.Membership(), PeerAddrs: conf.Addrs, Removed: conf.Removed}, nil
}

// AddLearner adds member id, at peer address peerAddr (host:port), to the
// group as a learner: it replicates and serves reads but neither votes
// nor counts for commits. Only the ready leader takes it; it returns once
// this member applied the change (committed on a majority). Refusals,
// with nothing proposed: a *NotLeaderError, ErrInSyncReplicasNotEnough,
// ErrConfChangePending (another change is in progress), ErrBadConfChange
// (id is or was a member, a bad address). ErrReplicationTimeout: not seen
// applied within ReplicationTimeout (or ctx): it may still apply, read
// Membership. The new member must be started with GroupOptions.Join.
func (s *Store) AddLearner(ctx context.Context, id uint64, peerAddr string) (GroupMembership, error) {
	return s.changeMembership(ctx, replica.ConfChange{Op: replica.AddLearner, ID: id, PeerAddr: peerAddr})
}

// PromoteLearner makes learner id a voter. It is refused (nothing
// proposed) with ErrLearnerBehind unless the learner was heard from
// within an election timeout and is at most replica.MaxPromoteLag
// entries behind the commit index; otherwise as AddLearner.
func (s *Store) PromoteLearner(ctx context.Context, id uint64) (GroupMembership, error) {
	return s.changeMembership(ctx, replica.ConfChange{Op: replica.Promote, ID: id})
}

// RemoveMember removes member id (voter or learner) from the group for
// good. A voter whose removal would leave fewer active voters than a
// quorum of the rest is refused (ErrQuorumAfterChange). Asked to remove
// itself, the leader hands its leadership over first and has the new
// leader propose the removal (replica.Node.ProposeConfChange); refusals
// then also ErrRemoveLeader (no active voter to take over) and
// ErrTransferTimeout. Otherwise as AddLearner. The removed member stops
// replicating once it applies the change (puts refused with cause
// REMOVED), and its data dir refuses to start again.
func (s *Store) RemoveMember(ctx context.Context, id uint64) (GroupMembership, error) {
	return s.changeMembership(ctx, replica.ConfChange{Op: replica.Remove, ID: id})
}

func (s *Store) changeMembership(ctx context.Context, c replica.ConfChange) (GroupMembership, error) {
	if s.group == nil || s.group.node == nil {
		return GroupMembership{}, ErrNotGroup
	}
	if s.closed.Load() {
		return GroupMembership{}, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.group.opts.ReplicationTimeout)
	defer cancel()
	m, err := s.group.node.ProposeConfChange(ctx, c)
	if err != nil {
		return GroupMembership{}, fmt.Errorf("storage: %s member %d: %w", c.Op, c.ID, err)
	}
	return m, nil
}

// MembershipChanged is replica.Host's: a conf change was applied.
func (h *groupHost) MembershipChanged(c raftlog.ConfChange) { (*Store)(h).membershipChanged(c) }

// membershipChanged tells GroupOptions.OnMembership about c, with every
// peer address and removal raft/conf holds (it holds c's already).
func (s *Store) membershipChanged(c raftlog.ConfChange) {
	cb := s.opts.Group.OnMembership
	if cb == nil {
		return
	}
	conf := s.group.rlog.Conf()
	cb(MembershipUpdate{Membership: c.Membership.Clone(), PeerAddrs: conf.Addrs, Removed: conf.Removed})
}
