package server

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// PullMessage of the RocketMQ protocol (the pull consumer's read of one
// queue from an offset), mapped onto the storaged.v1 pull path
// (pullRecords: the same in-flight read limit, long poll and drain). The
// answer stream is a status, then the messages, then the offset to pull
// next:
//
//	messages found           → OK, the messages, next_offset
//	none (after the long poll) → MESSAGE_NOT_FOUND, next_offset
//	offset outside the queue → ILLEGAL_OFFSET, next_offset = the nearer bound
//	a queue of the route that never received a message → as an empty queue [0, 0)
//
// A TAG filter ("a || b", "*") is the pull's tag filter; SQL92 filters are
// UNSUPPORTED. The group is required and checked (as RocketMQ does) but the
// read does not depend on it: offsets are the client's, kept with
// UpdateOffset.

// maxPullFilterLength bounds a filter expression.
const maxPullFilterLength = 4096

// PullMessage implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) PullMessage(req *rocketmqv2.PullMessageRequest, stream grpc.ServerStreamingServer[rocketmqv2.PullMessageResponse]) error {
	ctx := stream.Context()
	sendStatus := func(st *rocketmqv2.Status) error {
		return stream.Send(&rocketmqv2.PullMessageResponse{Content: &rocketmqv2.PullMessageResponse_Status{Status: st}})
	}
	sendNext := func(off int64) error {
		return stream.Send(&rocketmqv2.PullMessageResponse{Content: &rocketmqv2.PullMessageResponse_NextOffset{NextOffset: off}})
	}
	pr, st := r.pullRequest(ctx, req)
	if st != nil {
		return sendStatus(st)
	}
	s := r.svc
	res, held, err := s.pullRecords(ctx, pr)
	if err != nil {
		var re *storage.RangeError
		switch {
		case errors.As(err, &re):
			next := re.Min
			if re.Offset > re.Max {
				next = re.Max
			}
			if err := sendStatus(v2Status(rocketmqv2.Code_ILLEGAL_OFFSET, "offset %d is outside the queue: its offsets are [%d, %d)", re.Offset, re.Min, re.Max)); err != nil {
				return err
			}
			return sendNext(next)
		case errors.Is(err, storage.ErrQueueNotFound) && r.inRoute(pr.Topic, pr.QueueID) == nil:
			if pr.Offset > 0 {
				if err := sendStatus(v2Status(rocketmqv2.Code_ILLEGAL_OFFSET, "offset %d is outside the queue: it never received a message", pr.Offset)); err != nil {
					return err
				}
			} else if err := sendStatus(v2Status(rocketmqv2.Code_MESSAGE_NOT_FOUND, "no new message")); err != nil {
				return err
			}
			return sendNext(0)
		}
		return sendStatus(grpcToV2(s.readError(methodPullMessages, err)))
	}
	defer held.release() // the answers are handed to the transport by then
	if len(res.Messages) == 0 {
		if err := sendStatus(v2Status(rocketmqv2.Code_MESSAGE_NOT_FOUND, "no new message")); err != nil {
			return err
		}
		return sendNext(res.NextOffset)
	}
	if err := sendStatus(okStatus()); err != nil {
		return err
	}
	for _, rec := range res.Messages {
		if err := stream.Send(&rocketmqv2.PullMessageResponse{Content: &rocketmqv2.PullMessageResponse_Message{Message: toV2Message(rec)}}); err != nil {
			return err
		}
	}
	return sendNext(res.NextOffset)
}

// pullRequest validates a PullMessageRequest into a storage pull.
func (r *rocketMQ) pullRequest(ctx context.Context, req *rocketmqv2.PullMessageRequest) (storage.PullRequest, *rocketmqv2.Status) {
	if _, st := checkGroup(req.GetGroup()); st != nil {
		return storage.PullRequest{}, st
	}
	topic, qid, st := checkQueue(req.GetMessageQueue())
	if st != nil {
		return storage.PullRequest{}, st
	}
	if req.GetOffset() < 0 {
		return storage.PullRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_OFFSET, "offset must not be negative, got %d", req.GetOffset())
	}
	n := int(req.GetBatchSize())
	switch {
	case n < 0:
		return storage.PullRequest{}, v2Status(rocketmqv2.Code_BAD_REQUEST, "batch size must not be negative, got %d", n)
	case n == 0:
		n = DefaultPullMessages
	}
	tags, st := tagFilter(req.GetFilterExpression())
	if st != nil {
		return storage.PullRequest{}, st
	}
	var wait time.Duration
	if d := req.GetLongPollingTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return storage.PullRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_POLLING_TIME, "long polling timeout must be a duration of zero or more")
		}
		wait = d.AsDuration()
	}
	return storage.PullRequest{Topic: topic, QueueID: qid, Offset: req.GetOffset(), MaxMessages: min(n, MaxPullMessages),
		MaxBytes: DefaultPullBytes, Tags: tags, Wait: r.svc.boundWait(ctx, wait)}, nil
}

