package server

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// SendMessage of the RocketMQ protocol, mapped onto the put path.
//
// A request's messages (one topic) are stored as one storaged put: one
// message with PutMessage, several with PutMessages (one queue, all or
// nothing). What a message becomes:
//
//	topic                         → the topic (the store's name rules; system topics refused)
//	body                          → the body (IDENTITY encoding only)
//	system_properties.tag         → TAGS
//	system_properties.keys        → KEYS, space separated (RocketMQ's key separator)
//	system_properties.message_id  → UNIQ_KEY: a send the SDK retries with the same id is stored
//	                                once within the store's dedup window (storage/idempotent.go)
//	system_properties.message_group → __SHARDINGKEY (RocketMQ's property for it), and the queue:
//	                                FNV-1a of the group modulo the topic's queues, so a group
//	                                stays in one queue, in send order
//	system_properties.born_timestamp → the born timestamp (now when unset)
//	system_properties.delivery_timestamp → TIMER_DELIVER_MS (Unix ms), as the RocketMQ proxy
//	                                sets it: a timer message (storage/timers), stored on the
//	                                timer topic until then and delivered to its topic at that
//	                                time or later, never earlier; a time not in the future is
//	                                delivered at once; one more than the store's maximum timer
//	                                delay ahead is ILLEGAL_DELIVERY_TIME. Type DELAY or
//	                                unspecified, no message group, one message per send
//	user_properties               → properties (RocketMQ's reserved names refused)
//	the connection's peer address → the born host
//
// A message without a group goes to the next queue in turn (the client's
// queue_id is not used, as the RocketMQ proxy does not: the Node.js SDK
// names queue 0 for every message). TRANSACTION stores a half message
// (rocketmq_txn.go), answered with its transaction_id. Refused, nothing
// stored: LITE and PRIORITY, GZIP bodies: UNSUPPORTED. The route lists
// NORMAL, FIFO, DELAY and TRANSACTION only, so SDKs that validate message
// types refuse the others themselves.
//
// The answer has one entry per message. message_id is the stored record's
// msgId (storaged.v1 GetMessage takes it; for a timer message the timer
// topic's record), offset its queue offset, recall_handle for a timer
// message the handle RecallMessage takes (rocketmq_recall.go). A put
// that was stored but whose durability is degraded or unknown answers the
// persistence timeout codes with the msgId set (the SDK retries; the
// UNIQ_KEY makes the retry return the stored message).

// methodSendMessage names SendMessage in logs and error mapping.
const methodSendMessage method = "SendMessage"

// keySeparator joins a message's keys in its KEYS property (RocketMQ
// MessageConst.KEY_SEPARATOR).
const keySeparator = " "

// propertyShardingKey is the property RocketMQ keeps a message's group in
// (MessageConst.PROPERTY_SHARDING_KEY).
const propertyShardingKey = "__SHARDINGKEY"

// sendMessage is one validated message of a SendMessage request.
type sendMessage struct {
	body  []byte
	props []storage.Property
	born  int64
	due   int64 // delivery_timestamp in Unix ms; 0 when none
	txn   bool  // a transactional half message (rocketmq_txn.go)
}

