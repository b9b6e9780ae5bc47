package server

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/storagetest"
)

// rmqEnv is a real store served on 127.0.0.1:0, with clients of both
// protocols on one connection.
type rmqEnv struct {
	rmq   rocketmqv2.MessagingServiceClient
	v1    storagedv1.MessageStoreServiceClient
	store *storage.Store
	srv   *testServer
}

func rmqServer(t *testing.T, mutate func(*storage.Options)) *rmqEnv {
	t.Helper()
	st, _ := openStore(t, mutate)
	srv := startServer(t, New(st, zerolog.Nop(), WithMaxMessageSize(testMaxMessageSize)), GRPCConfig{})
	srv.SetServing(true)
	conn := dial(t, srv.addr, nil)
	return &rmqEnv{rmq: rocketmqv2.NewMessagingServiceClient(conn), v1: storagedv1.NewMessageStoreServiceClient(conn), store: st, srv: srv}
}

func access() *rocketmqv2.Endpoints {
	return &rocketmqv2.Endpoints{Scheme: rocketmqv2.AddressScheme_IPv4, Addresses: []*rocketmqv2.Address{{Host: "127.0.0.1", Port: 8081}}}
}

func res(name string) *rocketmqv2.Resource { return &rocketmqv2.Resource{Name: name} }

// wantCode fails unless st has code want.
func wantCode(t *testing.T, what string, st *rocketmqv2.Status, want rocketmqv2.Code) {
	t.Helper()
	if st.GetCode() != want {
		t.Errorf("%s: status %v %q, want %v", what, st.GetCode(), st.GetMessage(), want)
	}
}

// TestRocketMQQueryRoute: a route lists every queue of the topic on one
// broker at the client's access point; an unknown topic gets the
// auto-create queue count (TOPIC_NOT_FOUND with auto-creation off); bad,
// system and namespaced topics and bad access points are refused.
func TestRocketMQQueryRoute(t *testing.T) {
	e := rmqServer(t, func(o *storage.Options) { o.DefaultQueues = 3 })
	ctx := ctxT(t)
	if _, err := e.store.CreateTopic("Orders", 5); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic string
		want  int
	}{{"Orders", 5}, {"NotYet", 3}} {
		r, err := e.rmq.QueryRoute(ctx, &rocketmqv2.QueryRouteRequest{Topic: res(c.topic), Endpoints: access()})
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.topic, r.GetStatus(), rocketmqv2.Code_OK)
		if len(r.GetMessageQueues()) != c.want {
			t.Fatalf("%s: %d queues, want %d", c.topic, len(r.GetMessageQueues()), c.want)
		}
		for i, mq := range r.GetMessageQueues() {
			b := mq.GetBroker()
			if mq.GetId() != int32(i) || mq.GetTopic().GetName() != c.topic || mq.GetPermission() != rocketmqv2.Permission_READ_WRITE ||
				b.GetName() != BrokerName || b.GetId() != 0 || !proto.Equal(b.GetEndpoints(), access()) ||
				len(mq.GetAcceptMessageTypes()) != 4 || mq.GetAcceptMessageTypes()[0] != rocketmqv2.MessageType_NORMAL ||
				mq.GetAcceptMessageTypes()[1] != rocketmqv2.MessageType_FIFO || mq.GetAcceptMessageTypes()[2] != rocketmqv2.MessageType_DELAY ||
				mq.GetAcceptMessageTypes()[3] != rocketmqv2.MessageType_TRANSACTION {
				t.Errorf("%s queue %d: %v", c.topic, i, mq)
			}
		}
	}

	many := &rocketmqv2.Endpoints{}
	for range maxEndpointAddresses + 1 {
		many.Addresses = append(many.Addresses, &rocketmqv2.Address{Host: "h", Port: 1})
	}
	for _, c := range []struct {
		name string
		req  *rocketmqv2.QueryRouteRequest
		want rocketmqv2.Code
	}{
		{"no topic", &rocketmqv2.QueryRouteRequest{Endpoints: access()}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"bad name", &rocketmqv2.QueryRouteRequest{Topic: res("a/b"), Endpoints: access()}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"too long", &rocketmqv2.QueryRouteRequest{Topic: res(strings.Repeat("t", 200)), Endpoints: access()}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"offsets topic", &rocketmqv2.QueryRouteRequest{Topic: res(storage.OffsetTopic), Endpoints: access()}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"schedule topic", &rocketmqv2.QueryRouteRequest{Topic: res(storage.ScheduleTopic), Endpoints: access()}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"namespace", &rocketmqv2.QueryRouteRequest{Topic: &rocketmqv2.Resource{ResourceNamespace: "ns", Name: "Orders"}, Endpoints: access()}, rocketmqv2.Code_BAD_REQUEST},
		{"no endpoints", &rocketmqv2.QueryRouteRequest{Topic: res("Orders")}, rocketmqv2.Code_ILLEGAL_ACCESS_POINT},
		{"too many addresses", &rocketmqv2.QueryRouteRequest{Topic: res("Orders"), Endpoints: many}, rocketmqv2.Code_ILLEGAL_ACCESS_POINT},
		{"port 0", &rocketmqv2.QueryRouteRequest{Topic: res("Orders"), Endpoints: &rocketmqv2.Endpoints{Addresses: []*rocketmqv2.Address{{Host: "h"}}}}, rocketmqv2.Code_ILLEGAL_ACCESS_POINT},
		{"empty host", &rocketmqv2.QueryRouteRequest{Topic: res("Orders"), Endpoints: &rocketmqv2.Endpoints{Addresses: []*rocketmqv2.Address{{Port: 1}}}}, rocketmqv2.Code_ILLEGAL_ACCESS_POINT},
	} {
		r, err := e.rmq.QueryRoute(ctx, c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		wantCode(t, c.name, r.GetStatus(), c.want)
		if len(r.GetMessageQueues()) != 0 {
			t.Errorf("%s: refused route lists queues", c.name)
		}
	}

	off := rmqServer(t, func(o *storage.Options) { o.NoAutoCreateTopics = true })
	r, err := off.rmq.QueryRoute(ctx, &rocketmqv2.QueryRouteRequest{Topic: res("NotYet"), Endpoints: access()})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "auto-creation off", r.GetStatus(), rocketmqv2.Code_TOPIC_NOT_FOUND)
}

// TestRocketMQRouteLeader: a replica of a group that knows another leader
// routes clients to the leader's client address.
func TestRocketMQRouteLeader(t *testing.T) {
	st, _ := openStore(t, nil)
	info := func() ReplicaInfo { return ReplicaInfo{Role: RoleFollower, ID: 2, LeaderID: 1} }
	addrs := map[uint64]string{1: "10.0.0.1:8081", 2: "10.0.0.2:8081"}
	srv := startServer(t, New(st, zerolog.Nop(), WithReplication(info, func(id uint64) string { return addrs[id] })), GRPCConfig{})
	rmq := rocketmqv2.NewMessagingServiceClient(dial(t, srv.addr, nil))
	r, err := rmq.QueryRoute(ctxT(t), &rocketmqv2.QueryRouteRequest{Topic: res("Orders"), Endpoints: access()})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "follower", r.GetStatus(), rocketmqv2.Code_OK)
	want := &rocketmqv2.Endpoints{Scheme: rocketmqv2.AddressScheme_IPv4, Addresses: []*rocketmqv2.Address{{Host: "10.0.0.1", Port: 8081}}}
	if got := r.GetMessageQueues()[0].GetBroker().GetEndpoints(); !proto.Equal(got, want) {
		t.Fatalf("follower routes to %v, want the leader %v", got, want)
	}
}

