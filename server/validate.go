package server

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/record"
)

// fieldError is a request field refused by this package's validation,
// before the store is called. Field is the path of the field in the request
// (for example `message.properties["KEYS"]` or `messages[2].body`), as
// google.rpc.BadRequest expects.
type fieldError struct {
	Status storage.PutStatus
	Field  string
	Reason string
}

func (e *fieldError) Error() string { return "invalid " + e.Field + ": " + e.Reason }

func illegal(field, format string, args ...any) *fieldError {
	return &fieldError{Status: storage.MessageIllegal, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// reservedProperties are the property names RocketMQ and the store set
// themselves (RocketMQ MessageConst, plus the store's own). A client sets the
// ones that mean something to the store (TAGS, KEYS, DELAY, WAIT) through
// their dedicated fields; the others must not be forged. UNIQ_KEY is not
// among them: it is the client's own message id (RocketMQ producers set
// it), which a client sets in properties to make its put idempotent
// (storage/idempotent.go); it is at most storage.MaxUniqKeyLength bytes.
var reservedProperties = map[string]bool{
	storage.PropertyKeys:             true,
	storage.PropertyTags:             true,
	storage.PropertyWaitStoreOK:      true,
	storage.PropertyDelayLevel:       true,
	storage.PropertyRealTopic:        true,
	storage.PropertyRealQueueID:      true,
	storage.PropertyTranMsg:          true,
	storage.PropertyInnerNum:         true,
	storage.PropertyCRC32:            true,
	"INNER_BASE":                     true,
	"RETRY_TOPIC":                    true,
	"PGROUP":                         true,
	"MIN_OFFSET":                     true,
	"MAX_OFFSET":                     true,
	"BUYER_ID":                       true,
	"ORIGIN_MESSAGE_ID":              true,
	"TRANSFER_FLAG":                  true,
	"CORRECTION_FLAG":                true,
	"MQ2_FLAG":                       true,
	"RECONSUME_TIME":                 true,
	"MSG_REGION":                     true,
	"TRACE_ON":                       true,
	"EXTEND_UNIQ_INFO":               true,
	"MAX_RECONSUME_TIMES":            true,
	"CONSUME_START_TIME":             true,
	"DUP_INFO":                       true,
	"CHECK_IMMUNITY_TIME_IN_SECONDS": true,
	"TRAN_PREPARED_QUEUE_OFFSET":     true,
	"TRANSACTION_CHECK_TIMES":        true,
	"INSTANCE_ID":                    true,
	"CORRELATION_ID":                 true,
	"REPLY_TO_CLIENT":                true,
	"TTL":                            true,
	"ARRIVE_TIME":                    true,
	"PUSH_REPLY_TIME":                true,
	"CLUSTER":                        true,
	"MSG_TYPE":                       true,
	"POP_CK":                         true,
	"POP_CK_OFFSET":                  true,
	"1ST_POP_TIME":                   true,
	"PROPERTY_FORWARD_QUEUE_ID":      true,
	"REDIRECT":                       true,
	"INNER_MULTI_DISPATCH":           true,
	"INNER_MULTI_QUEUE_OFFSET":       true,
	"TRACE_CONTEXT":                  true,
	"BORN_TIMESTAMP":                 true,
	"bname":                          true,
}

// reservedPrefixes are name prefixes RocketMQ keeps for itself: the timer
// properties (TIMER_DELIVER_MS, TIMER_DELAY_SEC, …) and the "__" internals
// (__CRC32#, __transactionId__, __SHARDINGKEY, __BORNHOST,
// __RMQ.TRANSIENT.*).
var reservedPrefixes = []string{"TIMER_", "__"}

// reservedProperty reports whether key is a name clients may not set.
func reservedProperty(key string) bool {
	if reservedProperties[key] {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// validateMessage checks what the store cannot know or would report less
// precisely: presence, signs, separators, reserved names, topic encoding.
// The store still checks sizes (body, properties) against its limits.
func validateMessage(m *storagedv1.Message) *fieldError {
	const p = "message"
	if m == nil {
		return illegal(p, "message is required")
	}
	if fe := validateSendTopic(p+".topic", m.GetTopic()); fe != nil {
		return fe
	}
	if m.GetQueueId() < 0 {
		return illegal(p+".queue_id", "queue id must not be negative, got %d", m.GetQueueId())
	}
	if len(m.GetBody()) == 0 {
		return illegal(p+".body", "body is required")
	}
	if m.GetDelayLevel() < 0 {
		return illegal(p+".delay_level", "delay level must not be negative, got %d", m.GetDelayLevel())
	}
	if at := m.GetDeliverAt(); at != nil {
		if err := at.CheckValid(); err != nil {
			return illegal(p+".deliver_at", "invalid timestamp: %v", err)
		}
		if at.GetSeconds() < 0 {
			return illegal(p+".deliver_at", "delivery time must not be before 1970-01-01")
		}
	}
	return validateEntry(entryPath{index: -1}, m.GetTags(), m.GetKeys(), m.GetBornTimestamp(), m.GetProperties())
}

// validateBatch checks a PutMessages request. Batch-wide size limits are
// maxMessages entries here and the summed body size in the store.
func validateBatch(req *storagedv1.PutMessagesRequest, maxMessages int) *fieldError {
	if fe := validateSendTopic("topic", req.GetTopic()); fe != nil {
		return fe
	}
	if req.GetQueueId() < 0 {
		return illegal("queue_id", "queue id must not be negative, got %d", req.GetQueueId())
	}
	n := len(req.GetMessages())
	switch {
	case n == 0:
		return illegal("messages", "a batch needs at least one message")
	case n > maxMessages:
		return illegal("messages", "a batch holds at most %d messages, got %d", maxMessages, n)
	}
	for i, e := range req.GetMessages() {
		p := entryPath{index: i}
		if e == nil {
			return illegal(p.String(), "message is required")
		}
		if len(e.GetBody()) == 0 {
			return illegal(p.field(".body"), "body is required")
		}
		if fe := validateEntry(p, e.GetTags(), e.GetKeys(), e.GetBornTimestamp(), e.GetProperties()); fe != nil {
			return fe
		}
	}
	return nil
}

// entryPath is the field path of what validateEntry checks: "message"
// (index -1) or "messages[index]". It is a value so that the path string is
// built only for a violation, not for every batch entry.
type entryPath struct{ index int }

func (p entryPath) String() string {
	if p.index < 0 {
		return "message"
	}
	return "messages[" + strconv.Itoa(p.index) + "]"
}

// field is the path of the entry's field sub (".body", ".tags", …).
func (p entryPath) field(sub string) string { return p.String() + sub }

// validateEntry checks the parts a message and a batch entry share.
func validateEntry(p entryPath, tags, keys string, ts *timestamppb.Timestamp, props map[string]string) *fieldError {
	if hasSeparator(tags) {
		return illegal(p.field(".tags"), "tags must not contain the separator bytes 0x01 or 0x02")
	}
	if hasSeparator(keys) {
		return illegal(p.field(".keys"), "keys must not contain the separator bytes 0x01 or 0x02")
	}
	if ts != nil {
		if err := ts.CheckValid(); err != nil {
			return illegal(p.field(".born_timestamp"), "invalid timestamp: %v", err)
		}
		if ts.GetSeconds() < 0 {
			return illegal(p.field(".born_timestamp"), "born timestamp must not be before 1970-01-01")
		}
	}
	// Report the first bad key in key order, not Go's map order: the
	// smallest bad key, found without sorting (or allocating).
	first, found := "", false
	for k, v := range props {
		if (!found || k < first) && checkProperty(k, v) != propertyOK {
			first, found = k, true
		}
	}
	if !found {
		return nil
	}
	f := p.field(".properties[" + strconv.Quote(first) + "]")
	switch checkProperty(first, props[first]) {
	case propertyEmptyKey:
		return illegal(p.field(".properties"), "property keys must not be empty")
	case propertyEmptyValue:
		return illegal(f, "property values must not be empty (RocketMQ decoders drop them)")
	case propertySeparator:
		return illegal(f, "property keys and values must not contain the separator bytes 0x01 or 0x02")
	case propertyTooLong:
		return illegal(f, "%s must be at most %d bytes, got %d", first, storage.MaxUniqKeyLength, len(props[first]))
	default: // propertyReserved
		return illegal(f, "%q is a reserved system property; use the dedicated field (tags, keys, delay_level, wait_store_ok) or another name", first)
	}
}

// propertyFault is what is wrong with a user property, in the order the
// checks apply.
type propertyFault int

const (
	propertyOK propertyFault = iota
	propertyEmptyKey
	propertyEmptyValue
	propertySeparator
	propertyReserved
	propertyTooLong
)

// checkProperty applies the store's property rule (record.CheckProperty,
// shared with the store), then the client rule: names RocketMQ reserves
// (reservedProperty) are not for clients to set.
func checkProperty(k, v string) propertyFault {
	switch record.CheckProperty(k, v) {
	case record.PropertyEmptyKey:
		return propertyEmptyKey
	case record.PropertyEmptyValue:
		return propertyEmptyValue
	case record.PropertySeparator:
		return propertySeparator
	case record.PropertyStoreOwned:
		return propertyReserved
	}
	if reservedProperty(k) {
		return propertyReserved
	}
	if k == storage.PropertyUniqKey && len(v) > storage.MaxUniqKeyLength {
		return propertyTooLong
	}
	return propertyOK
}

func hasSeparator(s string) bool { return record.HasSeparator(s) }

// validateTopic applies the store's topic name rule (storage.TopicNameProblem:
// 1-127 bytes of [%|a-zA-Z0-9_-], no percent-encoded byte outside that set)
// with a precise reason. Reads may name reserved topics (the schedule topic
// is readable); puts check validateSendTopic.
func validateTopic(field, t string) *fieldError {
	if p := storage.TopicNameProblem(t); p != "" {
		return illegal(field, "%s", p)
	}
	return nil
}

// validateReadTopic is validateTopic plus the topics clients may not read
// (storage.HiddenTopic: the consumer offset records, read through
// GetOffset).
func validateReadTopic(field, t string) *fieldError {
	if fe := validateTopic(field, t); fe != nil {
		return fe
	}
	if storage.HiddenTopic(t) {
		return illegal(field, "topic %s holds the store's consumer offsets; read them with GetOffset", t)
	}
	return nil
}

// validateSendTopic is validateTopic plus the reserved topics clients may
// not write (storage.NotAllowedSendTopic, RocketMQ
// TopicValidator.isNotAllowedSendTopic): MESSAGE_ILLEGAL.
func validateSendTopic(field, t string) *fieldError {
	if p := storage.SendTopicProblem(t); p != "" {
		return illegal(field, "%s", p)
	}
	return nil
}
