package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// memberStore is an AdminStore whose membership changes fail with err.
type memberStore struct {
	AdminStore
	err error
}

func (m memberStore) AddLearner(context.Context, uint64, string) (storage.GroupMembership, error) {
	return storage.GroupMembership{}, m.err
}

func (m memberStore) PromoteLearner(context.Context, uint64) (storage.GroupMembership, error) {
	return storage.GroupMembership{}, m.err
}

func (m memberStore) RemoveMember(context.Context, uint64) (storage.GroupMembership, error) {
	return storage.GroupMembership{}, m.err
}

func (m memberStore) MoveLeadership(context.Context, uint64) (uint64, error) {
	return 0, m.err
}

// memberCalls are the three membership changes and the leadership
// transfer on c, with valid requests.
func memberCalls(c storagedv1.AdminServiceClient) map[string]func(ctx context.Context) error {
	return map[string]func(ctx context.Context) error{
		"add": func(ctx context.Context) error {
			_, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: "127.0.0.1:9191"})
			return err
		},
		"promote": func(ctx context.Context) error {
			_, err := c.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{Id: 4})
			return err
		},
		"remove": func(ctx context.Context) error {
			_, err := c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: 4})
			return err
		},
		"transfer": func(ctx context.Context) error {
			_, err := c.TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: 4})
			return err
		},
	}
}

// TestMemberChangeValidation: a zero id or a bad peer address is
// INVALID_ARGUMENT with a BadRequest on the field, before the store.
func TestMemberChangeValidation(t *testing.T) {
	c := startAdmin(t, memberStore{err: fmt.Errorf("store called")})
	ctx := ctxT(t)
	check := func(err error, field string) {
		t.Helper()
		d := details(t, err)
		d.want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
		if v := d.badRequest.GetFieldViolations(); len(v) != 1 || v[0].GetField() != field {
			t.Errorf("field violations %v, want one on %s", v, field)
		}
	}
	_, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{PeerAddr: "127.0.0.1:9191"})
	check(err, "id")
	for _, addr := range []string{"", "127.0.0.1", ":9191", "h:0", "h:65536", "h:x", "h:" + strings.Repeat("1", 260),
		strings.Repeat("h", 252) + ":9191"} {
		_, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: addr})
		check(err, "peer_addr")
	}
	_, err = c.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{})
	check(err, "id")
	_, err = c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{})
	check(err, "id")
	// The transport's own rule (AdminGroup.PeerAddrProblem), before the store.
	srv, err := NewAdminServer(NewAdminService(memberStore{err: fmt.Errorf("store called")}, zerolog.Nop(),
		WithAdminGroup(func() AdminGroup {
			return AdminGroup{PeerAddrProblem: func(addr string) string {
				if strings.HasPrefix(addr, "10.") {
					return "not loopback"
				}
				return ""
			}}
		})), GRPCConfig{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = serveAdmin(t, srv).AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: "10.0.0.4:9191"})
	check(err, "peer_addr")
	// 256 bytes is allowed (the fake store answers, with an internal error).
	_, err = c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: strings.Repeat("h", 251) + ":9191"})
	details(t, err).want(t, codes.Internal, ReasonInternal, false)
}

