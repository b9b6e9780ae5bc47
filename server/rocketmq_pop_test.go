package server

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/storagetest"
)

// receive runs one ReceiveMessage and returns its status and messages,
// checking the stream's shape: with messages, a delivery timestamp first,
// then the messages, then the status; without, the status alone.
func (e *rmqEnv) receive(t *testing.T, req *rocketmqv2.ReceiveMessageRequest) (*rocketmqv2.Status, []*rocketmqv2.Message) {
	t.Helper()
	s, err := e.rmq.ReceiveMessage(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	var (
		st   *rocketmqv2.Status
		msgs []*rocketmqv2.Message
		ts   bool
	)
	for i := 0; ; i++ {
		r, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if st != nil {
			t.Fatalf("response %d after the status", i)
		}
		switch c := r.GetContent().(type) {
		case *rocketmqv2.ReceiveMessageResponse_DeliveryTimestamp:
			if i != 0 {
				t.Fatalf("delivery timestamp at position %d", i)
			}
			ts = true
		case *rocketmqv2.ReceiveMessageResponse_Message:
			if !ts {
				t.Fatal("a message before the delivery timestamp")
			}
			msgs = append(msgs, c.Message)
		case *rocketmqv2.ReceiveMessageResponse_Status:
			st = c.Status
		}
	}
	if st == nil {
		t.Fatal("no status")
	}
	return st, msgs
}

func receiveReq(group, topic string, n int32, invisible time.Duration) *rocketmqv2.ReceiveMessageRequest {
	return &rocketmqv2.ReceiveMessageRequest{Group: res(group), BatchSize: n,
		MessageQueue:      &rocketmqv2.MessageQueue{Topic: res(topic), Id: 0},
		InvisibleDuration: durationpb.New(invisible)}
}

func msgBodies(ms []*rocketmqv2.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.GetBody()))
	}
	sort.Strings(out)
	return out
}

