package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/raftlog"
)

// Membership changes (design replication.md §4 "Membership", phase 2).
// storaged proposes only single changes, one at a time, in etcd's order
// for growing a group: a new member joins as a learner (it replicates and
// catches up without counting for the quorum), is promoted to voter once
// it holds nearly the whole log, and an old member is removed. Each is a
// simple raft conf change (one voter changed at most), so no joint
// configuration is ever entered; raft allows one pending change at a time.

// ConfOp is a membership change.
type ConfOp int

// Membership changes.
const (
	// AddLearner adds a new member as a non-voting learner. Its id must
	// never have been a member, and its peer address is recorded in the
	// log for every member's transport.
	AddLearner ConfOp = iota + 1
	// Promote makes a learner that has caught up a voter.
	Promote
	// Remove removes a member (voter or learner) for good: its id is never
	// used again.
	Remove
)

func (o ConfOp) String() string {
	switch o {
	case AddLearner:
		return "add-learner"
	case Promote:
		return "promote"
	case Remove:
		return "remove"
	}
	return fmt.Sprintf("ConfOp(%d)", int(o))
}

// ConfChange is one membership change to propose.
type ConfChange struct {
	Op ConfOp
	ID uint64
	// PeerAddr is the new member's peer address (host:port; AddLearner
	// only).
	PeerAddr string
}

// MaxPromoteLag is how many entries a learner may be behind the leader's
// commit index and still be promoted: a voter far behind would count for
// the quorum while unable to acknowledge anything new, so a group of
// four with one such voter stops if any other member fails.
const MaxPromoteLag = 1024

// maxPeerAddrLen bounds a peer address carried in a conf change.
const maxPeerAddrLen = 256

// Errors of membership changes. Each says nothing was proposed.
var (
	// ErrConfChangePending: another membership change is proposed and not
	// applied yet (raft takes one at a time).
	ErrConfChangePending = errors.New("replica: another membership change is in progress; nothing proposed")
	// ErrBadConfChange: the change does not fit the membership (an id
	// that is or was a member, a learner to promote that is not one, a
	// bad address).
	ErrBadConfChange = errors.New("replica: membership change refused; nothing proposed")
	// ErrLearnerBehind: the learner to promote is not active or is more
	// than MaxPromoteLag entries behind the commit index.
	ErrLearnerBehind = errors.New("replica: the learner has not caught up; nothing proposed")
	// ErrRemoveLeader: the leader was asked to remove itself and had no
	// active voter to hand its leadership to first.
	ErrRemoveLeader = errors.New("replica: the leader cannot remove itself without an active voter to hand the leadership to; nothing proposed")
	// ErrQuorumAfterChange: after the change, the active voters would not
	// form a quorum.
	ErrQuorumAfterChange = errors.New("replica: the change would leave too few active voters for a quorum; nothing proposed")
	// ErrRemoved: this replica was removed from the group; it serves no
	// more puts and stops replicating.
	ErrRemoved = raftlog.ErrRemoved
)

// confContext is the Context of a conf change storaged proposes.
type confContext struct {
	// Req tells the proposer its own change when it applies.
	Req string `json:"req"`
	// Addr is the peer address of the member an AddLearner adds.
	Addr string `json:"addr,omitempty"`
	// Base is the membership the change applies to (the leader's, with no
	// other change pending). A group bootstraps from raft/meta's
	// membership on every member, not from conf entries in the log (as
	// etcd does), so a member that joined later, catching up from the log
	// rather than a snapshot, knows no membership when it meets the first
	// change: it takes Base first (morphLocked). A member whose bootstrap
	// membership is stale (flags of a wiped member) takes it too.
	Base *confBase `json:"base,omitempty"`
}

// confBase is a membership in a conf change's context.
type confBase struct {
	Voters   []uint64 `json:"voters"`
	Learners []uint64 `json:"learners,omitempty"`
}

// confWaiter is a proposed membership change waiting to be applied.
type confWaiter struct {
	req  string
	done chan struct{}
	m    raftlog.Membership
	err  error
	// forwarded: proposed for a member that asked to be removed
	// (stepRemovalRequest); no one waits on done.
	forwarded bool
}

