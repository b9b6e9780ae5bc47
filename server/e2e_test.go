package server

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// readRecord decodes the record at a commitlog offset straight from the
// store's files (the mapping is shared, so this sees unflushed appends).
func readRecord(t *testing.T, opts storage.Options, offset int64) *storage.Record {
	t.Helper()
	from := offset / opts.FileSize * opts.FileSize
	data, err := os.ReadFile(filepath.Join(opts.Dir, "commitlog", fmt.Sprintf("%020d", from)))
	if err != nil {
		t.Fatalf("read commitlog file: %v", err)
	}
	rec, _, err := storage.DecodeRecord(data[offset-from:])
	if err != nil {
		t.Fatalf("decode record at %d: %v", offset, err)
	}
	if rec.PhysicalOffset != offset {
		t.Fatalf("record at %d says its offset is %d", offset, rec.PhysicalOffset)
	}
	return rec
}

// checkMsgID checks that id is a 32-character offset msgId of the test store
// host that decodes to offset.
func checkMsgID(t *testing.T, id string, offset int64) {
	t.Helper()
	if len(id) != 32 {
		t.Errorf("msg id %q: %d characters, want 32", id, len(id))
	}
	host, off, err := storage.ParseMsgID(id)
	if err != nil {
		t.Fatalf("ParseMsgID(%q): %v", id, err)
	}
	if host != testStoreHost || off != offset {
		t.Errorf("msg id %q decodes to %v @ %d, want %v @ %d", id, host, off, testStoreHost, offset)
	}
}

func prop(t *testing.T, rec *storage.Record, key, want string) {
	t.Helper()
	got, ok := rec.Property(key)
	if !ok || got != want {
		t.Errorf("property %s = %q (set %v), want %q", key, got, ok, want)
	}
}

func TestPutMessageRoundTrip(t *testing.T) {
	client, _, opts := storeServer(t, nil)
	ctx := ctxT(t)
	born := time.UnixMilli(1_700_000_000_123)

	before := time.Now().UnixMilli()
	var next int64
	for i := range 3 {
		body := []byte(fmt.Sprintf("hello %d", i))
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
			Topic: "orders", QueueId: 1, Body: body, Flag: 7, Tags: "tagA", Keys: "k1 k2",
			BornTimestamp: timestamppb.New(born),
			Properties:    map[string]string{"b": "2", "a": "1"},
		}})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Errorf("put %d: status %v", i, resp.GetStatus())
		}
		r := resp.GetResult()
		checkMsgID(t, r.GetMsgId(), r.GetWroteOffset())
		if r.GetWroteOffset() != next {
			t.Errorf("put %d: wrote offset %d, want %d (right after the previous record)", i, r.GetWroteOffset(), next)
		}
		next = r.GetWroteOffset() + int64(r.GetWroteBytes())
		if r.GetQueueId() != 1 || r.GetQueueOffset() != int64(i) || r.GetMessageCount() != 1 || len(r.GetMsgIds()) != 0 {
			t.Errorf("put %d: queue %d offset %d count %d ids %v; want queue 1 offset %d count 1 no ids",
				i, r.GetQueueId(), r.GetQueueOffset(), r.GetMessageCount(), r.GetMsgIds(), i)
		}
		if ts := r.GetStoreTimestamp().AsTime().UnixMilli(); ts < before || ts > time.Now().UnixMilli() {
			t.Errorf("put %d: store timestamp %d outside [%d, now]", i, ts, before)
		}

		rec := readRecord(t, opts, r.GetWroteOffset())
		if rec.Topic != "orders" || rec.QueueID != 1 || rec.QueueOffset != int64(i) || rec.Flag != 7 || !bytes.Equal(rec.Body, body) {
			t.Errorf("record %d: topic %q queue %d offset %d flag %d body %q", i, rec.Topic, rec.QueueID, rec.QueueOffset, rec.Flag, rec.Body)
		}
		if int64(rec.TotalSize) != int64(r.GetWroteBytes()) {
			t.Errorf("record %d: %d bytes, response says %d", i, rec.TotalSize, r.GetWroteBytes())
		}
		prop(t, rec, "TAGS", "tagA")
		prop(t, rec, "KEYS", "k1 k2")
		prop(t, rec, "a", "1")
		prop(t, rec, "b", "2")
		if _, ok := rec.Property("WAIT"); ok {
			t.Errorf("record %d: WAIT set although wait_store_ok is absent", i)
		}
		if rec.BornTimestamp != born.UnixMilli() {
			t.Errorf("record %d: born timestamp %d, want %d", i, rec.BornTimestamp, born.UnixMilli())
		}
		if rec.BornHost.Addr().String() != "127.0.0.1" || rec.BornHost.Port() == 0 {
			t.Errorf("record %d: born host %v, want the client's 127.0.0.1:port", i, rec.BornHost)
		}
		if rec.StoreHost != testStoreHost {
			t.Errorf("record %d: store host %v", i, rec.StoreHost)
		}
	}

	// Defaults: born timestamp is the server's receive time; wait_store_ok
	// false becomes WAIT=false.
	lo := time.Now().UnixMilli()
	resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "orders", Body: []byte("x"), WaitStoreOk: proto.Bool(false),
	}})
	if err != nil {
		t.Fatal(err)
	}
	rec := readRecord(t, opts, resp.GetResult().GetWroteOffset())
	if rec.BornTimestamp < lo || rec.BornTimestamp > time.Now().UnixMilli() {
		t.Errorf("default born timestamp %d outside [%d, now]", rec.BornTimestamp, lo)
	}
	prop(t, rec, "WAIT", "false")
	if resp.GetResult().GetQueueId() != 0 || resp.GetResult().GetQueueOffset() != 0 {
		t.Errorf("queue 0 of orders: got queue %d offset %d", resp.GetResult().GetQueueId(), resp.GetResult().GetQueueOffset())
	}
}