// send is one SendMessage of msgs.
func (e *rmqEnv) send(t *testing.T, msgs ...*rocketmqv2.Message) *rocketmqv2.SendMessageResponse {
	t.Helper()
	r, err := e.rmq.SendMessage(ctxT(t), &rocketmqv2.SendMessageRequest{Messages: msgs})
	if err != nil {
		t.Fatalf("SendMessage: %v", err)
	}
	return r
}

func rmqMsg(topic, body string, sp *rocketmqv2.SystemProperties) *rocketmqv2.Message {
	if sp == nil {
		sp = &rocketmqv2.SystemProperties{}
	}
	return &rocketmqv2.Message{Topic: res(topic), Body: []byte(body), SystemProperties: sp}
}

// stored reads the message a receipt names through storaged.v1.
func (e *rmqEnv) stored(t *testing.T, entry *rocketmqv2.SendResultEntry) *storagedv1.StoredMessage {
	t.Helper()
	r, err := e.v1.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: entry.GetMessageId()}})
	if err != nil {
		t.Fatalf("GetMessage(%s): %v", entry.GetMessageId(), err)
	}
	return r.GetMessage()
}

// TestRocketMQSendMessage: what a sent message becomes in the store, read
// back through storaged.v1 by the receipt's message id.
func TestRocketMQSendMessage(t *testing.T) {
	e := rmqServer(t, nil)
	if _, err := e.store.CreateTopic("Orders", 4); err != nil {
		t.Fatal(err)
	}
	born := time.UnixMilli(1_700_000_000_123)
	m := rmqMsg("Orders", "hello", &rocketmqv2.SystemProperties{
		Tag: proto.String("TagA"), Keys: []string{"k1", "k2"}, MessageId: "0102AB", MessageType: rocketmqv2.MessageType_NORMAL,
		BornTimestamp: timestamppb.New(born), BornHost: "client-host", BodyEncoding: rocketmqv2.Encoding_IDENTITY,
	})
	m.UserProperties = map[string]string{"b": "2", "a": "1"}
	r := e.send(t, m)
	wantCode(t, "send", r.GetStatus(), rocketmqv2.Code_OK)
	if len(r.GetEntries()) != 1 {
		t.Fatalf("%d entries", len(r.GetEntries()))
	}
	en := r.GetEntries()[0]
	wantCode(t, "entry", en.GetStatus(), rocketmqv2.Code_OK)
	got := e.stored(t, en)
	if got.GetTopic() != "Orders" || string(got.GetBody()) != "hello" || got.GetTags() != "TagA" || got.GetKeys() != "k1 k2" ||
		got.GetQueueOffset() != en.GetOffset() || got.GetBornTimestamp().AsTime().UnixMilli() != born.UnixMilli() ||
		got.GetProperties()["UNIQ_KEY"] != "0102AB" || got.GetProperties()["a"] != "1" || got.GetProperties()["b"] != "2" ||
		got.GetProperties()["__SHARDINGKEY"] != "" || !strings.HasPrefix(got.GetBornHost(), "127.0.0.1:") {
		t.Errorf("stored %v", got)
	}

	// The same message id again (an SDK retry): stored once, the same
	// receipt.
	again := e.send(t, m)
	wantCode(t, "retry", again.GetStatus(), rocketmqv2.Code_OK)
	if again.GetEntries()[0].GetMessageId() != en.GetMessageId() {
		t.Errorf("retry stored anew: %s, first %s", again.GetEntries()[0].GetMessageId(), en.GetMessageId())
	}

	// Without a group: one queue after the other.
	perQueue := map[int32]int{}
	for range 8 {
		r := e.send(t, rmqMsg("Orders", "rr", nil))
		wantCode(t, "round robin", r.GetStatus(), rocketmqv2.Code_OK)
		perQueue[e.stored(t, r.GetEntries()[0]).GetQueueId()]++
	}
	for q := range int32(4) {
		if perQueue[q] != 2 {
			t.Errorf("8 sends without a group over 4 queues: %v", perQueue)
			break
		}
	}

	// A message group: one queue, in send order, the group in
	// __SHARDINGKEY; groups spread over queues.
	groupQueues := map[int32]bool{}
	for g := range 8 {
		group := "group-" + string(rune('a'+g))
		q, last := int32(-1), int64(-1)
		for i := range 3 {
			r := e.send(t, rmqMsg("Orders", group, &rocketmqv2.SystemProperties{MessageGroup: proto.String(group), MessageType: rocketmqv2.MessageType_FIFO}))
			wantCode(t, group, r.GetStatus(), rocketmqv2.Code_OK)
			s := e.stored(t, r.GetEntries()[0])
			if s.GetProperties()["__SHARDINGKEY"] != group || (i > 0 && (s.GetQueueId() != q || s.GetQueueOffset() <= last)) {
				t.Errorf("%s message %d: queue %d offset %d group %q (before: queue %d offset %d)", group, i, s.GetQueueId(), s.GetQueueOffset(),
					s.GetProperties()["__SHARDINGKEY"], q, last)
			}
			q, last = s.GetQueueId(), s.GetQueueOffset()
		}
		groupQueues[q] = true
	}
	if len(groupQueues) < 2 {
		t.Errorf("8 groups all in queue(s) %v", groupQueues)
	}

	// Several messages: one put, one queue, consecutive offsets.
	b := e.send(t, rmqMsg("Orders", "b0", nil), rmqMsg("Orders", "b1", &rocketmqv2.SystemProperties{Tag: proto.String("T")}), rmqMsg("Orders", "b2", nil))
	wantCode(t, "batch", b.GetStatus(), rocketmqv2.Code_OK)
	if len(b.GetEntries()) != 3 {
		t.Fatalf("batch: %d entries", len(b.GetEntries()))
	}
	first := e.stored(t, b.GetEntries()[0])
	for i, en := range b.GetEntries() {
		s := e.stored(t, en)
		if string(s.GetBody()) != "b"+string(rune('0'+i)) || s.GetQueueId() != first.GetQueueId() || s.GetQueueOffset() != first.GetQueueOffset()+int64(i) ||
			en.GetOffset() != s.GetQueueOffset() {
			t.Errorf("batch entry %d: %v (entry offset %d)", i, s, en.GetOffset())
		}
	}
	if e.stored(t, b.GetEntries()[1]).GetTags() != "T" {
		t.Error("batch entry 1 lost its tag")
	}
}

