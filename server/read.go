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

// GetMessage implements storagedv1.MessageStoreServiceServer. It reserves
// room for the largest record before it reads (see inflight), keeps what
// the record takes until the answer is sent, and refuses with ErrReadBusy
// when the reservation does not fit.
func (s *Service) GetMessage(_ context.Context, req *storagedv1.GetMessageRequest) (*storagedv1.GetMessageResponse, error) {
	var read func() (*storage.Record, error)
	switch l := req.GetLocator().(type) {
	case *storagedv1.GetMessageRequest_CommitLogOffset:
		if l.CommitLogOffset < 0 {
			return nil, badRead("commit_log_offset", "commitlog offset must not be negative")
		}
		read = func() (*storage.Record, error) { return s.store.GetMessage(l.CommitLogOffset) }
	case *storagedv1.GetMessageRequest_MsgId:
		read = func() (*storage.Record, error) { return s.store.GetMessageByID(l.MsgId) }
	default:
		return nil, badRead("locator", "set commit_log_offset or msg_id")
	}
	r, err := s.inflight.reserve(s.maxRecordBytes())
	if err != nil {
		return nil, s.readError(methodGetMessage, err)
	}
	rec, err := read()
	if err != nil {
		r.release()
		return nil, s.readError(methodGetMessage, err)
	}
	r.shrink(int64(len(rec.Raw)))
	m, err := toStoredMessage(rec, req.GetIncludeRaw())
	if err != nil {
		r.release()
		return nil, s.readError(methodGetMessage, err)
	}
	resp := &storagedv1.GetMessageResponse{Message: m}
	defer s.inflight.hold(resp, r)()
	return resp, nil
}

// PullMessages implements storagedv1.MessageStoreServiceServer.
//
// Memory: the pull reserves its max_bytes (at least one largest record:
// a pull returns one message even when it is larger) of the in-flight read
// limit before it reads, shrinks the reservation to the records read, and
// holds that until the answer is sent. Beyond the limit it is ErrReadBusy
// (RESOURCE_EXHAUSTED + RetryInfo), nothing read. A long poll holds no
// reservation while it waits: it first pulls without waiting; when that
// finds nothing, it releases, waits for one message (pullWoken), and
// reserves again for the rest.
func (s *Service) PullMessages(ctx context.Context, req *storagedv1.PullMessagesRequest) (*storagedv1.PullMessagesResponse, error) {
	pr, err := s.toPullRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	// Linearizable: the leadership check runs once, before the first
	// look; every later look (a long poll's) reads a newer commit point of
	// the same replica, so the whole call stays linearizable.
	if req.GetLinearizable() {
		if err := s.store.ReadBarrier(ctx); err != nil {
			return nil, s.readError(methodPullMessages, err)
		}
	}
	res, r, err := s.pullRecords(ctx, pr)
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
			r.release()
			return nil, s.readError(methodPullMessages, err)
		}
	}
	defer s.inflight.hold(resp, r)()
	return resp, nil
}

// pullRecords is a pull under the in-flight read limit (see PullMessages):
// the records and the reservation that holds their bytes, which the caller
// releases once they are sent. On error nothing is held.
func (s *Service) pullRecords(ctx context.Context, pr storage.PullRequest) (storage.PullResult, *reservation, error) {
	r, err := s.inflight.reserve(s.pullReservation(pr))
	if err != nil {
		return storage.PullResult{}, nil, err
	}
	wait := pr.Wait
	pr.Wait = 0
	res, err := s.store.PullMessages(ctx, pr)
	if wait > 0 && len(res.Messages) == 0 && (err == nil || errors.Is(err, storage.ErrQueueNotFound)) {
		r.release()
		if err == nil {
			pr.Offset = res.NextOffset // a tag-filtered scan goes on where it stopped
		}
		pr.Wait = wait
		res, r, err = s.pullWoken(ctx, pr)
	}
	if err != nil {
		if r != nil {
			r.release()
		}
		return res, nil, err
	}
	r.shrink(recordBytes(res.Messages))
	return res, r, nil
}

