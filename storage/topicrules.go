package storage

import (
	"fmt"
	"strings"

	"github.com/storaged/storaged/storage/record"
)

// Topic rules, shared by the store (puts, the topic table, the admin
// calls) and the gRPC edge (server/validate.go), so that both refuse the
// same names for the same reasons.
//
// Reserved topics mirror RocketMQ's TopicValidator:
//
//   - clients may not send to the topics of NOT_ALLOWED_SEND_TOPIC_SET
//     (isNotAllowedSendTopic): SCHEDULE_TOPIC_XXXX (and its V2), the
//     transaction half and op topics, TRANS_CHECK_MAX_TIME_TOPIC,
//     SELF_TEST_TOPIC and OFFSET_MOVED_EVENT. The store itself writes
//     SCHEDULE_TOPIC_XXXX (delay diversion), so a client put there could
//     forge delayed messages or name a queue the scheduler would size
//     itself by;
//   - nor, as storaged's one addition, to topics with RocketMQ's system
//     prefix "rmq_sys_", which RocketMQ 5 keeps for its own topics (timer
//     wheel, replication sync topics) and storaged never writes;
//   - the system topics (SYSTEM_TOPIC_SET, isSystemTopic: the above plus
//     TBW102, BenchmarkTest, RMQ_SYS_TRACE_TOPIC, and the prefix) cannot be
//     created, updated or deleted through the admin calls. TBW102,
//     BenchmarkTest and RMQ_SYS_TRACE_TOPIC stay writable by puts, as in
//     RocketMQ (trace data is sent by clients).
//
// storaged adds RMQ_SYS_CONSUMER_OFFSET (OffsetTopic), the consumer offset
// records, and RMQ_SYS_POP_STATE (PopTopic), the POP consumption state:
// clients can neither put to them nor read them (HiddenTopic): their
// records are the store's state, served through the offset and POP calls.
//
// Retry (%RETRY%group) and dead-letter (%DLQ%group) topics are ordinary
// topics here, writable as in RocketMQ.

// SystemTopicPrefix is RocketMQ's TopicValidator.SYSTEM_TOPIC_PREFIX.
const SystemTopicPrefix = "rmq_sys_"

// notAllowedSendTopics is RocketMQ's NOT_ALLOWED_SEND_TOPIC_SET.
var notAllowedSendTopics = map[string]bool{
	ScheduleTopic:                 true,
	"SCHEDULE_TOPIC_XXXX_V2":      true,
	"RMQ_SYS_TRANS_HALF_TOPIC":    true,
	"RMQ_SYS_TRANS_OP_HALF_TOPIC": true,
	"TRANS_CHECK_MAX_TIME_TOPIC":  true,
	"SELF_TEST_TOPIC":             true,
	"OFFSET_MOVED_EVENT":          true,
	OffsetTopic:                   true, // storaged's: consumer offset records (consumer_offsets.go)
	PopTopic:                      true, // storaged's: POP consumption state records (pop.go)
}

// systemOnlyTopics are the rest of RocketMQ's SYSTEM_TOPIC_SET: writable,
// but not managed through the admin calls.
var systemOnlyTopics = map[string]bool{
	"TBW102":              true, // AUTO_CREATE_TOPIC_KEY_TOPIC
	"BenchmarkTest":       true,
	"RMQ_SYS_TRACE_TOPIC": true,
}

// NotAllowedSendTopic reports whether clients may not put to topic
// (RocketMQ TopicValidator.isNotAllowedSendTopic, plus the rmq_sys_
// prefix).
func NotAllowedSendTopic(topic string) bool {
	return notAllowedSendTopics[topic] || strings.HasPrefix(topic, SystemTopicPrefix)
}

// HiddenTopic reports whether clients may not read topic: the store's own
// state (OffsetTopic, PopTopic, the transaction topics), read through its
// calls only.
func HiddenTopic(topic string) bool {
	return topic == OffsetTopic || topic == PopTopic || topic == TransHalfTopic || topic == TransOpTopic
}

// SystemTopic reports whether topic is a system topic (RocketMQ
// TopicValidator.isSystemTopic): the admin calls refuse to create, update
// or delete it.
func SystemTopic(topic string) bool {
	return NotAllowedSendTopic(topic) || systemOnlyTopics[topic]
}

// TopicNameProblem returns why topic is not a valid topic name, or "" when
// it is: 1-127 bytes of [%|a-zA-Z0-9_-] (RocketMQ's rule; the name becomes
// a directory name), and no percent-encoded byte outside that set, decoded
// repeatedly ("%2e%2e" or "%2F" would turn into "..", "/" in any tool that
// URL-decodes topic names: dashboards, exporters, HTTP gateways); for
// %RETRY% and %DLQ% topics see below.
func TopicNameProblem(topic string) string {
	switch {
	case topic == "":
		return "topic is required"
	case len(topic) > MaxTopicLength:
		return fmt.Sprintf("topic is %d bytes long, limit %d", len(topic), MaxTopicLength)
	}
	for i := 0; i < len(topic); i++ {
		if !record.TopicByte(topic[i]) {
			return fmt.Sprintf("topic must contain only the characters [%%|a-zA-Z0-9_-]; byte %d is %q", i, topic[i])
		}
	}
	// A consumer group's retry and dead-letter topics are its name behind
	// a fixed prefix whose last "%" may read as an escape with the name's
	// first two characters: a group named "ab…" has "%DLQ%ab…" (RocketMQ
	// accepts it). So in those topics the name is held to the rule, and
	// the whole topic only to what the rule is for: decoded repeatedly it
	// must not hold an ASCII byte outside the set ("%DLQ%2F…" or
	// "%DLQ%252F…" would turn into "/"); a byte of 0x80 or more, which
	// only the prefix's escape can make there, separates nothing.
	for _, p := range [...]string{RetryTopicPrefix, DLQTopicPrefix} {
		if name, ok := strings.CutPrefix(topic, p); ok {
			if prob := escapeProblem(name, false); prob != "" {
				return prob
			}
			return escapeProblem(topic, true)
		}
	}
	return escapeProblem(topic, false)
}

// escapeProblem decodes s's percent escapes repeatedly and returns why a
// decoded byte is not allowed, or "": every byte must be in the topic set
// (or, with nonASCII, at least 0x80).
func escapeProblem(s string, nonASCII bool) string {
	for {
		d, changed := percentDecode(s)
		if !changed {
			return ""
		}
		for i := 0; i < len(d); i++ {
			if !record.TopicByte(d[i]) && !(nonASCII && d[i] >= 0x80) {
				return fmt.Sprintf("topic must not percent-encode characters outside [%%|a-zA-Z0-9_-] (decodes to %q)", d)
			}
		}
		s = d
	}
}

// SendTopicProblem returns why a client may not put to topic, or "": a
// malformed name (TopicNameProblem) or a reserved topic
// (NotAllowedSendTopic).
func SendTopicProblem(topic string) string {
	if p := TopicNameProblem(topic); p != "" {
		return p
	}
	if NotAllowedSendTopic(topic) {
		return fmt.Sprintf("topic %s is reserved for the store (RocketMQ system topic); clients cannot write it", topic)
	}
	return ""
}

// percentDecode decodes every %XX escape of s once.
func percentDecode(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, false
	}
	var b strings.Builder
	changed := false
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			changed = true
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), changed
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
