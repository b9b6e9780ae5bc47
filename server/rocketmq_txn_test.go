package server

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/storagetest"
)

// topicBodies is every body stored on topic's queues (read from the store).
func topicBodies(t *testing.T, st *storage.Store, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for q := int32(0); q < 8; q++ {
		res, err := st.PullMessages(context.Background(), storage.PullRequest{Topic: topic, QueueID: q, MaxMessages: 100})
		if err != nil {
			continue // a queue never written
		}
		for _, r := range res.Messages {
			out[string(r.Body)]++
		}
	}
	return out
}

func txnMsg(topic, body string) *rocketmqv2.Message {
	return rmqMsg(topic, body, &rocketmqv2.SystemProperties{MessageType: rocketmqv2.MessageType_TRANSACTION, Tag: strPtr("tx")})
}

func strPtr(s string) *string { return &s }

func (e *rmqEnv) end(t *testing.T, topic, id string, how rocketmqv2.TransactionResolution) *rocketmqv2.Status {
	t.Helper()
	r, err := e.rmq.EndTransaction(ctxT(t), &rocketmqv2.EndTransactionRequest{Topic: res(topic), MessageId: id, TransactionId: id,
		Resolution: how, Source: rocketmqv2.TransactionSource_SOURCE_CLIENT})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetStatus()
}

// TestRocketMQTransactions: a TRANSACTION send stores a half message
// (answered with a transaction id, invisible on its topic); COMMIT
// delivers it once however often it is repeated, ROLLBACK never; the
// other resolution after an end, unknown and malformed ids, another topic
// or message id get INVALID_TRANSACTION_ID, a missing resolution
// BAD_REQUEST.
func TestRocketMQTransactions(t *testing.T) {
	e := rmqServer(t, nil)
	send := func(body string) string {
		t.Helper()
		r := e.send(t, txnMsg("Orders", body))
		wantCode(t, "send "+body, r.GetStatus(), rocketmqv2.Code_OK)
		en := r.GetEntries()[0]
		if en.GetTransactionId() == "" || en.GetTransactionId() != en.GetMessageId() {
			t.Fatalf("send %s: entry %v", body, en)
		}
		return en.GetTransactionId()
	}
	a, b := send("a"), send("b")
	if got := topicBodies(t, e.store, "Orders"); len(got) != 0 {
		t.Fatalf("half messages visible: %v", got)
	}
	wantCode(t, "commit", e.end(t, "Orders", a, rocketmqv2.TransactionResolution_COMMIT), rocketmqv2.Code_OK)
	wantCode(t, "commit again", e.end(t, "Orders", a, rocketmqv2.TransactionResolution_COMMIT), rocketmqv2.Code_OK)
	wantCode(t, "rollback after commit", e.end(t, "Orders", a, rocketmqv2.TransactionResolution_ROLLBACK), rocketmqv2.Code_INVALID_TRANSACTION_ID)
	wantCode(t, "rollback", e.end(t, "Orders", b, rocketmqv2.TransactionResolution_ROLLBACK), rocketmqv2.Code_OK)
	wantCode(t, "commit after rollback", e.end(t, "Orders", b, rocketmqv2.TransactionResolution_COMMIT), rocketmqv2.Code_INVALID_TRANSACTION_ID)
	if got := topicBodies(t, e.store, "Orders"); len(got) != 1 || got["a"] != 1 {
		t.Fatalf("Orders holds %v, want a once", got)
	}
	c := send("c")
	unknown := storage.MsgID(testStoreHost, 1<<40)
	for _, x := range []struct {
		name string
		req  *rocketmqv2.EndTransactionRequest
		want rocketmqv2.Code
	}{
		{"malformed id", &rocketmqv2.EndTransactionRequest{Topic: res("Orders"), TransactionId: "zz", Resolution: rocketmqv2.TransactionResolution_COMMIT}, rocketmqv2.Code_INVALID_TRANSACTION_ID},
		{"unknown id", &rocketmqv2.EndTransactionRequest{Topic: res("Orders"), TransactionId: unknown, Resolution: rocketmqv2.TransactionResolution_COMMIT}, rocketmqv2.Code_INVALID_TRANSACTION_ID},
		{"another topic", &rocketmqv2.EndTransactionRequest{Topic: res("Other"), TransactionId: c, Resolution: rocketmqv2.TransactionResolution_COMMIT}, rocketmqv2.Code_INVALID_TRANSACTION_ID},
		{"another message", &rocketmqv2.EndTransactionRequest{Topic: res("Orders"), TransactionId: c, MessageId: a, Resolution: rocketmqv2.TransactionResolution_COMMIT}, rocketmqv2.Code_INVALID_TRANSACTION_ID},
		{"no resolution", &rocketmqv2.EndTransactionRequest{Topic: res("Orders"), TransactionId: c}, rocketmqv2.Code_BAD_REQUEST},
		{"system topic", &rocketmqv2.EndTransactionRequest{Topic: res(storage.TransHalfTopic), TransactionId: c, Resolution: rocketmqv2.TransactionResolution_COMMIT}, rocketmqv2.Code_ILLEGAL_TOPIC},
	} {
		r, err := e.rmq.EndTransaction(ctxT(t), x.req)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, x.name, r.GetStatus(), x.want)
	}
	if n := e.store.PendingTransactions(); n != 1 {
		t.Fatalf("pending %d after refused ends, want 1 (c)", n)
	}
}