// selfRemoval is a former leader's request to be removed, resent to
// the current leader until the removal applies or the caller gives up.
type selfRemoval struct {
	data   []byte // the marshalled ConfChangeV2, context included
	lead   uint64 // the leader it was last sent to
	sentAt uint64 // n.ticks when
}

// selfRemovalResendTicks: a removal request unanswered for this many
// ticks is sent again (the message may be lost; the leader may not be
// ready yet).
const selfRemovalResendTicks = 2

// maxConfReqLen bounds a confContext.Req a peer sends.
const maxConfReqLen = 64

// Membership is the group's membership as of this replica's applied
// index.
func (n *Node) Membership() raftlog.Membership {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.members.Clone()
}

// IsMember reports whether id is a member of the group as of this
// replica's applied index. A replica that joined an existing group knows
// no membership until it applied the change that added it (or a snapshot):
// it takes every peer its transport admits then.
func (n *Node) IsMember(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.isMember(id)
}

// TakesSnapshotFrom reports whether a snapshot from id would be stepped
// (StepSnapshot): id is a member as IsMember says, or a member this
// replica has not heard of yet that was never removed (strangerMayLocked).
// The receiver asks before it stages any file.
func (n *Node) TakesSnapshotFrom(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.takesSnapshotFromLocked(id)
}

// takesSnapshotFromLocked is TakesSnapshotFrom. REQUIRES: n.mu.
func (n *Node) takesSnapshotFromLocked(id uint64) bool {
	return id != n.opts.ID && (n.isMember(id) || n.strangerMayLocked(id, pb.MsgSnap))
}

// setMembersLocked makes m the membership as of the applied index.
// REQUIRES: n.mu.
func (n *Node) setMembersLocked(m raftlog.Membership) {
	n.members = m
	n.memberIDs = m.Members()
}

// ProposeConfChange proposes c on the ready leader and waits until this
// replica applies it, returning the membership it made. Refusals (nothing
// proposed): a *NotLeaderError, ErrInSyncReplicasNotEnough,
// ErrConfChangePending, ErrBadConfChange, ErrLearnerBehind,
// ErrRemoveLeader, ErrQuorumAfterChange, ErrProposalDropped,
// ErrTransferTimeout. A ctx that ends first is ErrReplicationTimeout (the
// change may still apply: read the membership); a change raft refused
// when it applied it (every member skips it alike) is ErrBadConfChange,
// nothing changed.
//
// The leader removes itself in two steps (removeSelf): it hands its
// leadership to the most caught-up active voter, as TransferLeadership
// does, then asks the new leader to propose its removal, and returns once
// it applies the removal itself. Handing over first keeps the group
// writable: a leader that applied its own removal would step down and
// leave the group without a leader for an election timeout, and the puts
// it proposed meanwhile without an answer.
func (n *Node) ProposeConfChange(ctx context.Context, c ConfChange) (raftlog.Membership, error) {
	n.mu.Lock()
	for {
		if err := n.refusalLocked(); err != nil {
			n.mu.Unlock()
			return raftlog.Membership{}, err
		}
		if n.confWait != nil {
			n.mu.Unlock()
			return raftlog.Membership{}, ErrConfChangePending
		}
		adv := n.confReadyLocked()
		if adv == nil {
			break
		}
		// The last change (or the leadership) applied here, not yet
		// counted by raft: at most the rest of the Ready being handled.
		n.mu.Unlock()
		select {
		case <-adv:
		case <-ctx.Done():
			return raftlog.Membership{}, fmt.Errorf("%w: waiting for the last change to be applied, nothing proposed (%v)", ErrReplicationTimeout, ctx.Err())
		case <-n.done:
			return raftlog.Membership{}, ErrClosed
		}
		n.mu.Lock()
	}
	typ, err := n.checkConfChangeLocked(c)
	if err != nil {
		n.mu.Unlock()
		return raftlog.Membership{}, err
	}
	n.confSeq++
	cx := confContext{Req: fmt.Sprintf("%d-%d-%d", n.opts.ID, n.term, n.confSeq),
		Base: &confBase{Voters: slices.Clone(n.members.Voters), Learners: slices.Clone(n.members.Learners)}}
	if c.Op == AddLearner {
		cx.Addr = c.PeerAddr
	}
	b, err := json.Marshal(cx)
	if err != nil {
		n.mu.Unlock()
		return raftlog.Membership{}, err
	}
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(c.ID)}}, Context: b}
	w := &confWaiter{req: cx.Req, done: make(chan struct{})}
	if c.Op == Remove && c.ID == n.opts.ID {
		if err := n.removeSelf(ctx, cc, w); err != nil { // unlocks n.mu
			return raftlog.Membership{}, err
		}
	} else {
		if err := n.rawLocked().ProposeConfChange(cc); err != nil {
			n.mu.Unlock()
			if errors.Is(err, raft.ErrProposalDropped) {
				return raftlog.Membership{}, ErrProposalDropped
			}
			return raftlog.Membership{}, fmt.Errorf("replica: propose a conf change: %w", err)
		}
		n.confWait = w
		n.kick()
		n.mu.Unlock()
	}
	select {
	case <-w.done:
		return w.m, w.err
	case <-ctx.Done():
		n.mu.Lock()
		if n.confWait == w {
			n.confWait, n.selfRemoval = nil, nil
		}
		n.mu.Unlock()
		return raftlog.Membership{}, fmt.Errorf("%w: membership change %s of %d (%v)", ErrReplicationTimeout, c.Op, c.ID, ctx.Err())
	case <-n.done:
		return raftlog.Membership{}, ErrClosed
	}
}