// TestRocketMQSendRefused: every refused send answers the API's code, for
// the call and for each message, and stores nothing.
func TestRocketMQSendRefused(t *testing.T) {
	e := rmqServer(t, nil)
	if _, err := e.store.CreateTopic("Orders", 2); err != nil {
		t.Fatal(err)
	}
	sp := func(f func(*rocketmqv2.SystemProperties)) *rocketmqv2.SystemProperties {
		p := &rocketmqv2.SystemProperties{}
		f(p)
		return p
	}
	withProps := func(props map[string]string) *rocketmqv2.Message {
		m := rmqMsg("Orders", "x", nil)
		m.UserProperties = props
		return m
	}
	tooMany := make([]*rocketmqv2.Message, DefaultMaxBatchMessages+1)
	for i := range tooMany {
		tooMany[i] = rmqMsg("Orders", "x", nil)
	}
	half := strings.Repeat("h", testMaxMessageSize/2+1)
	for _, c := range []struct {
		name string
		msgs []*rocketmqv2.Message
		want rocketmqv2.Code
	}{
		{"no message", nil, rocketmqv2.Code_BAD_REQUEST},
		{"too many messages", tooMany, rocketmqv2.Code_BAD_REQUEST},
		{"empty message", []*rocketmqv2.Message{{}}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"empty body", []*rocketmqv2.Message{rmqMsg("Orders", "", nil)}, rocketmqv2.Code_MESSAGE_BODY_EMPTY},
		{"body too large", []*rocketmqv2.Message{rmqMsg("Orders", strings.Repeat("x", testMaxMessageSize+1), nil)}, rocketmqv2.Code_MESSAGE_BODY_TOO_LARGE},
		{"bodies sum too large", []*rocketmqv2.Message{rmqMsg("Orders", half, nil), rmqMsg("Orders", half, nil)}, rocketmqv2.Code_MESSAGE_BODY_TOO_LARGE},
		{"no topic", []*rocketmqv2.Message{{Body: []byte("x")}}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"bad topic", []*rocketmqv2.Message{rmqMsg("../etc", "x", nil)}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"offsets topic", []*rocketmqv2.Message{rmqMsg(storage.OffsetTopic, "x", nil)}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"schedule topic", []*rocketmqv2.Message{rmqMsg(storage.ScheduleTopic, "x", nil)}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"half message topic", []*rocketmqv2.Message{rmqMsg("RMQ_SYS_TRANS_HALF_TOPIC", "x", nil)}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"system prefix", []*rocketmqv2.Message{rmqMsg("rmq_sys_x", "x", nil)}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"two topics", []*rocketmqv2.Message{rmqMsg("Orders", "x", nil), rmqMsg("Other", "x", nil)}, rocketmqv2.Code_BAD_REQUEST},
		{"namespace", []*rocketmqv2.Message{{Topic: &rocketmqv2.Resource{ResourceNamespace: "ns", Name: "Orders"}, Body: []byte("x")}}, rocketmqv2.Code_BAD_REQUEST},
		{"blank tag", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Tag = proto.String("  ") }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_TAG},
		{"tag with |", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Tag = proto.String("a|b") }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_TAG},
		{"tag with separator", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Tag = proto.String("a\x01b") }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_TAG},
		{"blank key", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Keys = []string{"k", ""} }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_KEY},
		{"key with space", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Keys = []string{"a b"} }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_KEY},
		{"key with separator", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Keys = []string{"a\x02"} }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_KEY},
		{"blank group", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageGroup = proto.String("") }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP},
		{"group too long", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageGroup = proto.String(strings.Repeat("g", MaxMessageGroupLength+1))
		}))}, rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP},
		{"FIFO without group", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageType = rocketmqv2.MessageType_FIFO }))}, rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP},
		{"NORMAL with group", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageType, p.MessageGroup = rocketmqv2.MessageType_NORMAL, proto.String("g")
		}))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"two groups", []*rocketmqv2.Message{
			rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageGroup = proto.String("g1") })),
			rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageGroup = proto.String("g2") })),
		}, rocketmqv2.Code_ILLEGAL_MESSAGE_GROUP},
		{"delivery beyond the maximum delay", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.DeliveryTimestamp = timestamppb.New(time.Now().Add(4 * 24 * time.Hour))
		}))}, rocketmqv2.Code_ILLEGAL_DELIVERY_TIME},
		{"delivery before 1970", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.DeliveryTimestamp = &timestamppb.Timestamp{Seconds: -1}
		}))}, rocketmqv2.Code_ILLEGAL_DELIVERY_TIME},
		{"DELAY without a delivery timestamp", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageType = rocketmqv2.MessageType_DELAY }))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"NORMAL with a delivery timestamp", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageType, p.DeliveryTimestamp = rocketmqv2.MessageType_NORMAL, timestamppb.New(time.Now().Add(time.Hour))
		}))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"a group with a delivery timestamp", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageGroup, p.DeliveryTimestamp = proto.String("g"), timestamppb.New(time.Now().Add(time.Hour))
		}))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"two timer messages in a send", []*rocketmqv2.Message{
			rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.DeliveryTimestamp = timestamppb.New(time.Now().Add(time.Hour)) })),
			rmqMsg("Orders", "y", sp(func(p *rocketmqv2.SystemProperties) { p.DeliveryTimestamp = timestamppb.New(time.Now().Add(time.Hour)) })),
		}, rocketmqv2.Code_BAD_REQUEST},
		{"TRANSACTION with a group", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageType, p.MessageGroup = rocketmqv2.MessageType_TRANSACTION, proto.String("g")
		}))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"TRANSACTION with a delivery timestamp", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageType, p.DeliveryTimestamp = rocketmqv2.MessageType_TRANSACTION, timestamppb.New(time.Now().Add(time.Hour))
		}))}, rocketmqv2.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
		{"two TRANSACTION messages in a send", []*rocketmqv2.Message{
			rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageType = rocketmqv2.MessageType_TRANSACTION })),
			rmqMsg("Orders", "y", sp(func(p *rocketmqv2.SystemProperties) { p.MessageType = rocketmqv2.MessageType_TRANSACTION })),
		}, rocketmqv2.Code_BAD_REQUEST},
		{"TRANSACTION with a negative recovery duration", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageType, p.OrphanedTransactionRecoveryDuration = rocketmqv2.MessageType_TRANSACTION, durationpb.New(-time.Second)
		}))}, rocketmqv2.Code_BAD_REQUEST},
		{"LITE", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.LiteTopic = proto.String("l") }))}, rocketmqv2.Code_UNSUPPORTED},
		{"PRIORITY", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.Priority = proto.Int32(1) }))}, rocketmqv2.Code_UNSUPPORTED},
		{"unknown type", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.MessageType = 99 }))}, rocketmqv2.Code_BAD_REQUEST},
		{"GZIP", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) { p.BodyEncoding = rocketmqv2.Encoding_GZIP }))}, rocketmqv2.Code_UNSUPPORTED},
		{"message id too long", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.MessageId = strings.Repeat("A", storage.MaxUniqKeyLength+1)
		}))}, rocketmqv2.Code_ILLEGAL_MESSAGE_ID},
		{"bad born timestamp", []*rocketmqv2.Message{rmqMsg("Orders", "x", sp(func(p *rocketmqv2.SystemProperties) {
			p.BornTimestamp = &timestamppb.Timestamp{Seconds: -5}
		}))}, rocketmqv2.Code_BAD_REQUEST},
		{"reserved property", []*rocketmqv2.Message{withProps(map[string]string{"ok": "1", "DELAY": "3"})}, rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{"UNIQ_KEY property", []*rocketmqv2.Message{withProps(map[string]string{"UNIQ_KEY": "forged"})}, rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{"__ property", []*rocketmqv2.Message{withProps(map[string]string{"__SHARDINGKEY": "g"})}, rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{"empty property value", []*rocketmqv2.Message{withProps(map[string]string{"k": ""})}, rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{"property separator", []*rocketmqv2.Message{withProps(map[string]string{"k": "a\x02b"})}, rocketmqv2.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{"properties too large", []*rocketmqv2.Message{withProps(map[string]string{"big": strings.Repeat("p", storage.MaxPropertiesLength)})}, rocketmqv2.Code_MESSAGE_PROPERTIES_TOO_LARGE},
	} {
		r, err := e.rmq.SendMessage(ctxT(t), &rocketmqv2.SendMessageRequest{Messages: c.msgs}, grpc.MaxCallSendMsgSize(64<<20))
		if c.name == "properties too large" && status.Code(err) == codes.ResourceExhausted {
			t.Fatalf("%s: the request did not reach the service: %v", c.name, err)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		wantCode(t, c.name, r.GetStatus(), c.want)
		for i, en := range r.GetEntries() {
			wantCode(t, c.name+" entry", en.GetStatus(), c.want)
			if en.GetMessageId() != "" {
				t.Errorf("%s: entry %d names message %s", c.name, i, en.GetMessageId())
			}
		}
		if n := len(c.msgs); n > 0 && n <= DefaultMaxBatchMessages && len(r.GetEntries()) != n {
			t.Errorf("%s: %d entries for %d messages", c.name, len(r.GetEntries()), n)
		}
	}
	for q := range int32(2) {
		if _, err := e.v1.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "Orders", QueueId: q}); status.Code(err) != codes.NotFound {
			t.Errorf("queue %d after refused sends: %v (want NotFound: nothing stored)", q, err)
		}
	}
	if topics, _, _ := e.store.Topics("", 0); len(topics) != 1 {
		t.Errorf("refused sends created topics: %v", topics)
	}

	// A request beyond the gRPC receive limit never reaches the service.
	huge := rmqMsg("Orders", strings.Repeat("x", MaxRecvMsgSize(testMaxMessageSize)+1), nil)
	if _, err := e.rmq.SendMessage(ctxT(t), &rocketmqv2.SendMessageRequest{Messages: []*rocketmqv2.Message{huge}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized request: %v, want RESOURCE_EXHAUSTED", err)
	}

	// Auto-creation off: an unknown topic is TOPIC_NOT_FOUND.
	off := rmqServer(t, func(o *storage.Options) { o.NoAutoCreateTopics = true })
	r := off.send(t, rmqMsg("Unknown", "x", nil))
	wantCode(t, "unknown topic", r.GetStatus(), rocketmqv2.Code_TOPIC_NOT_FOUND)
}

// TestRocketMQStatusMapping: storaged's classification of put and offset
// failures (putError, offsetError) reaches RocketMQ clients as the API's
// codes, whose SDK exceptions mean the same thing.
func TestRocketMQStatusMapping(t *testing.T) {
	s := New(nil, zerolog.Nop(), WithReplication(func() ReplicaInfo { return ReplicaInfo{} }, func(uint64) string { return "10.0.0.1:1" }))
	ctx := context.Background()
	appended := storage.PutResult{Status: storage.FlushSlaveTimeout, Append: storage.AppendResult{Status: storage.AppendOK, WroteOffset: 7}}
	for _, c := range []struct {
		name string
		err  error
		want rocketmqv2.Code
	}{
		{"busy", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.OSPageCacheBusy}, storage.ErrBusy), rocketmqv2.Code_TOO_MANY_REQUESTS},
		{"disk full", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.ServiceNotAvailable}, storage.ErrDiskFull), rocketmqv2.Code_TOO_MANY_REQUESTS},
		{"not leader", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.ServiceNotAvailable},
			&storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 2}), rocketmqv2.Code_HA_NOT_AVAILABLE},
		{"in-sync replicas", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.InSyncReplicasNotEnough}, storage.ErrInSyncReplicasNotEnough), rocketmqv2.Code_HA_NOT_AVAILABLE},
		{"starting", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.ServiceNotAvailable}, ErrStarting), rocketmqv2.Code_INTERNAL_SERVER_ERROR},
		{"topic not found", s.putError(ctx, methodSendMessage, storage.PutResult{Status: storage.MessageIllegal}, storage.ErrTopicNotFound), rocketmqv2.Code_TOPIC_NOT_FOUND},
		{"replication timeout", s.putError(ctx, methodSendMessage, appended, storage.ErrReplicationTimeout), rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT},
		{"flush wait deadline", s.putError(ctx, methodSendMessage, appended, context.DeadlineExceeded), rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT},
		{"deadline before append", s.putError(ctx, methodSendMessage, storage.PutResult{}, context.DeadlineExceeded), rocketmqv2.Code_PROXY_TIMEOUT},
		{"corrupt", s.putError(ctx, methodSendMessage, storage.PutResult{}, storage.ErrCorrupt), rocketmqv2.Code_INTERNAL_SERVER_ERROR},
		{"unexpected", s.putError(ctx, methodSendMessage, storage.PutResult{}, errors.New("boom")), rocketmqv2.Code_INTERNAL_SERVER_ERROR},
		{"offset not found", s.offsetError(methodGetOffset, storage.ErrOffsetNotFound), rocketmqv2.Code_OFFSET_NOT_FOUND},
		{"offset out of range", s.offsetError(methodCommitOffset, &storage.RangeError{What: "committed offset", Offset: 9, Min: 0, Max: 3}), rocketmqv2.Code_ILLEGAL_OFFSET},
		{"commit on a follower", s.offsetError(methodCommitOffset, &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 1, Term: 2}),
			rocketmqv2.Code_HA_NOT_AVAILABLE},
		{"commit in-sync replicas", s.offsetError(methodCommitOffset, storage.ErrInSyncReplicasNotEnough), rocketmqv2.Code_HA_NOT_AVAILABLE},
		{"commit replication timeout", s.offsetError(methodCommitOffset,
			&storage.NotDurableError{Status: storage.FlushSlaveTimeout, Err: storage.ErrReplicationTimeout}), rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT},
	} {
		got := grpcToV2(c.err)
		if got.GetCode() != c.want || !strings.Contains(got.GetMessage(), status.Convert(c.err).Message()) {
			t.Errorf("%s: %v %q, want %v with the status message %q", c.name, got.GetCode(), got.GetMessage(), c.want, status.Convert(c.err).Message())
		}
	}
	for _, c := range []struct {
		ps   storage.PutStatus
		want rocketmqv2.Code
	}{
		{storage.PutOK, rocketmqv2.Code_OK},
		{storage.FlushDiskTimeout, rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT},
		{storage.FlushSlaveTimeout, rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT},
		{storage.SlaveNotAvailable, rocketmqv2.Code_HA_NOT_AVAILABLE},
	} {
		if got := putStatusToV2(c.ps); got.GetCode() != c.want {
			t.Errorf("%v: %v, want %v", c.ps, got.GetCode(), c.want)
		}
	}
}

