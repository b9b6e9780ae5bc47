// Command example is a storaged client in Go: it produces messages
// (PutMessage, PutMessages, PutMessageStream), reads one back by msgId,
// consumes a queue by following next_offset, recovers from an out-of-range
// offset with the bounds its ErrorInfo carries, waits for a new message
// with a long poll, and reads the ErrorInfo and BadRequest of a refused put.
//
//	go run ./examples/go -addr 127.0.0.1:9090 -topic ExampleGo
//
// It prints one JSON object per step on stdout (the format is described in
// examples/README.md) so that examples/examples_test.go can check what it
// says against the store; a real client would act on the values instead.
// The same scenario is written in Node (examples/node) and Python
// (examples/python).
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// queueID is the one queue the example uses, so that every message it
// stores is in one consume queue and a pull sees them all in order.
const queueID = 0

func main() {
	addr := flag.String("addr", envOr("STORAGED_ADDR", "127.0.0.1:9090"), "storaged gRPC address, host:port (plaintext); env STORAGED_ADDR")
	topic := flag.String("topic", envOr("STORAGED_TOPIC", "ExampleGo"), "topic to produce to and consume from; env STORAGED_TOPIC")
	flag.Parse()

	// The whole run is bounded: every call below inherits this deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *addr, *topic, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, addr, topic string, stdout io.Writer) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := storagedv1.NewMessageStoreServiceClient(conn)
	out := json.NewEncoder(stdout)
	stored := 0

	// 1. Produce: one message per call. PUT_OK means stored (and, with the
	// default wait_store_ok, readable at once).
	var first *storagedv1.AppendResult
	for i := range 2 {
		m := newMessage(topic, fmt.Sprintf("hello %d from go", i))
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: m})
		if err != nil {
			return fmt.Errorf("PutMessage: %w", err)
		}
		if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			return fmt.Errorf("PutMessage: status %v", resp.GetStatus())
		}
		if first == nil {
			first = resp.GetResult()
		}
		out.Encode(putEvent("PutMessage", 0, resp.GetStatus(), m, resp.GetResult()))
		stored++
	}

	// 2. A batch: consecutive queue offsets, all or nothing.
	bodies := []string{"batch a", "batch b", "batch c"}
	batch := &storagedv1.PutMessagesRequest{Topic: topic, QueueId: queueID}
	for _, b := range bodies {
		batch.Messages = append(batch.Messages, &storagedv1.BatchEntry{Body: []byte(b), Tags: "batch"})
	}
	bresp, err := client.PutMessages(ctx, batch)
	if err != nil {
		return fmt.Errorf("PutMessages: %w", err)
	}
	r := bresp.GetResult()
	out.Encode(map[string]any{
		"event": "batch", "status": bresp.GetStatus().String(), "topic": topic, "queue_id": r.GetQueueId(),
		"queue_offset": r.GetQueueOffset(), "msg_id": r.GetMsgId(), "wrote_offset": r.GetWroteOffset(),
		"wrote_bytes": r.GetWroteBytes(), "store_ms": r.GetStoreTimestamp().AsTime().UnixMilli(),
		"message_count": r.GetMessageCount(), "msg_ids": r.GetMsgIds(), "bodies": bodies,
	})
	stored += len(bodies)

	// 3. A stream: many messages in flight on one call, one answer each,
	// matched by request_id, in completion order. A bad message is answered
	// with a code and reason and does not end the stream.
	n, err := produceStream(ctx, client, topic, out)
	if err != nil {
		return err
	}
	stored += n

	// 4. Read one message back by the msgId its put returned.
	got, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{
		Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: first.GetMsgId()}, IncludeRaw: true,
	})
	if err != nil {
		return fmt.Errorf("GetMessage: %w", err)
	}
	out.Encode(messageEvent("GetMessage", got.GetMessage()))

	// 5. Consume the queue from its first readable offset, following
	// next_offset, until every message stored above has come back. Small
	// pulls, so that it takes several; the wait lets a pull at the end of
	// the queue wait for the next message instead of returning empty.
	info, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: topic, QueueId: queueID})
	if err != nil {
		return fmt.Errorf("GetQueueInfo: %w", err)
	}
	offset := info.GetMinOffset()
	for received := 0; received < stored; {
		resp, err := pull(ctx, client, out, "PullMessages", topic, offset, 4, time.Second)
		if err != nil {
			return err
		}
		received += len(resp.GetMessages())
		offset = resp.GetNextOffset()
	}

	// 6. A consumer whose saved offset is past the end (say, a store that
	// was replaced) is told OUT_OF_RANGE; the ErrorInfo carries the readable
	// bounds, so it goes on from max_offset.
	_, err = client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: queueID, QueueOffset: 1_000_000})
	if err == nil {
		return errors.New("PullMessages past the end succeeded")
	}
	if status.Code(err) != codes.OutOfRange {
		return fmt.Errorf("PullMessages past the end: %w", err)
	}
	ev := errorEvent("PullMessages", err)
	out.Encode(ev)
	md, _ := ev["metadata"].(map[string]string)
	resume, err := strconv.ParseInt(md["max_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("OUT_OF_RANGE without max_offset: %w", err)
	}

	// 7. Long poll: a pull at the end of the queue waits (up to its wait)
	// and returns as soon as a message arrives. The late message is put
	// concurrently; whether it reaches the server before or after the poll
	// does, the poll returns it.
	late := newMessage(topic, "late message from go")
	type putDone struct {
		resp *storagedv1.PutMessageResponse
		err  error
	}
	put := make(chan putDone, 1)
	go func() {
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: late})
		put <- putDone{resp, err}
	}()
	for offset := resume; ; {
		resp, err := pull(ctx, client, out, "long poll", topic, offset, 32, 5*time.Second)
		if err != nil {
			<-put
			return err
		}
		if len(resp.GetMessages()) > 0 {
			break
		}
		offset = resp.GetNextOffset() // the wait ran out first: poll again
	}
	lp := <-put
	if lp.err != nil {
		return fmt.Errorf("PutMessage: %w", lp.err)
	}
	out.Encode(putEvent("PutMessage", 0, lp.resp.GetStatus(), late, lp.resp.GetResult()))
	stored++

	// 8. A refused put: INVALID_ARGUMENT, with ErrorInfo (reason
	// MESSAGE_ILLEGAL, the RocketMQ status name) and a BadRequest naming
	// the field.
	_, err = client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "../etc", Body: []byte("x")}})
	if status.Code(err) != codes.InvalidArgument {
		return fmt.Errorf("PutMessage with a bad topic: %v, want INVALID_ARGUMENT", err)
	}
	out.Encode(errorEvent("PutMessage", err))

	return out.Encode(map[string]any{"event": "done", "stored": stored})
}

