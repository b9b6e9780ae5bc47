package server

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/storagetest"
)

const testMsgID = "7F00000100002A9F0000000000001000" // 127.0.0.1:10911, commitlog offset 4096

// TestRecallHandleCodec: the handle is RocketMQ 5.3's HandleV1 (the raw
// text Java's buildHandle joins, base64url with padding); it decodes with
// or without the padding, and every malformed handle is refused.
func TestRecallHandleCodec(t *testing.T) {
	h := recallHandle{Topic: "Orders", Broker: BrokerName, DueMS: 1764633600123, MsgID: testMsgID}
	enc := encodeRecallHandle(h)
	java := base64.URLEncoding.EncodeToString([]byte("v1 Orders storaged 1764633600123 " + testMsgID)) // RecallMessageHandle.HandleV1.buildHandle
	if enc != java {
		t.Fatalf("encoded %q, want %q", enc, java)
	}
	for _, s := range []string{enc, strings.TrimRight(enc, "=")} {
		got, err := decodeRecallHandle(s)
		h.Phys = 4096
		if err != nil || got != h {
			t.Fatalf("decode %q: %+v %v, want %+v", s, got, err, h)
		}
	}
	b64 := func(raw string) string { return base64.URLEncoding.EncodeToString([]byte(raw)) }
	for name, s := range map[string]string{
		"empty":             "",
		"too long":          strings.Repeat("A", maxRecallHandleLength+1),
		"not base64":        "v1 Orders storaged 1 " + testMsgID,
		"standard base64":   "djE+T3JkZXJz",
		"version 2":         b64("v2 Orders storaged 1764633600123 " + testMsgID),
		"four fields":       b64("v1 Orders storaged 1764633600123"),
		"six fields":        b64("v1 Orders storaged 1764633600123 " + testMsgID + " x"),
		"double space":      b64("v1 Orders  storaged 1764633600123 " + testMsgID),
		"bad topic":         b64("v1 Ord/ers storaged 1764633600123 " + testMsgID),
		"empty broker":      b64("v1 Orders  1764633600123 " + testMsgID),
		"control in broker": b64("v1 Orders st\x01 1764633600123 " + testMsgID),
		"zero time":         b64("v1 Orders storaged 0 " + testMsgID),
		"negative time":     b64("v1 Orders storaged -5 " + testMsgID),
		"plus time":         b64("v1 Orders storaged +5 " + testMsgID),
		"time not a number": b64("v1 Orders storaged soon " + testMsgID),
		"short msg id":      b64("v1 Orders storaged 1764633600123 0A0B0C0D0E0F"),
		"msg id not hex":    b64("v1 Orders storaged 1764633600123 " + strings.Repeat("Z", 32)),
		"negative offset":   b64("v1 Orders storaged 1764633600123 7F00000100002A9F8000000000001000"),
	} {
		if _, err := decodeRecallHandle(s); !errors.Is(err, errRecallHandle) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeRecallHandle: the decoder never panics, and a handle it takes
// has valid fields and encodes back to one that decodes the same.
func FuzzDecodeRecallHandle(f *testing.F) {
	f.Add(encodeRecallHandle(recallHandle{Topic: "Orders", Broker: BrokerName, DueMS: 1, MsgID: testMsgID}))
	f.Add(base64.URLEncoding.EncodeToString([]byte("v1 a b 9 " + testMsgID)))
	f.Add("djEgT3JkZXJzIHN0b3JhZ2VkIDE")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := decodeRecallHandle(s)
		if err != nil {
			if !errors.Is(err, errRecallHandle) {
				t.Fatalf("error %v does not wrap errRecallHandle", err)
			}
			return
		}
		if storage.TopicNameProblem(h.Topic) != "" || h.Broker == "" || h.DueMS <= 0 || h.Phys < 0 {
			t.Fatalf("accepted %+v", h)
		}
		again, err := decodeRecallHandle(encodeRecallHandle(h))
		if err != nil || again != h {
			t.Fatalf("re-encoded %+v decodes to %+v %v", h, again, err)
		}
	})
}

