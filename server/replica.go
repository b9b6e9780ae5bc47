package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// ReplicaInfo is a replica's view of its replication group, as
// GetReplicaInfo reports it. The binary fills it from the store
// (WithReplication); the server only converts it.
type ReplicaInfo struct {
	// Role is one of the Role* constants.
	Role               string
	ID, Term, LeaderID uint64
	Commit, Applied    uint64
	CommitEnd          int64
	Ready              bool // the leader takes puts
	Peers              []PeerProgress
	// ReadaheadBytes and Readaheads: commitlog bytes this member, leading,
	// asked the kernel to read ahead of followers catching up, and in how
	// many requests (--raft-catchup-readahead).
	ReadaheadBytes, Readaheads int64
	// LeadersForgotten counts the leaders this member forgot because the
	// peer transport found their process gone (its stream ended, the next
	// attempts failed, nothing heard from it); EarlyCampaigns the
	// elections it started for that before raft's election timeout.
	LeadersForgotten, EarlyCampaigns uint64
	// StorageEntries times raft's reads of this member's log.
	StorageEntries storage.HistogramSnapshot
	// ReadyHandling times each round of the raft loop (a Ready: its
	// writes, sync, sends and applies), LogSync each sync of the raft log.
	ReadyHandling, LogSync storage.HistogramSnapshot
	// Membership is the group's membership as this member applied it;
	// nil while unknown (the store is opening).
	Membership *Membership
	// ClusterID and Group identify the group (--raft-join, --raft-group).
	ClusterID, Group string
	// TickInterval and ElectionTicks are the raft timing the member's
	// replica runs with (--raft-tick, and --raft-election-timeout in
	// ticks), read from the replica rather than the flags so that they
	// show what reached raft; 0 while unknown (the store is opening).
	TickInterval  time.Duration
	ElectionTicks int
}

// Membership is a group's membership (storage.MembershipUpdate, with the
// peer addresses this member knows).
type Membership struct {
	Index            uint64
	Voters, Learners []uint64
	PeerAddrs        map[uint64]string
	Removed          []uint64
}

// PeerProgress is the leader's view of one member.
type PeerProgress struct {
	ID, Match, Next uint64
	RecentActive    bool
	Learner         bool
}

// Roles of ReplicaInfo.Role.
const (
	RoleLeader    = "leader"
	RoleFollower  = "follower"
	RoleCandidate = "candidate" // pre-candidates too
	RoleLearner   = "learner"
)

// Causes of a "not leader" answer (ErrorInfo metadata "cause").
const (
	CauseNotLeader      = "NOT_LEADER"
	CauseNoLeader       = "NO_LEADER"
	CauseLeaderNotReady = "LEADER_NOT_READY"
	CauseTransferring   = "TRANSFERRING"
)

// retryDelayLeaderMoving is the RetryInfo of LEADER_NOT_READY and
// TRANSFERRING: a new leader applies its term's first entry within one
// commit round, and a leadership transfer on a healthy group finishes in
// one election round (no election timeout), both tens of milliseconds;
// the client asks again and follows the hint then.
const retryDelayLeaderMoving = 50 * time.Millisecond

// retryDelayNoLeader is the RetryInfo of a "not leader" answer while no
// leader is known: about one election timeout (10 ticks of 100 ms).
const retryDelayNoLeader = time.Second

// WithReplication makes GetReplicaInfo report info() and lets "not
// leader" answers name the leader's client address (clientAddr(id), ""
// when unknown). Without it the service is standalone: GetReplicaInfo
// answers REPLICA_ROLE_STANDALONE.
func WithReplication(info func() ReplicaInfo, clientAddr func(id uint64) string) Option {
	return func(s *Service) {
		s.replicaInfo = info
		s.clientAddr = clientAddr
	}
}

// GetReplicaInfo implements storagedv1.MessageStoreServiceServer.
func (s *Service) GetReplicaInfo(context.Context, *storagedv1.GetReplicaInfoRequest) (*storagedv1.GetReplicaInfoResponse, error) {
	var dedup *durationpb.Duration
	if ds, ok := s.store.(DedupStore); ok {
		if h := ds.DedupHorizon(); h > 0 {
			dedup = durationpb.New(h)
		}
	}
	if s.replicaInfo == nil {
		return &storagedv1.GetReplicaInfoResponse{Role: storagedv1.ReplicaRole_REPLICA_ROLE_STANDALONE, DedupWindow: dedup}, nil
	}
	ri := s.replicaInfo()
	resp := &storagedv1.GetReplicaInfoResponse{
		Role: replicaRole(ri.Role), Id: ri.ID, Term: ri.Term, LeaderId: ri.LeaderID, LeaderAddr: s.leaderAddr(ri.LeaderID),
		Commit: ri.Commit, Applied: ri.Applied, CommitEnd: ri.CommitEnd, Ready: ri.Ready, DedupWindow: dedup,
	}
	for _, p := range ri.Peers {
		resp.Peers = append(resp.Peers, &storagedv1.PeerProgress{Id: p.ID, Match: p.Match, Next: p.Next,
			RecentActive: p.RecentActive, Learner: p.Learner})
	}
	if ri.Membership != nil {
		resp.Membership = membershipProto(*ri.Membership)
		resp.Membership.ClientAddrs = s.memberClientAddrs(*ri.Membership)
	}
	resp.ClusterId, resp.Group = ri.ClusterID, ri.Group
	return resp, nil
}