func TestPutMessagesRoundTrip(t *testing.T) {
	client, _, opts := storeServer(t, nil)
	ctx := ctxT(t)

	bodies := [][]byte{[]byte("one"), []byte("two two"), []byte("three three three")}
	req := &storagedv1.PutMessagesRequest{Topic: "batch", QueueId: 2}
	for i, b := range bodies {
		req.Messages = append(req.Messages, &storagedv1.BatchEntry{
			Body: b, Flag: int32(i), Tags: fmt.Sprintf("t%d", i),
			Properties: map[string]string{"n": fmt.Sprint(i)},
		})
	}
	resp, err := client.PutMessages(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResult()
	if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK || r.GetMessageCount() != 3 ||
		len(r.GetMsgIds()) != 3 || r.GetMsgIds()[0] != r.GetMsgId() || r.GetQueueId() != 2 || r.GetQueueOffset() != 0 {
		t.Fatalf("batch response %v", resp)
	}
	checkMsgID(t, r.GetMsgId(), r.GetWroteOffset())
	var total int64
	next := r.GetWroteOffset()
	for i, id := range r.GetMsgIds() {
		_, off, err := storage.ParseMsgID(id)
		if err != nil {
			t.Fatal(err)
		}
		if off != next {
			t.Errorf("entry %d at offset %d, want %d (consecutive records)", i, off, next)
		}
		checkMsgID(t, id, off)
		rec := readRecord(t, opts, off)
		if rec.Topic != "batch" || rec.QueueID != 2 || rec.QueueOffset != int64(i) || !bytes.Equal(rec.Body, bodies[i]) || rec.Flag != int32(i) {
			t.Errorf("entry %d: topic %q queue %d offset %d flag %d body %q", i, rec.Topic, rec.QueueID, rec.QueueOffset, rec.Flag, rec.Body)
		}
		prop(t, rec, "TAGS", fmt.Sprintf("t%d", i))
		prop(t, rec, "n", fmt.Sprint(i))
		total += int64(rec.TotalSize)
		next = off + int64(rec.TotalSize)
	}
	if total != int64(r.GetWroteBytes()) {
		t.Errorf("records hold %d bytes, response says %d", total, r.GetWroteBytes())
	}

	// The queue continues after the batch.
	one, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "batch", QueueId: 2, Body: []byte("after")}})
	if err != nil {
		t.Fatal(err)
	}
	if one.GetResult().GetQueueOffset() != 3 || one.GetResult().GetWroteOffset() != next {
		t.Errorf("put after batch: queue offset %d wrote offset %d, want 3 and %d", one.GetResult().GetQueueOffset(), one.GetResult().GetWroteOffset(), next)
	}
}