// TestRocketMQTimerSendRecall: a message sent with a delivery timestamp is
// stored on the timer topic and answered with a recall handle; it is
// readable on its topic only once the store's clock reaches its time; a
// recalled one never is; recalls of a delivered, a recalled or a foreign
// message are refused, each for its reason.
func TestRocketMQTimerSendRecall(t *testing.T) {
	t0 := time.Now().Truncate(time.Millisecond)
	clock := storagetest.NewClock(t0)
	e := rmqServer(t, func(o *storage.Options) { o.Clock = clock })
	if _, err := e.store.CreateTopic("Orders", 1); err != nil {
		t.Fatal(err)
	}
	due := t0.Add(10 * time.Second)
	timer := func(body string) *rocketmqv2.SendResultEntry {
		r := e.send(t, rmqMsg("Orders", body, &rocketmqv2.SystemProperties{MessageType: rocketmqv2.MessageType_DELAY,
			DeliveryTimestamp: timestamppb.New(due)}))
		wantCode(t, "send "+body, r.GetStatus(), rocketmqv2.Code_OK)
		return r.GetEntries()[0]
	}
	keep, drop := timer("keep"), timer("drop")
	for _, entry := range []*rocketmqv2.SendResultEntry{keep, drop} {
		m := e.stored(t, entry)
		if m.GetTopic() != storage.TimerTopic || m.GetProperties()[storage.PropertyRealTopic] != "Orders" ||
			m.GetProperties()[storage.PropertyTimerOutMS] != timestampMS(due) || entry.GetRecallHandle() == "" {
			t.Fatalf("stored %v, handle %q", m, entry.GetRecallHandle())
		}
	}
	now := e.send(t, rmqMsg("Orders", "now", &rocketmqv2.SystemProperties{DeliveryTimestamp: timestamppb.New(t0.Add(-time.Second))}))
	if e.stored(t, now.GetEntries()[0]).GetTopic() != "Orders" || now.GetEntries()[0].GetRecallHandle() != "" {
		t.Fatalf("a delivery time in the past: %v", now.GetEntries()[0])
	}
	ctx := ctxT(t)
	recall := func(topic, handle string) *rocketmqv2.RecallMessageResponse {
		r, err := e.rmq.RecallMessage(ctx, &rocketmqv2.RecallMessageRequest{Topic: res(topic), RecallHandle: handle})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	wantCode(t, "recall for another topic", recall("Other", drop.GetRecallHandle()).GetStatus(), rocketmqv2.Code_BAD_REQUEST)
	wantCode(t, "bad handle", recall("Orders", "not-a-handle").GetStatus(), rocketmqv2.Code_BAD_REQUEST)
	wantCode(t, "system topic", recall(storage.TimerTopic, drop.GetRecallHandle()).GetStatus(), rocketmqv2.Code_ILLEGAL_TOPIC)
	h, _ := decodeRecallHandle(drop.GetRecallHandle())
	h.Broker = "other-broker"
	wantCode(t, "another broker", recall("Orders", encodeRecallHandle(h)).GetStatus(), rocketmqv2.Code_BAD_REQUEST)
	h.Broker, h.DueMS = BrokerName, h.DueMS+1
	wantCode(t, "another time", recall("Orders", encodeRecallHandle(h)).GetStatus(), rocketmqv2.Code_MESSAGE_NOT_FOUND)
	r := recall("Orders", drop.GetRecallHandle())
	wantCode(t, "recall", r.GetStatus(), rocketmqv2.Code_OK)
	if r.GetMessageId() != drop.GetMessageId() {
		t.Fatalf("recall answered message id %q, want %q", r.GetMessageId(), drop.GetMessageId())
	}
	wantCode(t, "second recall", recall("Orders", drop.GetRecallHandle()).GetStatus(), rocketmqv2.Code_MESSAGE_NOT_FOUND)

	readable := func() []string {
		rr, err := e.v1.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "Orders", QueueId: 0, QueueOffset: 0, MaxMessages: 100})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range rr.GetMessages() {
			out = append(out, string(m.GetBody()))
		}
		return out
	}
	clock.Set(due.Add(-time.Millisecond))
	if got := readable(); len(got) != 1 || got[0] != "now" {
		t.Fatalf("before the delivery time: %q", got)
	}
	clock.Set(due)
	waitFor(t, 10*time.Second, func() bool { return e.store.Stats().Timers.Delivered == 1 })
	if got := readable(); len(got) != 2 || got[1] != "keep" {
		t.Fatalf("after the delivery time: %q", got)
	}
	if st := e.store.Stats().Timers; st.Pending != 0 || st.Recalled != 1 {
		t.Fatalf("timer stats %+v", st)
	}
	wantCode(t, "recall after delivery", recall("Orders", keep.GetRecallHandle()).GetStatus(), rocketmqv2.Code_MESSAGE_NOT_FOUND)
	st, msgs, _, _ := e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: &rocketmqv2.MessageQueue{Topic: res("Orders"), Id: 0},
		Offset: 1, BatchSize: 10})
	wantCode(t, "pull", st, rocketmqv2.Code_OK)
	if len(msgs) != 1 || msgs[0].GetSystemProperties().GetMessageType() != rocketmqv2.MessageType_DELAY ||
		!msgs[0].GetSystemProperties().GetDeliveryTimestamp().AsTime().Equal(due) {
		t.Fatalf("pulled %v", msgs)
	}
}

