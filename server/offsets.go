package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// Consumer-group offsets (storage/consumer_offsets.go): CommitOffset,
// GetOffset and GetOffsetByTime. The store keeps them in the commitlog;
// this file only validates, calls and maps the outcome.

// OffsetStore is what the offset calls need from the store; *storage.Store
// implements it. A Store without it answers UNIMPLEMENTED.
type OffsetStore interface {
	CommitOffset(ctx context.Context, group, topic string, queueID int32, offset int64) error
	GetOffset(group, topic string, queueID int32) (int64, error)
	GetOffsetByTime(topic string, queueID int32, t time.Time) (int64, error)
}

var (
	_ OffsetStore = (*storage.Store)(nil)
	_ OffsetStore = (*DeferredStore)(nil)
)

// ReasonQueryNotFound is RocketMQ's ResponseCode.QUERY_NOT_FOUND: no
// offset committed for that group and queue.
const ReasonQueryNotFound = "QUERY_NOT_FOUND"

const (
	methodCommitOffset    method = "CommitOffset"
	methodGetOffset       method = "GetOffset"
	methodGetOffsetByTime method = "GetOffsetByTime"
)

func (s *Service) offsetStore() (OffsetStore, error) {
	if os, ok := s.store.(OffsetStore); ok {
		return os, nil
	}
	return nil, newStatus(codes.Unimplemented, "this store keeps no consumer offsets",
		&errdetails.ErrorInfo{Reason: ReasonInternal, Domain: ErrorDomain})
}

// CommitOffset implements storagedv1.MessageStoreServiceServer.
func (s *Service) CommitOffset(ctx context.Context, req *storagedv1.CommitOffsetRequest) (*storagedv1.CommitOffsetResponse, error) {
	return s.commitOffset(ctx, req, true)
}

// commitOffset is CommitOffset; forward: a follower may forward it to
// the leader (forward.go), false for a forwarded commit.
func (s *Service) commitOffset(ctx context.Context, req *storagedv1.CommitOffsetRequest, forward bool) (*storagedv1.CommitOffsetResponse, error) {
	st, err := s.offsetStore()
	if err != nil {
		return nil, err
	}
	if err := checkOffsetKey(req.GetConsumerGroup(), req.GetTopic(), req.GetQueueId()); err != nil {
		return nil, err
	}
	if err := st.CommitOffset(ctx, req.GetConsumerGroup(), req.GetTopic(), req.GetQueueId(), req.GetOffset()); err != nil {
		if forward {
			if resp, sent, ferr := s.forward(ctx, methodCommitOffset, err, bornHost(ctx),
				&peerv1.ForwardPutRequest{Put: &peerv1.ForwardPutRequest_CommitOffset{CommitOffset: req}}); sent {
				return resp.GetCommitOffset(), ferr
			}
		}
		return nil, s.offsetError(methodCommitOffset, err)
	}
	return &storagedv1.CommitOffsetResponse{}, nil
}

// GetOffset implements storagedv1.MessageStoreServiceServer. In a
// replication group any member answers from the offsets it has applied
// (committed there), or, with linearizable, the ready leader after its
// quorum check (storage.Store.ReadBarrier), as GetQueueInfo does.
func (s *Service) GetOffset(ctx context.Context, req *storagedv1.GetOffsetRequest) (*storagedv1.GetOffsetResponse, error) {
	st, err := s.offsetStore()
	if err != nil {
		return nil, err
	}
	if err := checkOffsetKey(req.GetConsumerGroup(), req.GetTopic(), req.GetQueueId()); err != nil {
		return nil, err
	}
	if req.GetLinearizable() {
		if err := s.store.ReadBarrier(ctx); err != nil {
			return nil, s.readError(methodGetOffset, err)
		}
	}
	off, err := st.GetOffset(req.GetConsumerGroup(), req.GetTopic(), req.GetQueueId())
	if err != nil {
		return nil, s.offsetError(methodGetOffset, err)
	}
	return &storagedv1.GetOffsetResponse{Offset: off}, nil
}

