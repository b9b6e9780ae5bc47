package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// pinnedWriters put to fixed members, each goroutine to one address, with
// no leader following and no retry: what a client behind a Kubernetes
// Service that spreads calls over every member does.
type pinnedWriters struct {
	putLoops

	mu       sync.Mutex
	acked    map[int64]string
	refused  int            // nothing stored (client.Classify)
	unknown  map[string]int // outcome unknown, by ErrorInfo cause (or gRPC code)
	examples []error
	bad      []error
}

func startPinnedWriters(t *testing.T, targets []*proctest.Process, perTarget int) *pinnedWriters {
	w := &pinnedWriters{putLoops: putLoops{stop: make(chan struct{})}, acked: map[int64]string{}, unknown: map[string]int{}}
	for ti, p := range targets {
		c := storagedv1.NewMessageStoreServiceClient(p.Conn())
		for i := range perTarget {
			w.start(fmt.Sprintf("p%d-%d", ti, i), c.PutMessage, w.record)
		}
	}
	t.Cleanup(w.close)
	return w
}

func (w *pinnedWriters) record(body string, resp *storagedv1.PutMessageResponse, err error) {
	st, off := resp.GetStatus(), resp.GetResult().GetQueueOffset()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil && st == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
		w.acked[off] = body
	case err == nil:
		w.bad = append(w.bad, fmt.Errorf("put %s: status %v", body, st))
	case client.Classify(err).NothingStored:
		w.refused++
	default:
		cause := status.Code(err).String()
		for _, d := range status.Convert(err).Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["cause"] != "" {
				cause = info.GetMetadata()["cause"]
			}
		}
		w.unknown[cause]++
		if len(w.examples) < 3 {
			w.examples = append(w.examples, err)
		}
	}
}

func (w *pinnedWriters) acks() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *pinnedWriters) waitAcks(t *testing.T, n int) {
	t.Helper()
	waitAcks(t, n, w.acks, func() string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return fmt.Sprintf("%d acked through the followers (refused %d, unknown %v, e.g. %v)", len(w.acked), w.refused, w.unknown, w.examples)
	})
}

func (w *pinnedWriters) close() { w.halt() }

// TestGroupForwardPuts: with --raft-forward-puts, clients that only ever
// call the two followers (unary puts, a batch, a stream, an offset
// commit) get their writes stored: each follower hands them to the leader and answers with its
// answer; the other follower (--raft-follower-reads) reads them linearizably at once. Then the leader is killed with -9 while they keep writing: a
// forwarded call cut by the kill is an unknown outcome (cause
// FORWARD_FAILED) or a refusal, never a false ack; once a new leader is
// elected the survivors take puts again (one of them directly, the other
// forwarding to it), and every acknowledged put is on both survivors.
func TestGroupForwardPuts(t *testing.T) {
	g := newGroup(t, "--raft-forward-puts", "--raft-follower-reads")
	leader := g.Leader(t)
	followers := slices.DeleteFunc(slices.Clone(g.nodes), func(p *proctest.Process) bool { return p == leader })
	f := followers[0]
	c := storagedv1.NewMessageStoreServiceClient(f.Conn())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// One of each put kind, to a follower.
	acked := map[int64]string{}
	resp, err := c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Group", Body: []byte("unary")}})
	if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		t.Fatalf("a put to follower %s: %v %v", g.Name(f), resp, err)
	}
	acked[resp.GetResult().GetQueueOffset()] = "unary"
	var entries []*storagedv1.BatchEntry
	for i := range 10 {
		entries = append(entries, &storagedv1.BatchEntry{Body: []byte(fmt.Sprintf("batch-%d", i))})
	}
	bresp, err := c.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "Group", Messages: entries})
	if err != nil || bresp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		t.Fatalf("a batch to follower %s: %v %v", g.Name(f), bresp, err)
	}
	for i := range entries {
		acked[bresp.GetResult().GetQueueOffset()+int64(i)] = fmt.Sprintf("batch-%d", i)
	}
	st, err := c.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := st.Send(&storagedv1.PutMessageStreamRequest{RequestId: uint64(i),
			Message: &storagedv1.Message{Topic: "Group", Body: []byte(fmt.Sprintf("stream-%d", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream to follower %s: %v", g.Name(f), err)
		}
		if r.GetCode() != 0 || r.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("stream message %d to follower %s: %v", r.GetRequestId(), g.Name(f), r)
		}
		acked[r.GetResult().GetQueueOffset()] = fmt.Sprintf("stream-%d", r.GetRequestId())
	}
	if len(acked) != 21 {
		t.Fatalf("%d distinct queue offsets acked, want 21: %v", len(acked), acked)
	}
	waitAcked(t, g.Name(leader), leader, acked)
	// A consumer-offset commit to the follower, read linearizably from the leader.
	if _, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "fwd", Topic: "Group", Offset: 17}); err != nil {
		t.Fatalf("a commit to follower %s: %v", g.Name(f), err)
	}
	got, err := storagedv1.NewMessageStoreServiceClient(leader.Conn()).GetOffset(ctx, &storagedv1.GetOffsetRequest{
		ConsumerGroup: "fwd", Topic: "Group", Linearizable: true})
	if err != nil || got.GetOffset() != 17 {
		t.Fatalf("the leader's committed offset: %v %v, want 17", got, err)
	}
	// And from the other follower (--raft-follower-reads: it serves the
	// linearizable read after the leader's read index), at once.
	other := followers[1]
	got, err = storagedv1.NewMessageStoreServiceClient(other.Conn()).GetOffset(ctx, &storagedv1.GetOffsetRequest{
		ConsumerGroup: "fwd", Topic: "Group", Linearizable: true})
	if err != nil || got.GetOffset() != 17 {
		t.Fatalf("follower %s's linearizable committed offset: %v %v, want 17", g.Name(other), got, err)
	}
	if max, err := linearMax(other); err != nil || max != int64(len(acked)) {
		t.Fatalf("follower %s's linearizable queue max: %d %v, want %d", g.Name(other), max, err, len(acked))
	}

	// Writers on both followers; then the leader dies.
	w := startPinnedWriters(t, followers, 4)
	w.waitAcks(t, 100)
	leader.Kill(t)
	t.Logf("killed the leader %s", g.Name(leader))
	newLeader := g.Leader(t)
	if !slices.Contains(followers, newLeader) {
		t.Fatalf("leader %s after the kill", g.Name(newLeader))
	}
	w.waitAcks(t, 100)
	w.close()
	if len(w.bad) > 0 {
		t.Fatalf("unexpected put answers: %v", w.bad)
	}
	for k, v := range acked {
		w.acked[k] = v
	}
	for _, p := range followers {
		waitAcked(t, g.Name(p), p, w.acked)
	}
	for cause := range w.unknown {
		if cause != "FORWARD_FAILED" && !strings.HasPrefix(cause, "DeadlineExceeded") {
			t.Errorf("an unknown outcome with cause %s (e.g. %v)", cause, w.examples)
		}
	}
	t.Logf("through the followers: %d acked, %d refused (nothing stored), unknown %v (e.g. %v)", len(w.acked), w.refused, w.unknown, w.examples)
}