// SendMessage implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) SendMessage(ctx context.Context, req *rocketmqv2.SendMessageRequest) (*rocketmqv2.SendMessageResponse, error) {
	msgs := req.GetMessages()
	topic, group, plan, st := r.checkSend(msgs)
	if st != nil {
		return sendFailed(len(msgs), st), nil
	}
	rs, st := r.routeStore()
	if st != nil {
		return sendFailed(len(msgs), st), nil
	}
	queues, _, err := rs.RouteQueues(topic)
	if err != nil {
		return sendFailed(len(msgs), r.storeStatus(err)), nil
	}
	qid := r.pickQueue(group, queues)
	born := bornHost(ctx)
	s := r.svc

	var res storage.PutResult
	if len(plan) == 1 {
		m := &storage.Message{Topic: topic, QueueID: qid, Body: plan[0].body, Properties: plan[0].props,
			BornTimestamp: plan[0].born, BornHost: born}
		if plan[0].txn {
			m.SysFlag = storage.TransactionPreparedType
		}
		res, err = s.store.PutMessage(ctx, m)
	} else {
		b := &storage.Batch{Topic: topic, QueueID: qid, BornHost: born, Messages: make([]storage.BatchMessage, len(plan))}
		for i, p := range plan {
			b.Messages[i] = storage.BatchMessage{Body: p.body, Properties: p.props, BornTimestamp: p.born}
		}
		res, err = s.store.PutMessages(ctx, b)
	}
	if s.tracer != nil {
		s.tracePut(ctx, &res, err)
	}
	var entrySt *rocketmqv2.Status
	switch {
	case err != nil:
		entrySt = grpcToV2(s.putError(ctx, methodSendMessage, res, err))
	default:
		entrySt = putStatusToV2(res.Status)
	}
	resp := &rocketmqv2.SendMessageResponse{Status: entrySt, Entries: make([]*rocketmqv2.SendResultEntry, len(plan))}
	var ids []string
	if res.Appended() {
		ids = res.Append.MsgIDs()
	}
	for i := range resp.Entries {
		e := &rocketmqv2.SendResultEntry{Status: entrySt}
		if i < len(ids) {
			e.MessageId = ids[i]
			e.Offset = res.Append.QueueOffset + int64(i)
			if res.Append.Topic == storage.TransHalfTopic && plan[i].txn {
				e.TransactionId = ids[i]
			}
			if res.Append.Topic == storage.TimerTopic && plan[i].due > 0 {
				e.RecallHandle = encodeRecallHandle(recallHandle{Topic: topic, Broker: BrokerName, DueMS: plan[i].due, MsgID: ids[i]})
			}
		}
		resp.Entries[i] = e
	}
	return resp, nil
}

// sendFailed is the answer to a request refused before anything was
// stored: st for the call and for every message.
func sendFailed(n int, st *rocketmqv2.Status) *rocketmqv2.SendMessageResponse {
	resp := &rocketmqv2.SendMessageResponse{Status: st}
	if n > 0 && n <= DefaultMaxBatchMessages {
		resp.Entries = make([]*rocketmqv2.SendResultEntry, n)
		for i := range resp.Entries {
			resp.Entries[i] = &rocketmqv2.SendResultEntry{Status: st}
		}
	}
	return resp
}

// pickQueue is the queue of a put: the group's (a stable hash), or the
// next in turn without a group.
func (r *rocketMQ) pickQueue(group string, queues int32) int32 {
	if queues <= 0 {
		return 0
	}
	if group != "" {
		h := fnv.New32a()
		h.Write([]byte(group))
		return int32(h.Sum32() % uint32(queues))
	}
	return int32(r.next.Add(1) % uint32(queues))
}

