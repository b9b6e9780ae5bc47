package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestLinearizableReadRefusals: the refusals of a linearizable read
// (storage.Store.ReadBarrier) reach a client over real gRPC, on
// GetQueueInfo, PullMessages (with and without a wait), GetOffset and
// GetOffsetByTime: a member that
// is not the ready leader answers exactly as it refuses a put (UNAVAILABLE,
// SERVICE_NOT_AVAILABLE, cause, leader_id, leader_addr, term, RetryInfo),
// a leader that cannot confirm its leadership UNAVAILABLE with
// READ_INDEX_TIMEOUT, the waiter bound RESOURCE_EXHAUSTED; without the
// field the barrier is never consulted.
func TestLinearizableReadRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason string
		md     map[string]string
		delay  time.Duration // -1: no RetryInfo
	}{
		{"follower", &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 4}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NOT_LEADER", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "4"}, 0},
		{"no leader", &storage.NotLeaderError{Cause: CauseNoLeader, Term: 4}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NO_LEADER", "leader_id": "0", "leader_addr": "", "term": "4"}, retryDelayNoLeader},
		{"leader not ready", fmt.Errorf("wrapped: %w", &storage.NotLeaderError{Cause: CauseLeaderNotReady, LeaderID: 1, Term: 6}),
			codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "LEADER_NOT_READY", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "6"}, retryDelayLeaderMoving},
		{"read index timeout", fmt.Errorf("%w: slow", storage.ErrReadIndexTimeout), codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "READ_INDEX_TIMEOUT"}, retryDelayUnavailable},
		{"waiters bound", storage.ErrReadIndexBusy, codes.ResourceExhausted, ReasonSystemBusy,
			map[string]string{"cause": "READ_INDEX_WAITERS"}, retryDelayReadBusy},
		{"replica stopped", fmt.Errorf("%w: sync", storage.ErrWriteFailed), codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "READ_ONLY"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := map[uint64]string{1: "127.0.0.1:9090"}
			// Every read of the fake fails NOT_FOUND: a call that skips the
			// barrier answers that instead of the barrier's refusal.
			fs := fakeOffsetStore{&fakeStore{barrierErr: tc.err, readErr: storage.ErrQueueNotFound}}
			svc := New(fs, zerologNop(), WithReplication(func() ReplicaInfo { return ReplicaInfo{} }, func(id uint64) string { return addrs[id] }))
			srv := startServer(t, svc, GRPCConfig{})
			srv.SetServing(true)
			c := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
			calls := map[string]func(lin bool) error{
				"GetQueueInfo": func(lin bool) error {
					_, err := c.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "t", Linearizable: lin})
					return err
				},
				"PullMessages": func(lin bool) error {
					_, err := c.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "t", Linearizable: lin})
					return err
				},
				"GetOffset": func(lin bool) error {
					_, err := c.GetOffset(ctxT(t), &storagedv1.GetOffsetRequest{ConsumerGroup: "g", Topic: "t", Linearizable: lin})
					return err
				},
				"GetOffsetByTime": func(lin bool) error {
					_, err := c.GetOffsetByTime(ctxT(t), &storagedv1.GetOffsetByTimeRequest{Topic: "t", Time: timestamppb.Now(), Linearizable: lin})
					return err
				},
				"PullMessages wait": func(lin bool) error {
					_, err := c.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "t", Linearizable: lin, Wait: durationpb.New(time.Second)})
					return err
				},
			}
			for name, call := range calls {
				d := details(t, call(true))
				if d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
					t.Fatalf("%s: %v %q (%q), want %v %q", name, d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, tc.reason)
				}
				for k, v := range tc.md {
					if got, ok := d.info.GetMetadata()[k]; !ok || got != v {
						t.Errorf("%s: metadata %s = %q, want %q (all %v)", name, k, got, v, d.info.GetMetadata())
					}
				}
				switch {
				case tc.delay < 0 && d.retry != nil:
					t.Errorf("%s: RetryInfo %v", name, d.retry)
				case tc.delay >= 0 && (d.retry == nil || d.retry.GetRetryDelay().AsDuration() != tc.delay):
					t.Errorf("%s: RetryInfo %v, want %v", name, d.retry, tc.delay)
				}
				if d := details(t, call(false)); d.st.Code() != codes.NotFound {
					t.Errorf("%s without linearizable: %v %q, want NOT_FOUND (the barrier is not consulted)", name, d.st.Code(), d.st.Message())
				}
			}
		})
	}
}

