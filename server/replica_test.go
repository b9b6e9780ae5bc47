package server

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// A standalone server answers GetReplicaInfo with role STANDALONE and its
// store's dedup window (unset when deduplication is off), over real gRPC;
// a store still opening (DeferredStore) has none yet.
func TestGetReplicaInfoStandalone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		want   *durationpb.Duration
	}{
		{"default", 0, durationpb.New(storage.DefaultDedupWindow)},
		{"configured", 90 * time.Second, durationpb.New(90 * time.Second)},
		{"off", -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := storeServer(t, func(o *storage.Options) { o.DedupWindow = tc.window })
			resp, err := c.GetReplicaInfo(ctxT(t), &storagedv1.GetReplicaInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			want := &storagedv1.GetReplicaInfoResponse{Role: storagedv1.ReplicaRole_REPLICA_ROLE_STANDALONE, DedupWindow: tc.want}
			if !proto.Equal(resp, want) {
				t.Fatalf("got %v, want %v", resp, want)
			}
		})
	}
	var d DeferredStore
	if h := d.DedupHorizon(); h != 0 {
		t.Fatalf("a DeferredStore before Set: dedup horizon %v, want 0", h)
	}
	st, _ := openStore(t, nil)
	d.Set(st)
	if h := d.DedupHorizon(); h != storage.DefaultDedupWindow {
		t.Fatalf("a DeferredStore after Set: dedup horizon %v, want the store's %v", h, storage.DefaultDedupWindow)
	}
}