// TestMemberChangeRefusals: each refusal of a membership change or a
// leadership transfer reaches the client with its code, reason and cause,
// on all four calls (one mapping serves them); a real standalone store
// answers FAILED_PRECONDITION, cause STANDALONE.
func TestMemberChangeRefusals(t *testing.T) {
	standalone, _ := openStore(t, nil)
	for _, tc := range []struct {
		name   string
		store  AdminStore
		code   codes.Code
		reason string
		md     map[string]string
		retry  bool
	}{
		{"standalone", standalone, codes.FailedPrecondition, ReasonConfChangeRefused, map[string]string{"cause": "STANDALONE"}, false},
		{"starting", &DeferredAdminStore{}, codes.Unavailable, ReasonUnavailable, nil, true},
		{"follower", memberStore{err: fmt.Errorf("storage: add: %w", &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 4})},
			codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NOT_LEADER", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "4"}, true},
		{"no leader", memberStore{err: &storage.NotLeaderError{Cause: CauseNoLeader, Term: 4}}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NO_LEADER", "leader_id": "0", "leader_addr": "", "term": "4"}, true},
		{"in sync", memberStore{err: storage.ErrInSyncReplicasNotEnough}, codes.Unavailable, "IN_SYNC_REPLICAS_NOT_ENOUGH", nil, true},
		{"pending", memberStore{err: fmt.Errorf("x: %w", storage.ErrConfChangePending)}, codes.Aborted, ReasonConfChangeRefused,
			map[string]string{"cause": "CONF_CHANGE_PENDING"}, true},
		{"bad", memberStore{err: fmt.Errorf("x: %w", storage.ErrBadConfChange)}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "BAD_CONF_CHANGE"}, false},
		{"behind", memberStore{err: fmt.Errorf("x: %w", storage.ErrLearnerBehind)}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "LEARNER_BEHIND"}, false},
		{"remove leader", memberStore{err: fmt.Errorf("x: %w", storage.ErrRemoveLeader)}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "REMOVE_LEADER"}, false},
		{"transfer timeout", memberStore{err: fmt.Errorf("x: %w", storage.ErrTransferTimeout)}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "TRANSFER_TIMEOUT"}, true},
		{"quorum", memberStore{err: fmt.Errorf("x: %w", storage.ErrQuorumAfterChange)}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "QUORUM_AFTER_CHANGE"}, false},
		{"not a voter", memberStore{err: fmt.Errorf("x: %w", storage.ErrNotVoter)}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "NOT_VOTER"}, false},
		{"transferee inactive", memberStore{err: fmt.Errorf("x: %w", storage.ErrTransfereeInactive)}, codes.FailedPrecondition,
			ReasonConfChangeRefused, map[string]string{"cause": "TRANSFEREE_INACTIVE"}, false},
		{"no transferee", memberStore{err: storage.ErrNoTransferee}, codes.FailedPrecondition, ReasonConfChangeRefused,
			map[string]string{"cause": "NO_TRANSFEREE"}, false},
		{"transferring", memberStore{err: fmt.Errorf("x: %w", &storage.NotLeaderError{Cause: CauseTransferring, LeaderID: 2, Term: 5})},
			codes.Unavailable, ReasonUnavailable, map[string]string{"cause": "TRANSFERRING", "leader_id": "2", "term": "5"}, true},
		{"closing", memberStore{err: fmt.Errorf("x: %w", storage.ErrClosed)}, codes.Unavailable, ReasonUnavailable, nil, true},
		{"timeout", memberStore{err: fmt.Errorf("x: %w", storage.ErrReplicationTimeout)}, codes.DeadlineExceeded,
			storage.FlushSlaveTimeout.String(), map[string]string{"outcome": "unknown"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := map[uint64]string{1: "127.0.0.1:9090"}
			srv, err := NewAdminServer(NewAdminService(tc.store, zerolog.Nop(), WithAdminGroup(func() AdminGroup {
				return AdminGroup{ClientAddr: func(id uint64) string { return addrs[id] }}
			})), GRPCConfig{})
			if err != nil {
				t.Fatal(err)
			}
			c := serveAdmin(t, srv)
			for name, call := range memberCalls(c) {
				d := details(t, call(ctxT(t)))
				if d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
					t.Errorf("%s: %v %q (%q), want %v %s", name, d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, tc.reason)
				}
				if (d.retry != nil) != tc.retry {
					t.Errorf("%s: RetryInfo %v, want present %v", name, d.retry, tc.retry)
				}
				for k, v := range tc.md {
					if got, ok := d.info.GetMetadata()[k]; !ok || got != v {
						t.Errorf("%s: metadata %s = %q, want %q (all %v)", name, k, got, v, d.info.GetMetadata())
					}
				}
			}
		})
	}
}

// nopTransport drops every raft message: a one-voter group needs none.
type nopTransport struct{}

func (nopTransport) Send(uint64, []byte) {}