// TestRocketMQTransactionsFull: beyond the store's pending bound a
// TRANSACTION send is TOO_MANY_REQUESTS (the SDKs back off), nothing
// stored.
func TestRocketMQTransactionsFull(t *testing.T) {
	e := rmqServer(t, func(o *storage.Options) { o.MaxPendingTransactions = 1 })
	wantCode(t, "first", e.send(t, txnMsg("Orders", "a")).GetStatus(), rocketmqv2.Code_OK)
	wantCode(t, "second", e.send(t, txnMsg("Orders", "b")).GetStatus(), rocketmqv2.Code_TOO_MANY_REQUESTS)
	if n := e.store.PendingTransactions(); n != 1 {
		t.Fatalf("pending %d", n)
	}
}

// TestRocketMQTransactionCheck: a half older than its immunity is sent as
// a RecoverOrphanedTransactionCommand on the Telemetry stream of the
// producer whose settings name its topic (not to a producer of another
// topic), with its body, tag, topic and transaction id; one with a longer
// orphaned_transaction_recovery_duration is not sent yet; the producer's
// EndTransaction (SERVER_CHECK) commits it. Only the store's fake clock
// moves.
func TestRocketMQTransactionCheck(t *testing.T) {
	clk := storagetest.NewClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	e := rmqServer(t, func(o *storage.Options) { o.Clock = clk })
	producer := rocketmqv2.ClientType_PRODUCER
	settings := func(topic string) *rocketmqv2.TelemetryCommand {
		return settingsCmd(&rocketmqv2.Settings{ClientType: &producer, AccessPoint: access(),
			PubSub: &rocketmqv2.Settings_Publishing{Publishing: &rocketmqv2.Publishing{Topics: []*rocketmqv2.Resource{res(topic)}}}})
	}
	other := e.telemetry(t, "other")
	if err := other.Send(settings("Elsewhere")); err != nil {
		t.Fatal(err)
	}
	s := e.telemetry(t, "producer-1")
	if err := s.Send(settings("Orders")); err != nil {
		t.Fatal(err)
	}
	for _, st := range []interface {
		Recv() (*rocketmqv2.TelemetryCommand, error)
	}{other, s} {
		if got, err := st.Recv(); err != nil || got.GetSettings() == nil {
			t.Fatalf("settings answer: %v %v", got, err)
		}
	}
	r := e.send(t, txnMsg("Orders", "orphan"))
	wantCode(t, "send", r.GetStatus(), rocketmqv2.Code_OK)
	id := r.GetEntries()[0].GetTransactionId()
	late := txnMsg("Orders", "late")
	late.SystemProperties.OrphanedTransactionRecoveryDuration = durationpb.New(time.Minute)
	wantCode(t, "send late", e.send(t, late).GetStatus(), rocketmqv2.Code_OK)
	clk.Advance(storage.DefaultTransactionTimeout)
	got, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	cmd := got.GetRecoverOrphanedTransactionCommand()
	m := cmd.GetMessage()
	if cmd == nil || cmd.GetTransactionId() != id || m.GetTopic().GetName() != "Orders" || string(m.GetBody()) != "orphan" ||
		m.GetSystemProperties().GetTag() != "tx" || m.GetSystemProperties().GetMessageId() != id ||
		m.GetSystemProperties().GetMessageType() != rocketmqv2.MessageType_TRANSACTION || m.GetSystemProperties().GetBodyDigest() == nil {
		t.Fatalf("check command %v", got)
	}
	rr, err := e.rmq.EndTransaction(ctxT(t), &rocketmqv2.EndTransactionRequest{Topic: res("Orders"), MessageId: id, TransactionId: id,
		Resolution: rocketmqv2.TransactionResolution_COMMIT, Source: rocketmqv2.TransactionSource_SOURCE_SERVER_CHECK})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "checked commit", rr.GetStatus(), rocketmqv2.Code_OK)
	if got := topicBodies(t, e.store, "Orders"); len(got) != 1 || got["orphan"] != 1 {
		t.Fatalf("Orders holds %v", got)
	}
	if n := e.store.PendingTransactions(); n != 1 {
		t.Fatalf("pending %d, want 1 (late)", n)
	}
	// The other producer got nothing: its next answer is to its next
	// settings.
	if err := other.Send(settings("Elsewhere")); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Recv(); err != nil || got.GetSettings() == nil {
		t.Fatalf("the other producer got %v %v", got, err)
	}
}

// TestTransactionMetrics: the transaction gauge and counters on /metrics
// follow a send, a commit and a rollback.
func TestTransactionMetrics(t *testing.T) {
	e := rmqServer(t, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(e.store))
	base := serveMetrics(t, reg)
	a := e.send(t, txnMsg("Orders", "a")).GetEntries()[0].GetTransactionId()
	b := e.send(t, txnMsg("Orders", "b")).GetEntries()[0].GetTransactionId()
	e.send(t, txnMsg("Orders", "c"))
	wantCode(t, "commit", e.end(t, "Orders", a, rocketmqv2.TransactionResolution_COMMIT), rocketmqv2.Code_OK)
	wantCode(t, "rollback", e.end(t, "Orders", b, rocketmqv2.TransactionResolution_ROLLBACK), rocketmqv2.Code_OK)
	mfs := scrape(t, base)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"storaged_transaction_pending_messages", nil, 1},
		{"storaged_transaction_ended_total", []string{"resolution", "commit"}, 1},
		{"storaged_transaction_ended_total", []string{"resolution", "rollback"}, 1},
		{"storaged_transaction_ended_total", []string{"resolution", "discard"}, 0},
		{"storaged_transaction_checks_total", nil, 0},
	} {
		if got := value(mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