// With WithReplication, GetReplicaInfo converts the store's view and names
// the leader's client address.
func TestGetReplicaInfoGroup(t *testing.T) {
	for _, tc := range []struct {
		role string
		want storagedv1.ReplicaRole
	}{
		{RoleLeader, storagedv1.ReplicaRole_REPLICA_ROLE_LEADER},
		{RoleFollower, storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER},
		{RoleCandidate, storagedv1.ReplicaRole_REPLICA_ROLE_CANDIDATE},
		{RoleLearner, storagedv1.ReplicaRole_REPLICA_ROLE_LEARNER},
		{"bogus", storagedv1.ReplicaRole_REPLICA_ROLE_UNSPECIFIED},
	} {
		info := ReplicaInfo{Role: tc.role, ID: 2, Term: 7, LeaderID: 1, Commit: 40, Applied: 39, CommitEnd: 4096, Ready: true,
			Peers: []PeerProgress{{ID: 3, Match: 38, Next: 39, RecentActive: true, Learner: true}},
			Membership: &Membership{Index: 12, Voters: []uint64{1, 2, 4}, Learners: []uint64{3},
				PeerAddrs: map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002"}, Removed: []uint64{5}}}
		// Member 4's address is not known yet, and 9 is no member (a
		// removed one's address the transport still holds): neither is
		// listed.
		addrs := map[uint64]string{1: "127.0.0.1:9090", 2: "127.0.0.1:9091", 3: "127.0.0.1:9092", 9: "127.0.0.1:9099"}
		c, _, _ := storeServer(t, nil, WithReplication(func() ReplicaInfo { return info }, func(id uint64) string { return addrs[id] }))
		resp, err := c.GetReplicaInfo(ctxT(t), &storagedv1.GetReplicaInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		want := &storagedv1.GetReplicaInfoResponse{Role: tc.want, Id: 2, Term: 7, LeaderId: 1, LeaderAddr: "127.0.0.1:9090",
			Commit: 40, Applied: 39, CommitEnd: 4096, Ready: true, DedupWindow: durationpb.New(storage.DefaultDedupWindow),
			Peers: []*storagedv1.PeerProgress{{Id: 3, Match: 38, Next: 39, RecentActive: true, Learner: true}},
			Membership: &storagedv1.ReplicaMembership{Index: 12, Voters: []uint64{1, 2, 4}, Learners: []uint64{3},
				PeerAddrs: map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002"}, Removed: []uint64{5},
				ClientAddrs: map[uint64]string{1: "127.0.0.1:9090", 2: "127.0.0.1:9091", 3: "127.0.0.1:9092"}}}
		if !proto.Equal(resp, want) {
			t.Fatalf("%s: got %v, want %v", tc.role, resp, want)
		}
	}
}

// notLeaderStatus: UNAVAILABLE, SERVICE_NOT_AVAILABLE with cause, leader
// id, address and term; RetryInfo 0 when the leader's address is known,
// short while it gets ready, about an election timeout when unknown.
func TestNotLeaderStatus(t *testing.T) {
	addrs := map[uint64]string{1: "127.0.0.1:9090"}
	s := New(&fakeStore{}, zerolog.Nop(), WithReplication(func() ReplicaInfo { return ReplicaInfo{} }, func(id uint64) string { return addrs[id] }))
	standalone := New(&fakeStore{}, zerolog.Nop())
	for _, tc := range []struct {
		name     string
		svc      *Service
		cause    string
		leader   uint64
		addr     string
		delay    time.Duration
		contains string
	}{
		{"leader known", s, CauseNotLeader, 1, "127.0.0.1:9090", 0, "member 1 at 127.0.0.1:9090"},
		{"leader address unknown", s, CauseNotLeader, 2, "", retryDelayNoLeader, "address not known yet"},
		{"no leader", s, CauseNoLeader, 0, "", retryDelayNoLeader, "no leader"},
		{"not ready", s, CauseLeaderNotReady, 1, "127.0.0.1:9090", retryDelayLeaderMoving, "not taking puts yet"},
		{"transferring", s, CauseTransferring, 1, "127.0.0.1:9090", retryDelayLeaderMoving, "not taking puts yet"},
		{"no address source", standalone, CauseNotLeader, 1, "", retryDelayNoLeader, "address not known yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.svc.notLeaderStatus(&errdetails.ErrorInfo{Domain: ErrorDomain}, tc.cause, tc.leader, 5, "put")
			d := details(t, err)
			if d.st.Code() != codes.Unavailable || d.info.GetReason() != ReasonUnavailable {
				t.Fatalf("%v %q", d.st.Code(), d.info.GetReason())
			}
			md := d.info.GetMetadata()
			if md["cause"] != tc.cause || md["leader_addr"] != tc.addr || md["term"] != "5" ||
				md["leader_id"] != strconv.FormatUint(tc.leader, 10) {
				t.Fatalf("metadata %v", md)
			}
			if d.retry == nil || d.retry.GetRetryDelay().AsDuration() != tc.delay {
				t.Fatalf("RetryInfo %v, want %v", d.retry, tc.delay)
			}
			if !strings.Contains(d.st.Message(), tc.contains) || !strings.Contains(d.st.Message(), "nothing was stored") {
				t.Fatalf("message %q", d.st.Message())
			}
		})
	}
}

// TestPutErrorsGroupMode: the store's group-mode refusals reach a client
// over real gRPC as the design says.
func TestPutErrorsGroupMode(t *testing.T) {
	appended := storage.AppendResult{Status: storage.AppendOK, WroteOffset: 64, WroteBytes: 100, MsgNum: 1, Offsets: []int64{64}, StoreHost: testStoreHost}
	for _, tc := range []struct {
		name   string
		res    storage.PutResult
		err    error
		code   codes.Code
		reason string
		md     map[string]string
		delay  time.Duration // -1: no RetryInfo
	}{
		{"follower", storage.PutResult{Status: storage.ServiceNotAvailable},
			&storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 4}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NOT_LEADER", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "4"}, 0},
		{"no leader", storage.PutResult{Status: storage.ServiceNotAvailable},
			&storage.NotLeaderError{Cause: CauseNoLeader, Term: 4}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NO_LEADER", "leader_id": "0", "leader_addr": "", "term": "4"}, retryDelayNoLeader},
		{"superseded", storage.PutResult{Status: storage.ServiceNotAvailable},
			fmt.Errorf("wrapped: %w", &storage.NotLeaderError{Cause: "SUPERSEDED", LeaderID: 1, Term: 5}), codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "SUPERSEDED", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "5"}, 0},
		{"in-sync replicas", storage.PutResult{Status: storage.InSyncReplicasNotEnough}, storage.ErrInSyncReplicasNotEnough,
			codes.Unavailable, storage.InSyncReplicasNotEnough.String(), nil, retryDelayUnavailable},
		{"proposal dropped", storage.PutResult{Status: storage.OSPageCacheBusy}, errors.New("replica: proposal dropped by raft; nothing stored"),
			codes.Unavailable, storage.OSPageCacheBusy.String(), nil, retryDelayBusy},
		{"replication timeout", storage.PutResult{Status: storage.FlushSlaveTimeout, Append: appended}, storage.ErrReplicationTimeout,
			codes.DeadlineExceeded, storage.FlushSlaveTimeout.String(), map[string]string{"outcome": "unknown", "stored": "unknown"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := map[uint64]string{1: "127.0.0.1:9090"}
			svc := New(&fakeStore{res: tc.res, err: tc.err}, zerologNop(),
				WithReplication(func() ReplicaInfo { return ReplicaInfo{} }, func(id uint64) string { return addrs[id] }))
			srv := startServer(t, svc, GRPCConfig{})
			srv.SetServing(true)
			c := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
			_, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}})
			d := details(t, err)
			if d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
				t.Fatalf("%v %q (%q), want %v %q", d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, tc.reason)
			}
			for k, v := range tc.md {
				if got, ok := d.info.GetMetadata()[k]; !ok || got != v {
					t.Errorf("metadata %s = %q, want %q (all %v)", k, got, v, d.info.GetMetadata())
				}
			}
			// Over the wire, the client helper's verdict: retry exactly the
			// refusals, at the leader they name.
			if v := client.Classify(err); v.NothingStored != (tc.code == codes.Unavailable) || v.LeaderAddr != tc.md["leader_addr"] ||
				v.HasRetryDelay != (tc.delay >= 0) || (tc.delay >= 0 && v.RetryDelay != tc.delay) {
				t.Errorf("client.Classify: %+v", v)
			}
			switch {
			case tc.delay < 0 && d.retry != nil:
				t.Errorf("RetryInfo %v on an unknown outcome", d.retry)
			case tc.delay >= 0 && (d.retry == nil || d.retry.GetRetryDelay().AsDuration() != tc.delay):
				t.Errorf("RetryInfo %v, want %v", d.retry, tc.delay)
			}
		})
	}
}