// removeSelf is the first half of a leader's removal of itself: it hands
// the leadership over and leaves the request for the loop to send to the
// new leader (selfRemovalMsgLocked). Nothing is proposed when it fails:
// ErrRemoveLeader (no active voter to take over), ErrTransferTimeout.
// REQUIRES: n.mu, which it unlocks.
func (n *Node) removeSelf(ctx context.Context, cc *pb.ConfChangeV2, w *confWaiter) error {
	data, err := proto.Marshal(cc)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	n.confWait, n.selfRemoval = w, &selfRemoval{data: data}
	term := n.rn.BasicStatus().GetTerm()
	for {
		// Each attempt two election timeouts, as for a stopping leader
		// (transferWait). Raft gives a transfer up after an election
		// timeout (a follower that could not catch up in time): try again,
		// with the most caught-up voter then, until ctx ends.
		_, err = n.transferLeadershipLocked(n.transferWait(), ctx.Done()) // unlocks n.mu
		if err == nil {
			n.kick() // the loop sends the request to the new leader
			return nil
		}
		if !errors.Is(err, ErrTransferTimeout) || ctx.Err() != nil {
			break
		}
		n.mu.Lock()
	}
	n.mu.Lock()
	if n.confWait == w {
		n.confWait, n.selfRemoval = nil, nil
	}
	// Still leading: take puts again (the hand-over leaves them refused),
	// unless the process began stopping meanwhile.
	n.resumeLocked(term)
	n.mu.Unlock()
	if errors.Is(err, ErrNoTransferee) {
		return fmt.Errorf("%w: no voter was active to hand the leadership to", ErrRemoveLeader)
	}
	return err
}

// selfRemovalMsgLocked returns the removal request to send to the
// leader, if this replica is waiting to be removed and a leader other
// than itself is known: at once for a new leader, again every
// selfRemovalResendTicks. REQUIRES: n.mu.
func (n *Node) selfRemovalMsgLocked() *pb.Message {
	r := n.selfRemoval
	lead := n.soft.Lead
	if r == nil || n.err != nil || lead == raft.None || lead == n.opts.ID ||
		(lead == r.lead && n.ticks-r.sentAt < selfRemovalResendTicks) {
		return nil
	}
	r.lead, r.sentAt = lead, n.ticks
	return &pb.Message{Type: pb.MsgProp.Enum(), To: proto.Uint64(lead), From: proto.Uint64(n.opts.ID),
		Entries: []*pb.Entry{{Type: pb.EntryConfChangeV2.Enum(), Data: r.data}}}
}

