package server

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
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
	m := new(storage.Message)
	if fe := fillMessage(m, make([]storage.Property, 0, 4), req.GetMessage(), now, born); fe != nil {
		return nil, fe
	}
	return m, nil
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

// toBatch validates req and converts it into a storage batch.
func toBatch(req *storagedv1.PutMessagesRequest, now int64, born netip.AddrPort, maxMessages int) (*storage.Batch, *fieldError) {
	if fe := validateBatch(req, maxMessages); fe != nil {
		return nil, fe
	}
	b := &storage.Batch{
		Topic:    req.GetTopic(),
		QueueID:  req.GetQueueId(),
		BornHost: born,
		Messages: make([]storage.BatchMessage, len(req.GetMessages())),
	}
	for i, e := range req.GetMessages() {
		b.Messages[i] = storage.BatchMessage{
			Flag:          e.GetFlag(),
			Body:          e.GetBody(),
			Properties:    appendUserProperties(systemProperties(e.GetTags(), e.GetKeys()), e.GetProperties()),
			BornTimestamp: bornTimestamp(e.GetBornTimestamp(), now),
		}
	}
	return b, nil
}

// systemProperties returns TAGS and KEYS when set, with room for more.
func systemProperties(tags, keys string) []storage.Property {
	return appendSystemProperties(make([]storage.Property, 0, 4), tags, keys)
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
	keys := make([]string, 0, len(user))
	for k := range user {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		props = append(props, storage.Property{Key: k, Value: user[k]})
	}
	return props
}

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

// toAppendResult converts what the store appended. msg_ids is filled for a
// batch only, as the proto documents.
func toAppendResult(a *storage.AppendResult, batch bool) *storagedv1.AppendResult {
	r := new(storagedv1.AppendResult)
	fillAppendResult(r, new(timestamppb.Timestamp), a)
	if batch {
		if len(a.Offsets) == 0 {
			r.MsgIds = []string{r.MsgId}
		} else {
			r.MsgIds = make([]string, len(a.Offsets))
			for i, off := range a.Offsets {
				r.MsgIds[i] = msgID(a.StoreHost, off)
			}
		}
	}
	return r
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