func TestPutDelayedMessage(t *testing.T) {
	client, _, opts := storeServer(t, nil)
	resp, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "later", QueueId: 5, Body: []byte("x"), DelayLevel: 3,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if q := resp.GetResult().GetQueueId(); q != 2 {
		t.Errorf("queue id %d, want 2 (delay level 3 - 1 of %s)", q, storage.ScheduleTopic)
	}
	rec := readRecord(t, opts, resp.GetResult().GetWroteOffset())
	if rec.Topic != storage.ScheduleTopic || rec.QueueID != 2 {
		t.Errorf("record in %s/%d, want %s/2", rec.Topic, rec.QueueID, storage.ScheduleTopic)
	}
	prop(t, rec, "DELAY", "3")
	prop(t, rec, "REAL_TOPIC", "later")
	prop(t, rec, "REAL_QID", "5")
}

func TestPutSyncFlushConcurrent(t *testing.T) {
	client, st, _ := storeServer(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	ctx := ctxT(t)
	const n = 16
	var wg sync.WaitGroup
	offsets := make(chan int64, n)
	for i := range n {
		wg.Go(func() {
			resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
				Topic: "sync", Body: []byte(fmt.Sprintf("m%d", i)),
			}})
			if err != nil {
				t.Errorf("put %d: %v", i, err)
				return
			}
			if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
				t.Errorf("put %d: %v", i, resp.GetStatus())
			}
			offsets <- resp.GetResult().GetWroteOffset()
		})
	}
	wg.Wait()
	close(offsets)
	seen := map[int64]bool{}
	for off := range offsets {
		if seen[off] {
			t.Errorf("offset %d acknowledged twice", off)
		}
		seen[off] = true
	}
	if s := st.Stats(); s.FlushedOffset < s.MaxOffset {
		t.Errorf("sync puts acknowledged but flushed offset %d < max offset %d", s.FlushedOffset, s.MaxOffset)
	}
}

