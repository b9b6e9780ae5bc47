package server

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// TestTooManyStreams: a client that opens more calls on one connection than
// MaxConcurrentStreams allows gets no more than that many running at once:
// the next call waits for a free stream (and ends with its own deadline if
// none frees up), a second connection is served meanwhile, and once a stream
// ends the waiting caller gets through. Nothing stored is lost.
func TestTooManyStreams(t *testing.T) {
	const limit = 2
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{MaxConcurrentStreams: limit})
	srv.SetServing(true)
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	ctx := ctxT(t)
	put := func(c storagedv1.MessageStoreServiceClient, ctx context.Context, body string) (*storagedv1.PutMessageResponse, error) {
		return c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "streams", Body: []byte(body)}})
	}

	// Fill the connection's streams with open PutMessageStreams, each proven
	// established by one answered message.
	type openStream = interface {
		Send(*storagedv1.PutMessageStreamRequest) error
		Recv() (*storagedv1.PutMessageStreamResponse, error)
		CloseSend() error
	}
	var streams []openStream
	for i := range limit {
		s, err := client.PutMessageStream(ctx)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if err := s.Send(streamMsg(1, &storagedv1.Message{Topic: "streams", Body: []byte("in a stream")})); err != nil {
			t.Fatalf("stream %d send: %v", i, err)
		}
		if ack, err := s.Recv(); err != nil || ack.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("stream %d: ack %v, err %v", i, ack, err)
		}
		streams = append(streams, s)
	}

	// One more call on the same connection cannot start: it ends with its
	// own deadline, never with an answer from the server.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := put(client, short, "over the limit")
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call over the stream limit: %v, want DEADLINE_EXCEEDED while %d streams are open", err, limit)
	}

	// Another connection is not affected.
	other := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	if _, err := put(other, ctx, "second connection"); err != nil {
		t.Fatalf("second connection: %v", err)
	}

	// Ending one stream frees a slot: a call waiting for it gets through.
	done := make(chan error, 1)
	go func() {
		_, err := put(client, ctx, "after a stream ended")
		done <- err
	}()
	if err := streams[0].CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := streams[0].Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("closed stream ended with %v, want EOF", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("call after a stream ended: %v", err)
	}
	if err := streams[1].CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := streams[1].Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("second stream ended with %v, want EOF", err)
	}

	// Everything that was answered is stored: two stream messages, the
	// second connection's put and the put after the stream ended (the
	// deadline-exceeded call never reached the server).
	got := map[string]int{}
	for next, n := int64(0), 0; n < limit+2; {
		resp := pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: "streams", QueueOffset: next, MaxMessages: 10})
		for _, m := range resp.GetMessages() {
			got[string(m.GetBody())]++
			n++
		}
		next = resp.GetNextOffset()
	}
	if got["in a stream"] != limit || got["second connection"] != 1 || got["after a stream ended"] != 1 || got["over the limit"] != 0 {
		t.Fatalf("stored bodies %v", got)
	}
}