// pullWoken is the waiting part of a long poll: it waits (s.pull) for one
// message, holding nothing of the in-flight limit meanwhile, then reserves
// for the rest of the answer and pulls it without waiting. The one message
// the wake-up read is counted as soon as it is read; when the rest does
// not fit, the answer is that message alone (it is already in memory).
func (s *Service) pullWoken(ctx context.Context, pr storage.PullRequest) (storage.PullResult, *reservation, error) {
	first := pr
	first.MaxMessages, first.MaxBytes = 1, 1
	res, err := s.pull(ctx, first)
	if err != nil || len(res.Messages) == 0 {
		return res, s.inflight.force(0), err
	}
	got := recordBytes(res.Messages)
	held := s.inflight.force(got)
	if pr.MaxMessages <= 1 || got >= int64(pr.MaxBytes) || res.NextOffset >= res.MaxOffset {
		return res, held, nil
	}
	r, err := s.inflight.reserve(s.pullReservation(pr) - got)
	if err != nil {
		return res, held, nil // busy: answer what is read
	}
	rest := pr
	rest.Offset, rest.Wait = res.NextOffset, 0
	rest.MaxMessages--
	rest.MaxBytes -= int(got)
	more, err := s.store.PullMessages(ctx, rest)
	if err != nil || len(more.Messages) == 0 {
		r.release()
		return res, held, nil // the first message is a good answer on its own
	}
	more.Messages = append(res.Messages, more.Messages...)
	r.shrink(recordBytes(more.Messages) - got)
	held.merge(r)
	return more, held, nil
}

// pullReservation is what a pull reserves before it reads: max_bytes, and
// at least one largest record.
func (s *Service) pullReservation(pr storage.PullRequest) int64 {
	return max(int64(pr.MaxBytes), s.maxRecordBytes())
}

// recordOverhead bounds what a stored record holds besides its body:
// properties (storage.MaxPropertiesLength, 32 KiB), topic, the fixed
// fields.
const recordOverhead = 64 << 10

// maxRecordBytes bounds one stored record.
func (s *Service) maxRecordBytes() int64 { return int64(s.maxMessageSize) + recordOverhead }

// recordBytes is the memory the records hold: their stored bytes, which
// the bodies alias.
func recordBytes(recs []*storage.Record) int64 {
	var n int64
	for _, r := range recs {
		n += int64(len(r.Raw))
	}
	return n
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
	if fe := validateReadTopic("topic", req.GetTopic()); fe != nil {
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
	wait = s.boundWait(ctx, wait)
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

// boundWait bounds a long poll's wait: at most the server's maximum, and
// ending pullDeadlineMargin before the call's deadline.
func (s *Service) boundWait(ctx context.Context, wait time.Duration) time.Duration {
	wait = min(wait, s.maxPullWait)
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		wait = max(min(wait, time.Until(dl)-pullDeadlineMargin), 0)
	}
	return wait
}

// GetQueueInfo implements storagedv1.MessageStoreServiceServer.
func (s *Service) GetQueueInfo(ctx context.Context, req *storagedv1.GetQueueInfoRequest) (*storagedv1.GetQueueInfoResponse, error) {
	if fe := validateReadTopic("topic", req.GetTopic()); fe != nil {
		return nil, badRead(fe.Field, fe.Reason)
	}
	if req.GetQueueId() < 0 {
		return nil, badRead("queue_id", "queue id must not be negative")
	}
	if req.GetLinearizable() {
		if err := s.store.ReadBarrier(ctx); err != nil {
			return nil, s.readError(methodGetQueueInfo, err)
		}
	}
	lo, hi, err := s.store.QueueInfo(req.GetTopic(), req.GetQueueId())
	if err != nil {
		return nil, s.readError(methodGetQueueInfo, err)
	}
	return &storagedv1.GetQueueInfoResponse{MinOffset: lo, MaxOffset: hi}, nil
}