// telemetry opens a Telemetry stream with (or without) a client id.
func (e *rmqEnv) telemetry(t *testing.T, clientID string) grpc.BidiStreamingClient[rocketmqv2.TelemetryCommand, rocketmqv2.TelemetryCommand] {
	t.Helper()
	ctx := ctxT(t)
	if clientID != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, clientIDHeader, clientID)
	}
	s, err := e.rmq.Telemetry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func settingsCmd(s *rocketmqv2.Settings) *rocketmqv2.TelemetryCommand {
	return &rocketmqv2.TelemetryCommand{Command: &rocketmqv2.TelemetryCommand_Settings{Settings: s}}
}

// TestRocketMQTelemetry: the server answers a producer's and a consumer's
// settings with what they must use, ignores the reports a client sends,
// refuses what it cannot take, and ends the stream when it drains.
func TestRocketMQTelemetry(t *testing.T) {
	e := rmqServer(t, nil)
	producer := rocketmqv2.ClientType_PRODUCER
	s := e.telemetry(t, "client-1")
	// A report storaged never asked for gets no answer: the next answer is
	// the settings'.
	if err := s.Send(&rocketmqv2.TelemetryCommand{Command: &rocketmqv2.TelemetryCommand_ThreadStackTrace{ThreadStackTrace: &rocketmqv2.ThreadStackTrace{Nonce: "n"}}}); err != nil {
		t.Fatal(err)
	}
	pub := &rocketmqv2.Settings{ClientType: &producer, AccessPoint: access(), RequestTimeout: durationpb.New(3 * time.Second),
		PubSub: &rocketmqv2.Settings_Publishing{Publishing: &rocketmqv2.Publishing{Topics: []*rocketmqv2.Resource{res("Orders")}}}}
	if err := s.Send(settingsCmd(pub)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "producer settings", got.GetStatus(), rocketmqv2.Code_OK)
	set := got.GetSettings()
	p := set.GetPublishing()
	bo := set.GetBackoffPolicy()
	if set.GetClientType() != producer || !proto.Equal(set.GetAccessPoint(), access()) || set.GetRequestTimeout().AsDuration() != 3*time.Second ||
		p.GetMaxBodySize() != testMaxMessageSize || !p.GetValidateMessageType() || len(p.GetTopics()) != 1 ||
		bo.GetMaxAttempts() != producerMaxAttempts || bo.GetExponentialBackoff().GetInitial().AsDuration() != backoffInitial ||
		bo.GetExponentialBackoff().GetMultiplier() != backoffMultiplier {
		t.Errorf("producer settings answered %v", set)
	}

	consumer := rocketmqv2.ClientType_SIMPLE_CONSUMER
	sub := &rocketmqv2.Settings{ClientType: &consumer, PubSub: &rocketmqv2.Settings_Subscription{Subscription: &rocketmqv2.Subscription{
		Group: res("G1"), Subscriptions: []*rocketmqv2.SubscriptionEntry{{Topic: res("Orders")}}}}}
	if err := s.Send(settingsCmd(sub)); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Recv(); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "consumer settings", got.GetStatus(), rocketmqv2.Code_OK)
	if c := got.GetSettings().GetSubscription(); c.GetGroup().GetName() != "G1" || c.GetFifo() || c.GetReceiveBatchSize() != receiveBatchSize ||
		got.GetSettings().GetBackoffPolicy().GetMaxAttempts() != consumerMaxAttempts {
		t.Errorf("consumer settings answered %v", got.GetSettings())
	}

	unknown := rocketmqv2.ClientType(42)
	lite := rocketmqv2.ClientType_LITE_PUSH_CONSUMER
	noGroup := &rocketmqv2.Settings{ClientType: &consumer, PubSub: &rocketmqv2.Settings_Subscription{Subscription: &rocketmqv2.Subscription{}}}
	for _, c := range []struct {
		name string
		cmd  *rocketmqv2.TelemetryCommand
		want rocketmqv2.Code
	}{
		{"unknown client type", settingsCmd(&rocketmqv2.Settings{ClientType: &unknown}), rocketmqv2.Code_UNRECOGNIZED_CLIENT_TYPE},
		{"no client type", settingsCmd(&rocketmqv2.Settings{}), rocketmqv2.Code_UNRECOGNIZED_CLIENT_TYPE},
		{"lite consumer", settingsCmd(&rocketmqv2.Settings{ClientType: &lite}), rocketmqv2.Code_UNSUPPORTED},
		{"consumer without group", settingsCmd(noGroup), rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"producer without publishing", settingsCmd(&rocketmqv2.Settings{ClientType: &producer}), rocketmqv2.Code_BAD_REQUEST},
		{"no command", &rocketmqv2.TelemetryCommand{}, rocketmqv2.Code_BAD_REQUEST},
		{"server command", &rocketmqv2.TelemetryCommand{Command: &rocketmqv2.TelemetryCommand_PrintThreadStackTraceCommand{}}, rocketmqv2.Code_BAD_REQUEST},
	} {
		if err := s.Send(c.cmd); err != nil {
			t.Fatal(err)
		}
		got, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.name, got.GetStatus(), c.want)
		if got.GetSettings() != nil {
			t.Errorf("%s: answered settings %v", c.name, got.GetSettings())
		}
	}

	// Without a client id: one CLIENT_ID_REQUIRED, then the end.
	anon := e.telemetry(t, "")
	if got, err := anon.Recv(); err != nil || got.GetStatus().GetCode() != rocketmqv2.Code_CLIENT_ID_REQUIRED {
		t.Errorf("no client id: %v %v", got, err)
	}
	if _, err := anon.Recv(); err != io.EOF {
		t.Errorf("no client id: the stream goes on: %v", err)
	}

	// The client ends the stream: it ends with OK.
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("after CloseSend: %v, want the stream's OK end", err)
	}

	// The server drains: an open stream ends with OK (the SDKs reconnect).
	open := e.telemetry(t, "client-2")
	if err := open.Send(settingsCmd(pub)); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Recv(); err != nil {
		t.Fatal(err)
	}
	e.srv.Shutdown(10 * time.Second)
	if _, err := open.Recv(); err != io.EOF {
		t.Errorf("after the server drained: %v, want the stream's OK end", err)
	}
}

