package server

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// toProtoStatus is the one table between storage.PutStatus and the proto
// enum. Every storage status has its own value with the same name after the
// PUT_MESSAGE_STATUS_ prefix (TestStatusTable checks it).
func toProtoStatus(s storage.PutStatus) storagedv1.PutMessageStatus {
	switch s {
	case storage.PutOK:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK
	case storage.FlushDiskTimeout:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT
	case storage.FlushSlaveTimeout:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_FLUSH_SLAVE_TIMEOUT
	case storage.SlaveNotAvailable:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_SLAVE_NOT_AVAILABLE
	case storage.ServiceNotAvailable:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_SERVICE_NOT_AVAILABLE
	case storage.CreateMappedFileFailed:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_CREATE_MAPPED_FILE_FAILED
	case storage.MessageIllegal:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_MESSAGE_ILLEGAL
	case storage.PropertiesSizeExceeded:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PROPERTIES_SIZE_EXCEEDED
	case storage.OSPageCacheBusy:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_OS_PAGE_CACHE_BUSY
	case storage.UnknownError:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR
	case storage.InSyncReplicasNotEnough:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_IN_SYNC_REPLICAS_NOT_ENOUGH
	case storage.PutToRemoteBrokerFail:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_TO_REMOTE_BROKER_FAIL
	case storage.LMQConsumeQueueNumExceeded:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_LMQ_CONSUME_QUEUE_NUM_EXCEEDED
	case storage.WheelTimerFlowControl:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_WHEEL_TIMER_FLOW_CONTROL
	case storage.WheelTimerMsgIllegal:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_WHEEL_TIMER_MSG_ILLEGAL
	case storage.WheelTimerNotEnable:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_WHEEL_TIMER_NOT_ENABLE
	}
	return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNSPECIFIED
}

// toMessage validates req and converts it into a storage message. now is the
// default born timestamp (Unix ms), born the caller's address.
func toMessage(req *storagedv1.PutMessageRequest, now int64, born netip.AddrPort) (*storage.Message, *fieldError) {
	m := new(messageWithProps) // the message and room for its properties in one allocation
	if fe := fillMessage(&m.msg, m.props[:0], req.GetMessage(), now, born); fe != nil {
		return nil, fe
	}
	return &m.msg, nil
}

// messageWithProps is a storage message with room for the system
// properties (TAGS, KEYS, DELAY, WAIT, TIMER_DELIVER_MS) a message can get.
type messageWithProps struct {
	msg   storage.Message
	props [5]storage.Property
}

// fillMessage validates pm and converts it into dst, appending the
// properties to props (whose backing array the caller may reuse).
func fillMessage(dst *storage.Message, props []storage.Property, pm *storagedv1.Message, now int64, born netip.AddrPort) *fieldError {
	if fe := validateMessage(pm); fe != nil {
		return fe
	}
	props = appendSystemProperties(props, pm.GetTags(), pm.GetKeys())
	if lvl := pm.GetDelayLevel(); lvl > 0 {
		props = append(props, storage.Property{Key: storage.PropertyDelayLevel, Value: strconv.Itoa(int(lvl))})
	}
	if pm.WaitStoreOk != nil && !pm.GetWaitStoreOk() {
		props = append(props, storage.Property{Key: storage.PropertyWaitStoreOK, Value: "false"})
	}
	if at := pm.GetDeliverAt(); at != nil {
		props = append(props, storage.Property{Key: storage.PropertyTimerDeliverMS, Value: strconv.FormatInt(at.AsTime().UnixMilli(), 10)})
	}
	*dst = storage.Message{
		Topic:         pm.GetTopic(),
		QueueID:       pm.GetQueueId(),
		Flag:          pm.GetFlag(),
		Body:          pm.GetBody(),
		Properties:    appendUserProperties(props, pm.GetProperties()),
		BornTimestamp: bornTimestamp(pm.GetBornTimestamp(), now),
		BornHost:      born,
	}
	return nil
}

// toBatch validates req and converts it into a storage batch. The entries'
// properties share one array, each entry's slice capped at its own end.
func toBatch(req *storagedv1.PutMessagesRequest, now int64, born netip.AddrPort, maxMessages int) (*storage.Batch, *fieldError) {
	if fe := validateBatch(req, maxMessages); fe != nil {
		return nil, fe
	}
	entries := req.GetMessages()
	n := 0
	for _, e := range entries {
		n += len(e.GetProperties())
		if e.GetTags() != "" {
			n++
		}
		if e.GetKeys() != "" {
			n++
		}
	}
	var props []storage.Property
	if n > 0 {
		props = make([]storage.Property, 0, n)
	}
	b := &storage.Batch{
		Topic:    req.GetTopic(),
		QueueID:  req.GetQueueId(),
		BornHost: born,
		Messages: make([]storage.BatchMessage, len(entries)),
	}
	for i, e := range entries {
		start := len(props)
		props = appendUserProperties(appendSystemProperties(props, e.GetTags(), e.GetKeys()), e.GetProperties())
		var own []storage.Property // nil without properties
		if len(props) > start {
			own = props[start:len(props):len(props)]
		}
		b.Messages[i] = storage.BatchMessage{
			Flag:          e.GetFlag(),
			Body:          e.GetBody(),
			Properties:    own,
			BornTimestamp: bornTimestamp(e.GetBornTimestamp(), now),
		}
	}
	return b, nil
}

