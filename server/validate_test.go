package server

import (
	"strings"
	"testing"
)

func TestValidateTopic(t *testing.T) {
	ok := []string{"t", "orders", "Topic_1-x", "%RETRY%group", "%DLQ%group", "a|b", "%41bc", "%25", "rmq_sys_TRACE_DATA",
		strings.Repeat("a", 127), "%", "100%", "%zz"}
	bad := []string{"", "../x", "..", ".", "a/b", `a\b`, "a b", "a\x00b", "t\u043epic", "\uff54opic", "caf\u00e9",
		strings.Repeat("a", 128), "%2e%2e", "%2E%2E", "x%2fy", "%5c", "%00", "%252e%252e", "%25252e", "%ff", "a.b"}
	for _, s := range ok {
		if fe := validateTopic("topic", s); fe != nil {
			t.Errorf("validateTopic(%q) = %v, want ok", s, fe)
		}
	}
	for _, s := range bad {
		if fe := validateTopic("topic", s); fe == nil {
			t.Errorf("validateTopic(%q) = ok, want an error", s)
		} else if fe.Field != "topic" || fe.Reason == "" {
			t.Errorf("validateTopic(%q) = %+v", s, fe)
		}
	}
}

func TestReservedProperty(t *testing.T) {
	for _, k := range []string{"KEYS", "TAGS", "WAIT", "DELAY", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "INNER_NUM",
		"INNER_BASE", "CLUSTER", "DUP_INFO", "__CRC32#", "__transactionId__", "__SHARDINGKEY", "__RMQ.TRANSIENT.X", "TIMER_DELIVER_MS",
		"TIMER_ANYTHING", "MSG_TYPE", "TRACE_ON"} {
		if !reservedProperty(k) {
			t.Errorf("%q should be reserved", k)
		}
	}
	for _, k := range []string{"orderId", "keys", "tags", "KEYS2", "my_TIMER_", "_x", "traceparent", "UNIQ_KEY"} {
		if reservedProperty(k) {
			t.Errorf("%q should be allowed", k)
		}
	}
}

// FuzzValidateTopic: whatever validateTopic accepts is a topic the store
// accepts too (1-127 bytes of [%|a-zA-Z0-9_-]), and it never panics.
func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"t", "%2e%2e", "%RETRY%g", "../x", "%252e", "%", "%%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if validateTopic("topic", s) != nil {
			return
		}
		if len(s) == 0 || len(s) > 127 {
			t.Fatalf("accepted %q of length %d", s, len(s))
		}
		for i := 0; i < len(s); i++ {
			if !strings.ContainsRune("%|_-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", rune(s[i])) {
				t.Fatalf("accepted %q with byte %q", s, s[i])
			}
		}
	})
}

// TestValidatePropertiesStableOrder: with several bad properties the first
// in key order is reported, whatever Go's map order is.
func TestValidatePropertiesStableOrder(t *testing.T) {
	props := map[string]string{"d": "", "c": "x\x01", "b": "", "KEYS": "k", "e": "ok"}
	for range 20 {
		fe := validateEntry(entryPath{index: -1}, "", "", nil, props)
		if fe == nil || fe.Field != `message.properties["KEYS"]` {
			t.Fatalf("got %v, want the KEYS violation first", fe)
		}
	}
}