// TestRocketMQHeartbeat: producers and consumers with a group are
// answered OK; a bad client type or group is refused.
func TestRocketMQHeartbeat(t *testing.T) {
	e := rmqServer(t, nil)
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		req  *rocketmqv2.HeartbeatRequest
		want rocketmqv2.Code
	}{
		{"producer", &rocketmqv2.HeartbeatRequest{ClientType: rocketmqv2.ClientType_PRODUCER}, rocketmqv2.Code_OK},
		{"consumer", &rocketmqv2.HeartbeatRequest{ClientType: rocketmqv2.ClientType_PUSH_CONSUMER, Group: res("G")}, rocketmqv2.Code_OK},
		{"consumer without group", &rocketmqv2.HeartbeatRequest{ClientType: rocketmqv2.ClientType_SIMPLE_CONSUMER}, rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"bad group", &rocketmqv2.HeartbeatRequest{ClientType: rocketmqv2.ClientType_PULL_CONSUMER, Group: res("a b")}, rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"no type", &rocketmqv2.HeartbeatRequest{}, rocketmqv2.Code_UNRECOGNIZED_CLIENT_TYPE},
	} {
		r, err := e.rmq.Heartbeat(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.name, r.GetStatus(), c.want)
	}
	r, err := e.rmq.NotifyClientTermination(ctx, &rocketmqv2.NotifyClientTerminationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "termination", r.GetStatus(), rocketmqv2.Code_OK)
}

// TestRocketMQUnsupported: every call storaged does not serve answers
// UNSUPPORTED in the protocol's status (not a gRPC UNIMPLEMENTED), saying
// why.
func TestRocketMQUnsupported(t *testing.T) {
	e := rmqServer(t, nil)
	ctx := ctxT(t)
	calls := map[string]func() (*rocketmqv2.Status, error){
		"SyncLiteSubscription": func() (*rocketmqv2.Status, error) {
			r, err := e.rmq.SyncLiteSubscription(ctx, &rocketmqv2.SyncLiteSubscriptionRequest{})
			return r.GetStatus(), err
		},
	}
	for name, call := range calls {
		st, err := call()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.GetCode() != rocketmqv2.Code_UNSUPPORTED || !strings.Contains(st.GetMessage(), "storaged") {
			t.Errorf("%s: %v %q, want UNSUPPORTED saying why", name, st.GetCode(), st.GetMessage())
		}
	}
}