// checkSend validates a request's messages and converts them: the topic
// (the same for all), the message group (the same for all, or none), and
// one sendMessage each. Every refusal names the message's index.
func (r *rocketMQ) checkSend(msgs []*rocketmqv2.Message) (topic, group string, plan []sendMessage, st *rocketmqv2.Status) {
	s := r.svc
	switch n := len(msgs); {
	case n == 0:
		return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "a send needs at least one message")
	case n > s.maxBatchMessages:
		return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "a send holds at most %d messages, got %d", s.maxBatchMessages, n)
	}
	plan = make([]sendMessage, len(msgs))
	total := 0
	now := s.now()
	for i, m := range msgs {
		if m == nil {
			return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "messages[%d] is empty", i)
		}
		t, st := checkTopic(m.GetTopic())
		if st != nil {
			st.Message = prefixed(i, st.Message)
			return "", "", nil, st
		}
		if i == 0 {
			topic = t
		} else if t != topic {
			return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "messages[%d]: topic %s differs from messages[0]'s %s: a send is for one topic", i, t, topic)
		}
		g, p, st := r.checkMessage(m, now)
		if st != nil {
			st.Message = prefixed(i, st.Message)
			return "", "", nil, st
		}
		if i == 0 {
			group = g
		} else if g != group {
			return "", "", nil, v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP, "messages[%d]: message group %q differs from messages[0]'s %q: a send of several messages goes to one queue", i, g, group)
		}
		if p.txn && len(msgs) > 1 {
			return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "messages[%d]: a send of several messages cannot be transactional; send them one by one", i)
		}
		if p.due > 0 && len(msgs) > 1 {
			return "", "", nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "messages[%d]: a send of several messages cannot carry delivery timestamps; send timer messages one by one", i)
		}
		total += len(p.body)
		if total > s.maxMessageSize {
			return "", "", nil, v2Status(rocketmqv2.Code_MESSAGE_BODY_TOO_LARGE, "the bodies of a send sum to more than %d bytes (at messages[%d])", s.maxMessageSize, i)
		}
		plan[i] = p
	}
	return topic, group, plan, nil
}

func prefixed(i int, msg string) string { return "messages[" + strconv.Itoa(i) + "]: " + msg }