// newMessage is a message with every optional field a producer usually
// sets. The born time is in milliseconds, the precision the store keeps.
func newMessage(topic, body string) *storagedv1.Message {
	return &storagedv1.Message{
		Topic:         topic,
		QueueId:       queueID,
		Body:          []byte(body),
		Tags:          "example",
		Keys:          "k1 k2",
		BornTimestamp: timestamppb.New(time.Now().Truncate(time.Millisecond)),
		Properties:    map[string]string{"lang": "go"},
	}
}

// produceStream sends four good messages and one bad one on a
// PutMessageStream and prints each answer. It returns how many were stored.
func produceStream(ctx context.Context, client storagedv1.MessageStoreServiceClient, topic string, out *json.Encoder) (int, error) {
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		return 0, fmt.Errorf("PutMessageStream: %w", err)
	}
	sent := map[uint64]*storagedv1.Message{}
	var reqs []*storagedv1.PutMessageStreamRequest
	for i := range 5 {
		m := newMessage(topic, fmt.Sprintf("stream %d from go", i))
		if i == 3 {
			m.Topic = "" // refused: MESSAGE_ILLEGAL
		}
		id := uint64(i + 1)
		sent[id] = m
		reqs = append(reqs, &storagedv1.PutMessageStreamRequest{RequestId: id, Message: m})
	}
	// Send and receive concurrently, as a producer with many messages in
	// flight would; the server holds at most 256 unanswered ones.
	sendErr := make(chan error, 1)
	go func() {
		for _, req := range reqs {
			if err := stream.Send(req); err != nil {
				sendErr <- err // io.EOF: the stream failed, Recv says why
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	stored := 0
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break // every answer was sent
		}
		if err != nil {
			<-sendErr
			return stored, fmt.Errorf("PutMessageStream: %w", err)
		}
		if resp.GetCode() != int32(codes.OK) {
			out.Encode(map[string]any{
				"event": "stream_error", "request_id": resp.GetRequestId(), "code": resp.GetCode(),
				"reason": resp.GetReason(), "message": resp.GetErrorMessage(),
			})
			continue
		}
		out.Encode(putEvent("PutMessageStream", resp.GetRequestId(), resp.GetStatus(), sent[resp.GetRequestId()], resp.GetResult()))
		stored++
	}
	if err := <-sendErr; err != nil && err != io.EOF {
		return stored, fmt.Errorf("PutMessageStream send: %w", err)
	}
	return stored, nil
}