func timestampMS(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// TestTimerPutRecallV1: storaged.v1's deliver_at and RecallMessage: a put
// due later answers a recall handle and is stored on the timer topic;
// RecallMessage withdraws it (then NOT_FOUND TIMER_MESSAGE_NOT_PENDING);
// bad handles, topics and times are INVALID_ARGUMENT; a time beyond the
// maximum delay is WHEEL_TIMER_MSG_ILLEGAL and a full timer store
// WHEEL_TIMER_FLOW_CONTROL with a RetryInfo.
func TestTimerPutRecallV1(t *testing.T) {
	t0 := time.Now().Truncate(time.Millisecond)
	clock := storagetest.NewClock(t0)
	client, st, _ := storeServer(t, func(o *storage.Options) { o.Clock, o.MaxTimerMessages = clock, 2 })
	ctx := ctxT(t)
	put := func(body string, at time.Time) (*storagedv1.PutMessageResponse, error) {
		return client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Later", Body: []byte(body),
			DeliverAt: timestamppb.New(at)}})
	}
	now, err := put("now", t0)
	if err != nil || now.GetRecallHandle() != "" {
		t.Fatalf("put due now: %v %v", now, err)
	}
	a, err := put("a", t0.Add(time.Minute))
	if err != nil || a.GetRecallHandle() == "" {
		t.Fatalf("timer put: %v %v", a, err)
	}
	if _, err := put("b", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = put("c", t0.Add(time.Minute))
	details(t, err).want(t, codes.ResourceExhausted, storage.WheelTimerFlowControl.String(), true)
	_, err = put("far", t0.Add(73*time.Hour))
	details(t, err).want(t, codes.InvalidArgument, storage.WheelTimerMsgIllegal.String(), false)
	_, err = client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Later", Body: []byte("x"),
		DeliverAt: &timestamppb.Timestamp{Seconds: -5}}})
	details(t, err).want(t, codes.InvalidArgument, storage.MessageIllegal.String(), false)

	recall := func(topic, handle string) (*storagedv1.RecallMessageResponse, error) {
		return client.RecallMessage(ctx, &storagedv1.RecallMessageRequest{Topic: topic, RecallHandle: handle})
	}
	_, err = recall("Other", a.GetRecallHandle())
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = recall("Later", "bm90IGEgaGFuZGxl")
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	r, err := recall("Later", a.GetRecallHandle())
	if err != nil || r.GetMsgId() != a.GetResult().GetMsgId() {
		t.Fatalf("recall: %v %v, want msg id %s", r, err, a.GetResult().GetMsgId())
	}
	_, err = recall("Later", a.GetRecallHandle())
	details(t, err).want(t, codes.NotFound, ReasonTimerNotPending, false)
	clock.Set(t0.Add(time.Minute))
	waitFor(t, 10*time.Second, func() bool { return st.Stats().Timers.Delivered == 1 })
	pr, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "Later", QueueId: 0, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range pr.GetMessages() {
		got = append(got, string(m.GetBody()))
	}
	if strings.Join(got, ",") != "now,b" {
		t.Fatalf("delivered %q, want now and b (a was recalled)", got)
	}
}