// stepRemovalRequest is the other half: a member that handed its
// leadership over asks to be removed (the only proposal a peer sends;
// raft's own forwarding is off, DisableProposalForwarding). The ready
// leader proposes the removal under the member's request id, so that the
// member sees its change apply, with the checks of any removal (too few
// active voters after it). Anything else leaves the request unanswered:
// the member sends it again, to the next leader if there is one, until
// its caller gives up. A request that is not exactly one removal of its
// sender is ErrBadMessage.
func (n *Node) stepRemovalRequest(m *pb.Message) error {
	from := m.GetFrom()
	ents := m.GetEntries()
	if len(ents) != 1 || ents[0].GetType() != pb.EntryConfChangeV2 {
		return fmt.Errorf("%w: a proposal from peer %d that is not one conf change", ErrBadMessage, from)
	}
	cc := &pb.ConfChangeV2{}
	var cx confContext
	if err := proto.Unmarshal(ents[0].GetData(), cc); err != nil || len(cc.GetChanges()) != 1 ||
		cc.GetChanges()[0].GetType() != pb.ConfChangeRemoveNode || cc.GetChanges()[0].GetNodeId() != from ||
		json.Unmarshal(cc.GetContext(), &cx) != nil || cx.Req == "" || len(cx.Req) > maxConfReqLen {
		return fmt.Errorf("%w: a proposal from peer %d that is not the removal of itself", ErrBadMessage, from)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.isMember(from) {
		return fmt.Errorf("%w: from %d, not a member", ErrBadMessage, from)
	}
	if n.err != nil {
		return n.err
	}
	if n.refusalLocked() != nil || n.confWait != nil || n.confReadyLocked() != nil {
		return nil // not the ready leader, or a change pending: the member asks again
	}
	if _, err := n.checkConfChangeLocked(ConfChange{Op: Remove, ID: from}); err != nil {
		n.opts.Logger.Warningf("replica %d: member %d asks to be removed: %v", n.opts.ID, from, err)
		return nil
	}
	b, err := json.Marshal(confContext{Req: cx.Req,
		Base: &confBase{Voters: slices.Clone(n.members.Voters), Learners: slices.Clone(n.members.Learners)}})
	if err != nil {
		return err
	}
	prop := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(from)}}, Context: b}
	if err := n.rawLocked().ProposeConfChange(prop); err != nil {
		return nil // dropped (a transfer under way): the member asks again
	}
	n.confWait = &confWaiter{req: cx.Req, done: make(chan struct{}), forwarded: true}
	n.opts.Logger.Infof("replica %d: proposed the removal of member %d, which asked for it", n.opts.ID, from)
	n.kick()
	return nil
}

// confReadyLocked returns nil when raft takes a conf change proposed
// now, else a channel closed at the next Advance: raft counts an entry
// applied only at Advance, after the Ready that applied it here (and
// answered its proposer), and replaces a conf change proposed while its
// applied index is below the last one's (or below the entries of earlier
// terms a new leader commits with its first) with an empty entry, with
// no error: the proposer would wait for a change that never applies.
// REQUIRES: n.mu.
func (n *Node) confReadyLocked() <-chan struct{} {
	return n.appliedLocked(n.confFloor)
}

// appliedLocked returns nil once raft counts index applied, else a
// channel closed at the next Advance (raft counts an entry applied, and
// lowers its count of uncommitted bytes by it, only at the Advance after
// the Ready that applied it). REQUIRES: n.mu.
func (n *Node) appliedLocked(index uint64) <-chan struct{} {
	if n.rn.BasicStatus().Applied >= index {
		return nil
	}
	if n.advanced == nil {
		n.advanced = make(chan struct{})
	}
	return n.advanced
}

