package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/replica"
)

// ReasonConfChangeRefused is the ErrorInfo reason of a membership change
// refused for the group's state (FAILED_PRECONDITION or ABORTED); the
// metadata cause says why (the Cause* constants below).
const ReasonConfChangeRefused = "CONF_CHANGE_REFUSED"

// Causes of a refused membership change (ErrorInfo metadata "cause").
const (
	CauseStandalone        = "STANDALONE"
	CauseConfChangePending = "CONF_CHANGE_PENDING"
	CauseBadConfChange     = "BAD_CONF_CHANGE"
	CauseLearnerBehind     = "LEARNER_BEHIND"
	CauseRemoveLeader      = "REMOVE_LEADER"
	CauseQuorumAfterChange = "QUORUM_AFTER_CHANGE"
	// CauseTransferTimeout (UNAVAILABLE, reason SERVICE_NOT_AVAILABLE): a
	// leader asked to remove itself or to move its leadership did not hand
	// it over in time; nothing was proposed, and it takes puts again.
	CauseTransferTimeout = "TRANSFER_TIMEOUT"
	// Refusals of a leadership transfer (TransferReplicaLeadership): the
	// member asked for is not a voter, was not heard from within an
	// election timeout, or (id 0) no voter was.
	CauseNotVoter           = "NOT_VOTER"
	CauseTransfereeInactive = "TRANSFEREE_INACTIVE"
	CauseNoTransferee       = "NO_TRANSFEREE"
)

// maxPeerAddrBytes bounds AddReplicaMemberRequest.peer_addr.
const maxPeerAddrBytes = 256

// retryDelayConfPending: a membership change commits in one round.
const retryDelayConfPending = time.Second

// AdminGroup is what the binary tells the admin service about its group:
// its identity and the addresses its peer transport knows.
type AdminGroup struct {
	ClusterID, Group string
	// PeerAddrs: the peer addresses the transport dials, by member id.
	PeerAddrs map[uint64]string
	// ClientAddr is a member's client address ("" when unknown), for the
	// leader hint of a "not leader" answer.
	ClientAddr func(id uint64) string
	// PeerAddrProblem, if set, says why the peer transport would refuse
	// addr (plaintext off loopback), "" when it would not: a change it
	// refuses would add a member no one can reach.
	PeerAddrProblem func(addr string) string
}

// WithAdminGroup makes the membership answers carry the group's identity
// and peer addresses, and "not leader" answers the leader's address.
func WithAdminGroup(g func() AdminGroup) AdminOption {
	return func(a *AdminService) { a.group = g }
}

func (a *AdminService) groupInfo() AdminGroup {
	if a.group == nil {
		return AdminGroup{}
	}
	return a.group()
}

// AddReplicaMember implements storagedv1.AdminServiceServer.
func (a *AdminService) AddReplicaMember(ctx context.Context, req *storagedv1.AddReplicaMemberRequest) (*storagedv1.AddReplicaMemberResponse, error) {
	if req.GetId() == 0 {
		return nil, badAdmin("id", "a member id must not be 0")
	}
	if reason := peerAddrProblem(req.GetPeerAddr()); reason != "" {
		return nil, badAdmin("peer_addr", reason)
	}
	g := a.groupInfo()
	if g.PeerAddrProblem != nil {
		if reason := g.PeerAddrProblem(req.GetPeerAddr()); reason != "" {
			return nil, badAdmin("peer_addr", reason)
		}
	}
	m, err := a.store.AddLearner(ctx, req.GetId(), req.GetPeerAddr())
	if err != nil {
		return nil, a.memberError("AddReplicaMember", err)
	}
	return &storagedv1.AddReplicaMemberResponse{Membership: a.membershipAnswer(m, g), ClusterId: g.ClusterID, Group: g.Group}, nil
}