// oneVoterGroup is a real store, the only voter (1) of group "g" of
// cluster "cid", once it is the ready leader, and an admin client of it
// whose group knows member 1 at peer address 127.0.0.1:9191 and client
// address 127.0.0.1:9090.
func oneVoterGroup(t *testing.T) (*storage.Store, storagedv1.AdminServiceClient) {
	t.Helper()
	st, _ := openStore(t, func(o *storage.Options) {
		o.FlushMode = storage.FlushSync
		o.Group = &storage.GroupOptions{ID: 1, Name: "g", ClusterID: "cid", Peers: []uint64{1}, Transport: nopTransport{},
			ReplicationTimeout: 10 * time.Second, TickInterval: 10 * time.Millisecond}
	})
	poll, deadline := time.NewTicker(5*time.Millisecond), time.After(20*time.Second)
	defer poll.Stop()
	for !st.ReplicaInfo().Ready {
		select {
		case <-deadline:
			t.Fatal("the one-voter group's leader is not ready after 20s")
		case <-poll.C:
		}
	}
	srv, err := NewAdminServer(NewAdminService(st, zerolog.Nop(), WithAdminGroup(func() AdminGroup {
		return AdminGroup{ClusterID: "cid", Group: "g", PeerAddrs: map[uint64]string{1: "127.0.0.1:9191"},
			ClientAddr: func(id uint64) string { return map[uint64]string{1: "127.0.0.1:9090"}[id] }}
	})), GRPCConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return st, serveAdmin(t, srv)
}

// TestMemberChangesOnGroup: against a real one-voter group, an added
// learner is in the answered membership with its peer address, the cluster
// id and group name; a learner never heard from is not promoted
// (LEARNER_BEHIND), the only voter cannot remove itself (QUORUM_AFTER_CHANGE), an id
// that is a member or was removed is refused (BAD_CONF_CHANGE); the
// learner's removal is answered with it in removed; GetReplicaInfo-style
// MembershipOf shows the same.
func TestMemberChangesOnGroup(t *testing.T) {
	st, c := oneVoterGroup(t)
	ctx := ctxT(t)
	add, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 2, PeerAddr: "127.0.0.1:9292"})
	if err != nil {
		t.Fatalf("AddReplicaMember: %v", err)
	}
	m := add.GetMembership()
	if add.GetClusterId() != "cid" || add.GetGroup() != "g" || m.GetIndex() == 0 || !slices.Equal(m.GetVoters(), []uint64{1}) ||
		!slices.Equal(m.GetLearners(), []uint64{2}) || m.GetPeerAddrs()[1] != "127.0.0.1:9191" || m.GetPeerAddrs()[2] != "127.0.0.1:9292" {
		t.Fatalf("AddReplicaMember answered %v", add)
	}
	_, err = c.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{Id: 2})
	if d := details(t, err); d.st.Code() != codes.FailedPrecondition || d.info.GetMetadata()["cause"] != CauseLearnerBehind {
		t.Errorf("promote of a silent learner: %v %v", d.st.Code(), d.info)
	}
	_, err = c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: 1})
	if d := details(t, err); d.st.Code() != codes.FailedPrecondition || d.info.GetMetadata()["cause"] != CauseQuorumAfterChange {
		t.Errorf("remove of the only voter: %v %v", d.st.Code(), d.info)
	}
	_, err = c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 2, PeerAddr: "127.0.0.1:9292"})
	if d := details(t, err); d.st.Code() != codes.FailedPrecondition || d.info.GetMetadata()["cause"] != CauseBadConfChange {
		t.Errorf("add of a member: %v %v", d.st.Code(), d.info)
	}
	rm, err := c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: 2})
	if err != nil {
		t.Fatalf("RemoveReplicaMember: %v", err)
	}
	if m := rm.GetMembership(); len(m.GetLearners()) != 0 || !slices.Equal(m.GetRemoved(), []uint64{2}) || m.GetIndex() <= add.GetMembership().GetIndex() {
		t.Fatalf("RemoveReplicaMember answered %v", rm)
	}
	_, err = c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 2, PeerAddr: "127.0.0.1:9292"})
	if d := details(t, err); d.st.Code() != codes.FailedPrecondition || d.info.GetMetadata()["cause"] != CauseBadConfChange {
		t.Errorf("add of a removed id: %v %v", d.st.Code(), d.info)
	}
	u, err := st.Membership()
	if err != nil {
		t.Fatal(err)
	}
	if mo := MembershipOf(u, map[uint64]string{1: "127.0.0.1:9191"}); !slices.Equal(mo.Voters, []uint64{1}) ||
		!slices.Equal(mo.Removed, []uint64{2}) || mo.PeerAddrs[1] != "127.0.0.1:9191" || len(mo.PeerAddrs) != 1 {
		t.Errorf("MembershipOf = %+v", mo)
	}
}

// TestTransferLeadershipOnGroup: against a real one-voter group with a
// learner, TransferReplicaLeadership to the leader itself answers at once
// with its id, client address and the membership; to the learner, to an
// unknown id or to a removed one it is FAILED_PRECONDITION, cause
// NOT_VOTER; with id 0 (no other voter) NO_TRANSFEREE; after each the
// leader leads, ready. (Moves between members: tests/cluster's
// TestGroupTransferLeadership.)
func TestTransferLeadershipOnGroup(t *testing.T) {
	st, c := oneVoterGroup(t)
	ctx := ctxT(t)
	if _, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 2, PeerAddr: "127.0.0.1:9292"}); err != nil {
		t.Fatalf("AddReplicaMember: %v", err)
	}
	if _, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 3, PeerAddr: "127.0.0.1:9393"}); err != nil {
		t.Fatalf("AddReplicaMember: %v", err)
	}
	if _, err := c.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: 3}); err != nil {
		t.Fatalf("RemoveReplicaMember: %v", err)
	}
	resp, err := c.TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: 1})
	if m := resp.GetMembership(); err != nil || resp.GetLeaderId() != 1 || resp.GetLeaderAddr() != "127.0.0.1:9090" ||
		!slices.Equal(m.GetVoters(), []uint64{1}) || !slices.Equal(m.GetLearners(), []uint64{2}) || !slices.Equal(m.GetRemoved(), []uint64{3}) ||
		m.GetPeerAddrs()[2] != "127.0.0.1:9292" {
		t.Fatalf("a transfer to the leader itself: %v, %v", resp, err)
	}
	for _, tc := range []struct {
		name  string
		id    uint64
		cause string
	}{
		{"the learner", 2, CauseNotVoter},
		{"a removed member", 3, CauseNotVoter},
		{"an unknown id", 9, CauseNotVoter},
		{"the most caught-up voter", 0, CauseNoTransferee},
	} {
		_, err := c.TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: tc.id})
		d := details(t, err)
		d.want(t, codes.FailedPrecondition, ReasonConfChangeRefused, false)
		if got := d.info.GetMetadata()["cause"]; got != tc.cause {
			t.Errorf("a transfer to %s: cause %q (%s), want %s", tc.name, got, d.st.Message(), tc.cause)
		}
		if ri := st.ReplicaInfo(); ri.Role != "leader" || !ri.Ready {
			t.Fatalf("after a transfer to %s: %s, ready %v", tc.name, ri.Role, ri.Ready)
		}
	}
}