// checkMessage validates one message (the topic aside) and converts it.
func (r *rocketMQ) checkMessage(m *rocketmqv2.Message, now int64) (group string, p sendMessage, st *rocketmqv2.Status) {
	body := m.GetBody()
	switch {
	case len(body) == 0:
		return "", p, v2Status(rocketmqv2.Code_MESSAGE_BODY_EMPTY, "body is required")
	case len(body) > r.svc.maxMessageSize:
		return "", p, v2Status(rocketmqv2.Code_MESSAGE_BODY_TOO_LARGE, "body is %d bytes, limit %d", len(body), r.svc.maxMessageSize)
	}
	sp := m.GetSystemProperties()
	if sp == nil { // absent: no system property set (the checks below read its fields)
		sp = &rocketmqv2.SystemProperties{}
	}
	switch sp.GetBodyEncoding() {
	case rocketmqv2.Encoding_ENCODING_UNSPECIFIED, rocketmqv2.Encoding_IDENTITY:
	case rocketmqv2.Encoding_GZIP:
		return "", p, v2Status(rocketmqv2.Code_UNSUPPORTED, "storaged stores bodies as sent and takes no GZIP encoding; send it uncompressed")
	default:
		return "", p, v2Status(rocketmqv2.Code_BAD_REQUEST, "body encoding %d is unknown", int32(sp.GetBodyEncoding()))
	}
	if ts := sp.GetDeliveryTimestamp(); ts != nil {
		if err := ts.CheckValid(); err != nil || ts.GetSeconds() < 0 {
			return "", p, v2Status(rocketmqv2.Code_ILLEGAL_DELIVERY_TIME, "delivery timestamp is not a time at or after 1970-01-01")
		}
		p.due = max(ts.AsTime().UnixMilli(), 1)
	}
	if sp.LiteTopic != nil {
		return "", p, v2Status(rocketmqv2.Code_UNSUPPORTED, notServedLite)
	}
	if sp.Priority != nil {
		return "", p, v2Status(rocketmqv2.Code_UNSUPPORTED, "storaged has no priority messages")
	}
	group = sp.GetMessageGroup()
	if sp.MessageGroup != nil {
		if st := checkMessageGroup(group); st != nil {
			return "", p, st
		}
	}
	switch t := sp.GetMessageType(); t {
	case rocketmqv2.MessageType_MESSAGE_TYPE_UNSPECIFIED:
	case rocketmqv2.MessageType_NORMAL:
		if group != "" {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a NORMAL message has no message group; send it as FIFO")
		}
		if p.due > 0 {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a NORMAL message has no delivery timestamp; send it as DELAY")
		}
	case rocketmqv2.MessageType_FIFO:
		if group == "" {
			return "", p, v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
		}
		if p.due > 0 {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message has no delivery timestamp")
		}
	case rocketmqv2.MessageType_DELAY:
		if p.due == 0 {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery timestamp")
		}
		if group != "" {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message has no message group")
		}
	case rocketmqv2.MessageType_TRANSACTION:
		if group != "" {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a TRANSACTION message has no message group")
		}
		if p.due > 0 {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a TRANSACTION message has no delivery timestamp")
		}
		p.txn = true
	case rocketmqv2.MessageType_LITE:
		return "", p, v2Status(rocketmqv2.Code_UNSUPPORTED, notServedLite)
	case rocketmqv2.MessageType_PRIORITY:
		return "", p, v2Status(rocketmqv2.Code_UNSUPPORTED, "storaged has no priority messages")
	default:
		return "", p, v2Status(rocketmqv2.Code_BAD_REQUEST, "message type %d is unknown", int32(t))
	}

	props := make([]storage.Property, 0, 4+len(m.GetUserProperties()))
	if sp.Tag != nil {
		if st := checkTag(sp.GetTag()); st != nil {
			return "", p, st
		}
		props = append(props, storage.Property{Key: storage.PropertyTags, Value: sp.GetTag()})
	}
	if keys := sp.GetKeys(); len(keys) > 0 {
		for i, k := range keys {
			if st := checkKey(i, k); st != nil {
				return "", p, st
			}
		}
		props = append(props, storage.Property{Key: storage.PropertyKeys, Value: strings.Join(keys, keySeparator)})
	}
	if id := sp.GetMessageId(); id != "" {
		if len(id) > storage.MaxUniqKeyLength || hasControl(id) {
			return "", p, v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_ID, "message id must be at most %d bytes without control characters", storage.MaxUniqKeyLength)
		}
		props = append(props, storage.Property{Key: storage.PropertyUniqKey, Value: id})
	}
	if group != "" {
		if p.due > 0 {
			return "", p, v2Status(rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a message with a message group has no delivery timestamp")
		}
		props = append(props, storage.Property{Key: propertyShardingKey, Value: group})
	}
	if p.due > 0 {
		props = append(props, storage.Property{Key: storage.PropertyTimerDeliverMS, Value: strconv.FormatInt(p.due, 10)})
	}
	if p.txn && sp.OrphanedTransactionRecoveryDuration != nil {
		sec, st := immunitySeconds(sp)
		if st != nil {
			return "", p, st
		}
		props = append(props, storage.Property{Key: storage.PropertyCheckImmunity, Value: sec})
	}
	if st := checkUserProperties(m.GetUserProperties()); st != nil {
		return "", p, st
	}
	props = appendUserProperties(props, m.GetUserProperties())

	born := now
	if ts := sp.GetBornTimestamp(); ts != nil {
		if err := ts.CheckValid(); err != nil || ts.GetSeconds() < 0 {
			return "", p, v2Status(rocketmqv2.Code_BAD_REQUEST, "born timestamp is not a time at or after 1970-01-01")
		}
		born = ts.AsTime().UnixMilli()
	}
	return group, sendMessage{body: body, props: props, born: born, due: p.due, txn: p.txn}, nil
}

// checkMessageGroup applies the RocketMQ proxy's rule: not blank, at most
// MaxMessageGroupLength bytes, no control characters.
func checkMessageGroup(g string) *rocketmqv2.Status {
	switch {
	case strings.TrimSpace(g) == "":
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP, "message group must not be blank")
	case len(g) > MaxMessageGroupLength:
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP, "message group is %d bytes, limit %d", len(g), MaxMessageGroupLength)
	case hasControl(g):
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP, "message group must not contain control characters")
	}
	return nil
}

// checkTag applies the RocketMQ proxy's rule: not blank, no '|' (the tag
// filter's separator), no control characters.
func checkTag(tag string) *rocketmqv2.Status {
	switch {
	case strings.TrimSpace(tag) == "":
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_TAG, "tag must not be blank")
	case strings.Contains(tag, "|"):
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_TAG, "tag must not contain '|' (the tag filter's separator)")
	case hasControl(tag):
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_TAG, "tag must not contain control characters")
	}
	return nil
}

