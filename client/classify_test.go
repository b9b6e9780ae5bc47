package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

func statusErr(code codes.Code, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, "msg").WithDetails(details...)
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func info(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: "storaged", Metadata: md}
}

func retry(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

// TestClassify: only storaged's own UNAVAILABLE refusals are "nothing
// stored"; anything that may have stored the message is not.
func TestClassify(t *testing.T) {
	notLeader := info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER", "leader_id": "2", "leader_addr": "127.0.0.1:2", "term": "7"})
	for _, tc := range []struct {
		name  string
		err   error
		want  Verdict
		retry bool
	}{
		{"nil", nil, Verdict{}, false},
		{"not a status", errors.New("boom"), Verdict{}, false},
		{"context deadline", context.DeadlineExceeded, Verdict{}, false},
		{"bare UNAVAILABLE (connection, proxy)", status.Error(codes.Unavailable, "connection reset"), Verdict{}, false},
		{"UNAVAILABLE, foreign ErrorInfo", statusErr(codes.Unavailable, &errdetails.ErrorInfo{Reason: "SERVICE_NOT_AVAILABLE", Domain: "envoy"}, retry(0)),
			Verdict{}, false},
		{"UNAVAILABLE, RetryInfo only", statusErr(codes.Unavailable, retry(time.Second)), Verdict{}, false},
		{"not leader, hint", statusErr(codes.Unavailable, notLeader, retry(0)),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "NOT_LEADER", LeaderAddr: "127.0.0.1:2", HasRetryDelay: true}, true},
		{"not leader, wrapped", fmt.Errorf("put: %w", statusErr(codes.Unavailable, notLeader, retry(0))),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "NOT_LEADER", LeaderAddr: "127.0.0.1:2", HasRetryDelay: true}, true},
		{"no leader", statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NO_LEADER"}), retry(time.Second)),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "NO_LEADER", RetryDelay: time.Second, HasRetryDelay: true}, true},
		{"transferring", statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "TRANSFERRING", "leader_addr": "h:3"}),
			retry(50*time.Millisecond)),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "TRANSFERRING", LeaderAddr: "h:3", RetryDelay: 50 * time.Millisecond,
				HasRetryDelay: true}, true},
		{"in-sync replicas", statusErr(codes.Unavailable, info("IN_SYNC_REPLICAS_NOT_ENOUGH", nil), retry(time.Second)),
			Verdict{NothingStored: true, Reason: "IN_SYNC_REPLICAS_NOT_ENOUGH", RetryDelay: time.Second, HasRetryDelay: true}, true},
		{"read-only, no RetryInfo", statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "READ_ONLY"})),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "READ_ONLY"}, true},
		{"UNAVAILABLE marked stored unknown", statusErr(codes.Unavailable, info("UNKNOWN_ERROR", map[string]string{"stored": "unknown"})),
			Verdict{Reason: "UNKNOWN_ERROR"}, false},
		{"replication timeout", statusErr(codes.DeadlineExceeded, info("FLUSH_SLAVE_TIMEOUT", map[string]string{"outcome": "unknown", "stored": "unknown"})),
			Verdict{Reason: "FLUSH_SLAVE_TIMEOUT"}, false},
		{"deadline before the append", statusErr(codes.DeadlineExceeded, info("UNKNOWN_ERROR", nil)), Verdict{Reason: "UNKNOWN_ERROR"}, false},
		{"cancelled", statusErr(codes.Canceled, info("UNKNOWN_ERROR", nil)), Verdict{Reason: "UNKNOWN_ERROR"}, false},
		{"internal", statusErr(codes.Internal, info("UNKNOWN_ERROR", map[string]string{"stored": "unknown"})), Verdict{Reason: "UNKNOWN_ERROR"}, false},
		{"resource exhausted", statusErr(codes.ResourceExhausted, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "DISK_FULL"}), retry(5*time.Second)),
			Verdict{Reason: "SERVICE_NOT_AVAILABLE", Cause: "DISK_FULL", RetryDelay: 5 * time.Second, HasRetryDelay: true}, false},
		{"negative RetryInfo", statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil), retry(-time.Second)),
			Verdict{NothingStored: true, Reason: "OS_PAGE_CACHE_BUSY", HasRetryDelay: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			if got != tc.want {
				t.Errorf("Classify = %+v, want %+v", got, tc.want)
			}
			if got.NothingStored != tc.retry {
				t.Errorf("NothingStored %v, want %v", got.NothingStored, tc.retry)
			}
		})
	}
}
