package server

import (
	"context"
	"errors"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// The RocketMQ protocol's offset calls, mapped onto the consumer-group
// offsets of storage/consumer_offsets.go (kept in the commitlog, so they
// survive a crash as acked messages do) and the queue bounds:
//
//	GetOffset    → GetOffset (OFFSET_NOT_FOUND when the group never committed)
//	UpdateOffset → CommitOffset (ILLEGAL_OFFSET outside the queue's offsets and its end)
//	QueryOffset  → BEGINNING: the queue's first readable offset; END: its end;
//	               TIMESTAMP: GetOffsetByTime (the first offset stored at or after the time)
//
// A queue of the topic's route that never received a message has the
// offsets [0, 0). Statuses come from offsetError and readError, mapped by
// grpcToV2.

// checkQueue checks a request's message queue: a topic storaged serves and
// a queue id that is not negative.
func checkQueue(mq *rocketmqv2.MessageQueue) (string, int32, *rocketmqv2.Status) {
	if mq == nil {
		return "", 0, v2Status(rocketmqv2.Code_BAD_REQUEST, "message queue is required")
	}
	topic, st := checkTopic(mq.GetTopic())
	if st != nil {
		return "", 0, st
	}
	if mq.GetId() < 0 {
		return "", 0, v2Status(rocketmqv2.Code_BAD_REQUEST, "queue id must not be negative, got %d", mq.GetId())
	}
	return topic, mq.GetId(), nil
}

// offsetStore is the store's OffsetStore, or a Status saying it has none.
func (r *rocketMQ) offsetStore() (OffsetStore, *rocketmqv2.Status) {
	st, err := r.svc.offsetStore()
	if err != nil {
		return nil, grpcToV2(err)
	}
	return st, nil
}

// GetOffset implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) GetOffset(_ context.Context, req *rocketmqv2.GetOffsetRequest) (*rocketmqv2.GetOffsetResponse, error) {
	group, st := checkGroup(req.GetGroup())
	var topic string
	var qid int32
	if st == nil {
		topic, qid, st = checkQueue(req.GetMessageQueue())
	}
	var os OffsetStore
	if st == nil {
		os, st = r.offsetStore()
	}
	if st != nil {
		return &rocketmqv2.GetOffsetResponse{Status: st}, nil
	}
	off, err := os.GetOffset(group, topic, qid)
	if err != nil {
		return &rocketmqv2.GetOffsetResponse{Status: grpcToV2(r.svc.offsetError(methodGetOffset, err))}, nil
	}
	return &rocketmqv2.GetOffsetResponse{Status: okStatus(), Offset: off}, nil
}

// UpdateOffset implements rocketmqv2.MessagingServiceServer. It answers OK
// once the commit is durable, as CommitOffset does.
func (r *rocketMQ) UpdateOffset(ctx context.Context, req *rocketmqv2.UpdateOffsetRequest) (*rocketmqv2.UpdateOffsetResponse, error) {
	group, st := checkGroup(req.GetGroup())
	var topic string
	var qid int32
	if st == nil {
		topic, qid, st = checkQueue(req.GetMessageQueue())
	}
	if st == nil && req.GetOffset() < 0 {
		st = v2Status(rocketmqv2.Code_ILLEGAL_OFFSET, "offset must not be negative, got %d", req.GetOffset())
	}
	var os OffsetStore
	if st == nil {
		os, st = r.offsetStore()
	}
	if st != nil {
		return &rocketmqv2.UpdateOffsetResponse{Status: st}, nil
	}
	if err := os.CommitOffset(ctx, group, topic, qid, req.GetOffset()); err != nil {
		return &rocketmqv2.UpdateOffsetResponse{Status: grpcToV2(r.svc.offsetError(methodCommitOffset, err))}, nil
	}
	return &rocketmqv2.UpdateOffsetResponse{Status: okStatus()}, nil
}

// QueryOffset implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) QueryOffset(_ context.Context, req *rocketmqv2.QueryOffsetRequest) (*rocketmqv2.QueryOffsetResponse, error) {
	topic, qid, st := checkQueue(req.GetMessageQueue())
	if st != nil {
		return &rocketmqv2.QueryOffsetResponse{Status: st}, nil
	}
	s := r.svc
	switch p := req.GetQueryOffsetPolicy(); p {
	case rocketmqv2.QueryOffsetPolicy_BEGINNING, rocketmqv2.QueryOffsetPolicy_END:
		lo, hi, err := s.store.QueueInfo(topic, qid)
		if errors.Is(err, storage.ErrQueueNotFound) {
			lo, hi, err = 0, 0, r.inRoute(topic, qid)
		}
		if err != nil {
			return &rocketmqv2.QueryOffsetResponse{Status: grpcToV2(s.readError(methodGetQueueInfo, err))}, nil
		}
		off := lo
		if p == rocketmqv2.QueryOffsetPolicy_END {
			off = hi
		}
		return &rocketmqv2.QueryOffsetResponse{Status: okStatus(), Offset: off}, nil
	case rocketmqv2.QueryOffsetPolicy_TIMESTAMP:
		ts := req.GetTimestamp()
		if ts == nil {
			return &rocketmqv2.QueryOffsetResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST, "the TIMESTAMP policy needs a timestamp")}, nil
		}
		if err := ts.CheckValid(); err != nil {
			return &rocketmqv2.QueryOffsetResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST, "timestamp: %v", err)}, nil
		}
		os, st := r.offsetStore()
		if st != nil {
			return &rocketmqv2.QueryOffsetResponse{Status: st}, nil
		}
		off, err := os.GetOffsetByTime(topic, qid, ts.AsTime())
		if errors.Is(err, storage.ErrQueueNotFound) {
			off, err = 0, r.inRoute(topic, qid)
		}
		if err != nil {
			return &rocketmqv2.QueryOffsetResponse{Status: grpcToV2(s.offsetError(methodGetOffsetByTime, err))}, nil
		}
		return &rocketmqv2.QueryOffsetResponse{Status: okStatus(), Offset: off}, nil
	default:
		return &rocketmqv2.QueryOffsetResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST, "query offset policy %d is unknown", int32(p))}, nil
	}
}

// inRoute is nil when queue qid is in topic's route (an empty queue then
// has the offsets [0, 0)), else the store's error or ErrQueueNotFound.
func (r *rocketMQ) inRoute(topic string, qid int32) error {
	rs, ok := r.svc.store.(RouteStore)
	if !ok {
		return storage.ErrQueueNotFound
	}
	n, _, err := rs.RouteQueues(topic)
	if err != nil {
		return err
	}
	if qid >= n {
		return storage.ErrQueueNotFound
	}
	return nil
}
