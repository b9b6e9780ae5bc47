package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// Timer messages in the RocketMQ protocol: SendMessage takes a message's
// delivery_timestamp (stored with TIMER_DELIVER_MS, as the RocketMQ proxy
// does) and answers a recall handle for one stored on the timer topic;
// RecallMessage withdraws it by that handle.
//
// The recall handle is RocketMQ 5.3's (RecallMessageHandle.HandleV1):
// base64url, padded as Java's Base64.getUrlEncoder writes it, of
//
//	v1 <topic> <broker name> <delivery time, Unix ms> <message id>
//
// separated by single spaces. The message id is the timer record's offset
// msgId (the message_id SendMessage answered); broker name is BrokerName.
// RocketMQ's SDKs pass the handle through unread (the Java remoting
// client reads the broker name), so the handle only has to mean something
// to storaged; decodeRecallHandle checks every field.

// methodRecallMessage names RecallMessage in logs and error mapping.
const methodRecallMessage method = "RecallMessage"

// recallHandleVersion is the handle format written and read.
const recallHandleVersion = "v1"

// maxRecallHandleLength bounds a handle taken: the longest one storaged
// writes is under 300 bytes (a 127-byte topic, a 56-character IPv6
// msgId).
const maxRecallHandleLength = 512

// errRecallHandle marks a handle that does not decode.
var errRecallHandle = errors.New("recall handle is invalid")

// recallHandle is a decoded recall handle.
type recallHandle struct {
	Topic  string
	Broker string
	DueMS  int64  // the message's delivery time (TIMER_OUT_MS)
	MsgID  string // the timer record's offset msgId
	Phys   int64  // its commitlog offset, from MsgID
}

// encodeRecallHandle writes h (Phys is carried by MsgID).
func encodeRecallHandle(h recallHandle) string {
	raw := strings.Join([]string{recallHandleVersion, h.Topic, h.Broker, strconv.FormatInt(h.DueMS, 10), h.MsgID}, " ")
	return base64.URLEncoding.EncodeToString([]byte(raw))
}

// decodeRecallHandle reads a handle: at most maxRecallHandleLength bytes
// of base64url (padding optional, as Java's URL decoder takes it),
// decoding to exactly five space-separated fields: the version v1, a valid
// topic name, a broker name, a positive delivery time and an offset msgId.
// Every other input is an error wrapping errRecallHandle; it never panics
// and allocates at most a few times the input.
func decodeRecallHandle(s string) (recallHandle, error) {
	if s == "" || len(s) > maxRecallHandleLength {
		return recallHandle{}, fmt.Errorf("%w: %d bytes (1-%d)", errRecallHandle, len(s), maxRecallHandleLength)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return recallHandle{}, fmt.Errorf("%w: not base64url", errRecallHandle)
	}
	f := strings.Split(string(raw), " ")
	if len(f) == 0 || f[0] != recallHandleVersion {
		return recallHandle{}, fmt.Errorf("%w: not a %s handle", errRecallHandle, recallHandleVersion)
	}
	if len(f) != 5 {
		return recallHandle{}, fmt.Errorf("%w: %d fields, want 5", errRecallHandle, len(f))
	}
	h := recallHandle{Topic: f[1], Broker: f[2], MsgID: f[4]}
	if p := storage.TopicNameProblem(h.Topic); p != "" {
		return recallHandle{}, fmt.Errorf("%w: topic: %s", errRecallHandle, p)
	}
	if h.Broker == "" || hasControl(h.Broker) {
		return recallHandle{}, fmt.Errorf("%w: empty or bad broker name", errRecallHandle)
	}
	if h.DueMS, err = strconv.ParseInt(f[3], 10, 64); err != nil || h.DueMS <= 0 || f[3][0] == '+' {
		return recallHandle{}, fmt.Errorf("%w: delivery time %.24q is not a positive integer", errRecallHandle, f[3])
	}
	if _, h.Phys, err = storage.ParseMsgID(h.MsgID); err != nil || h.Phys < 0 {
		return recallHandle{}, fmt.Errorf("%w: message id %.64q is not an offset message id", errRecallHandle, h.MsgID)
	}
	return h, nil
}

// TimerStore is what RecallMessage needs from the store;
// *storage.Store implements it.
type TimerStore interface {
	RecallTimer(ctx context.Context, topic string, dueMS, phys int64) error
}

var (
	_ TimerStore = (*storage.Store)(nil)
	_ TimerStore = (*DeferredStore)(nil)
)

// errNoTimers: the store set keeps no timer messages.
var errNoTimers = errors.New("server: this store keeps no timer messages")

