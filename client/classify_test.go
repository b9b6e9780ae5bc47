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

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
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
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "NOT_LEADER", LeaderAddr: "127.0.0.1:2", Term: 7, HasRetryDelay: true}, true},
		{"not leader, wrapped", fmt.Errorf("put: %w", statusErr(codes.Unavailable, notLeader, retry(0))),
			Verdict{NothingStored: true, Reason: "SERVICE_NOT_AVAILABLE", Cause: "NOT_LEADER", LeaderAddr: "127.0.0.1:2", Term: 7, HasRetryDelay: true}, true},
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

// TestNothingStored: the errors puts through a tracker and a stream end
// with, on scripted members over real gRPC, are "nothing stored" exactly
// when no send was made or every send was refused; a send that may have
// stored the message makes the put's error "maybe stored" whatever ended
// it afterwards.
func TestNothingStored(t *testing.T) {
	unknown := statusErr(codes.DeadlineExceeded, info("FLUSH_SLAVE_TIMEOUT", map[string]string{"outcome": "unknown"}))
	refused := statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil), retry(0))
	refusedLong := statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil), retry(time.Hour))
	for _, tc := range []struct {
		name string
		// setup scripts the member; key is the message's UNIQ_KEY.
		setup func(s *scripted)
		opts  Options
		key   string
		// endCtx, if set, sets hooks that cancel the put's ctx (30 s) at
		// the point the case is about, which the put surely reaches then:
		// a short deadline could end it elsewhere on a loaded machine
		// (before the send: nothing stored; during it: maybe stored).
		endCtx func(s *scripted, tr *LeaderTracker, cancel context.CancelFunc)
		closed bool // the tracker is closed before the put
		want   bool
	}{
		{name: "refused until the attempts run out", setup: func(s *scripted) { s.set(leader, true, 1, refused) },
			opts: Options{MaxAttempts: 2}, want: true},
		{name: "no ready leader", setup: func(s *scripted) { s.set(storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false, 1) },
			opts: Options{LookupInterval: time.Millisecond, LeaderWait: 20 * time.Millisecond}, want: true},
		{name: "ctx ends waiting out a refusal's RetryInfo", setup: func(s *scripted) { s.set(leader, true, 1, refusedLong) },
			opts: Options{MaxRetryDelay: time.Hour}, endCtx: cancelWaitingAfter(1), want: true},
		{name: "ctx ends while no leader is ready", setup: func(s *scripted) { s.set(storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false, 1) },
			opts: Options{LookupInterval: time.Hour, LeaderWait: 2 * time.Hour}, endCtx: cancelWaitingAfter(0), want: true},
		// The lookup's answer or the ctx, whichever the put sees first,
		// ends it before any send.
		{name: "ctx ends during the first lookup", setup: func(s *scripted) { s.set(storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false, 1) },
			opts: Options{LookupInterval: time.Hour, LeaderWait: 2 * time.Hour}, endCtx: func(s *scripted, _ *LeaderTracker, cancel context.CancelFunc) {
				s.onProbe = func(*scripted) { cancel() }
			}, want: true},
		{name: "closed tracker", setup: func(s *scripted) { s.set(leader, true, 1) }, closed: true, want: true},
		{name: "replication timeout", setup: func(s *scripted) { s.set(leader, true, 1, unknown) }, want: false},
		{name: "bare UNAVAILABLE (a proxy)", setup: func(s *scripted) {
			s.set(leader, true, 1, status.Error(codes.Unavailable, "upstream connect error"))
		}, want: false},
		{name: "ctx ends during the call", setup: func(s *scripted) { s.set(leader, true, 1); s.hang = true },
			endCtx: func(s *scripted, _ *LeaderTracker, cancel context.CancelFunc) {
				s.onHang = func(*scripted) { cancel() }
			}, want: false},
		{name: "keyed: unknown, then refused until the attempts run out", setup: func(s *scripted) {
			s.set(leader, true, 1, unknown, refused)
			s.window = 10 * time.Minute
		}, opts: Options{MaxAttempts: 3}, key: "k", want: false},
		// The wait after the unknown outcome (a backoff) is not cut: the
		// one after the refusal is.
		{name: "keyed: unknown, then ctx ends waiting out a refusal", setup: func(s *scripted) {
			s.set(leader, true, 1, unknown, refusedLong)
			s.window = 10 * time.Minute
		}, opts: Options{MaxRetryDelay: time.Hour}, key: "k", endCtx: cancelWaitingAfter(2), want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScripted(t)
			tc.setup(s)
			tr := newTracker(t, tc.opts, s)
			if tc.closed {
				tr.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if tc.endCtx != nil {
				tc.endCtx(s, tr, cancel)
			}
			m := &storagedv1.Message{Topic: "T", Body: []byte("b")}
			if tc.key != "" {
				m.Properties = map[string]string{UniqKeyProperty: tc.key}
			}
			_, err := tr.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: m})
			if err == nil {
				t.Fatal("the put succeeded")
			}
			if got := NothingStored(err); got != tc.want {
				t.Fatalf("NothingStored(%v) = %v, want %v (after %d calls)", err, got, tc.want, s.putCount())
			}
		})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"a refusal", refused, true},
		{"a replication timeout", unknown, false},
		{"a deadline status", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{"ErrNoLeader", ErrNoLeader, true},
		{"a ctx error before any send", context.DeadlineExceeded, true},
		{"an error of the caller's own", errors.New("boom"), false},
	} {
		t.Run("single/"+tc.name, func(t *testing.T) {
			if got := NothingStored(tc.err); got != tc.want {
				t.Fatalf("NothingStored(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// cancelWaitingAfter cancels a put's ctx as it begins to wait before its
// next lookup or send (a RetryInfo, a backoff, LookupInterval) once its
// member has received n puts: the put ends in that wait, its answers in.
func cancelWaitingAfter(n int) func(s *scripted, tr *LeaderTracker, cancel context.CancelFunc) {
	return func(s *scripted, tr *LeaderTracker, cancel context.CancelFunc) {
		tr.retryWait = func() {
			if s.putCount() >= n {
				cancel()
			}
		}
	}
}

// TestStreamNothingStored: a stream put whose stream ended OK unanswered
// on its last attempt stored nothing; one whose stream broke may have.
func TestStreamNothingStored(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakOK bool
		want    bool
	}{
		{"ended OK without an answer", true, true},
		{"broke", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScripted(t)
			s.set(leader, true, 5)
			gate := make(chan struct{})
			defer close(gate)
			s.streamGate = gate // nothing answered before the end
			s.breakAt, s.breakOK = 1, tc.breakOK
			tr := newTracker(t, Options{MaxAttempts: 1}, s)
			st := newStream(t, tr, StreamOptions{})
			_, err := streamPut(st, "")
			if err == nil {
				t.Fatal("the put succeeded")
			}
			if got := NothingStored(err); got != tc.want {
				t.Fatalf("NothingStored(%v) = %v, want %v", err, got, tc.want)
			}
		})
	}
}