// checkConfChangeLocked refuses a change that does not fit the group as
// this leader sees it, and returns raft's change type. The membership as
// of the applied index is raft's configuration: no change is pending (the
// leader became ready after applying everything of earlier terms, and
// confWait covers its own proposals). REQUIRES: n.mu.
func (n *Node) checkConfChangeLocked(c ConfChange) (pb.ConfChangeType, error) {
	m := n.members
	isMember := slices.Contains(n.memberIDs, c.ID)
	switch c.Op {
	case AddLearner:
		if c.ID == 0 || isMember || slices.Contains(n.opts.Log.Conf().Removed, c.ID) {
			return 0, fmt.Errorf("%w: member %d is or was in the group (ids are never reused)", ErrBadConfChange, c.ID)
		}
		if _, _, err := net.SplitHostPort(c.PeerAddr); err != nil || len(c.PeerAddr) > maxPeerAddrLen {
			return 0, fmt.Errorf("%w: peer address %q: want host:port, at most %d bytes", ErrBadConfChange, c.PeerAddr, maxPeerAddrLen)
		}
		return pb.ConfChangeAddLearnerNode, nil
	case Promote:
		if !m.IsLearner(c.ID) {
			return 0, fmt.Errorf("%w: member %d is not a learner of %v", ErrBadConfChange, c.ID, m.Members())
		}
		st := n.rn.BasicStatus()
		var match uint64
		found := false
		n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id == c.ID {
				match, found = pr.Match, true
			}
		})
		if !found || !n.heardLocked(c.ID) || match+MaxPromoteLag < st.GetCommit() {
			return 0, fmt.Errorf("%w: learner %d has entries up to %d, the commit index is %d (at most %d behind, and heard "+
				"from within an election timeout)", ErrLearnerBehind, c.ID, match, st.GetCommit(), MaxPromoteLag)
		}
		return pb.ConfChangeAddNode, nil
	case Remove:
		if !isMember {
			return 0, fmt.Errorf("%w: member %d is not in the group %v", ErrBadConfChange, c.ID, m.Members())
		}
		if slices.Contains(m.Voters, c.ID) {
			voters, active := 0, 0
			for _, id := range m.Voters {
				if id == c.ID {
					continue
				}
				voters++
				if id == n.opts.ID || n.heardLocked(id) {
					active++
				}
			}
			if need := voters/2 + 1; active < need {
				return 0, fmt.Errorf("%w: %d of the %d voters left would be active, %d needed", ErrQuorumAfterChange, active, voters, need)
			}
		}
		return pb.ConfChangeRemoveNode, nil
	}
	return 0, fmt.Errorf("%w: unknown operation %v", ErrBadConfChange, c.Op)
}

// applyConfLocked applies a committed conf change: raft's configuration,
// then raft/conf (durably, before anything moves past the entry), then the
// replica's view. A change raft refuses (it panics on an invalid one,
// before changing anything) is skipped on every replica alike. It returns
// what changed, for the host (ok false: nothing). An entry at or below the
// membership's index is in it already (raft restored it at start).
// REQUIRES: n.mu.
func (n *Node) applyConfLocked(e *pb.Entry) (raftlog.ConfChange, bool, error) {
	if e.GetIndex() <= n.members.Index {
		return raftlog.ConfChange{}, false, nil
	}
	var cc pb.ConfChangeI
	switch e.GetType() {
	case pb.EntryConfChange:
		v1 := &pb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			n.opts.Logger.Warningf("replica %d: conf change at %d does not decode, skipped: %v", n.opts.ID, e.GetIndex(), err)
			return raftlog.ConfChange{}, false, nil
		}
		cc = v1
	default:
		v2 := &pb.ConfChangeV2{}
		if err := proto.Unmarshal(e.GetData(), v2); err != nil {
			n.opts.Logger.Warningf("replica %d: conf change at %d does not decode, skipped: %v", n.opts.ID, e.GetIndex(), err)
			return raftlog.ConfChange{}, false, nil
		}
		cc = v2
	}
	v2 := cc.AsV2()
	var cx confContext
	if len(v2.GetContext()) > 0 {
		_ = json.Unmarshal(v2.GetContext(), &cx) // raft's own (an auto leave) has none
	}
	if cx.Base != nil && n.members.Index == 0 {
		// No change applied here yet: this replica's membership is raft/meta's
		// bootstrap (empty on a member that joined): take the group's.
		if err := n.morphLocked(cx.Base); err != nil {
			n.opts.Logger.Warningf("replica %d: conf change at %d: cannot take the membership %v/%v it applies to: %v",
				n.opts.ID, e.GetIndex(), cx.Base.Voters, cx.Base.Learners, err)
		}
	} else if cx.Base != nil && (!slices.Equal(cx.Base.Voters, n.members.Voters) || !slices.Equal(cx.Base.Learners, n.members.Learners)) {
		n.opts.Logger.Errorf("replica %d: conf change at %d applies to voters %v learners %v, this replica has voters %v learners %v",
			n.opts.ID, e.GetIndex(), cx.Base.Voters, cx.Base.Learners, n.members.Voters, n.members.Learners)
	}
	cs, err := n.applyToRaftLocked(cc)
	if err != nil {
		n.opts.Logger.Warningf("replica %d: conf change at %d refused by raft, skipped: %v", n.opts.ID, e.GetIndex(), err)
		if w := n.confWait; w != nil && w.req == cx.Req {
			w.err = fmt.Errorf("%w: raft refused the change: %v", ErrBadConfChange, err)
			close(w.done)
			n.confWait = nil
		}
		return raftlog.ConfChange{}, false, nil
	}
	m := raftlog.MembershipOf(e.GetIndex(), cs)
	ch := raftlog.ConfChange{Membership: m}
	for _, s := range v2.GetChanges() {
		if id := s.GetNodeId(); (s.GetType() == pb.ConfChangeAddLearnerNode || s.GetType() == pb.ConfChangeAddNode) &&
			cx.Addr != "" && len(cx.Addr) <= maxPeerAddrLen && !slices.Contains(n.memberIDs, id) {
			ch.Addrs = map[uint64]string{id: cx.Addr}
		}
	}
	now := m.Members()
	for _, id := range n.memberIDs {
		if !slices.Contains(now, id) {
			ch.Removed = append(ch.Removed, id)
			delete(n.heard, id)
		}
	}
	if err := n.opts.Log.SetMembership(ch); err != nil {
		return raftlog.ConfChange{}, false, err
	}
	n.setMembersLocked(m)
	n.confFloor = max(n.confFloor, e.GetIndex())
	n.opts.Logger.Infof("replica %d: membership at %d: voters %v, learners %v", n.opts.ID, m.Index, m.Voters, m.Learners)
	if w := n.confWait; w != nil && w.req == cx.Req {
		w.m = m.Clone()
		close(w.done)
		n.confWait = nil
	}
	if slices.Contains(ch.Removed, n.opts.ID) {
		return ch, true, fmt.Errorf("%w: at raft index %d", ErrRemoved, m.Index)
	}
	return ch, true, nil
}