// GetOffsetByTime implements storagedv1.MessageStoreServiceServer
// (linearizable as GetOffset).
func (s *Service) GetOffsetByTime(ctx context.Context, req *storagedv1.GetOffsetByTimeRequest) (*storagedv1.GetOffsetByTimeResponse, error) {
	st, err := s.offsetStore()
	if err != nil {
		return nil, err
	}
	if fe := validateTopic("topic", req.GetTopic()); fe != nil {
		return nil, badRead(fe.Field, fe.Reason)
	}
	if req.GetQueueId() < 0 {
		return nil, badRead("queue_id", "queue id must not be negative")
	}
	if req.GetTime() == nil {
		return nil, badRead("time", "time is required")
	}
	if err := req.GetTime().CheckValid(); err != nil {
		return nil, badRead("time", err.Error())
	}
	if req.GetLinearizable() {
		if err := s.store.ReadBarrier(ctx); err != nil {
			return nil, s.readError(methodGetOffsetByTime, err)
		}
	}
	off, err := st.GetOffsetByTime(req.GetTopic(), req.GetQueueId(), req.GetTime().AsTime())
	if err != nil {
		return nil, s.offsetError(methodGetOffsetByTime, err)
	}
	return &storagedv1.GetOffsetByTimeResponse{Offset: off}, nil
}

// checkOffsetKey validates the key fields at the edge, with the store's
// rules, before anything is called.
func checkOffsetKey(group, topic string, queueID int32) error {
	if p := storage.GroupProblem(group); p != "" {
		return badRead("consumer_group", p)
	}
	if fe := validateTopic("topic", topic); fe != nil {
		return badRead(fe.Field, fe.Reason)
	}
	if queueID < 0 {
		return badRead("queue_id", "queue id must not be negative")
	}
	return nil
}

