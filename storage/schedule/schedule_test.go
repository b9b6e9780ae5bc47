package schedule

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/storaged/storaged/storage/record"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseDelayLevels(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []time.Duration
	}{
		{"1s 5s 1m 2h 1d", []time.Duration{time.Second, 5 * time.Second, time.Minute, 2 * time.Hour, 24 * time.Hour}},
		{"  10s\t30s ", []time.Duration{10 * time.Second, 30 * time.Second}},
		{"", nil}, {"1", nil}, {"0s", nil}, {"1w", nil}, {"-1s", nil}, {"1.5s", nil},
	} {
		got, err := ParseDelayLevels(tc.in)
		if (err == nil) != (tc.want != nil) || len(got) != len(tc.want) {
			t.Errorf("ParseDelayLevels(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ParseDelayLevels(%q)[%d] = %v, want %v", tc.in, i, got[i], tc.want[i])
			}
		}
	}
	if DelayOf([]time.Duration{time.Minute}, 1) != time.Minute || DelayOf(nil, 3) != time.Second {
		t.Error("DelayOf: level 1 of [1m] or the 1 s fallback for an unknown level")
	}
}

// TestDivert: a delayed message goes to the schedule topic's queue
// level-1, levels past the table clamped, with REAL_TOPIC/REAL_QID set
// (a client's own values replaced) and DELAY rewritten to the level used;
// the caller's properties are not modified.
func TestDivert(t *testing.T) {
	props := []record.Property{{Key: "K", Value: "v"}, {Key: record.PropertyDelayLevel, Value: "99"},
		{Key: record.PropertyRealTopic, Value: "forged"}}
	sp := record.Spec{Topic: "Orders", QueueID: 5, Props: props}
	Divert(&sp, 99, 18)
	if sp.Topic != record.ScheduleTopic || sp.QueueID != 17 {
		t.Fatalf("diverted to %s/%d, want %s/17", sp.Topic, sp.QueueID, record.ScheduleTopic)
	}
	want := map[string]string{"K": "v", record.PropertyDelayLevel: "18", record.PropertyRealTopic: "Orders", record.PropertyRealQueueID: "5"}
	if len(sp.Props) != len(want) {
		t.Fatalf("properties %v, want %v", sp.Props, want)
	}
	for _, p := range sp.Props {
		if want[p.Key] != p.Value {
			t.Fatalf("property %s = %q, want %q", p.Key, p.Value, want[p.Key])
		}
	}
	if props[1].Value != "99" || props[2].Value != "forged" {
		t.Fatal("Divert modified the caller's properties")
	}
}

// TestRealMessage: the message delivered is the record's, for its real
// topic and queue, without the delay properties and the store's CRC, with
// WAIT=false; a record without a valid REAL_TOPIC/REAL_QID is refused.
func TestRealMessage(t *testing.T) {
	rec := &record.Record{Topic: record.ScheduleTopic, QueueID: 2, Body: []byte("b"), Flag: 3, SysFlag: record.FlagBornHostV6,
		Properties: []record.Property{{Key: "K", Value: "v"}, {Key: record.PropertyDelayLevel, Value: "3"},
			{Key: record.PropertyRealTopic, Value: "Orders"}, {Key: record.PropertyRealQueueID, Value: "1"},
			{Key: record.PropertyCRC32, Value: "0000000000"}, {Key: "TIMER_DELAY_MS", Value: "5"}}}
	m, err := realMessage(rec)
	if err != nil {
		t.Fatal(err)
	}
	if m.Topic != "Orders" || m.QueueID != 1 || string(m.Body) != "b" || m.Flag != 3 || m.SysFlag != 0 {
		t.Fatalf("message %+v", m)
	}
	if len(m.Properties) != 2 || m.Properties[0] != (record.Property{Key: "K", Value: "v"}) ||
		m.Properties[1] != (record.Property{Key: record.PropertyWaitStoreOK, Value: "false"}) {
		t.Fatalf("properties %v", m.Properties)
	}
	for _, bad := range []string{"", "-1", "x"} {
		r := *rec
		r.Properties = []record.Property{{Key: record.PropertyRealTopic, Value: "Orders"}, {Key: record.PropertyRealQueueID, Value: bad}}
		if _, err := realMessage(&r); err == nil {
			t.Errorf("REAL_QID %q accepted", bad)
		}
	}
}