// tagFilter turns a filter expression into the pull's tags: none for no
// filter, "" or "*"; else the "||"-separated tags.
func tagFilter(f *rocketmqv2.FilterExpression) ([]string, *rocketmqv2.Status) {
	if f == nil {
		return nil, nil
	}
	switch f.GetType() {
	case rocketmqv2.FilterType_FILTER_TYPE_UNSPECIFIED, rocketmqv2.FilterType_TAG:
	case rocketmqv2.FilterType_SQL:
		return nil, v2Status(rocketmqv2.Code_UNSUPPORTED, "storaged filters by tag only, not by SQL92")
	default:
		return nil, v2Status(rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION, "filter type %d is unknown", int32(f.GetType()))
	}
	e := strings.TrimSpace(f.GetExpression())
	if e == "" || e == "*" {
		return nil, nil
	}
	if len(e) > maxPullFilterLength {
		return nil, v2Status(rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION, "filter expression is %d bytes, limit %d", len(e), maxPullFilterLength)
	}
	parts := strings.Split(e, "||")
	if len(parts) > MaxPullTags {
		return nil, v2Status(rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION, "a filter names at most %d tags, got %d", MaxPullTags, len(parts))
	}
	tags := make([]string, len(parts))
	for i, p := range parts {
		if tags[i] = strings.TrimSpace(p); tags[i] == "" || tags[i] == "*" {
			return nil, v2Status(rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION, "filter %.64q: tag %d is empty or '*'", e, i)
		}
	}
	return tags, nil
}

// toV2Message is a stored record as the RocketMQ protocol hands it to a
// consumer: TAGS, KEYS, __SHARDINGKEY and the store's own properties become
// system properties, the rest user properties. message_id is the record's
// msgId (what SendMessage answered). The body digest is MD5: the Java and
// Node.js SDKs both check it in upper-case hex, while they write a CRC32
// digest differently (hex against decimal) and one of them would drop
// every message as corrupted.
func toV2Message(rec *storage.Record) *rocketmqv2.Message {
	sum := md5.Sum(rec.Body)
	sp := &rocketmqv2.SystemProperties{
		MessageId:      msgID(rec.StoreHost, rec.PhysicalOffset),
		BodyDigest:     &rocketmqv2.Digest{Type: rocketmqv2.DigestType_MD5, Checksum: strings.ToUpper(hex.EncodeToString(sum[:]))},
		BodyEncoding:   rocketmqv2.Encoding_IDENTITY,
		MessageType:    rocketmqv2.MessageType_NORMAL,
		BornTimestamp:  timestamppb.New(time.UnixMilli(rec.BornTimestamp)),
		BornHost:       hostString(rec.BornHost),
		StoreTimestamp: timestamppb.New(time.UnixMilli(rec.StoreTimestamp)),
		StoreHost:      hostString(rec.StoreHost),
		QueueId:        rec.QueueID,
	}
	qo := rec.QueueOffset
	sp.QueueOffset = &qo
	attempt := rec.ReconsumeTimes + 1
	sp.DeliveryAttempt = &attempt
	var user map[string]string
	for _, p := range rec.Properties {
		switch p.Key {
		case storage.PropertyTags:
			v := p.Value
			sp.Tag = &v
		case storage.PropertyKeys:
			sp.Keys = strings.Fields(p.Value)
		case propertyShardingKey:
			v := p.Value
			sp.MessageGroup = &v
			sp.MessageType = rocketmqv2.MessageType_FIFO
		case storage.PropertyTimerOutMS: // a delivered timer message: its delivery time, as the proxy answers it
			if ms, err := strconv.ParseInt(p.Value, 10, 64); err == nil && ms > 0 {
				sp.DeliveryTimestamp = timestamppb.New(time.UnixMilli(ms))
				sp.MessageType = rocketmqv2.MessageType_DELAY
			}
		default:
			if p.Key == storage.PropertyUniqKey || reservedProperty(p.Key) || p.Key == storage.PropertyCRC32 || p.Key == storage.PropertyBatch {
				continue
			}
			if user == nil {
				user = make(map[string]string, len(rec.Properties))
			}
			user[p.Key] = p.Value
		}
	}
	return &rocketmqv2.Message{Topic: &rocketmqv2.Resource{Name: rec.Topic}, UserProperties: user, SystemProperties: sp, Body: rec.Body}
}