// PromoteReplicaMember implements storagedv1.AdminServiceServer.
func (a *AdminService) PromoteReplicaMember(ctx context.Context, req *storagedv1.PromoteReplicaMemberRequest) (*storagedv1.PromoteReplicaMemberResponse, error) {
	if req.GetId() == 0 {
		return nil, badAdmin("id", "a member id must not be 0")
	}
	m, err := a.store.PromoteLearner(ctx, req.GetId())
	if err != nil {
		return nil, a.memberError("PromoteReplicaMember", err)
	}
	return &storagedv1.PromoteReplicaMemberResponse{Membership: a.membershipAnswer(m, a.groupInfo())}, nil
}

// RemoveReplicaMember implements storagedv1.AdminServiceServer.
func (a *AdminService) RemoveReplicaMember(ctx context.Context, req *storagedv1.RemoveReplicaMemberRequest) (*storagedv1.RemoveReplicaMemberResponse, error) {
	if req.GetId() == 0 {
		return nil, badAdmin("id", "a member id must not be 0")
	}
	m, err := a.store.RemoveMember(ctx, req.GetId())
	if err != nil {
		return nil, a.memberError("RemoveReplicaMember", err)
	}
	return &storagedv1.RemoveReplicaMemberResponse{Membership: a.membershipAnswer(m, a.groupInfo())}, nil
}

// TransferReplicaLeadership implements storagedv1.AdminServiceServer.
func (a *AdminService) TransferReplicaLeadership(ctx context.Context, req *storagedv1.TransferReplicaLeadershipRequest) (*storagedv1.TransferReplicaLeadershipResponse, error) {
	lead, err := a.store.MoveLeadership(ctx, req.GetId())
	if err != nil {
		return nil, a.memberError("TransferReplicaLeadership", err)
	}
	resp := &storagedv1.TransferReplicaLeadershipResponse{LeaderId: lead, LeaderAddr: a.leaderAddr(lead)}
	if u, err := a.store.Membership(); err == nil {
		resp.Membership = a.membershipAnswer(u.Membership, a.groupInfo())
	}
	return resp, nil
}

// membershipAnswer is m with the peer addresses (those raft/conf holds,
// else the transport's) and removals this member knows.
func (a *AdminService) membershipAnswer(m storage.GroupMembership, g AdminGroup) *storagedv1.ReplicaMembership {
	out := Membership{Index: m.Index, Voters: m.Voters, Learners: m.Learners}
	var conf storage.MembershipUpdate
	if u, err := a.store.Membership(); err == nil {
		conf = u
	}
	out.PeerAddrs = MemberPeerAddrs(m, conf.PeerAddrs, g.PeerAddrs)
	out.Removed = slices.Clone(conf.Removed)
	return membershipProto(out)
}

// MemberPeerAddrs is the peer address of each member of m: the one a
// conf change recorded (conf), else the one the transport knows.
func MemberPeerAddrs(m storage.GroupMembership, conf, transport map[uint64]string) map[uint64]string {
	addrs := make(map[uint64]string)
	for _, id := range slices.Concat(m.Voters, m.Learners, m.VotersOutgoing, m.LearnersNext) {
		if a, ok := conf[id]; ok && a != "" {
			addrs[id] = a
		} else if a, ok := transport[id]; ok && a != "" {
			addrs[id] = a
		}
	}
	return addrs
}

// MembershipOf is u as GetReplicaInfo reports it, with the transport's
// addresses for the members raft/conf has none of.
func MembershipOf(u storage.MembershipUpdate, transport map[uint64]string) *Membership {
	return &Membership{Index: u.Membership.Index, Voters: slices.Clone(u.Membership.Voters),
		Learners: slices.Clone(u.Membership.Learners), PeerAddrs: MemberPeerAddrs(u.Membership, u.PeerAddrs, transport),
		Removed: slices.Clone(u.Removed)}
}