func membershipProto(m Membership) *storagedv1.ReplicaMembership {
	return &storagedv1.ReplicaMembership{Index: m.Index, Voters: m.Voters, Learners: m.Learners,
		PeerAddrs: m.PeerAddrs, Removed: m.Removed}
}

func replicaRole(r string) storagedv1.ReplicaRole {
	switch r {
	case RoleLeader:
		return storagedv1.ReplicaRole_REPLICA_ROLE_LEADER
	case RoleFollower:
		return storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER
	case RoleCandidate:
		return storagedv1.ReplicaRole_REPLICA_ROLE_CANDIDATE
	case RoleLearner:
		return storagedv1.ReplicaRole_REPLICA_ROLE_LEARNER
	}
	return storagedv1.ReplicaRole_REPLICA_ROLE_UNSPECIFIED
}

// memberClientAddrs is the client address this member knows for each
// voter and learner of m: what lets a client configured with some of the
// members find the ones added since (client.LeaderTracker).
func (s *Service) memberClientAddrs(m Membership) map[uint64]string {
	if s.clientAddr == nil {
		return nil
	}
	out := map[uint64]string{}
	for _, id := range slices.Concat(m.Voters, m.Learners) {
		if a := s.clientAddr(id); a != "" {
			out[id] = a
		}
	}
	return out
}

func (s *Service) leaderAddr(id uint64) string {
	if id == 0 || s.clientAddr == nil {
		return ""
	}
	return s.clientAddr(id)
}

// notLeaderStatus is the answer of a replica that cannot take a put, or
// serve a linearizable read (op "put" or "read"; design replication.md
// §1): UNAVAILABLE, nothing stored or read, ErrorInfo SERVICE_NOT_AVAILABLE
// with metadata cause (NOT_LEADER, NO_LEADER, LEADER_NOT_READY,
// TRANSFERRING), leader_id, leader_addr and term, and a RetryInfo of 0 when
// the leader's address is known (retry there now), about one election
// timeout when not. Not FAILED_PRECONDITION: gRPC clients do not retry
// that, and this is a retry elsewhere.
func (s *Service) notLeaderStatus(info *errdetails.ErrorInfo, cause string, leaderID, term uint64, op string) error {
	return notLeaderStatus(info, cause, leaderID, s.leaderAddr(leaderID), term, op)
}

// notLeaderStatus is Service.notLeaderStatus with the leader's client
// address given; op "change" is a membership change (AdminService).
func notLeaderStatus(info *errdetails.ErrorInfo, cause string, leaderID uint64, addr string, term uint64, op string) error {
	info.Reason = ReasonUnavailable
	info.Metadata = map[string]string{
		"cause":       cause,
		"leader_id":   strconv.FormatUint(leaderID, 10),
		"leader_addr": addr,
		"term":        strconv.FormatUint(term, 10),
	}
	nothing, takes := "nothing was stored", "taking puts"
	switch op {
	case "read":
		nothing, takes = "nothing was read", "serving linearizable reads"
	case "change":
		nothing, takes = "nothing changed", "taking membership changes"
	}
	delay := retryDelayNoLeader
	var msg string
	switch {
	case addr != "" && (cause == CauseLeaderNotReady || cause == CauseTransferring):
		// The leader is about to take puts (its term's first entry is being
		// applied), or leadership is moving: a short wait, then the hint
		// again.
		delay = retryDelayLeaderMoving
		msg = fmt.Sprintf("the group's leader, member %d at %s, is not %s yet (%s); %s; retry shortly",
			leaderID, addr, takes, cause, nothing)
	case addr != "":
		delay = 0
		msg = fmt.Sprintf("this replica is not the group's leader (%s); %s; send the %s to the leader, member %d at %s",
			cause, nothing, op, leaderID, addr)
	case leaderID != 0:
		msg = fmt.Sprintf("this replica is not the group's leader (%s); %s; the leader is member %d (address not known yet)",
			cause, nothing, leaderID)
	default:
		msg = fmt.Sprintf("the group has no leader right now (%s); %s; retry after an election", cause, nothing)
	}
	return newStatus(codes.Unavailable, msg, info, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}