// offsetError is the one mapping from a failed offset call to a gRPC
// status (see the proto's comments on CommitOffset):
//
//	*storage.ValidationError       → INVALID_ARGUMENT + BadRequest on its field
//	storage.ErrTopicNotFound       → NOT_FOUND, TOPIC_NOT_EXIST
//	storage.ErrOffsetNotFound      → NOT_FOUND, QUERY_NOT_FOUND
//	committed offset *RangeError   → OUT_OF_RANGE, OFFSET_OUT_OF_RANGE, bounds inclusive
//	storage.ErrTooManyOffsets      → RESOURCE_EXHAUSTED, SYSTEM_BUSY, cause TOO_MANY_CONSUMER_OFFSETS
//	storage.ErrOffsetNotDurable    → UNAVAILABLE, FLUSH_DISK_TIMEOUT/UNKNOWN_ERROR, stored unknown;
//	  in a group, not seen committed in time (ErrReplicationTimeout) → DEADLINE_EXCEEDED,
//	  FLUSH_SLAVE_TIMEOUT, stored and outcome unknown (as a put)
//	*storage.NotLeaderError        → UNAVAILABLE + RetryInfo and the leader hint (notLeaderStatus)
//	storage.ErrInSyncReplicasNotEnough → UNAVAILABLE + RetryInfo, IN_SYNC_REPLICAS_NOT_ENOUGH
//	storage.ErrBusy                → UNAVAILABLE, OS_PAGE_CACHE_BUSY + RetryInfo
//	write refusals (closed, slave, not writable, write failed) → UNAVAILABLE + RetryInfo
//	the rest                       → readError (QUEUE_NOT_FOUND, DATA_LOSS, INTERNAL, …)
func (s *Service) offsetError(m method, err error) error {
	var (
		verr *storage.ValidationError
		re   *storage.RangeError
		nl   *storage.NotLeaderError
	)
	info := func(reason string, kv ...string) *errdetails.ErrorInfo {
		i := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
		if len(kv) > 0 {
			i.Metadata = map[string]string{}
			for j := 0; j+1 < len(kv); j += 2 {
				i.Metadata[kv[j]] = kv[j+1]
			}
		}
		return i
	}
	switch {
	case errors.As(err, &verr):
		return badRead(verr.Field, verr.Reason)
	case errors.As(err, &nl) && m == methodCommitOffset: // group mode: nothing stored
		return s.notLeaderStatus(info(""), nl.Cause, nl.LeaderID, nl.Term, "put")
	case errors.Is(err, storage.ErrInSyncReplicasNotEnough):
		return unavailable(info(storage.InSyncReplicasNotEnough.String()), retryDelayUnavailable,
			"the group's leader has too few recently active followers to commit; nothing was stored; retry shortly")
	case errors.Is(err, storage.ErrOffsetNotDurable) && errors.Is(err, storage.ErrReplicationTimeout):
		return newStatus(codes.DeadlineExceeded, "the commit was proposed but not committed by a majority of the group within "+
			"--replication-timeout; it may still commit; commit again (commits are idempotent)",
			info(storage.FlushSlaveTimeout.String(), "stored", "unknown", "outcome", "unknown"))
	case errors.Is(err, storage.ErrTopicNotFound):
		return newStatus(codes.NotFound, "topic does not exist", info(ReasonTopicNotExist))
	case errors.Is(err, storage.ErrOffsetNotFound):
		return newStatus(codes.NotFound, "this consumer group never committed an offset for this queue", info(ReasonQueryNotFound))
	case errors.As(err, &re) && re.What == "committed offset":
		hi := re.Max - 1 // the store's range is half-open; a commit may name max itself
		return newStatus(codes.OutOfRange,
			fmt.Sprintf("offset %d is out of range: commit an offset in [%d, %d], the queue's readable offsets and its end", re.Offset, re.Min, hi),
			info(ReasonOffsetOutOfRange, "offset", strconv.FormatInt(re.Offset, 10),
				"min_offset", strconv.FormatInt(re.Min, 10), "max_offset", strconv.FormatInt(hi, 10)))
	case errors.Is(err, storage.ErrTooManyOffsets):
		return newStatus(codes.ResourceExhausted, "the store holds as many (group, topic, queue) offsets as it may; nothing was stored",
			info(ReasonSystemBusy, "cause", "TOO_MANY_CONSUMER_OFFSETS"))
	case errors.Is(err, storage.ErrOffsetNotDurable):
		reason := storage.UnknownError.String()
		var nd *storage.NotDurableError
		if errors.As(err, &nd) {
			reason = nd.Status.String()
		}
		return unavailable(info(reason, "stored", "unknown"), retryDelayUnavailable,
			"the commit was appended but its durability was not confirmed; commit again (commits are idempotent)")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return s.readError(m, err)
	case errors.Is(err, storage.ErrBusy):
		return unavailable(info(storage.OSPageCacheBusy.String()), retryDelayBusy, "the store is busy; nothing was stored; retry")
	case errors.Is(err, storage.ErrSlave):
		return unavailable(info(ReasonUnavailable), retryDelayUnavailable, "this store is a slave; commit offsets on the master")
	case errors.Is(err, storage.ErrNotWritable), errors.Is(err, storage.ErrWriteFailed):
		return unavailable(info(ReasonUnavailable), retryDelayUnavailable, "the store takes no writes now; nothing was stored")
	}
	return s.readError(m, err)
}

// CommitOffset implements OffsetStore.
func (d *DeferredStore) CommitOffset(ctx context.Context, group, topic string, queueID int32, offset int64) error {
	st, err := d.offsets()
	if err != nil {
		return err
	}
	return st.CommitOffset(ctx, group, topic, queueID, offset)
}

// GetOffset implements OffsetStore.
func (d *DeferredStore) GetOffset(group, topic string, queueID int32) (int64, error) {
	st, err := d.offsets()
	if err != nil {
		return 0, err
	}
	return st.GetOffset(group, topic, queueID)
}

// GetOffsetByTime implements OffsetStore.
func (d *DeferredStore) GetOffsetByTime(topic string, queueID int32, t time.Time) (int64, error) {
	st, err := d.offsets()
	if err != nil {
		return 0, err
	}
	return st.GetOffsetByTime(topic, queueID, t)
}

// errNoOffsets: the store set keeps no consumer offsets.
var errNoOffsets = errors.New("server: this store keeps no consumer offsets")

func (d *DeferredStore) offsets() (OffsetStore, error) {
	b := d.p.Load()
	if b == nil {
		return nil, ErrStarting
	}
	st, ok := b.s.(OffsetStore)
	if !ok {
		return nil, errNoOffsets
	}
	return st, nil
}