// pull runs one PullMessages and prints it and the messages it returned.
func pull(ctx context.Context, client storagedv1.MessageStoreServiceClient, out *json.Encoder, via, topic string,
	offset int64, maxMessages int32, wait time.Duration) (*storagedv1.PullMessagesResponse, error) {
	resp, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{
		Topic: topic, QueueId: queueID, QueueOffset: offset, MaxMessages: maxMessages, Wait: durationpb.New(wait),
	})
	if err != nil {
		return nil, fmt.Errorf("PullMessages at %d: %w", offset, err)
	}
	out.Encode(map[string]any{
		"event": "pull", "via": via, "queue_offset": offset, "count": len(resp.GetMessages()),
		"next_offset": resp.GetNextOffset(), "min_offset": resp.GetMinOffset(), "max_offset": resp.GetMaxOffset(),
	})
	for _, m := range resp.GetMessages() {
		out.Encode(messageEvent(via, m))
	}
	return resp, nil
}

func putEvent(via string, requestID uint64, st storagedv1.PutMessageStatus, m *storagedv1.Message, r *storagedv1.AppendResult) map[string]any {
	ev := map[string]any{
		"event": "put", "via": via, "status": st.String(), "topic": m.GetTopic(), "queue_id": r.GetQueueId(),
		"queue_offset": r.GetQueueOffset(), "msg_id": r.GetMsgId(), "wrote_offset": r.GetWroteOffset(),
		"wrote_bytes": r.GetWroteBytes(), "store_ms": r.GetStoreTimestamp().AsTime().UnixMilli(),
		"body": string(m.GetBody()), "tags": m.GetTags(), "keys": m.GetKeys(), "properties": m.GetProperties(),
		"born_ms": m.GetBornTimestamp().AsTime().UnixMilli(),
	}
	if requestID != 0 {
		ev["request_id"] = requestID
	}
	return ev
}

func messageEvent(via string, m *storagedv1.StoredMessage) map[string]any {
	ev := map[string]any{
		"event": "message", "via": via, "topic": m.GetTopic(), "queue_id": m.GetQueueId(),
		"queue_offset": m.GetQueueOffset(), "commit_log_offset": m.GetCommitLogOffset(), "msg_id": m.GetMsgId(),
		"body": string(m.GetBody()), "tags": m.GetTags(), "keys": m.GetKeys(), "properties": m.GetProperties(),
		"born_ms": m.GetBornTimestamp().AsTime().UnixMilli(), "store_ms": m.GetStoreTimestamp().AsTime().UnixMilli(),
		"born_host": m.GetBornHost(), "store_host": m.GetStoreHost(), "store_size": m.GetStoreSize(),
	}
	if len(m.GetRaw()) > 0 {
		ev["raw_hex"] = hex.EncodeToString(m.GetRaw())
	}
	return ev
}

// errorEvent decodes the rich error model: the gRPC code, and the
// google.rpc.Status details storaged attaches (grpc-status-details-bin).
// Every storaged error carries an ErrorInfo (domain "storaged"; reason the
// RocketMQ status name or a read reason); bad requests add a BadRequest,
// retryable ones a RetryInfo.
func errorEvent(call string, err error) map[string]any {
	st := status.Convert(err)
	ev := map[string]any{"event": "error", "call": call, "code": int(st.Code()), "message": st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			ev["reason"], ev["domain"], ev["metadata"] = d.GetReason(), d.GetDomain(), d.GetMetadata()
		case *errdetails.BadRequest:
			var fields []string
			for _, v := range d.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
			ev["field_violations"] = fields
		case *errdetails.RetryInfo:
			ev["retry_delay_ms"] = d.GetRetryDelay().AsDuration().Milliseconds()
		}
	}
	return ev
}