// checkKey checks one key: not blank, no control characters, and no white
// space (keys are stored space separated; a key with a space would read
// back as two).
func checkKey(i int, k string) *rocketmqv2.Status {
	switch {
	case strings.TrimSpace(k) == "":
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_KEY, "keys[%d] must not be blank", i)
	case hasControl(k):
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_KEY, "keys[%d] must not contain control characters", i)
	case strings.IndexFunc(k, unicode.IsSpace) >= 0:
		return v2Status(rocketmqv2.Code_ILLEGAL_MESSAGE_KEY, "keys[%d] must not contain white space (keys are stored space separated)", i)
	}
	return nil
}

// checkUserProperties applies storaged.v1's property rules (checkProperty:
// non-empty, no separators, not a name RocketMQ reserves) plus UNIQ_KEY,
// which this protocol sets from message_id. The first bad key in key order
// is reported.
func checkUserProperties(props map[string]string) *rocketmqv2.Status {
	first, found := "", false
	for k, v := range props {
		if (!found || k < first) && (k == storage.PropertyUniqKey || checkProperty(k, v) != propertyOK) {
			first, found = k, true
		}
	}
	if !found {
		return nil
	}
	code := rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY
	if first == storage.PropertyUniqKey {
		return v2Status(code, "user property %q is reserved: storaged stores the message id there", first)
	}
	switch checkProperty(first, props[first]) {
	case propertyEmptyKey:
		return v2Status(code, "user property names must not be empty")
	case propertyEmptyValue:
		return v2Status(code, "user property %.64q has an empty value (RocketMQ decoders drop them)", first)
	case propertySeparator:
		return v2Status(code, "user property %.64q: names and values must not contain the bytes 0x01 or 0x02", first)
	}
	return v2Status(code, "user property %.64q is a name RocketMQ reserves for itself", first)
}

// hasControl reports whether s holds a control character (RocketMQ's
// containControlCharacter: below 0x20, and DEL).
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return true
		}
	}
	return false
}

// putStatusToV2 is the code of a put that was stored (err nil), as the
// RocketMQ proxy maps the broker's send statuses.
func putStatusToV2(ps storage.PutStatus) *rocketmqv2.Status {
	switch ps {
	case storage.PutOK:
		return okStatus()
	case storage.FlushDiskTimeout:
		return v2Status(rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT, "stored, but the disk flush did not complete in time (FLUSH_DISK_TIMEOUT)")
	case storage.FlushSlaveTimeout:
		return v2Status(rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT, "stored, but the slave did not confirm it in time (FLUSH_SLAVE_TIMEOUT)")
	case storage.SlaveNotAvailable:
		return v2Status(rocketmqv2.Code_HA_NOT_AVAILABLE, "stored, but no slave is available to replicate it (SLAVE_NOT_AVAILABLE)")
	}
	return v2Status(rocketmqv2.Code_INTERNAL_SERVER_ERROR, "stored with status %s", ps)
}

// storeStatus maps a store error outside a put (RouteQueues) through the
// put mapping: the same causes get the same codes.
func (r *rocketMQ) storeStatus(err error) *rocketmqv2.Status {
	return grpcToV2(r.svc.putError(context.Background(), methodSendMessage, storage.PutResult{}, err))
}

