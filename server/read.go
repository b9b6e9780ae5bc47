package server

import (
	"context"
	"errors"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// pullDeadlineMargin is how long before the call's deadline a long poll
// stops waiting, so that the client gets an (empty) answer instead of
// DEADLINE_EXCEEDED.
const pullDeadlineMargin = 100 * time.Millisecond

// GetMessage implements storagedv1.MessageStoreServiceServer.
func (s *Service) GetMessage(_ context.Context, req *storagedv1.GetMessageRequest) (*storagedv1.GetMessageResponse, error) {
	var (
		rec *storage.Record
		err error
	)
	switch l := req.GetLocator().(type) {
	case *storagedv1.GetMessageRequest_CommitLogOffset:
		if l.CommitLogOffset < 0 {
			return nil, badRead("commit_log_offset", "commitlog offset must not be negative")
		}
		rec, err = s.store.GetMessage(l.CommitLogOffset)
	case *storagedv1.GetMessageRequest_MsgId:
		rec, err = s.store.GetMessageByID(l.MsgId)
	default:
		return nil, badRead("locator", "set commit_log_offset or msg_id")
	}
	if err != nil {
		return nil, s.readError(methodGetMessage, err)
	}
	m, err := toStoredMessage(rec, req.GetIncludeRaw())
	if err != nil {
		return nil, s.readError(methodGetMessage, err)
	}
	return &storagedv1.GetMessageResponse{Message: m}, nil
}

// PullMessages implements storagedv1.MessageStoreServiceServer.
func (s *Service) PullMessages(ctx context.Context, req *storagedv1.PullMessagesRequest) (*storagedv1.PullMessagesResponse, error) {
	pr, err := s.toPullRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	res, err := s.pull(ctx, pr)
	if err != nil {
		return nil, s.readError(methodPullMessages, err)
	}
	resp := &storagedv1.PullMessagesResponse{
		Messages:   make([]*storagedv1.StoredMessage, len(res.Messages)),
		NextOffset: res.NextOffset,
		MinOffset:  res.MinOffset,
		MaxOffset:  res.MaxOffset,
	}
	for i, rec := range res.Messages {
		if resp.Messages[i], err = toStoredMessage(rec, req.GetIncludeRaw()); err != nil {
			return nil, s.readError(methodPullMessages, err)
		}
	}
	return resp, nil
}

// pull runs a pull whose wait also ends when the server starts draining:
// then it answers with what is there at once.
func (s *Service) pull(ctx context.Context, pr storage.PullRequest) (storage.PullResult, error) {
	if pr.Wait <= 0 {
		return s.store.PullMessages(ctx, pr)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.draining, cancel)
	defer stop()
	res, err := s.store.PullMessages(wctx, pr)
	if errors.Is(err, context.Canceled) && ctx.Err() == nil {
		pr.Wait = 0
		return s.store.PullMessages(ctx, pr)
	}
	return res, err
}

// toPullRequest validates req and applies the defaults and caps, including
// the wait: at most maxPullWait, and ending pullDeadlineMargin before the
// call's deadline.
func (s *Service) toPullRequest(ctx context.Context, req *storagedv1.PullMessagesRequest) (storage.PullRequest, error) {
	if fe := validateTopic("topic", req.GetTopic()); fe != nil {
		return storage.PullRequest{}, badRead(fe.Field, fe.Reason)
	}
	if req.GetQueueId() < 0 {
		return storage.PullRequest{}, badRead("queue_id", "queue id must not be negative")
	}
	if req.GetQueueOffset() < 0 {
		return storage.PullRequest{}, badRead("queue_offset", "queue offset must not be negative")
	}
	if req.GetMaxMessages() < 0 {
		return storage.PullRequest{}, badRead("max_messages", "must not be negative")
	}
	if req.GetMaxBytes() < 0 {
		return storage.PullRequest{}, badRead("max_bytes", "must not be negative")
	}
	if len(req.GetTags()) > MaxPullTags {
		return storage.PullRequest{}, badRead("tags", "at most 64 tags")
	}
	for _, t := range req.GetTags() {
		if t == "" {
			return storage.PullRequest{}, badRead("tags", "tags must not be empty strings")
		}
	}
	var wait time.Duration
	if w := req.GetWait(); w != nil {
		if err := w.CheckValid(); err != nil {
			return storage.PullRequest{}, badRead("wait", err.Error())
		}
		if wait = w.AsDuration(); wait < 0 {
			return storage.PullRequest{}, badRead("wait", "wait must not be negative")
		}
	}
	wait = min(wait, s.maxPullWait)
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		wait = max(min(wait, time.Until(dl)-pullDeadlineMargin), 0)
	}
	n, b := int(req.GetMaxMessages()), int(req.GetMaxBytes())
	if n == 0 {
		n = DefaultPullMessages
	}
	if b == 0 {
		b = DefaultPullBytes
	}
	return storage.PullRequest{
		Topic:       req.GetTopic(),
		QueueID:     req.GetQueueId(),
		Offset:      req.GetQueueOffset(),
		MaxMessages: min(n, MaxPullMessages),
		MaxBytes:    min(b, MaxPullBytes),
		Tags:        req.GetTags(),
		Wait:        wait,
	}, nil
}

// GetQueueInfo implements storagedv1.MessageStoreServiceServer.
func (s *Service) GetQueueInfo(_ context.Context, req *storagedv1.GetQueueInfoRequest) (*storagedv1.GetQueueInfoResponse, error) {
	if fe := validateTopic("topic", req.GetTopic()); fe != nil {
		return nil, badRead(fe.Field, fe.Reason)
	}
	if req.GetQueueId() < 0 {
		return nil, badRead("queue_id", "queue id must not be negative")
	}
	lo, hi, err := s.store.QueueInfo(req.GetTopic(), req.GetQueueId())
	if err != nil {
		return nil, s.readError(methodGetQueueInfo, err)
	}
	return &storagedv1.GetQueueInfoResponse{MinOffset: lo, MaxOffset: hi}, nil
}