func (e *rmqEnv) ack(t *testing.T, group, topic string, ms ...*rocketmqv2.Message) *rocketmqv2.AckMessageResponse {
	t.Helper()
	req := &rocketmqv2.AckMessageRequest{Group: res(group), Topic: res(topic)}
	for _, m := range ms {
		req.Entries = append(req.Entries, &rocketmqv2.AckMessageEntry{MessageId: m.GetSystemProperties().GetMessageId(),
			ReceiptHandle: m.GetSystemProperties().GetReceiptHandle()})
	}
	r, err := e.rmq.AckMessage(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRocketMQPop: the POP calls over gRPC on a real store with a test
// clock. A receive hands out what was sent (topic, body, tag, the sent
// message id, a receipt handle, delivery attempt 1, the invisible
// duration); an ack answers per entry (INVALID_RECEIPT_HANDLE for a used
// handle, MULTIPLE_RESULTS when entries differ); a change of invisible
// duration answers a new handle and moves the redelivery; a forward puts
// the message on %DLQ%<group> (read back through storaged.v1); after the
// invisible duration the unacknowledged message comes back with attempt
// 2; an empty receive is MESSAGE_NOT_FOUND; QueryAssignment assigns the
// whole topic.
func TestRocketMQPop(t *testing.T) {
	clk := storagetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := rmqServer(t, func(o *storage.Options) { o.Clock = clk })
	if _, err := e.store.CreateTopic("Orders", 2); err != nil {
		t.Fatal(err)
	}
	sent := map[string]string{} // body → message id
	for _, b := range []string{"a", "b", "c", "d"} {
		tag := "t1"
		r := e.send(t, rmqMsg("Orders", b, &rocketmqv2.SystemProperties{Tag: &tag}))
		wantCode(t, "send "+b, r.GetStatus(), rocketmqv2.Code_OK)
		sent[b] = r.GetEntries()[0].GetMessageId()
	}
	st, got := e.receive(t, receiveReq("G", "Orders", 32, 10*time.Second))
	wantCode(t, "receive", st, rocketmqv2.Code_OK)
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(msgBodies(got), want) {
		t.Fatalf("received %v, want %v", msgBodies(got), want)
	}
	by := map[string]*rocketmqv2.Message{}
	for _, m := range got {
		b, sp := string(m.GetBody()), m.GetSystemProperties()
		by[b] = m
		if m.GetTopic().GetName() != "Orders" || sp.GetMessageId() != sent[b] || sp.GetTag() != "t1" || sp.GetDeliveryAttempt() != 1 ||
			sp.GetReceiptHandle() == "" || sp.GetInvisibleDuration().AsDuration() != 10*time.Second {
			t.Errorf("%s: topic %s id %s (sent %s) tag %q attempt %d handle %q invisible %v", b, m.GetTopic().GetName(), sp.GetMessageId(),
				sent[b], sp.GetTag(), sp.GetDeliveryAttempt(), sp.GetReceiptHandle(), sp.GetInvisibleDuration().AsDuration())
		}
	}
	st, none := e.receive(t, receiveReq("G", "Orders", 32, 10*time.Second))
	wantCode(t, "receive with everything in flight", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
	if len(none) != 0 {
		t.Fatalf("received %v while in flight", msgBodies(none))
	}

	r := e.ack(t, "G", "Orders", by["a"])
	wantCode(t, "ack a", r.GetStatus(), rocketmqv2.Code_OK)
	if len(r.GetEntries()) != 1 || r.GetEntries()[0].GetMessageId() != sent["a"] {
		t.Fatalf("ack entries %v", r.GetEntries())
	}
	r = e.ack(t, "G", "Orders", by["a"])
	wantCode(t, "ack a again", r.GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)
	r = e.ack(t, "G", "Orders", by["a"], by["b"])
	wantCode(t, "ack a (again) and b", r.GetStatus(), rocketmqv2.Code_MULTIPLE_RESULTS)
	wantCode(t, "entry a", r.GetEntries()[0].GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)
	wantCode(t, "entry b", r.GetEntries()[1].GetStatus(), rocketmqv2.Code_OK)

	ch, err := e.rmq.ChangeInvisibleDuration(ctxT(t), &rocketmqv2.ChangeInvisibleDurationRequest{Group: res("G"), Topic: res("Orders"),
		ReceiptHandle: by["c"].GetSystemProperties().GetReceiptHandle(), InvisibleDuration: durationpb.New(time.Minute), MessageId: sent["c"]})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "change c", ch.GetStatus(), rocketmqv2.Code_OK)
	if ch.GetReceiptHandle() == "" || ch.GetReceiptHandle() == by["c"].GetSystemProperties().GetReceiptHandle() {
		t.Fatalf("change answered handle %q", ch.GetReceiptHandle())
	}
	r = e.ack(t, "G", "Orders", by["c"])
	wantCode(t, "ack c with its old handle", r.GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)

	fw, err := e.rmq.ForwardMessageToDeadLetterQueue(ctxT(t), &rocketmqv2.ForwardMessageToDeadLetterQueueRequest{Group: res("G"),
		Topic: res("Orders"), ReceiptHandle: by["d"].GetSystemProperties().GetReceiptHandle(), MessageId: sent["d"], DeliveryAttempt: 1, MaxDeliveryAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "forward d", fw.GetStatus(), rocketmqv2.Code_OK)
	pr, err := e.v1.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: storage.DLQTopic("G"), QueueId: 0, QueueOffset: 0, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.GetMessages()) != 1 || string(pr.GetMessages()[0].GetBody()) != "d" || pr.GetMessages()[0].GetProperties()[storage.PropertyRetryTopic] != "Orders" {
		t.Fatalf("DLQ holds %v", pr.GetMessages())
	}

	clk.Advance(10 * time.Second) // past c's first deadline, before its changed one
	st, none = e.receive(t, receiveReq("G", "Orders", 32, 10*time.Second))
	wantCode(t, "receive before c's changed deadline", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
	if len(none) != 0 {
		t.Fatalf("received %v before c's changed deadline", none)
	}
	clk.Advance(50 * time.Second)
	st, again := e.receive(t, receiveReq("G", "Orders", 32, 10*time.Second))
	wantCode(t, "receive after c's deadline", st, rocketmqv2.Code_OK)
	if len(again) != 1 || string(again[0].GetBody()) != "c" || again[0].GetSystemProperties().GetDeliveryAttempt() != 2 ||
		again[0].GetTopic().GetName() != "Orders" || again[0].GetSystemProperties().GetMessageId() != sent["c"] {
		t.Fatalf("redelivered %v", again)
	}
	wantCode(t, "ack the redelivery", e.ack(t, "G", "Orders", again[0]).GetStatus(), rocketmqv2.Code_OK)

	qa, err := e.rmq.QueryAssignment(ctxT(t), &rocketmqv2.QueryAssignmentRequest{Topic: res("Orders"), Group: res("G"), Endpoints: access()})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "assignment", qa.GetStatus(), rocketmqv2.Code_OK)
	if as := qa.GetAssignments(); len(as) != 1 || as[0].GetMessageQueue().GetId() != -1 || as[0].GetMessageQueue().GetTopic().GetName() != "Orders" ||
		!proto.Equal(as[0].GetMessageQueue().GetBroker().GetEndpoints(), access()) || as[0].GetMessageQueue().GetPermission() != rocketmqv2.Permission_READ_WRITE {
		t.Fatalf("assignments %v", as)
	}
	// A receive for the assignment's queue -1 (the PushConsumer's, with
	// auto_renew and no invisible duration) is served.
	e.send(t, rmqMsg("Orders", "e", nil))
	pushReq := &rocketmqv2.ReceiveMessageRequest{Group: res("G"), BatchSize: 32, AutoRenew: true,
		MessageQueue: qa.GetAssignments()[0].GetMessageQueue(), LongPollingTimeout: durationpb.New(time.Second)}
	st, pushed := e.receive(t, pushReq)
	wantCode(t, "push receive", st, rocketmqv2.Code_OK)
	if len(pushed) != 1 || string(pushed[0].GetBody()) != "e" || pushed[0].GetSystemProperties().GetInvisibleDuration().AsDuration() != defaultAutoRenewInvisible {
		t.Fatalf("push receive got %v", pushed)
	}
}

// TestRocketMQPopMaxAttempts: a group's max attempts come from its
// client's settings (Telemetry backoff_policy.max_attempts) and are
// answered back; a message received that many times goes to %DLQ%<group>.
func TestRocketMQPopMaxAttempts(t *testing.T) {
	clk := storagetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := rmqServer(t, func(o *storage.Options) { o.Clock = clk })
	simple := rocketmqv2.ClientType_SIMPLE_CONSUMER
	s := e.telemetry(t, "client-1")
	in := &rocketmqv2.Settings{ClientType: &simple, AccessPoint: access(), BackoffPolicy: &rocketmqv2.RetryPolicy{MaxAttempts: 2},
		PubSub: &rocketmqv2.Settings_Subscription{Subscription: &rocketmqv2.Subscription{Group: res("G2")}}}
	if err := s.Send(settingsCmd(in)); err != nil {
		t.Fatal(err)
	}
	reply, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if n := reply.GetSettings().GetBackoffPolicy().GetMaxAttempts(); n != 2 {
		t.Fatalf("settings answered max attempts %d, want the client's 2", n)
	}
	// Another group without its own gets the server's default.
	other := proto.Clone(in).(*rocketmqv2.Settings)
	other.BackoffPolicy = nil
	other.GetSubscription().Group = res("G3")
	if err := s.Send(settingsCmd(other)); err != nil {
		t.Fatal(err)
	}
	if reply, err = s.Recv(); err != nil {
		t.Fatal(err)
	}
	if n := reply.GetSettings().GetBackoffPolicy().GetMaxAttempts(); n != storage.DefaultPopMaxAttempts {
		t.Fatalf("G3 answered max attempts %d, want %d", n, storage.DefaultPopMaxAttempts)
	}
	e.send(t, rmqMsg("Orders", "x", nil))
	for attempt := int32(1); attempt <= 2; attempt++ {
		st, got := e.receive(t, receiveReq("G2", "Orders", 1, time.Second))
		wantCode(t, "receive", st, rocketmqv2.Code_OK)
		if len(got) != 1 || got[0].GetSystemProperties().GetDeliveryAttempt() != attempt {
			t.Fatalf("attempt %d: got %v", attempt, got)
		}
		clk.Advance(time.Second)
	}
	st, got := e.receive(t, receiveReq("G2", "Orders", 1, time.Second))
	wantCode(t, "receive past max attempts", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
	if len(got) != 0 {
		t.Fatalf("delivered a third time: %v", got)
	}
	pr, err := e.v1.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: storage.DLQTopic("G2"), QueueId: 0, QueueOffset: 0, MaxMessages: 10})
	if err != nil || len(pr.GetMessages()) != 1 || string(pr.GetMessages()[0].GetBody()) != "x" {
		t.Fatalf("DLQ: %v %v", pr.GetMessages(), err)
	}
}

// TestRocketMQPopRefused: bad POP requests get the protocol's codes, and
// nothing is put in flight.
func TestRocketMQPopRefused(t *testing.T) {
	e := rmqServer(t, nil)
	e.send(t, rmqMsg("Orders", "x", nil))
	rq := func(mod func(*rocketmqv2.ReceiveMessageRequest)) *rocketmqv2.ReceiveMessageRequest {
		r := receiveReq("G", "Orders", 1, 10*time.Second)
		mod(r)
		return r
	}
	for name, c := range map[string]struct {
		req  *rocketmqv2.ReceiveMessageRequest
		code rocketmqv2.Code
	}{
		"no group":     {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.Group = nil }), rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		"bad group":    {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.Group = res("a/b") }), rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		"long group":   {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.Group = res(strings.Repeat("g", 130)) }), rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		"no queue":     {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.MessageQueue = nil }), rocketmqv2.Code_BAD_REQUEST},
		"system topic": {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.MessageQueue.Topic = res(storage.PopTopic) }), rocketmqv2.Code_ILLEGAL_TOPIC},
		"batch 0":      {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.BatchSize = 0 }), rocketmqv2.Code_BAD_REQUEST},
		"batch 33":     {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.BatchSize = 33 }), rocketmqv2.Code_BAD_REQUEST},
		"no invisible": {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.InvisibleDuration = nil }), rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME},
		"invisible 100ms": {rq(func(r *rocketmqv2.ReceiveMessageRequest) {
			r.InvisibleDuration = durationpb.New(100 * time.Millisecond)
		}), rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME},
		"invisible 13h": {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.InvisibleDuration = durationpb.New(13 * time.Hour) }), rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME},
		"negative poll": {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.LongPollingTimeout = durationpb.New(-time.Second) }), rocketmqv2.Code_ILLEGAL_POLLING_TIME},
		"SQL filter": {rq(func(r *rocketmqv2.ReceiveMessageRequest) {
			r.FilterExpression = &rocketmqv2.FilterExpression{Type: rocketmqv2.FilterType_SQL, Expression: "a>1"}
		}), rocketmqv2.Code_UNSUPPORTED},
		"namespaced topic": {rq(func(r *rocketmqv2.ReceiveMessageRequest) { r.MessageQueue.Topic.ResourceNamespace = "ns" }), rocketmqv2.Code_BAD_REQUEST},
		"empty filter tags": {rq(func(r *rocketmqv2.ReceiveMessageRequest) {
			r.FilterExpression = &rocketmqv2.FilterExpression{Expression: "a||"}
		}), rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION},
	} {
		st, msgs := e.receive(t, c.req)
		wantCode(t, name, st, c.code)
		if len(msgs) != 0 {
			t.Errorf("%s: received %d messages", name, len(msgs))
		}
	}
	if n := e.store.PopInflight(""); n != 0 {
		t.Fatalf("%d in flight after refused receives", n)
	}
	ack, err := e.rmq.AckMessage(ctxT(t), &rocketmqv2.AckMessageRequest{Group: res("G"), Topic: res("Orders")})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "ack without entries", ack.GetStatus(), rocketmqv2.Code_BAD_REQUEST)
	ack, err = e.rmq.AckMessage(ctxT(t), &rocketmqv2.AckMessageRequest{Group: res("G"), Topic: res("Orders"),
		Entries: []*rocketmqv2.AckMessageEntry{{ReceiptHandle: "not-a-handle"}}})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "ack of junk", ack.GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)
	ch, err := e.rmq.ChangeInvisibleDuration(ctxT(t), &rocketmqv2.ChangeInvisibleDurationRequest{Group: res("G"), Topic: res("Orders"),
		ReceiptHandle: "x"})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "change without a duration", ch.GetStatus(), rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME)
	fw, err := e.rmq.ForwardMessageToDeadLetterQueue(ctxT(t), &rocketmqv2.ForwardMessageToDeadLetterQueueRequest{Group: res("G"),
		Topic: res("Orders"), ReceiptHandle: "x"})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "forward of junk", fw.GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)
	qa, err := e.rmq.QueryAssignment(ctxT(t), &rocketmqv2.QueryAssignmentRequest{Topic: res("Orders"), Group: res("G")})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "assignment without endpoints", qa.GetStatus(), rocketmqv2.Code_ILLEGAL_ACCESS_POINT)
}