// TestLinearizableReadStandalone: a standalone store serves linearizable
// reads as any other (its barrier passes at once): the put just
// acknowledged is there.
func TestLinearizableReadStandalone(t *testing.T) {
	c, _, _ := storeServer(t, nil)
	for i := range 3 {
		if _, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		qi, err := c.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "t", Linearizable: true})
		if err != nil || qi.GetMaxOffset() != int64(i+1) {
			t.Fatalf("linearizable GetQueueInfo after %d puts: %v %v", i+1, qi, err)
		}
		pr, err := c.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "t", QueueOffset: int64(i), Linearizable: true})
		if err != nil || len(pr.GetMessages()) != 1 || pr.GetMaxOffset() != int64(i+1) {
			t.Fatalf("linearizable pull at %d: %v %v", i, pr, err)
		}
	}
}

// fakeOffsetStore is a fakeStore that keeps consumer offsets: every call
// answers its read error.
type fakeOffsetStore struct{ *fakeStore }

func (f fakeOffsetStore) CommitOffset(context.Context, string, string, int32, int64) error {
	return f.err
}
func (f fakeOffsetStore) GetOffset(string, string, int32) (int64, error) { return 0, f.readError() }
func (f fakeOffsetStore) GetOffsetByTime(string, int32, time.Time) (int64, error) {
	return 0, f.readError()
}

// TestCommitOffsetGroupRefusals: a replica's refusals of a commit reach a
// client over real gRPC as a put's do: the leader hint, too few followers,
// and a commit not seen committed in time (outcome unknown).
func TestCommitOffsetGroupRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason string
		md     map[string]string
	}{
		{"follower", &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 4}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "NOT_LEADER", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "4"}},
		{"superseded", &storage.NotLeaderError{Cause: storage.CauseSuperseded, LeaderID: 1, Term: 5}, codes.Unavailable, ReasonUnavailable,
			map[string]string{"cause": "SUPERSEDED", "leader_id": "1", "leader_addr": "127.0.0.1:9090", "term": "5"}},
		{"in-sync replicas", storage.ErrInSyncReplicasNotEnough, codes.Unavailable, storage.InSyncReplicasNotEnough.String(), nil},
		{"replication timeout", &storage.NotDurableError{Status: storage.FlushSlaveTimeout, Err: storage.ErrReplicationTimeout},
			codes.DeadlineExceeded, storage.FlushSlaveTimeout.String(), map[string]string{"stored": "unknown", "outcome": "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := map[uint64]string{1: "127.0.0.1:9090"}
			fs := fakeOffsetStore{&fakeStore{err: tc.err}}
			svc := New(fs, zerologNop(), WithReplication(func() ReplicaInfo { return ReplicaInfo{} }, func(id uint64) string { return addrs[id] }))
			srv := startServer(t, svc, GRPCConfig{})
			srv.SetServing(true)
			c := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
			_, err := c.CommitOffset(ctxT(t), &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "t", Offset: 1})
			d := details(t, err)
			if d.st.Code() != tc.code || d.info.GetReason() != tc.reason {
				t.Fatalf("%v %q (%q), want %v %q", d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, tc.reason)
			}
			for k, v := range tc.md {
				if got := d.info.GetMetadata()[k]; got != v {
					t.Errorf("metadata %s = %q, want %q (all %v)", k, got, v, d.info.GetMetadata())
				}
			}
		})
	}
}