// RecallTimer implements TimerStore.
func (d *DeferredStore) RecallTimer(ctx context.Context, topic string, dueMS, phys int64) error {
	b := d.p.Load()
	if b == nil {
		return ErrStarting
	}
	ts, ok := b.s.(TimerStore)
	if !ok {
		return errNoTimers
	}
	return ts.RecallTimer(ctx, topic, dueMS, phys)
}

// RecallMessage implements rocketmqv2.MessagingServiceServer: the pending
// timer message the handle names is withdrawn (a recall record is stored
// and committed first), so it is never delivered. MESSAGE_NOT_FOUND when
// it is no longer pending (delivered, recalled) or never was; BAD_REQUEST
// for a handle that does not decode or names another topic or broker.
func (r *rocketMQ) RecallMessage(ctx context.Context, req *rocketmqv2.RecallMessageRequest) (*rocketmqv2.RecallMessageResponse, error) {
	topic, st := checkTopic(req.GetTopic())
	if st != nil {
		return &rocketmqv2.RecallMessageResponse{Status: st}, nil
	}
	h, err := decodeRecallHandle(req.GetRecallHandle())
	switch {
	case err != nil:
		return &rocketmqv2.RecallMessageResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST, "%v", err)}, nil
	case h.Topic != topic:
		return &rocketmqv2.RecallMessageResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST,
			"the recall handle is for topic %s, not %s", h.Topic, topic)}, nil
	case h.Broker != BrokerName:
		return &rocketmqv2.RecallMessageResponse{Status: v2Status(rocketmqv2.Code_BAD_REQUEST,
			"the recall handle is for broker %.64q, not %s", h.Broker, BrokerName)}, nil
	}
	ts, ok := r.svc.store.(TimerStore)
	if !ok {
		return &rocketmqv2.RecallMessageResponse{Status: v2Status(rocketmqv2.Code_INTERNAL_SERVER_ERROR, "this store keeps no timer messages")}, nil
	}
	switch err := ts.RecallTimer(ctx, topic, h.DueMS, h.Phys); {
	case err == nil:
		return &rocketmqv2.RecallMessageResponse{Status: okStatus(), MessageId: h.MsgID}, nil
	case errors.Is(err, storage.ErrTimerNotPending):
		return &rocketmqv2.RecallMessageResponse{Status: v2Status(rocketmqv2.Code_MESSAGE_NOT_FOUND,
			"no pending timer message for this handle: delivered already, recalled already, or never stored")}, nil
	default:
		return &rocketmqv2.RecallMessageResponse{Status: grpcToV2(r.svc.putError(ctx, methodRecallMessage, storage.PutResult{}, err))}, nil
	}
}

// ReasonTimerNotPending is the ErrorInfo reason of a storaged.v1
// RecallMessage that found no pending timer message for its handle.
const ReasonTimerNotPending = "TIMER_MESSAGE_NOT_PENDING"

// RecallMessage implements storagedv1.MessageStoreServiceServer: the
// storaged.v1 face of RecallMessage above, with gRPC statuses.
func (s *Service) RecallMessage(ctx context.Context, req *storagedv1.RecallMessageRequest) (*storagedv1.RecallMessageResponse, error) {
	info := &errdetails.ErrorInfo{Reason: ReasonInvalidRequest, Domain: ErrorDomain}
	topic := req.GetTopic()
	if p := storage.TopicNameProblem(topic); p != "" {
		return nil, invalidArgument(info, "topic", p)
	}
	h, err := decodeRecallHandle(req.GetRecallHandle())
	switch {
	case err != nil:
		return nil, invalidArgument(info, "recall_handle", err.Error())
	case h.Topic != topic:
		return nil, invalidArgument(info, "recall_handle", fmt.Sprintf("the recall handle is for topic %s, not %s", h.Topic, topic))
	case h.Broker != BrokerName:
		return nil, invalidArgument(info, "recall_handle", fmt.Sprintf("the recall handle is for broker %.64q, not %s", h.Broker, BrokerName))
	}
	ts, ok := s.store.(TimerStore)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this store keeps no timer messages")
	}
	switch err := ts.RecallTimer(ctx, topic, h.DueMS, h.Phys); {
	case err == nil:
		return &storagedv1.RecallMessageResponse{MsgId: h.MsgID}, nil
	case errors.Is(err, storage.ErrTimerNotPending):
		return nil, newStatus(codes.NotFound, "no pending timer message for this handle: delivered already, recalled already, or never stored",
			&errdetails.ErrorInfo{Reason: ReasonTimerNotPending, Domain: ErrorDomain})
	default:
		return nil, s.putError(ctx, methodRecallMessage, storage.PutResult{}, err)
	}
}