// TestRocketMQPopStatusMapping: the store's POP refusals become the
// codes the SDKs act on.
func TestRocketMQPopStatusMapping(t *testing.T) {
	r := &rocketMQ{svc: New(nil, zerolog.Nop())}
	for _, c := range []struct {
		err  error
		code rocketmqv2.Code
	}{
		{&storage.NotLeaderError{Cause: storage.CauseNotLeader, LeaderID: 1, Term: 2}, rocketmqv2.Code_HA_NOT_AVAILABLE},
		{&storage.PopNotDurableError{Status: storage.FlushSlaveTimeout, Err: storage.ErrReplicationTimeout}, rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT},
		{storage.ErrTooManyInflight, rocketmqv2.Code_TOO_MANY_REQUESTS},
		{storage.ErrInvalidHandle, rocketmqv2.Code_INVALID_RECEIPT_HANDLE},
		{&storage.PopNotDurableError{Status: storage.FlushDiskTimeout}, rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT},
		{storage.ErrTopicNotFound, rocketmqv2.Code_TOPIC_NOT_FOUND},
		{storage.ErrBusy, rocketmqv2.Code_TOO_MANY_REQUESTS},
		{storage.ErrClosed, rocketmqv2.Code_INTERNAL_SERVER_ERROR},
		{errors.New("boom"), rocketmqv2.Code_INTERNAL_SERVER_ERROR},
	} {
		st := r.popStatus(methodReceiveMessage, c.err)
		wantCode(t, c.err.Error(), st, c.code)
	}
}