// peerAddrProblem checks a member's peer address: host:port, a host, a
// port in 1-65535, at most maxPeerAddrBytes.
func peerAddrProblem(addr string) string {
	if addr == "" {
		return "required: the new member's peer address, host:port of its --peer-listen"
	}
	if len(addr) > maxPeerAddrBytes {
		return fmt.Sprintf("longer than %d bytes", maxPeerAddrBytes)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "not host:port"
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "the port is not a number in 1-65535"
	}
	if host == "" {
		return "no host"
	}
	return ""
}

// memberError is the one mapping from a refused or failed membership
// change to a gRPC status (admin.proto, AddReplicaMember):
//
//	storage.ErrNotGroup                   → FAILED_PRECONDITION, CONF_CHANGE_REFUSED, cause STANDALONE
//	*storage.NotLeaderError               → UNAVAILABLE + RetryInfo, as a refused put (notLeaderStatus)
//	storage.ErrInSyncReplicasNotEnough    → UNAVAILABLE + RetryInfo, IN_SYNC_REPLICAS_NOT_ENOUGH
//	replica.ErrProposalDropped            → UNAVAILABLE + RetryInfo, cause PROPOSAL_DROPPED
//	storage.ErrConfChangePending          → ABORTED + RetryInfo, CONF_CHANGE_REFUSED, cause CONF_CHANGE_PENDING
//	storage.ErrBadConfChange, ErrLearnerBehind, ErrRemoveLeader, ErrQuorumAfterChange
//	                                      → FAILED_PRECONDITION, CONF_CHANGE_REFUSED, cause BAD_CONF_CHANGE,
//	                                        LEARNER_BEHIND, REMOVE_LEADER, QUORUM_AFTER_CHANGE
//	storage.ErrNotVoter, ErrTransfereeInactive, ErrNoTransferee
//	                                      → FAILED_PRECONDITION, CONF_CHANGE_REFUSED, cause NOT_VOTER,
//	                                        TRANSFEREE_INACTIVE, NO_TRANSFEREE (a leadership transfer)
//	storage.ErrTransferTimeout            → UNAVAILABLE + RetryInfo, cause TRANSFER_TIMEOUT
//	storage.ErrReplicationTimeout         → DEADLINE_EXCEEDED, FLUSH_SLAVE_TIMEOUT, metadata outcome unknown
//	replica.ErrClosed                     → UNAVAILABLE, metadata outcome unknown (the member closed meanwhile)
//	ErrStarting, storage.ErrClosed        → UNAVAILABLE + RetryInfo
//	anything else                         → INTERNAL (logged)
//
// Every refusal but the timeout and replica.ErrClosed means nothing was
// proposed (for a leadership transfer: nothing changed, but for
// TRANSFER_TIMEOUT, after which the leader leads still unless the
// transferee had been told to campaign already).
func (a *AdminService) memberError(m string, err error) error {
	var nl *storage.NotLeaderError
	refused := func(code codes.Code, cause, msg string, details ...*errdetails.RetryInfo) error {
		info := &errdetails.ErrorInfo{Reason: ReasonConfChangeRefused, Domain: ErrorDomain, Metadata: map[string]string{"cause": cause}}
		if len(details) > 0 {
			return newStatus(code, msg, info, details[0])
		}
		return newStatus(code, msg, info)
	}
	switch {
	case errors.Is(err, storage.ErrNotGroup):
		return refused(codes.FailedPrecondition, CauseStandalone, "this server is not a member of a replication group (no --raft-peers)")
	case errors.As(err, &nl):
		return notLeaderStatus(&errdetails.ErrorInfo{Domain: ErrorDomain}, nl.Cause, nl.LeaderID,
			a.leaderAddr(nl.LeaderID), nl.Term, "change")
	case errors.Is(err, storage.ErrInSyncReplicasNotEnough):
		return unavailable(&errdetails.ErrorInfo{Reason: storage.InSyncReplicasNotEnough.String(), Domain: ErrorDomain},
			retryDelayUnavailable, "the group's leader has too few recently active followers to commit; nothing changed; retry shortly")
	case errors.Is(err, replica.ErrProposalDropped):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": "PROPOSAL_DROPPED"}}, retryDelayUnavailable,
			"raft dropped the change (a leadership transfer, or too much uncommitted); nothing changed; retry shortly")
	case errors.Is(err, storage.ErrConfChangePending):
		return refused(codes.Aborted, CauseConfChangePending, "another membership change is in progress; nothing changed; "+
			"retry once it applied", &errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayConfPending)})
	case errors.Is(err, storage.ErrBadConfChange):
		return refused(codes.FailedPrecondition, CauseBadConfChange, "the change does not fit the group's membership "+
			"(an id that is or was a member, or not a member; ids are never reused): nothing changed: "+err.Error())
	case errors.Is(err, storage.ErrLearnerBehind):
		return refused(codes.FailedPrecondition, CauseLearnerBehind, "the learner is not caught up with the leader, "+
			"or was not heard from recently; nothing changed; promote it once it has caught up")
	case errors.Is(err, storage.ErrRemoveLeader):
		return refused(codes.FailedPrecondition, CauseRemoveLeader, "the leader found no active voter to hand its "+
			"leadership to before its removal; nothing changed")
	case errors.Is(err, storage.ErrNotVoter):
		return refused(codes.FailedPrecondition, CauseNotVoter, "only a voter can lead: the member asked for is a learner, "+
			"not a member, or removed; nothing changed: "+err.Error())
	case errors.Is(err, storage.ErrTransfereeInactive):
		return refused(codes.FailedPrecondition, CauseTransfereeInactive, "the leader has not heard from that voter within "+
			"an election timeout (down or cut off); nothing changed: "+err.Error())
	case errors.Is(err, storage.ErrNoTransferee):
		return refused(codes.FailedPrecondition, CauseNoTransferee, "the leader has heard from no other voter within an "+
			"election timeout; nothing changed")
	case errors.Is(err, storage.ErrTransferTimeout):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": CauseTransferTimeout}}, retryDelayUnavailable,
			"the leader did not hand its leadership over in time (two election timeouts, or the call's deadline); "+
				"it leads still and takes puts again (read the leader first: a transferee already told to campaign may win); "+
				"retry on the group's leader")
	case errors.Is(err, storage.ErrQuorumAfterChange):
		return refused(codes.FailedPrecondition, CauseQuorumAfterChange, "removing this voter would leave fewer active "+
			"voters than a quorum; nothing changed")
	case errors.Is(err, storage.ErrReplicationTimeout):
		return newStatus(codes.DeadlineExceeded, "the change was proposed to the group but not seen applied within "+
			"--replication-timeout; it may still apply: read the membership before trying again",
			&errdetails.ErrorInfo{Reason: storage.FlushSlaveTimeout.String(), Domain: ErrorDomain,
				Metadata: map[string]string{"outcome": "unknown"}})
	case errors.Is(err, replica.ErrClosed):
		return newStatus(codes.Unavailable, "the member closed while the change was pending; it may still apply: "+
			"read the membership from the group before trying again",
			&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain, Metadata: map[string]string{"outcome": "unknown"}})
	case errors.Is(err, ErrStarting):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain}, retryDelayUnavailable,
			"the store is starting (recovering its commitlog); retry shortly")
	case errors.Is(err, storage.ErrClosed):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain}, retryDelayUnavailable,
			"the store is shutting down")
	}
	a.log.Error().Err(err).Str("grpc.method", m).Msg("membership change failed with an unexpected error")
	return newStatus(codes.Internal, "internal error", &errdetails.ErrorInfo{Reason: ReasonInternal, Domain: ErrorDomain})
}

func (a *AdminService) leaderAddr(id uint64) string {
	g := a.groupInfo()
	if id == 0 || g.ClientAddr == nil {
		return ""
	}
	return g.ClientAddr(id)
}