// TestRocketMQOffsets: UpdateOffset, GetOffset and QueryOffset on the
// consumer-group offsets and queue bounds, and their refusals.
func TestRocketMQOffsets(t *testing.T) {
	e := rmqServer(t, nil)
	ctx := ctxT(t)
	if _, err := e.store.CreateTopic("Orders", 2); err != nil {
		t.Fatal(err)
	}
	mq := func(q int32) *rocketmqv2.MessageQueue { return &rocketmqv2.MessageQueue{Topic: res("Orders"), Id: q} }
	var times []time.Time
	for range 3 {
		r := e.send(t, rmqMsg("Orders", "x", &rocketmqv2.SystemProperties{MessageGroup: proto.String("one-queue")}))
		wantCode(t, "send", r.GetStatus(), rocketmqv2.Code_OK)
		times = append(times, e.stored(t, r.GetEntries()[0]).GetStoreTimestamp().AsTime())
	}
	full := e.stored(t, e.send(t, rmqMsg("Orders", "x", &rocketmqv2.SystemProperties{MessageGroup: proto.String("one-queue")})).GetEntries()[0]).GetQueueId()
	empty := 1 - full

	get, err := e.rmq.GetOffset(ctx, &rocketmqv2.GetOffsetRequest{Group: res("G"), MessageQueue: mq(full)})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "never committed", get.GetStatus(), rocketmqv2.Code_OFFSET_NOT_FOUND)
	upd, err := e.rmq.UpdateOffset(ctx, &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: mq(full), Offset: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "update", upd.GetStatus(), rocketmqv2.Code_OK)
	if get, err = e.rmq.GetOffset(ctx, &rocketmqv2.GetOffsetRequest{Group: res("G"), MessageQueue: mq(full)}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "get", get.GetStatus(), rocketmqv2.Code_OK)
	if get.GetOffset() != 2 {
		t.Errorf("GetOffset after UpdateOffset(2): %d", get.GetOffset())
	}
	if v1, err := e.v1.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "G", Topic: "Orders", QueueId: full}); err != nil || v1.GetOffset() != 2 {
		t.Errorf("storaged.v1 GetOffset of the same commit: %v %v", v1, err)
	}

	for _, c := range []struct {
		name string
		req  *rocketmqv2.UpdateOffsetRequest
		want rocketmqv2.Code
	}{
		{"past the end", &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: mq(full), Offset: 99}, rocketmqv2.Code_ILLEGAL_OFFSET},
		{"negative", &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: mq(full), Offset: -1}, rocketmqv2.Code_ILLEGAL_OFFSET},
		{"no group", &rocketmqv2.UpdateOffsetRequest{MessageQueue: mq(full)}, rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"bad group", &rocketmqv2.UpdateOffsetRequest{Group: res("a/b"), MessageQueue: mq(full)}, rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"no queue", &rocketmqv2.UpdateOffsetRequest{Group: res("G")}, rocketmqv2.Code_BAD_REQUEST},
		{"offsets topic", &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: &rocketmqv2.MessageQueue{Topic: res(storage.OffsetTopic)}}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"negative queue", &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: mq(-1)}, rocketmqv2.Code_BAD_REQUEST},
	} {
		r, err := e.rmq.UpdateOffset(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.name, r.GetStatus(), c.want)
	}

	ts := func(tm time.Time) *timestamppb.Timestamp { return timestamppb.New(tm) }
	for _, c := range []struct {
		name string
		req  *rocketmqv2.QueryOffsetRequest
		want rocketmqv2.Code
		off  int64
	}{
		{"beginning", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_BEGINNING}, rocketmqv2.Code_OK, 0},
		{"end", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_END}, rocketmqv2.Code_OK, 4},
		{"before the first", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_TIMESTAMP,
			Timestamp: ts(times[0].Add(-time.Hour))}, rocketmqv2.Code_OK, 0},
		{"after the last", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_TIMESTAMP,
			Timestamp: ts(time.Now().Add(time.Hour))}, rocketmqv2.Code_OK, 4},
		{"empty queue end", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(empty), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_END}, rocketmqv2.Code_OK, 0},
		{"empty queue time", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(empty), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_TIMESTAMP,
			Timestamp: ts(time.Now())}, rocketmqv2.Code_OK, 0},
		{"queue beyond the route", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(2), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_END}, rocketmqv2.Code_NOT_FOUND, 0},
		{"no timestamp", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_TIMESTAMP}, rocketmqv2.Code_BAD_REQUEST, 0},
		{"bad timestamp", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: rocketmqv2.QueryOffsetPolicy_TIMESTAMP,
			Timestamp: &timestamppb.Timestamp{Nanos: -1}}, rocketmqv2.Code_BAD_REQUEST, 0},
		{"unknown policy", &rocketmqv2.QueryOffsetRequest{MessageQueue: mq(full), QueryOffsetPolicy: 7}, rocketmqv2.Code_BAD_REQUEST, 0},
	} {
		r, err := e.rmq.QueryOffset(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, c.name, r.GetStatus(), c.want)
		if r.GetOffset() != c.off {
			t.Errorf("%s: offset %d, want %d", c.name, r.GetOffset(), c.off)
		}
	}
}

// FuzzRocketMQSend: whatever bytes arrive as a SendMessageRequest, the
// send validation never panics, and what it accepts is a message the
// store takes as is: one topic the store's rules allow clients to write,
// bodies within the limit, properties with no empty part, no separator
// byte, no store-owned or reserved name beyond the ones it sets itself,
// and at most one message group of bounded length.
func FuzzRocketMQSend(f *testing.F) {
	seed := &rocketmqv2.SendMessageRequest{Messages: []*rocketmqv2.Message{
		rmqMsg("Orders", "hello", &rocketmqv2.SystemProperties{Tag: proto.String("T"), Keys: []string{"k"}, MessageId: "01",
			MessageGroup: proto.String("g"), MessageType: rocketmqv2.MessageType_FIFO, BornTimestamp: timestamppb.New(time.UnixMilli(5))}),
		rmqMsg("Orders", "two", &rocketmqv2.SystemProperties{MessageGroup: proto.String("g")}),
	}}
	seed.Messages[0].UserProperties = map[string]string{"a": "b"}
	b, err := proto.Marshal(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{})
	r := &rocketMQ{svc: New(nil, zerolog.Nop(), WithMaxMessageSize(testMaxMessageSize))}
	set := map[string]bool{storage.PropertyTags: true, storage.PropertyKeys: true, storage.PropertyUniqKey: true, propertyShardingKey: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rocketmqv2.SendMessageRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		topic, group, plan, st := r.checkSend(req.GetMessages())
		if st != nil {
			if st.GetCode() == rocketmqv2.Code_OK || st.GetMessage() == "" {
				t.Fatalf("refusal without a code or a reason: %v", st)
			}
			return
		}
		if storage.SendTopicProblem(topic) != "" || storage.HiddenTopic(topic) || len(plan) != len(req.GetMessages()) {
			t.Fatalf("accepted topic %q with %d of %d messages", topic, len(plan), len(req.GetMessages()))
		}
		if len(group) > MaxMessageGroupLength {
			t.Fatalf("accepted a group of %d bytes", len(group))
		}
		total := 0
		for _, p := range plan {
			total += len(p.body)
			if len(p.body) == 0 {
				t.Fatal("accepted an empty body")
			}
			for _, pr := range p.props {
				if record.CheckProperty(pr.Key, pr.Value) != record.PropertyOK {
					t.Fatalf("accepted property %q=%q", pr.Key, pr.Value)
				}
				if reservedProperty(pr.Key) && !set[pr.Key] {
					t.Fatalf("accepted reserved property %q", pr.Key)
				}
			}
		}
		if total > testMaxMessageSize {
			t.Fatalf("accepted %d body bytes", total)
		}
	})
}

