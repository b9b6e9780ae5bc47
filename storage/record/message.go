package record

import (
	"net/netip"
	"strconv"
)

// Property names the store reads or writes (RocketMQ MessageConst).
const (
	PropertyKeys        = "KEYS"
	PropertyTags        = "TAGS"
	PropertyWaitStoreOK = "WAIT"
	PropertyDelayLevel  = "DELAY"
	PropertyRealTopic   = "REAL_TOPIC"
	PropertyRealQueueID = "REAL_QID"
	PropertyUniqKey     = "UNIQ_KEY"
	PropertyTranMsg     = "TRAN_MSG"
	PropertyInnerNum    = "INNER_NUM"
	// PropertyCRC32 is the whole-record CRC property the store appends
	// (RocketMQ enabledAppendPropCRC); a client may not set it.
	PropertyCRC32 = "__CRC32#"
	// PropertyBatch is the batch-extent property the store writes on the
	// first record of a multi-message batch: "<count>,<bytes>", each 13
	// zero-padded decimal digits, so recovery can tell a batch a crash tore
	// from whole records. A client may not set it.
	PropertyBatch = "__BATCH#"
)

// ScheduleTopic is the topic delay-level messages are diverted to; queue id
// = level - 1 (RocketMQ TopicValidator.RMQ_SYS_SCHEDULE_TOPIC).
const ScheduleTopic = "SCHEDULE_TOPIC_XXXX"

// Timer messages (RocketMQ 5 TimerMessageStore, MessageConst): a message
// with TIMER_DELIVER_MS (Unix ms), TIMER_DELAY_SEC or TIMER_DELAY_MS and
// no delay level is stored on TimerTopic, queue 0, with TIMER_OUT_MS (its
// delivery time, Unix ms) and REAL_TOPIC/REAL_QID, until it is due. A
// recall is a record on the same queue carrying TIMER_DEL_UNIQKEY.
const (
	PropertyTimerDeliverMS  = "TIMER_DELIVER_MS"
	PropertyTimerDelaySec   = "TIMER_DELAY_SEC"
	PropertyTimerDelayMS    = "TIMER_DELAY_MS"
	PropertyTimerOutMS      = "TIMER_OUT_MS"
	PropertyTimerDelUniqKey = "TIMER_DEL_UNIQKEY"
	// TimerTopic is RocketMQ 5's timer topic (TimerMessageStore.TIMER_TOPIC).
	TimerTopic = "rmq_sys_wheel_timer"
	// TimerRecallTags is the consume-queue tags code of a recall record on
	// TimerTopic; a timer record's is its delivery time, never negative.
	TimerRecallTags int64 = -1
)

// TimerTagsCode is the consume-queue tags code of a record on TimerTopic:
// TimerRecallTags for a recall record, else its delivery time
// (TIMER_OUT_MS), 0 when that does not parse (due at once: the timer
// service then finds it undeliverable and skips it). The dispatcher runs
// it for every timer record, so it does not allocate.
func TimerTagsCode(h *Header) int64 {
	if h.Property(PropertyTimerDelUniqKey) != nil {
		return TimerRecallTags
	}
	v := h.Property(PropertyTimerOutMS)
	if len(v) == 0 || len(v) > 18 {
		return 0
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// Transaction types carried in sysflag bits 2-3.
const (
	TransactionNotType      int32 = 0x0
	TransactionPreparedType int32 = 0x4
	TransactionCommitType   int32 = 0x8
	TransactionRollbackType int32 = 0xC
	TransactionMask         int32 = 0xC
)

// Sysflag bits (common/sysflag/MessageSysFlag.java).
const (
	FlagCompressed  int32 = 0x1
	FlagMultiTags   int32 = 0x2
	FlagBornHostV6  int32 = 0x10
	FlagStoreHostV6 int32 = 0x20
	FlagNeedUnwrap  int32 = 0x40
	FlagInnerBatch  int32 = 0x80
	// StoreOwnedSysFlags are set by the encoder from the hosts, whatever
	// the caller passed.
	StoreOwnedSysFlags = FlagBornHostV6 | FlagStoreHostV6
)

// Property is one key/value pair of a message's properties. Order is kept
// as given; keys should be unique.
type Property struct {
	Key, Value string
}

// Message is one message to store. The store never modifies it or keeps a
// reference to it after the put returns.
type Message struct {
	Topic   string
	QueueID int32
	// Flag is the user flag, stored as is.
	Flag int32
	// Body is stored as is; it must not be nil.
	Body []byte
	// Properties include the system properties TAGS, KEYS, DELAY, WAIT,
	// UNIQ_KEY as ordinary entries. Keys and values must be non-empty and
	// free of the separators 0x01 and 0x02.
	Properties []Property
	// SysFlag carries the transaction type and compression bits; the host
	// IPv6 bits are set by the store.
	SysFlag int32
	// BornTimestamp is the producer's time in Unix milliseconds.
	BornTimestamp int64
	// BornHost is the producer's address; the zero value is stored as
	// 0.0.0.0:0.
	BornHost         netip.AddrPort
	ReconsumeTimes   int32
	PreparedTxOffset int64
}

// Property returns the value of the property key and whether it is set.
func (m *Message) Property(key string) (string, bool) {
	return Lookup(m.Properties, key)
}

// DelayLevel returns the DELAY property as a number (0 when absent or not
// a number).
func (m *Message) DelayLevel() int {
	return DelayLevel(m.Properties)
}

// WaitStoreOK reports whether the put waits for the sync flush: true unless
// the WAIT property is "false".
func (m *Message) WaitStoreOK() bool {
	return WaitStoreOK(m.Properties)
}

// Batch is several messages for one topic and queue, stored in one file with
// consecutive queue offsets, all or nothing (RocketMQ MessageExtBatch).
type Batch struct {
	Topic    string
	QueueID  int32
	SysFlag  int32
	BornHost netip.AddrPort
	// Properties are batch-level: WAIT and DELAY are read (a DELAY > 0 is
	// illegal); they are never copied into the messages (RocketMQ #9416).
	Properties []Property
	Messages   []BatchMessage
}

// BatchMessage is one message of a Batch.
type BatchMessage struct {
	Flag          int32
	Body          []byte
	Properties    []Property
	BornTimestamp int64
}

// WaitStoreOK reports whether the batch put waits for the sync flush.
func (b *Batch) WaitStoreOK() bool { return WaitStoreOK(b.Properties) }

// Lookup returns the value of key in props and whether it is set.
func Lookup(props []Property, key string) (string, bool) {
	for i := range props {
		if props[i].Key == key {
			return props[i].Value, true
		}
	}
	return "", false
}

// DelayLevel is the DELAY property of props as a number (0 when absent or
// not a number).
func DelayLevel(props []Property) int {
	v, ok := Lookup(props, PropertyDelayLevel)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0
	}
	return n
}

// WaitStoreOK is false only when props has WAIT=false.
func WaitStoreOK(props []Property) bool {
	v, ok := Lookup(props, PropertyWaitStoreOK)
	return !ok || v != "false"
}

// ValidTopic reports whether t is 1..MaxTopicLength bytes of
// [%|a-zA-Z0-9_-]: topics become directory names, so "/", "..", NUL and
// anything non-ASCII are refused.
func ValidTopic(t string) bool {
	if len(t) == 0 || len(t) > MaxTopicLength {
		return false
	}
	for i := 0; i < len(t); i++ {
		if !TopicByte(t[i]) {
			return false
		}
	}
	return true
}

// TopicByte reports whether c may appear in a topic name.
func TopicByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case c == '%', c == '|', c == '_', c == '-':
		return true
	}
	return false
}