// morphLocked changes raft's configuration, one simple change at a time,
// from this replica's bootstrap membership to base: voters added first
// (a configuration never loses its last voter), then learners, then the
// members base does not have removed or demoted. REQUIRES: n.mu.
func (n *Node) morphLocked(base *confBase) error {
	cur := n.members
	single := func(t pb.ConfChangeType, id uint64) error {
		_, err := n.applyToRaftLocked(&pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: t.Enum(), NodeId: proto.Uint64(id)}}})
		return err
	}
	for _, v := range base.Voters {
		if !slices.Contains(cur.Voters, v) {
			if err := single(pb.ConfChangeAddNode, v); err != nil {
				return err
			}
		}
	}
	for _, l := range base.Learners {
		if !slices.Contains(cur.Learners, l) {
			if err := single(pb.ConfChangeAddLearnerNode, l); err != nil {
				return err
			}
		}
	}
	for _, id := range cur.Members() {
		if !slices.Contains(base.Voters, id) && !slices.Contains(base.Learners, id) {
			if err := single(pb.ConfChangeRemoveNode, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyToRaftLocked is RawNode.ApplyConfChange, with raft's panic on an
// invalid change (confchange refuses it before touching anything) turned
// into an error. REQUIRES: n.mu.
func (n *Node) applyToRaftLocked(cc pb.ConfChangeI) (cs *pb.ConfState, err error) {
	defer func() {
		if r := recover(); r != nil {
			cs, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return n.rawLocked().ApplyConfChange(cc), nil
}

// replayConfs applies again the conf changes committed above the
// membership raft restarted with, up to the applied index (see raftlog's
// confName): raft hands no entry at or below Applied back.
func (n *Node) replayConfs(applied uint64) error {
	n.mu.Lock()
	from := n.members.Index + 1
	n.mu.Unlock()
	if c, ok := n.opts.Log.LastConf(); ok && c < from {
		return nil // no conf entry past the record: nothing to scan for
	}
	return n.opts.Log.Confs(from, applied, func(e *pb.Entry) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		_, _, err := n.applyConfLocked(e)
		return err
	})
}