// TestRocketMQPopFifo: a FIFO consumer group, configured on the server
// (WithFifoConsumerGroups) or named fifo by its client's settings, is told
// fifo in the settings reply, and its receives consume a queue in order:
// nothing after a message in flight, the unacked message again in place
// with attempt 2 (not through %RETRY%); a group that is neither is told
// no fifo and receives past a message in flight.
func TestRocketMQPopFifo(t *testing.T) {
	clk := storagetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st, _ := openStore(t, func(o *storage.Options) { o.Clock = clk })
	srv := startServer(t, New(st, zerolog.Nop(), WithMaxMessageSize(testMaxMessageSize), WithFifoConsumerGroups([]string{"FG"})), GRPCConfig{})
	srv.SetServing(true)
	e := &rmqEnv{rmq: rocketmqv2.NewMessagingServiceClient(dial(t, srv.addr, nil)), store: st, srv: srv}
	if _, err := st.CreateTopic("Orders", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r := e.send(t, rmqMsg("Orders", fmt.Sprintf("o%d", i), &rocketmqv2.SystemProperties{MessageGroup: proto.String("og"),
			MessageType: rocketmqv2.MessageType_FIFO}))
		wantCode(t, "send", r.GetStatus(), rocketmqv2.Code_OK)
	}

	s := e.telemetry(t, "client-1")
	consumer := rocketmqv2.ClientType_SIMPLE_CONSUMER
	for _, c := range []struct {
		group       string
		said, reply bool
	}{{"FG", false, true}, {"DG", true, true}, {"NG", false, false}} {
		sub := &rocketmqv2.Settings{ClientType: &consumer, PubSub: &rocketmqv2.Settings_Subscription{Subscription: &rocketmqv2.Subscription{
			Group: res(c.group), Subscriptions: []*rocketmqv2.SubscriptionEntry{{Topic: res("Orders")}}}}}
		if c.said {
			sub.GetSubscription().Fifo = proto.Bool(true)
		}
		if err := s.Send(settingsCmd(sub)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.group+" settings", got.GetStatus(), rocketmqv2.Code_OK)
		if f := got.GetSettings().GetSubscription().GetFifo(); f != c.reply {
			t.Errorf("%s: settings answered fifo %v, want %v", c.group, f, c.reply)
		}
	}

	one := func(group string, want string, attempt int32) *rocketmqv2.Message {
		t.Helper()
		st, ms := e.receive(t, receiveReq(group, "Orders", 1, 10*time.Second))
		if want == "" {
			wantCode(t, group+" receive", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
			if len(ms) != 0 {
				t.Fatalf("%s: received %v, want nothing", group, msgBodies(ms))
			}
			return nil
		}
		wantCode(t, group+" receive", st, rocketmqv2.Code_OK)
		if len(ms) != 1 || string(ms[0].GetBody()) != want || ms[0].GetSystemProperties().GetDeliveryAttempt() != attempt {
			t.Fatalf("%s: received %v, want %s attempt %d", group, msgBodies(ms), want, attempt)
		}
		return ms[0]
	}
	for _, g := range []string{"FG", "DG"} {
		one(g, "o0", 1)
		one(g, "", 0) // o0 in flight: nothing after it
	}
	one("NG", "o0", 1)
	one("NG", "o1", 1) // not FIFO: past o0 in flight
	clk.Advance(10 * time.Second)
	for _, g := range []string{"FG", "DG"} {
		m := one(g, "o0", 2) // in place, attempt 2
		wantCode(t, g+" ack", e.ack(t, g, "Orders", m).GetStatus(), rocketmqv2.Code_OK)
		one(g, "o1", 1)
	}
	if _, err := st.Topic("%RETRY%FG"); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("the FIFO group used its retry topic: %v", err)
	}
}