// appendSystemProperties appends TAGS and KEYS when set.
func appendSystemProperties(props []storage.Property, tags, keys string) []storage.Property {
	if tags != "" {
		props = append(props, storage.Property{Key: storage.PropertyTags, Value: tags})
	}
	if keys != "" {
		props = append(props, storage.Property{Key: storage.PropertyKeys, Value: keys})
	}
	return props
}

// appendUserProperties appends the user properties in key order, so that the
// stored bytes do not depend on Go's map iteration order.
func appendUserProperties(props []storage.Property, user map[string]string) []storage.Property {
	if len(user) == 0 {
		return props
	}
	start := len(props)
	for k, v := range user {
		props = append(props, storage.Property{Key: k, Value: v})
	}
	slices.SortFunc(props[start:], compareKeys) // keys of a map: no ties
	return props
}

func compareKeys(a, b storage.Property) int { return strings.Compare(a.Key, b.Key) }

// bornTimestamp returns ts in Unix ms, or now when ts is absent. ts has been
// validated.
func bornTimestamp(ts *timestamppb.Timestamp, now int64) int64 {
	if ts == nil {
		return now
	}
	return ts.AsTime().UnixMilli()
}

func unixMilliNow() int64 { return time.Now().UnixMilli() }

// bornHost is the caller's address, IPv4-mapped addresses unmapped, or the
// zero AddrPort when the transport is not TCP.
func bornHost(ctx context.Context) netip.AddrPort {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return netip.AddrPort{}
	}
	tcp, ok := p.Addr.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}
	}
	ap := tcp.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// withResult is a response with room for its AppendResult and the
// result's store timestamp: one allocation instead of three. Responses are
// not reused: grpc-go does not allow touching a message after SendMsg
// (stats handlers may read it later).
type withResult[R any] struct {
	resp   R
	result storagedv1.AppendResult
	ts     timestamppb.Timestamp
}

// fillResult fills the result from a and returns it.
func (w *withResult[R]) fillResult(a *storage.AppendResult) *storagedv1.AppendResult {
	fillAppendResult(&w.result, &w.ts, a)
	return &w.result
}

// toPutMessageResponse is the answer to a PutMessage whose put returned
// res without an error.
func toPutMessageResponse(res *storage.PutResult) *storagedv1.PutMessageResponse {
	w := new(withResult[storagedv1.PutMessageResponse])
	w.resp.Status = toProtoStatus(res.Status)
	w.resp.Result = w.fillResult(&res.Append)
	return &w.resp
}

// toPutMessagesResponse is the answer to a PutMessages whose put returned
// res without an error. Unlike PutMessage's, its result has msg_ids, as the
// proto documents.
func toPutMessagesResponse(res *storage.PutResult) *storagedv1.PutMessagesResponse {
	w := new(withResult[storagedv1.PutMessagesResponse])
	w.resp.Status = toProtoStatus(res.Status)
	w.resp.Result = w.fillResult(&res.Append)
	if offs := res.Append.Offsets; len(offs) == 0 {
		w.result.MsgIds = []string{w.result.MsgId}
	} else {
		w.result.MsgIds = msgIDs(res.Append.StoreHost, offs)
	}
	return &w.resp
}

// fillAppendResult fills r (and ts, its store timestamp) from a, for a
// single message.
func fillAppendResult(r *storagedv1.AppendResult, ts *timestamppb.Timestamp, a *storage.AppendResult) {
	ms := a.StoreTimestamp
	ts.Seconds, ts.Nanos = ms/1000, int32(ms%1000)*1e6
	if ts.Nanos < 0 { // before 1970: Timestamp nanos are never negative
		ts.Seconds--
		ts.Nanos += 1e9
	}
	r.MsgId = msgID(a.StoreHost, a.WroteOffset)
	r.WroteOffset = a.WroteOffset
	r.WroteBytes = a.WroteBytes
	r.QueueId = a.QueueID
	r.QueueOffset = a.QueueOffset
	r.StoreTimestamp = ts
	r.MessageCount = a.MsgNum
}
