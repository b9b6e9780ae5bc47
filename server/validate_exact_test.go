package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestValidationErrorsExact pins the field and the whole message of every
// validation error of a message and of a batch entry, byte for byte: the
// field paths are built only when a violation is reported.
func TestValidationErrorsExact(t *testing.T) {
	msg := func(mutate func(m *storagedv1.Message)) *storagedv1.Message {
		m := &storagedv1.Message{Topic: "t", Body: []byte("b")}
		mutate(m)
		return m
	}
	props := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	badTS := &timestamppb.Timestamp{Seconds: 1, Nanos: 2e9}
	before1970 := &timestamppb.Timestamp{Seconds: -10}
	cases := []struct {
		name  string
		m     *storagedv1.Message
		field string
		err   string
	}{
		{"nil", nil, "message", "invalid message: message is required"},
		{"no topic", msg(func(m *storagedv1.Message) { m.Topic = "" }), "message.topic", "invalid message.topic: topic is required"},
		{"topic byte", msg(func(m *storagedv1.Message) { m.Topic = "a/b" }), "message.topic",
			`invalid message.topic: topic must contain only the characters [%|a-zA-Z0-9_-]; byte 1 is '/'`},
		{"negative queue", msg(func(m *storagedv1.Message) { m.QueueId = -3 }), "message.queue_id",
			"invalid message.queue_id: queue id must not be negative, got -3"},
		{"no body", msg(func(m *storagedv1.Message) { m.Body = nil }), "message.body", "invalid message.body: body is required"},
		{"negative delay", msg(func(m *storagedv1.Message) { m.DelayLevel = -1 }), "message.delay_level",
			"invalid message.delay_level: delay level must not be negative, got -1"},
		{"tags", msg(func(m *storagedv1.Message) { m.Tags = "a\x01" }), "message.tags",
			"invalid message.tags: tags must not contain the separator bytes 0x01 or 0x02"},
		{"keys", msg(func(m *storagedv1.Message) { m.Keys = "a\x02" }), "message.keys",
			"invalid message.keys: keys must not contain the separator bytes 0x01 or 0x02"},
		{"timestamp", msg(func(m *storagedv1.Message) { m.BornTimestamp = badTS }), "message.born_timestamp",
			"invalid message.born_timestamp: invalid timestamp: " + badTS.CheckValid().Error()},
		{"before 1970", msg(func(m *storagedv1.Message) { m.BornTimestamp = before1970 }), "message.born_timestamp",
			"invalid message.born_timestamp: born timestamp must not be before 1970-01-01"},
		{"empty key", msg(func(m *storagedv1.Message) { m.Properties = props("", "v", "a", "") }), "message.properties",
			"invalid message.properties: property keys must not be empty"},
		{"empty value", msg(func(m *storagedv1.Message) { m.Properties = props("b", "", "c", "x\x01") }), `message.properties["b"]`,
			`invalid message.properties["b"]: property values must not be empty (RocketMQ decoders drop them)`},
		{"separator", msg(func(m *storagedv1.Message) { m.Properties = props("ok", "1", "q\x02", "v", "z", "") }), `message.properties["q\x02"]`,
			`invalid message.properties["q\x02"]: property keys and values must not contain the separator bytes 0x01 or 0x02`},
		{"reserved", msg(func(m *storagedv1.Message) { m.Properties = props("x", "", "KEYS", "k", "a", "1") }), `message.properties["KEYS"]`,
			`invalid message.properties["KEYS"]: "KEYS" is a reserved system property; use the dedicated field (tags, keys, delay_level, wait_store_ok) or another name`},
		{"reserved prefix", msg(func(m *storagedv1.Message) { m.Properties = props("__x", "1", "zz", "") }), `message.properties["__x"]`,
			`invalid message.properties["__x"]: "__x" is a reserved system property; use the dedicated field (tags, keys, delay_level, wait_store_ok) or another name`},
	}
	for _, tc := range cases {
		t.Run("message/"+tc.name, func(t *testing.T) {
			for range 10 { // map order must not matter
				fe := validateMessage(tc.m)
				if fe == nil || fe.Field != tc.field || fe.Error() != tc.err || fe.Status != storage.MessageIllegal {
					t.Fatalf("got %#v (%v)\nwant field %q error %q", fe, fe, tc.field, tc.err)
				}
			}
		})
		if tc.m == nil || strings.HasPrefix(tc.field, "message.topic") || tc.field == "message.queue_id" || tc.field == "message.delay_level" {
			continue // not per entry
		}
		t.Run("batch/"+tc.name, func(t *testing.T) {
			req := &storagedv1.PutMessagesRequest{Topic: "t"}
			for range 12 {
				req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: []byte("b"), Tags: "ok", Properties: props("p", "v")})
			}
			req.Messages[11] = &storagedv1.BatchEntry{Body: tc.m.Body, Tags: tc.m.Tags, Keys: tc.m.Keys,
				BornTimestamp: tc.m.BornTimestamp, Properties: tc.m.Properties}
			field := "messages[11]" + strings.TrimPrefix(tc.field, "message")
			want := "invalid " + field + strings.TrimPrefix(tc.err, "invalid "+tc.field)
			for range 10 {
				fe := validateBatch(req, 100)
				if fe == nil || fe.Field != field || fe.Error() != want || fe.Status != storage.MessageIllegal {
					t.Fatalf("got %#v (%v)\nwant field %q error %q", fe, fe, field, want)
				}
			}
		})
	}

	batch := []struct {
		name  string
		req   *storagedv1.PutMessagesRequest
		field string
		err   string
	}{
		{"no topic", &storagedv1.PutMessagesRequest{}, "topic", "invalid topic: topic is required"},
		{"percent topic", &storagedv1.PutMessagesRequest{Topic: "%2e%2e"}, "topic",
			`invalid topic: topic must not percent-encode characters outside [%|a-zA-Z0-9_-] (decodes to "..")`},
		{"long topic", &storagedv1.PutMessagesRequest{Topic: strings.Repeat("a", 128)}, "topic", "invalid topic: topic is 128 bytes long, limit 127"},
		{"negative queue", &storagedv1.PutMessagesRequest{Topic: "t", QueueId: -1}, "queue_id", "invalid queue_id: queue id must not be negative, got -1"},
		{"empty", &storagedv1.PutMessagesRequest{Topic: "t"}, "messages", "invalid messages: a batch needs at least one message"},
		{"too many", &storagedv1.PutMessagesRequest{Topic: "t", Messages: make([]*storagedv1.BatchEntry, 101)}, "messages",
			"invalid messages: a batch holds at most 100 messages, got 101"},
		{"nil entry", &storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}, nil}}, "messages[1]",
			"invalid messages[1]: message is required"},
	}
	for _, tc := range batch {
		t.Run("batch/"+tc.name, func(t *testing.T) {
			fe := validateBatch(tc.req, 100)
			if fe == nil || fe.Field != tc.field || fe.Error() != tc.err || fe.Status != storage.MessageIllegal {
				t.Fatalf("got %#v (%v)\nwant field %q error %q", fe, fe, tc.field, tc.err)
			}
		})
	}
}