// grpcToV2 turns a storaged.v1 status error (putError, readError,
// offsetError: the one place each cause is classified) into the RocketMQ
// protocol's Code, keeping its message and naming its storaged reason:
//
//	INVALID_ARGUMENT                  → BAD_REQUEST (PROPERTIES_SIZE_EXCEEDED: MESSAGE_PROPERTIES_TOO_LARGE,
//	                                    WHEEL_TIMER_MSG_ILLEGAL: ILLEGAL_DELIVERY_TIME)
//	NOT_FOUND TOPIC_NOT_EXIST         → TOPIC_NOT_FOUND; QUERY_NOT_FOUND → OFFSET_NOT_FOUND; else NOT_FOUND
//	OUT_OF_RANGE                      → ILLEGAL_OFFSET
//	RESOURCE_EXHAUSTED                → TOO_MANY_REQUESTS (the SDKs back off)
//	UNAVAILABLE OS_PAGE_CACHE_BUSY    → TOO_MANY_REQUESTS
//	UNAVAILABLE not leader / IN_SYNC_REPLICAS_NOT_ENOUGH → HA_NOT_AVAILABLE
//	DEADLINE_EXCEEDED, stored unknown → SLAVE_PERSISTENCE_TIMEOUT (replication) or MASTER_PERSISTENCE_TIMEOUT
//	DEADLINE_EXCEEDED, CANCELLED      → PROXY_TIMEOUT
//	UNIMPLEMENTED                     → UNSUPPORTED
//	anything else                     → INTERNAL_SERVER_ERROR (the SDKs retry)
func grpcToV2(err error) *rocketmqv2.Status {
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
			break
		}
	}
	reason := info.GetReason()
	meta := info.GetMetadata()
	code := rocketmqv2.Code_INTERNAL_SERVER_ERROR
	switch st.Code() {
	case codes.InvalidArgument:
		code = rocketmqv2.Code_BAD_REQUEST
		switch reason {
		case storage.PropertiesSizeExceeded.String():
			code = rocketmqv2.Code_MESSAGE_PROPERTIES_TOO_LARGE
		case storage.WheelTimerMsgIllegal.String():
			code = rocketmqv2.Code_ILLEGAL_DELIVERY_TIME
		}
	case codes.NotFound:
		switch reason {
		case ReasonTopicNotExist:
			code = rocketmqv2.Code_TOPIC_NOT_FOUND
		case ReasonQueryNotFound:
			code = rocketmqv2.Code_OFFSET_NOT_FOUND
		default:
			code = rocketmqv2.Code_NOT_FOUND
		}
	case codes.OutOfRange:
		code = rocketmqv2.Code_ILLEGAL_OFFSET
	case codes.ResourceExhausted:
		code = rocketmqv2.Code_TOO_MANY_REQUESTS
	case codes.Unavailable:
		switch {
		case reason == storage.OSPageCacheBusy.String():
			code = rocketmqv2.Code_TOO_MANY_REQUESTS
		case reason == storage.InSyncReplicasNotEnough.String():
			code = rocketmqv2.Code_HA_NOT_AVAILABLE
		default:
			switch meta["cause"] {
			case CauseNotLeader, CauseNoLeader, CauseLeaderNotReady, CauseTransferring:
				code = rocketmqv2.Code_HA_NOT_AVAILABLE
			}
		}
	case codes.DeadlineExceeded:
		code = rocketmqv2.Code_PROXY_TIMEOUT
		if meta["stored"] == "unknown" {
			code = rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT
			if meta["outcome"] == "unknown" {
				code = rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT
			}
		}
	case codes.Canceled:
		code = rocketmqv2.Code_PROXY_TIMEOUT
	case codes.Unimplemented:
		code = rocketmqv2.Code_UNSUPPORTED
	}
	msg := st.Message()
	if reason != "" {
		msg += " (storaged: " + reason + ")"
	}
	return &rocketmqv2.Status{Code: code, Message: msg}
}

// errNoRouteStore: the store set keeps no topic configuration.
var errNoRouteStore = errors.New("server: this store keeps no topic configuration")

// RouteQueues implements RouteStore.
func (d *DeferredStore) RouteQueues(topic string) (int32, bool, error) {
	b := d.p.Load()
	if b == nil {
		return 0, false, ErrStarting
	}
	rs, ok := b.s.(RouteStore)
	if !ok {
		return 0, false, errNoRouteStore
	}
	return rs.RouteQueues(topic)
}