// pull runs one PullMessage and returns its status, messages and next
// offset, checking the stream's shape: a status first, the messages, then
// the next offset, then the end.
func (e *rmqEnv) pull(t *testing.T, req *rocketmqv2.PullMessageRequest) (*rocketmqv2.Status, []*rocketmqv2.Message, int64, bool) {
	t.Helper()
	s, err := e.rmq.PullMessage(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	var (
		st      *rocketmqv2.Status
		msgs    []*rocketmqv2.Message
		next    int64
		hasNext bool
	)
	for i := 0; ; i++ {
		r, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch c := r.GetContent().(type) {
		case *rocketmqv2.PullMessageResponse_Status:
			if i != 0 {
				t.Fatalf("status at position %d", i)
			}
			st = c.Status
		case *rocketmqv2.PullMessageResponse_Message:
			if st == nil || hasNext {
				t.Fatalf("message at position %d, before the status or after the next offset", i)
			}
			msgs = append(msgs, c.Message)
		case *rocketmqv2.PullMessageResponse_NextOffset:
			if st == nil || hasNext {
				t.Fatalf("next offset at position %d", i)
			}
			next, hasNext = c.NextOffset, true
		}
	}
	if st == nil {
		t.Fatal("no status")
	}
	return st, msgs, next, hasNext
}

// TestRocketMQPullMessage: a pull consumer reads what was sent (through
// either protocol) with its tags, keys, group, properties and a body
// digest both SDKs accept; filters by tag; long-polls; and is told where
// to go on when its offset is outside the queue.
func TestRocketMQPullMessage(t *testing.T) {
	e := rmqServer(t, nil)
	if _, err := e.store.CreateTopic("Orders", 2); err != nil {
		t.Fatal(err)
	}
	grp := &rocketmqv2.SystemProperties{MessageGroup: proto.String("g")}
	var q int32
	for i, tag := range []string{"A", "B", "A"} {
		sp := proto.Clone(grp).(*rocketmqv2.SystemProperties)
		sp.Tag, sp.Keys = proto.String(tag), []string{"k" + tag, "x"}
		m := rmqMsg("Orders", "body-"+string(rune('0'+i)), sp)
		m.UserProperties = map[string]string{"n": string(rune('0' + i))}
		r := e.send(t, m)
		wantCode(t, "send", r.GetStatus(), rocketmqv2.Code_OK)
		q = e.stored(t, r.GetEntries()[0]).GetQueueId()
	}
	mq := func(id int32) *rocketmqv2.MessageQueue { return &rocketmqv2.MessageQueue{Topic: res("Orders"), Id: id} }

	st, msgs, next, ok := e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), BatchSize: 10})
	wantCode(t, "pull", st, rocketmqv2.Code_OK)
	if len(msgs) != 3 || !ok || next != 3 {
		t.Fatalf("pull: %d messages, next %d (%v)", len(msgs), next, ok)
	}
	for i, m := range msgs {
		sp := m.GetSystemProperties()
		tag := []string{"A", "B", "A"}[i]
		sum := md5.Sum(m.GetBody())
		v1, err := e.v1.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: sp.GetMessageId()}})
		if err != nil {
			t.Fatal(err)
		}
		if string(m.GetBody()) != "body-"+string(rune('0'+i)) || m.GetTopic().GetName() != "Orders" || sp.GetTag() != tag ||
			strings.Join(sp.GetKeys(), ",") != "k"+tag+",x" || sp.GetMessageGroup() != "g" || sp.GetMessageType() != rocketmqv2.MessageType_FIFO ||
			sp.GetQueueId() != q || sp.GetQueueOffset() != int64(i) || sp.GetDeliveryAttempt() != 1 ||
			sp.GetBodyDigest().GetType() != rocketmqv2.DigestType_MD5 || sp.GetBodyDigest().GetChecksum() != strings.ToUpper(hex.EncodeToString(sum[:])) ||
			len(m.GetUserProperties()) != 1 || m.GetUserProperties()["n"] != string(rune('0'+i)) ||
			string(v1.GetMessage().GetBody()) != string(m.GetBody()) {
			t.Errorf("message %d: %v", i, m)
		}
	}

	// A tag filter: only the A messages; the next offset past the scan.
	st, msgs, next, _ = e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q),
		FilterExpression: &rocketmqv2.FilterExpression{Type: rocketmqv2.FilterType_TAG, Expression: " A || C "}})
	wantCode(t, "filtered", st, rocketmqv2.Code_OK)
	if len(msgs) != 2 || msgs[0].GetSystemProperties().GetTag() != "A" || msgs[1].GetSystemProperties().GetTag() != "A" || next != 3 {
		t.Errorf("filter A || C: %d messages, next %d", len(msgs), next)
	}
	// From the end: nothing new.
	st, msgs, next, _ = e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), Offset: 3})
	wantCode(t, "at the end", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
	if len(msgs) != 0 || next != 3 {
		t.Errorf("at the end: %d messages, next %d", len(msgs), next)
	}
	// Past the end: ILLEGAL_OFFSET, go on from the end.
	st, _, next, ok = e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), Offset: 9})
	wantCode(t, "past the end", st, rocketmqv2.Code_ILLEGAL_OFFSET)
	if !ok || next != 3 {
		t.Errorf("past the end: next %d (%v), want 3", next, ok)
	}
	// The other queue never received a message: empty, from 0.
	st, _, next, ok = e.pull(t, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(1 - q)})
	wantCode(t, "empty queue", st, rocketmqv2.Code_MESSAGE_NOT_FOUND)
	if !ok || next != 0 {
		t.Errorf("empty queue: next %d (%v)", next, ok)
	}

	// A long poll answers with the message sent meanwhile.
	got := make(chan []*rocketmqv2.Message, 1)
	pctx := ctxT(t)
	go func() {
		s, err := e.rmq.PullMessage(pctx, &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), Offset: 3,
			LongPollingTimeout: durationpb.New(8 * time.Second)})
		var msgs []*rocketmqv2.Message
		for err == nil {
			var r *rocketmqv2.PullMessageResponse
			if r, err = s.Recv(); err == nil && r.GetMessage() != nil {
				msgs = append(msgs, r.GetMessage())
			}
		}
		got <- msgs
	}()
	// Whether the poll is already waiting when the message arrives or not,
	// it answers with the message (its first read finds it otherwise).
	wantCode(t, "send while polling", e.send(t, rmqMsg("Orders", "late", grp)).GetStatus(), rocketmqv2.Code_OK)
	if msgs := <-got; len(msgs) != 1 || string(msgs[0].GetBody()) != "late" {
		t.Errorf("long poll got %v", msgs)
	}

	for _, c := range []struct {
		name string
		req  *rocketmqv2.PullMessageRequest
		want rocketmqv2.Code
	}{
		{"no group", &rocketmqv2.PullMessageRequest{MessageQueue: mq(q)}, rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP},
		{"no queue", &rocketmqv2.PullMessageRequest{Group: res("G")}, rocketmqv2.Code_BAD_REQUEST},
		{"offsets topic", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: &rocketmqv2.MessageQueue{Topic: res(storage.OffsetTopic)}}, rocketmqv2.Code_ILLEGAL_TOPIC},
		{"negative offset", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), Offset: -1}, rocketmqv2.Code_ILLEGAL_OFFSET},
		{"negative batch", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), BatchSize: -1}, rocketmqv2.Code_BAD_REQUEST},
		{"SQL filter", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q),
			FilterExpression: &rocketmqv2.FilterExpression{Type: rocketmqv2.FilterType_SQL, Expression: "a > 1"}}, rocketmqv2.Code_UNSUPPORTED},
		{"empty tag", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q),
			FilterExpression: &rocketmqv2.FilterExpression{Type: rocketmqv2.FilterType_TAG, Expression: "A || "}}, rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION},
		{"too many tags", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q),
			FilterExpression: &rocketmqv2.FilterExpression{Expression: strings.Repeat("t||", MaxPullTags) + "t"}}, rocketmqv2.Code_ILLEGAL_FILTER_EXPRESSION},
		{"negative poll", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(q), LongPollingTimeout: durationpb.New(-time.Second)}, rocketmqv2.Code_ILLEGAL_POLLING_TIME},
		{"queue beyond the route", &rocketmqv2.PullMessageRequest{Group: res("G"), MessageQueue: mq(5)}, rocketmqv2.Code_NOT_FOUND},
	} {
		st, msgs, _, _ := e.pull(t, c.req)
		wantCode(t, c.name, st, c.want)
		if len(msgs) != 0 {
			t.Errorf("%s: %d messages", c.name, len(msgs))
		}
	}
}