// TestErrorMappingEndToEnd sends invalid requests through a real server and
// store and checks code, ErrorInfo and the BadRequest field path.
func TestErrorMappingEndToEnd(t *testing.T) {
	client, _, _ := storeServer(t, nil, WithMaxBatchMessages(4))
	ctx := ctxT(t)

	msg := func(mutate func(m *storagedv1.Message)) *storagedv1.PutMessageRequest {
		m := &storagedv1.Message{Topic: "t", Body: []byte("b")}
		mutate(m)
		return &storagedv1.PutMessageRequest{Message: m}
	}
	entries := func(n int, mutate func(i int, e *storagedv1.BatchEntry)) []*storagedv1.BatchEntry {
		var out []*storagedv1.BatchEntry
		for i := range n {
			e := &storagedv1.BatchEntry{Body: []byte("b")}
			if mutate != nil {
				mutate(i, e)
			}
			out = append(out, e)
		}
		return out
	}
	const illegal, propsTooBig = "MESSAGE_ILLEGAL", "PROPERTIES_SIZE_EXCEEDED"
	huge := strings.Repeat("v", storage.MaxPropertiesLength+1)

	single := []struct {
		name, field, reason string
		req                 *storagedv1.PutMessageRequest
	}{
		{"nil message", "message", illegal, &storagedv1.PutMessageRequest{}},
		{"empty topic", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "" })},
		{"dot-dot path", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "../x" })},
		{"slash", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "a/b" })},
		{"percent-encoded dot-dot", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "%2e%2e" })},
		{"percent-encoded slash", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "a%2Fb" })},
		{"double percent-encoding", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "%252e%252e" })},
		{"NUL", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "a\x00b" })},
		{"cyrillic lookalike", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "t\u043epic" })},
		{"fullwidth lookalike", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = "\uff54opic" })},
		{"topic too long", "message.topic", illegal, msg(func(m *storagedv1.Message) { m.Topic = strings.Repeat("a", 128) })},
		{"negative queue", "message.queue_id", illegal, msg(func(m *storagedv1.Message) { m.QueueId = -1 })},
		{"empty body", "message.body", illegal, msg(func(m *storagedv1.Message) { m.Body = nil })},
		{"body too large (store limit)", "message.body", illegal, msg(func(m *storagedv1.Message) { m.Body = make([]byte, testMaxMessageSize+1) })},
		{"negative delay", "message.delay_level", illegal, msg(func(m *storagedv1.Message) { m.DelayLevel = -1 })},
		{"bad born timestamp", "message.born_timestamp", illegal, msg(func(m *storagedv1.Message) {
			m.BornTimestamp = &timestamppb.Timestamp{Seconds: 1, Nanos: 2e9}
		})},
		{"born before 1970", "message.born_timestamp", illegal, msg(func(m *storagedv1.Message) {
			m.BornTimestamp = timestamppb.New(time.Unix(-10, 0))
		})},
		{"separator in tags", "message.tags", illegal, msg(func(m *storagedv1.Message) { m.Tags = "a\x02b" })},
		{"separator in keys", "message.keys", illegal, msg(func(m *storagedv1.Message) { m.Keys = "a\x01b" })},
		{"reserved KEYS", `message.properties["KEYS"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"KEYS": "k"} })},
		{"reserved DELAY", `message.properties["DELAY"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"DELAY": "3"} })},
		{"UNIQ_KEY too long", `message.properties["UNIQ_KEY"]`, illegal, msg(func(m *storagedv1.Message) {
			m.Properties = map[string]string{"UNIQ_KEY": strings.Repeat("u", storage.MaxUniqKeyLength+1)}
		})},
		{"reserved __CRC32#", `message.properties["__CRC32#"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"__CRC32#": "1"} })},
		{"reserved TIMER_ prefix", `message.properties["TIMER_DELIVER_MS"]`, illegal, msg(func(m *storagedv1.Message) {
			m.Properties = map[string]string{"TIMER_DELIVER_MS": "1"}
		})},
		{"separator in property key", `message.properties["a\x01b"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"a\x01b": "v"} })},
		{"separator in property value", `message.properties["k"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"k": "v\x02"} })},
		{"empty property value", `message.properties["k"]`, illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"k": ""} })},
		{"empty property key", "message.properties", illegal, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"": "v"} })},
		{"huge property (store limit)", "message.properties", propsTooBig, msg(func(m *storagedv1.Message) { m.Properties = map[string]string{"k": huge} })},
		{"huge tags (store limit)", "message.properties", propsTooBig, msg(func(m *storagedv1.Message) { m.Tags = huge })},
	}
	for _, tc := range single {
		t.Run("PutMessage/"+tc.name, func(t *testing.T) {
			_, err := client.PutMessage(ctx, tc.req)
			d := details(t, err)
			d.want(t, codes.InvalidArgument, tc.reason, false)
			checkViolation(t, d, tc.field, tc.reason)
		})
	}

	batch := []struct {
		name, field, reason string
		req                 *storagedv1.PutMessagesRequest
	}{
		{"empty", "messages", illegal, &storagedv1.PutMessagesRequest{Topic: "t"}},
		{"too many", "messages", illegal, &storagedv1.PutMessagesRequest{Topic: "t", Messages: entries(5, nil)}},
		{"bad topic", "topic", illegal, &storagedv1.PutMessagesRequest{Topic: "../x", Messages: entries(1, nil)}},
		{"negative queue", "queue_id", illegal, &storagedv1.PutMessagesRequest{Topic: "t", QueueId: -2, Messages: entries(1, nil)}},
		{"empty body", "messages[1].body", illegal, &storagedv1.PutMessagesRequest{Topic: "t", Messages: entries(2, func(i int, e *storagedv1.BatchEntry) {
			if i == 1 {
				e.Body = nil
			}
		})}},
		{"reserved property", `messages[0].properties["WAIT"]`, illegal, &storagedv1.PutMessagesRequest{Topic: "t", Messages: entries(1, func(_ int, e *storagedv1.BatchEntry) {
			e.Properties = map[string]string{"WAIT": "false"}
		})}},
		{"bodies too large (store limit)", "messages", illegal, &storagedv1.PutMessagesRequest{Topic: "t", Messages: entries(3, func(_ int, e *storagedv1.BatchEntry) {
			e.Body = make([]byte, testMaxMessageSize/2)
		})}},
		{"huge property (store limit)", "messages", propsTooBig, &storagedv1.PutMessagesRequest{Topic: "t", Messages: entries(2, func(i int, e *storagedv1.BatchEntry) {
			if i == 1 {
				e.Properties = map[string]string{"k": huge}
			}
		})}},
	}
	for _, tc := range batch {
		t.Run("PutMessages/"+tc.name, func(t *testing.T) {
			_, err := client.PutMessages(ctx, tc.req)
			d := details(t, err)
			d.want(t, codes.InvalidArgument, tc.reason, false)
			checkViolation(t, d, tc.field, tc.reason)
		})
	}
}

func checkViolation(t *testing.T, d statusDetails, field, reason string) {
	t.Helper()
	if d.badRequest == nil || len(d.badRequest.GetFieldViolations()) != 1 {
		t.Fatalf("want one BadRequest field violation, got %v", d.badRequest)
	}
	v := d.badRequest.GetFieldViolations()[0]
	if v.GetField() != field {
		t.Errorf("violation field %q, want %q (%s)", v.GetField(), field, v.GetDescription())
	}
	if v.GetDescription() == "" || v.GetReason() != reason {
		t.Errorf("violation description %q reason %q", v.GetDescription(), v.GetReason())
	}
	if strings.Contains(d.st.Message(), os.TempDir()) {
		t.Errorf("message leaks a path: %q", d.st.Message())
	}
}

// TestUnavailableEndToEnd: a store that takes no writes (slave, closed,
// still opening) answers UNAVAILABLE with SERVICE_NOT_AVAILABLE and a retry
// hint, and stores nothing.
func TestUnavailableEndToEnd(t *testing.T) {
	put := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}}
	batch := &storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}}}
	check := func(t *testing.T, client storagedv1.MessageStoreServiceClient) {
		t.Helper()
		_, err := client.PutMessage(ctxT(t), put)
		details(t, err).want(t, codes.Unavailable, "SERVICE_NOT_AVAILABLE", true)
		_, err = client.PutMessages(ctxT(t), batch)
		details(t, err).want(t, codes.Unavailable, "SERVICE_NOT_AVAILABLE", true)
	}

	t.Run("slave", func(t *testing.T) {
		client, st, _ := storeServer(t, func(o *storage.Options) { o.Role = storage.RoleSlave })
		check(t, client)
		if s := st.Stats(); s.MaxOffset != 0 {
			t.Errorf("slave store appended %d bytes", s.MaxOffset)
		}
	})
	t.Run("closed", func(t *testing.T) {
		client, st, _ := storeServer(t, nil)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		check(t, client)
	})
	t.Run("starting", func(t *testing.T) {
		srv := startServer(t, New(&DeferredStore{}, zerologNop()), GRPCConfig{})
		check(t, storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil)))
	})
	t.Run("deferred store set", func(t *testing.T) {
		st, _ := openStore(t, nil)
		var d DeferredStore
		srv := startServer(t, New(&d, zerologNop()), GRPCConfig{})
		client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
		d.Set(st)
		if _, err := client.PutMessage(ctxT(t), put); err != nil {
			t.Fatalf("put after Set: %v", err)
		}
		if _, err := client.PutMessages(ctxT(t), batch); err != nil {
			t.Fatalf("batch after Set: %v", err)
		}
	})
}

// TestRequestTooLarge: a request beyond the largest valid one
// (MaxMessageSize + RequestOverhead) reaches the service and is answered
// INVALID_ARGUMENT with ErrorInfo MESSAGE_ILLEGAL and a BadRequest, on each
// put RPC (a stream answers the message with the same code and reason); only one beyond MaxRecvMsgSize is refused by gRPC itself (bare
// RESOURCE_EXHAUSTED). The connection and the store go on. Before, every
// request over MaxMessageSize + RequestOverhead got the bare status.
func TestRequestTooLarge(t *testing.T) {
	client, _, _ := storeServer(t, nil)
	big := make([]byte, testMaxMessageSize+RequestOverhead+1)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"PutMessage", func() error {
			_, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: big}})
			return err
		}},
		{"PutMessages", func() error {
			_, err := client.PutMessages(ctxT(t), &storagedv1.PutMessagesRequest{Topic: "t",
				Messages: []*storagedv1.BatchEntry{{Body: big}}})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := details(t, c.call())
			d.want(t, codes.InvalidArgument, storage.MessageIllegal.String(), false)
			if d.badRequest == nil {
				t.Error("no BadRequest detail")
			}
		})
	}
	t.Run("PutMessageStream", func(t *testing.T) {
		st, err := client.PutMessageStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&storagedv1.PutMessageStreamRequest{RequestId: 7, Message: &storagedv1.Message{Topic: "t", Body: big}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if codes.Code(resp.GetCode()) != codes.InvalidArgument || resp.GetReason() != storage.MessageIllegal.String() {
			t.Fatalf("stream answer %v %q (%s), want InvalidArgument MESSAGE_ILLEGAL", codes.Code(resp.GetCode()), resp.GetReason(), resp.GetErrorMessage())
		}
	})
	_, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "t", Body: make([]byte, MaxRecvMsgSize(testMaxMessageSize)+1)}})
	if codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("beyond MaxRecvMsgSize: %v, want ResourceExhausted", err)
	}
	if _, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("x")}}); err != nil {
		t.Fatalf("put after the oversized requests: %v", err)
	}
}

// TestCancelledBeforeAppend calls the service directly with a cancelled
// context: the real store refuses before appending.
func TestCancelledBeforeAppend(t *testing.T) {
	st, _ := openStore(t, nil)
	svc := New(st, zerologNop())
	ctx, cancel := contextWithCancel(t)
	cancel()
	_, err := svc.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}})
	d := details(t, err)
	d.want(t, codes.Canceled, "UNKNOWN_ERROR", false)
	if !strings.Contains(d.st.Message(), "nothing was stored") {
		t.Errorf("message %q should say nothing was stored", d.st.Message())
	}
	if s := st.Stats(); s.MaxOffset != 0 {
		t.Errorf("cancelled put appended %d bytes", s.MaxOffset)
	}
}

// TestPanicBecomesInternal: a panicking store is recovered into INTERNAL
// with an ErrorInfo, logged, and the server keeps serving.
func TestPanicBecomesInternal(t *testing.T) {
	var logs syncBuffer
	srv := startServer(t, New(&fakeStore{panic: "boom"}, zerologNop()), GRPCConfig{Logger: newLogger(&logs)})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	for range 2 {
		_, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}})
		d := details(t, err)
		d.want(t, codes.Internal, "UNKNOWN_ERROR", false)
		if d.info.GetMetadata()["stored"] != "unknown" {
			t.Errorf("metadata %v", d.info.GetMetadata())
		}
	}
	if !strings.Contains(logs.String(), "recovered a panic") || !strings.Contains(logs.String(), "boom") {
		t.Errorf("panic not logged: %s", logs.String())
	}
}