// FieldError says which part of a message cannot be encoded: an illegal
// property, or properties too long for the layout (TooLong; RocketMQ
// PROPERTIES_SIZE_EXCEEDED). The storage package turns it into its
// ValidationError.
type FieldError struct {
	Field   string
	Reason  string
	TooLong bool
}

func (e *FieldError) Error() string { return "storage: illegal message: " + e.Field + ": " + e.Reason }

// PropertyFault is what makes a property unstorable, in the order the
// checks apply: the one rule the store (PropertiesLen) and the gRPC edge's
// validation share. The edge adds its own, stricter, client rules (names
// RocketMQ reserves for itself) after these.
type PropertyFault int

// The faults.
const (
	PropertyOK         PropertyFault = iota
	PropertyEmptyKey                 // RocketMQ decoders drop it
	PropertyEmptyValue               // RocketMQ decoders drop it
	PropertySeparator                // 0x01 or 0x02 in the key or value would split it
	PropertyStoreOwned               // __CRC32# or __BATCH#: written by the store only
)

// CheckProperty returns what makes k=v unstorable, or PropertyOK.
func CheckProperty(k, v string) PropertyFault {
	switch {
	case k == "":
		return PropertyEmptyKey
	case v == "":
		return PropertyEmptyValue
	case hasSeparator(k) || hasSeparator(v):
		return PropertySeparator
	case k == PropertyCRC32 || k == PropertyBatch:
		return PropertyStoreOwned
	}
	return PropertyOK
}

// PropertiesLen returns the encoded length of props (key 0x01 value 0x02
// each) or a *FieldError naming the first bad entry (CheckProperty).
func PropertiesLen(props []Property) (int, *FieldError) {
	n := 0
	for i := range props {
		k, v := props[i].Key, props[i].Value
		switch CheckProperty(k, v) {
		case PropertyOK:
		case PropertyEmptyKey, PropertyEmptyValue:
			return 0, &FieldError{Field: "properties", Reason: "empty property key or value (RocketMQ decoders drop them)"}
		case PropertyStoreOwned:
			return 0, &FieldError{Field: "properties", Reason: "property " + k + " is reserved for the store"}
		default:
			return 0, &FieldError{Field: "properties", Reason: "property key or value contains separator byte 0x01 or 0x02"}
		}
		n += len(k) + len(v) + 2
	}
	return n, nil
}

// HasSeparator reports whether s holds a property separator byte (0x01 or
// 0x02): tags and keys become property values.
func HasSeparator(s string) bool { return hasSeparator(s) }

func hasSeparator(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == nameValueSeparator || s[i] == propertySeparator {
			return true
		}
	}
	return false
}