// TestRocketMQCallLog: a RocketMQ call answered with a failure status
// (gRPC OK) is logged as the failure it is: info for a refused request,
// warn for a server failure, with the protocol's code and message; a
// served call stays at debug level.
func TestRocketMQCallLog(t *testing.T) {
	var logs syncBuffer
	st, _ := openStore(t, nil)
	var deferred DeferredStore // never set: the store is "starting"
	cfg := GRPCConfig{Logger: zerolog.New(&logs).Level(zerolog.InfoLevel)}
	ok := rocketmqv2.NewMessagingServiceClient(dial(t, startServer(t, New(st, zerolog.Nop()), cfg).addr, nil))
	starting := rocketmqv2.NewMessagingServiceClient(dial(t, startServer(t, New(&deferred, zerolog.Nop()), cfg).addr, nil))
	ctx := ctxT(t)
	send := func(c rocketmqv2.MessagingServiceClient, m *rocketmqv2.Message) {
		if _, err := c.SendMessage(ctx, &rocketmqv2.SendMessageRequest{Messages: []*rocketmqv2.Message{m}}); err != nil {
			t.Fatal(err)
		}
	}
	send(ok, rmqMsg("Orders", "fine", nil))
	send(ok, rmqMsg("Orders", "x", &rocketmqv2.SystemProperties{Tag: proto.String("a|b")}))
	send(starting, rmqMsg("Orders", "x", nil))
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["grpc.method"] == "SendMessage" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("SendMessage lines at info and above: %v, want the two failures", lines)
	}
	for i, want := range []struct{ level, code string }{{"info", "ILLEGAL_MESSAGE_TAG"}, {"warn", "INTERNAL_SERVER_ERROR"}} {
		if lines[i]["level"] != want.level || lines[i]["rocketmq.code"] != want.code || lines[i]["grpc.code"] != "OK" || lines[i]["rocketmq.message"] == "" {
			t.Errorf("line %d: %v, want level %s rocketmq.code %s", i, lines[i], want.level, want.code)
		}
	}
}

// FuzzRocketMQTagFilter: a filter expression never panics the parser, and
// what it accepts is what the pull's tag filter takes: at most MaxPullTags
// tags, each non-empty, trimmed, without the "||" separator, or no filter.
func FuzzRocketMQTagFilter(f *testing.F) {
	for _, s := range []string{"", "*", "A", " A || B ", "A||", "||", "a|b", strings.Repeat("t||", 70)} {
		f.Add(int32(rocketmqv2.FilterType_TAG), s)
	}
	f.Add(int32(rocketmqv2.FilterType_SQL), "a > 1")
	f.Fuzz(func(t *testing.T, typ int32, expr string) {
		tags, st := tagFilter(&rocketmqv2.FilterExpression{Type: rocketmqv2.FilterType(typ), Expression: expr})
		if st != nil {
			if tags != nil || st.GetCode() == rocketmqv2.Code_OK || st.GetMessage() == "" {
				t.Fatalf("refusal %v with tags %q", st, tags)
			}
			return
		}
		if len(tags) > MaxPullTags {
			t.Fatalf("%d tags accepted", len(tags))
		}
		for _, tag := range tags {
			if tag == "" || tag == "*" || strings.Contains(tag, "||") || strings.TrimSpace(tag) != tag {
				t.Fatalf("tag %q accepted from %q", tag, expr)
			}
		}
		if tags == nil && strings.TrimSpace(expr) != "" && strings.TrimSpace(expr) != "*" {
			t.Fatalf("no filter from %q", expr)
		}
	})
}

// TestRocketMQTelemetryEndsBeforeConnectionAge: on a test clock, a
// Telemetry stream answers settings until its soft end and then ends with
// OK, before the connection's age limit would cut it with an error.
func TestRocketMQTelemetryEndsBeforeConnectionAge(t *testing.T) {
	born := time.Now()
	clock := storagetest.NewClock(born)
	st, _ := openStore(t, nil)
	const age, grace = time.Hour, 40 * time.Second // grpc-go's real age limit never comes
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{Clock: clock, MaxConnectionAge: age, MaxConnectionAgeGrace: grace})
	e := &rmqEnv{rmq: rocketmqv2.NewMessagingServiceClient(dial(t, srv.addr, nil))}
	s := e.telemetry(t, "client-1")
	producer := rocketmqv2.ClientType_PRODUCER
	settings := settingsCmd(&rocketmqv2.Settings{ClientType: &producer,
		PubSub: &rocketmqv2.Settings_Publishing{Publishing: &rocketmqv2.Publishing{}}})
	if err := s.Send(settings); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Recv(); err != nil || got.GetSettings() == nil {
		t.Fatalf("before the soft end: %v %v", got, err)
	}
	clock.WaitPending(t, 1) // the stream waits for its soft end
	clock.Set(born.Add(age - age/10 + grace/2))
	if got, err := s.Recv(); err != io.EOF {
		t.Fatalf("at the soft end: %v %v, want the stream's OK end", got, err)
	}
}

// TestDeleteTopicClearsConsumerStateEndToEnd: over gRPC, a topic deleted
// through the admin service and re-created loses the consumer state of
// its first life (storage/topicclear.go): the RocketMQ 5 GetOffset and
// storaged.v1 GetOffset answer no committed offset, a POP receive of the
// group that had messages in flight gets the new messages from queue
// offset 0, and a receipt handle of the old topic is refused.
func TestDeleteTopicClearsConsumerStateEndToEnd(t *testing.T) {
	e := rmqServer(t, nil)
	admin := startAdmin(t, e.store)
	ctx := ctxT(t)
	if _, err := admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: "Orders", QueueCount: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		wantCode(t, "send", e.send(t, rmqMsg("Orders", fmt.Sprint("old-", i), nil)).GetStatus(), rocketmqv2.Code_OK)
	}
	mq := &rocketmqv2.MessageQueue{Topic: res("Orders"), Id: 0}
	upd, err := e.rmq.UpdateOffset(ctx, &rocketmqv2.UpdateOffsetRequest{Group: res("G"), MessageQueue: mq, Offset: 5})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "update", upd.GetStatus(), rocketmqv2.Code_OK)
	st, old := e.receive(t, receiveReq("P", "Orders", 3, time.Hour))
	wantCode(t, "receive the old topic", st, rocketmqv2.Code_OK)
	if len(old) != 3 {
		t.Fatalf("received %d of the old topic", len(old))
	}

	if _, err := admin.DeleteTopic(ctx, &storagedv1.DeleteTopicRequest{Name: "Orders"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: "Orders", QueueCount: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		wantCode(t, "send", e.send(t, rmqMsg("Orders", fmt.Sprint("new-", i), nil)).GetStatus(), rocketmqv2.Code_OK)
	}
	get, err := e.rmq.GetOffset(ctx, &rocketmqv2.GetOffsetRequest{Group: res("G"), MessageQueue: mq})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "GetOffset of the re-created topic", get.GetStatus(), rocketmqv2.Code_OFFSET_NOT_FOUND)
	_, err = e.v1.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "G", Topic: "Orders", QueueId: 0})
	details(t, err).want(t, codes.NotFound, ReasonQueryNotFound, false)

	st, fresh := e.receive(t, receiveReq("P", "Orders", 32, time.Hour))
	wantCode(t, "receive the re-created topic", st, rocketmqv2.Code_OK)
	if got := msgBodies(fresh); strings.Join(got, ",") != "new-0,new-1" {
		t.Fatalf("P receives %v from the re-created topic, want new-0,new-1", got)
	}
	wantCode(t, "ack with a handle of the deleted topic", e.ack(t, "P", "Orders", old[2]).GetStatus(), rocketmqv2.Code_INVALID_RECEIPT_HANDLE)
	wantCode(t, "ack the new messages", e.ack(t, "P", "Orders", fresh...).GetStatus(), rocketmqv2.Code_OK)
}
