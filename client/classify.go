package client

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errorDomain is the ErrorInfo domain of every status storaged returns
// (server.ErrorDomain; not imported, so a client does not pull the server).
const errorDomain = "storaged"

// Verdict is what a failed call says about a retry (Classify).
type Verdict struct {
	// NothingStored: storaged itself refused the put before storing
	// anything (UNAVAILABLE with its ErrorInfo): a retry cannot store it
	// twice. False for every other error, whose outcome may be "stored".
	NothingStored bool
	// Reason and Cause are the ErrorInfo reason (the RocketMQ status name,
	// SERVICE_NOT_AVAILABLE for "not the leader") and its metadata cause
	// (NOT_LEADER, NO_LEADER, LEADER_NOT_READY, TRANSFERRING, SUPERSEDED,
	// ...), when storaged sent them.
	Reason, Cause string
	// LeaderAddr is the leader's client address the refusal names ("":
	// unknown), Term the term the refusing member was in (0: not named).
	LeaderAddr string
	Term       uint64
	// RetryDelay is the server's RetryInfo, if HasRetryDelay.
	RetryDelay    time.Duration
	HasRetryDelay bool
}

// Classify tells whether a failed put may be retried. Only one answer is
// "nothing stored": a gRPC UNAVAILABLE carrying storaged's own ErrorInfo
// (domain "storaged"), without a stored/outcome "unknown" mark. storaged
// answers so when it refuses before the append (not the leader, no
// leader, leader not ready or transferring, too few in-sync replicas,
// busy, starting, draining, read-only) or when raft committed another
// entry over the put's position (SUPERSEDED).
//
// Everything else may have stored the message and is never retried:
// DEADLINE_EXCEEDED (a replication timeout is outcome=unknown; a client
// deadline may have passed after the commit), CANCELLED, INTERNAL, and an
// UNAVAILABLE without storaged's ErrorInfo: a connection that broke or a
// proxy that gave up after forwarding the request, with the put possibly
// committed behind it.
func Classify(err error) Verdict {
	var v Verdict
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return v
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if info == nil {
				info = d
			}
		case *errdetails.RetryInfo:
			if d.GetRetryDelay() != nil && d.GetRetryDelay().IsValid() {
				v.RetryDelay, v.HasRetryDelay = max(d.GetRetryDelay().AsDuration(), 0), true
			}
		}
	}
	if info == nil || info.GetDomain() != errorDomain {
		return Verdict{}
	}
	md := info.GetMetadata()
	v.Reason, v.Cause, v.LeaderAddr = info.GetReason(), md["cause"], md["leader_addr"]
	v.Term, _ = strconv.ParseUint(md["term"], 10, 64)
	v.NothingStored = st.Code() == codes.Unavailable && md["stored"] != "unknown" && md["outcome"] != "unknown"
	return v
}

// The marks NothingStored reads in a put's error: a send whose outcome is
// unknown (the put's error says so first, whatever follows it: putRetry's
// fail), and a stream that ended OK without answering a message.
var (
	errOutcomeUnknown = errors.New("outcome unknown unless the status says otherwise")
	errUnanswered     = errors.New("ended without an answer, nothing stored")
)

// NothingStored reports whether err, the error of a put through a
// LeaderTracker (PutMessage, PutMessages, or Do with a call that returns
// the RPC's error as it is) or of a Stream.Put, proves that the message
// was not stored, so that sending it again cannot store it twice, keyed
// or not. That is so when no send was made (no ready leader found within
// LeaderWait: ErrNoLeader; the tracker or stream closed; the caller's ctx
// ended before the first send) and when every send was refused before the
// append (Classify's NothingStored, which also decides for the error of a
// single gRPC call). It is false for nil and whenever a send may have
// stored the message, whatever ended the put after it: a deadline or a
// cancellation during a call, a broken connection, a replication timeout,
// any answer storaged did not mark as a refusal.
//
// Tell the outcomes apart with it, not with errors.Is(err,
// context.DeadlineExceeded): a put whose call timed out and a put whose
// ctx ended while it waited for a leader both end with the ctx's error,
// and only the second stored nothing.
func NothingStored(err error) bool {
	if err == nil || errors.Is(err, errOutcomeUnknown) {
		return false
	}
	if _, ok := status.FromError(err); ok {
		return Classify(err).NothingStored
	}
	// No answer is in err: the put ended before any send, or a stream
	// ended without answering it.
	return errors.Is(err, errUnanswered) || errors.Is(err, ErrNoLeader) || errors.Is(err, ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
