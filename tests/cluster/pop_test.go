package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/internal/proctest"
)

// POP consumption (the RocketMQ 5 SimpleConsumer's calls, over the
// apache.rocketmq.v2 service) on a group of three storaged processes.

// popMsg is one message received: body, delivery attempt, receipt handle.
type popMsg struct {
	body    string
	attempt int32
	handle  string
	id      string
}

func v2res(name string) *rocketmqv2.Resource { return &rocketmqv2.Resource{Name: name} }

// popReceive runs one ReceiveMessage of group POP on topic Group on p and
// returns its status code and messages.
func popReceive(p *proctest.Process, n int32, invisible, wait time.Duration) (rocketmqv2.Code, []popMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait+10*time.Second)
	defer cancel()
	s, err := rocketmqv2.NewMessagingServiceClient(p.Conn()).ReceiveMessage(ctx, &rocketmqv2.ReceiveMessageRequest{
		Group: v2res("POP"), MessageQueue: &rocketmqv2.MessageQueue{Topic: v2res("Group"), Id: 0}, BatchSize: n,
		InvisibleDuration: durationpb.New(invisible), LongPollingTimeout: durationpb.New(wait)})
	if err != nil {
		return 0, nil, err
	}
	var (
		code rocketmqv2.Code
		got  []popMsg
		seen bool
	)
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, nil, err
		}
		switch c := r.GetContent().(type) {
		case *rocketmqv2.ReceiveMessageResponse_Message:
			sp := c.Message.GetSystemProperties()
			got = append(got, popMsg{body: string(c.Message.GetBody()), attempt: sp.GetDeliveryAttempt(), handle: sp.GetReceiptHandle(),
				id: sp.GetMessageId()})
		case *rocketmqv2.ReceiveMessageResponse_Status:
			code, seen = c.Status.GetCode(), true
		}
	}
	if !seen {
		return 0, nil, errors.New("no status in the receive stream")
	}
	return code, got, nil
}

// popAck acks ms on p and returns the call's code and each entry's.
func popAck(p *proctest.Process, ms ...popMsg) (rocketmqv2.Code, []rocketmqv2.Code, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &rocketmqv2.AckMessageRequest{Group: v2res("POP"), Topic: v2res("Group")}
	for _, m := range ms {
		req.Entries = append(req.Entries, &rocketmqv2.AckMessageEntry{MessageId: m.id, ReceiptHandle: m.handle})
	}
	r, err := rocketmqv2.NewMessagingServiceClient(p.Conn()).AckMessage(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	var codes []rocketmqv2.Code
	for _, e := range r.GetEntries() {
		codes = append(codes, e.GetStatus().GetCode())
	}
	return r.GetStatus().GetCode(), codes, nil
}

// TestGroupPopFailover: a follower refuses a receive (HA_NOT_AVAILABLE);
// four messages received on the leader, one acknowledged; after kill -9
// of the leader the new one accepts the old leader's receipt handle for a
// second, refuses the first's (acknowledged already), and hands out the
// two others again with attempt 2 once their invisible time has passed,
// and the two never received with attempt 1; never the acknowledged ones.
func TestGroupPopFailover(t *testing.T) {
	g := newGroup(t)
	leader := g.Leader(t)
	for k := range 6 {
		if _, err := putTo(leader, fmt.Sprintf("m%d", k)); err != nil {
			t.Fatalf("put %d: %v", k, err)
		}
	}
	for _, p := range g.nodes {
		if p == leader {
			continue
		}
		if code, ms, err := popReceive(p, 4, time.Minute, 0); err != nil || code != rocketmqv2.Code_HA_NOT_AVAILABLE || len(ms) != 0 {
			t.Fatalf("receive on follower %s: %v, %d messages, %v; want HA_NOT_AVAILABLE", g.Name(p), code, len(ms), err)
		}
	}
	const invisible = 3 * time.Second
	code, first, err := popReceive(leader, 4, invisible, 0)
	if err != nil || code != rocketmqv2.Code_OK || len(first) != 4 {
		t.Fatalf("receive on the leader: %v, %d messages, %v", code, len(first), err)
	}
	sort.Slice(first, func(i, j int) bool { return first[i].body < first[j].body })
	for i, m := range first {
		if m.body != fmt.Sprintf("m%d", i) || m.attempt != 1 {
			t.Fatalf("received %+v", first)
		}
	}
	if code, _, err := popAck(leader, first[0]); err != nil || code != rocketmqv2.Code_OK {
		t.Fatalf("ack m0 on the leader: %v %v", code, err)
	}

	leader.Kill(t)
	nl := g.Leader(t)
	// The new leader may refuse until it is ready (HA_NOT_AVAILABLE):
	// nothing changed then, so the ack is sent again.
	waitFor(t, 30*time.Second, "an ack on the new leader "+g.Name(nl), func() bool {
		code, entries, err := popAck(nl, first[1], first[0])
		if err != nil || code == rocketmqv2.Code_HA_NOT_AVAILABLE {
			return false
		}
		if len(entries) != 2 || entries[0] != rocketmqv2.Code_OK || entries[1] != rocketmqv2.Code_INVALID_RECEIPT_HANDLE {
			t.Fatalf("ack of m1 (in flight) and m0 (acknowledged) on the new leader %s: %v %v", g.Name(nl), code, entries)
		}
		return true
	})

	// m2 and m3 come back (attempt 2) once their invisible time passed;
	// m4 and m5 are delivered (attempt 1); m0 and m1 never.
	want := map[string]int32{"m2": 2, "m3": 2, "m4": 1, "m5": 1}
	got := map[string]int32{}
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < len(want) {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s the new leader handed out %v, want %v", got, want)
		}
		code, ms, err := popReceive(nl, 32, time.Minute, 2*time.Second)
		if err != nil || (code != rocketmqv2.Code_OK && code != rocketmqv2.Code_MESSAGE_NOT_FOUND) {
			t.Fatalf("receive on the new leader: %v %v", code, err)
		}
		for _, m := range ms {
			if a, ok := want[m.body]; !ok || a != m.attempt {
				t.Fatalf("the new leader handed out %s with attempt %d; want only %v", m.body, m.attempt, want)
			}
			if _, dup := got[m.body]; dup {
				t.Fatalf("%s handed out twice", m.body)
			}
			got[m.body] = m.attempt
			if code, _, err := popAck(nl, m); err != nil || code != rocketmqv2.Code_OK {
				t.Fatalf("ack %s: %v %v", m.body, code, err)
			}
		}
	}
	g.Heal(t)
}
