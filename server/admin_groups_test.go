package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/storagetest"
)

// TestAdminConsumerGroups: ListConsumerGroups and GetConsumerGroup over a
// real gRPC server and store, paged, against what the test put and
// committed, and their refusals.
func TestAdminConsumerGroups(t *testing.T) {
	client, st, _ := storeServer(t, nil)
	admin := startAdmin(t, st)
	ctx := ctxT(t)

	// Topic T gets 6 messages on queue 0 and 2 on queue 1.
	for q, n := range []int{6, 2} {
		for i := range n {
			req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", QueueId: int32(q), Body: []byte(fmt.Sprint(i))}}
			if _, err := client.PutMessage(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	commit := func(group string, q int32, off int64) {
		t.Helper()
		if _, err := client.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: group, Topic: "T", QueueId: q, Offset: off}); err != nil {
			t.Fatalf("commit %s T/%d=%d: %v", group, q, off, err)
		}
	}
	commit("billing", 0, 1) // lag 5
	commit("billing", 1, 2) // lag 0
	commit("audit", 0, 6)   // lag 0
	commit("search", 1, 0)  // lag 2

	var got []string
	token := ""
	for {
		page, err := admin.ListConsumerGroups(ctx, &storagedv1.ListConsumerGroupsRequest{PageSize: 2, PageToken: token})
		if err != nil || len(page.GetGroups()) > 2 {
			t.Fatalf("ListConsumerGroups: %v %v", page, err)
		}
		for _, g := range page.GetGroups() {
			got = append(got, fmt.Sprintf("%s:%d:%d", g.GetName(), g.GetQueueCount(), g.GetLag()))
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if s := strings.Join(got, ","); s != "audit:1:0,billing:2:5,search:1:2" {
		t.Fatalf("groups %s", s)
	}

	// billing one queue a page.
	var queues []string
	token = ""
	for {
		resp, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "billing", PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if g := resp.GetGroup(); g.GetName() != "billing" || g.GetQueueCount() != 2 || g.GetLag() != 5 {
			t.Fatalf("billing summary %v", g)
		}
		for _, q := range resp.GetQueues() {
			queues = append(queues, fmt.Sprintf("%s/%d c=%d [%d,%d) lag=%d", q.GetTopic(), q.GetQueueId(),
				q.GetCommittedOffset(), q.GetMinOffset(), q.GetMaxOffset(), q.GetLag()))
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if s := strings.Join(queues, "; "); s != "T/0 c=1 [0,6) lag=5; T/1 c=2 [0,2) lag=0" {
		t.Fatalf("billing queues: %s", s)
	}

	for _, c := range []struct {
		name string
		call func() error
		code codes.Code
		why  string
	}{
		{"unknown group", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "nobody"})
			return err
		}, codes.NotFound, ReasonGroupNotExist},
		{"no group name", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
		{"bad group name", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "a b"})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
		{"forged queue token", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "billing", PageToken: "T/-1"})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
		{"token without a queue", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "billing", PageToken: "T"})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
		{"negative page size", func() error {
			_, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: "billing", PageSize: -1})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
		{"forged group token", func() error {
			_, err := admin.ListConsumerGroups(ctx, &storagedv1.ListConsumerGroupsRequest{PageToken: "../x"})
			return err
		}, codes.InvalidArgument, ReasonInvalidRequest},
	} {
		t.Run(c.name, func(t *testing.T) { details(t, c.call()).want(t, c.code, c.why, false) })
	}
}

// TestConsumerLagMetrics: storaged_consumer_lag_messages labels only the
// most lagging groups (here 2 of 4), the rest are summed, and the values
// follow new puts and commits, scraped from a real /metrics endpoint.
func TestConsumerLagMetrics(t *testing.T) {
	client, st, _ := storeServer(t, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewConsumerCollector(st, 2))
	base := serveMetrics(t, reg)
	ctx := ctxT(t)
	put := func(n int) {
		t.Helper()
		for i := range n {
			req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte(fmt.Sprint(i))}}
			if _, err := client.PutMessage(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	commit := func(group string, off int64) {
		t.Helper()
		if _, err := client.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: group, Topic: "T", Offset: off}); err != nil {
			t.Fatalf("commit %s=%d: %v", group, off, err)
		}
	}

	mfs := scrape(t, base)
	if v := value(mfs, "storaged_consumer_groups"); v != 0 {
		t.Fatalf("no groups yet: storaged_consumer_groups %v", v)
	}
	put(10)
	commit("a", 9) // lag 1
	commit("b", 2) // lag 8
	commit("c", 5) // lag 5
	commit("d", 7) // lag 3
	mfs = scrape(t, base)
	if v := value(mfs, "storaged_consumer_groups"); v != 4 {
		t.Errorf("storaged_consumer_groups %v, want 4", v)
	}
	if n := len(mfs["storaged_consumer_lag_messages"].GetMetric()); n != 2 {
		t.Errorf("%d labelled groups, want 2", n)
	}
	for g, want := range map[string]float64{"b": 8, "c": 5} {
		if v := value(mfs, "storaged_consumer_lag_messages", "group", g); v != want {
			t.Errorf("lag of %s %v, want %v", g, v, want)
		}
	}
	if v := value(mfs, "storaged_consumer_lag_other_messages"); v != 1+3 {
		t.Errorf("other lag %v, want 4", v)
	}

	put(4)          // every group 4 further behind
	commit("b", 14) // b catches up
	mfs = scrape(t, base)
	for g, want := range map[string]float64{"c": 9, "d": 7} {
		if v := value(mfs, "storaged_consumer_lag_messages", "group", g); v != want {
			t.Errorf("after more puts: lag of %s %v, want %v", g, v, want)
		}
	}
	if v := value(mfs, "storaged_consumer_lag_other_messages"); v != 5+0 {
		t.Errorf("after more puts: other lag %v, want 5", v)
	}
}

// TestAdminPopConsumerGroups: a group consuming by POP is listed with its
// POP progress (cursor, messages in flight, lag = not yet received + not
// yet acknowledged), over its committed offset on the same queue; its
// retry topic is one of its queues once a redelivery used it; a group
// with committed offsets only keeps the offset lag. Read through the real
// gRPC admin service and a real /metrics endpoint, on a real store.
func TestAdminPopConsumerGroups(t *testing.T) {
	clk := storagetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	client, st, _ := storeServer(t, func(o *storage.Options) { o.Clock = clk })
	admin := startAdmin(t, st)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewConsumerCollector(st, 10))
	base := serveMetrics(t, reg)
	ctx := ctxT(t)
	if _, err := st.CreateTopic("P", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "P", Body: []byte(fmt.Sprint(i))}}
		if _, err := client.PutMessage(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		group string
		off   int64
	}{{"offsets", 1}, {"pop", 2}} {
		if _, err := client.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: c.group, Topic: "P", Offset: c.off}); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(n int) []storage.PopMessage {
		t.Helper()
		ms, err := st.PopReceive(ctx, storage.PopRequest{Group: "pop", Topic: "P", MaxMessages: n, Invisible: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	// queues is the group's queues as GetConsumerGroup answers, and its
	// summary.
	queues := func(group string) (string, string) {
		t.Helper()
		resp, err := admin.GetConsumerGroup(ctx, &storagedv1.GetConsumerGroupRequest{Name: group})
		if err != nil {
			t.Fatalf("GetConsumerGroup %s: %v", group, err)
		}
		var qs []string
		for _, q := range resp.GetQueues() {
			qs = append(qs, fmt.Sprintf("%s/%d pop=%v c=%d [%d,%d) inflight=%d lag=%d", q.GetTopic(), q.GetQueueId(), q.GetPop(),
				q.GetCommittedOffset(), q.GetMinOffset(), q.GetMaxOffset(), q.GetInflight(), q.GetLag()))
		}
		g := resp.GetGroup()
		return strings.Join(qs, "; "), fmt.Sprintf("%d queues, lag %d, inflight %d", g.GetQueueCount(), g.GetLag(), g.GetInflight())
	}
	check := func(what, wantQueues string, n, lag, inflight int) {
		t.Helper()
		q, sum := queues("pop")
		if wantSummary := fmt.Sprintf("%d queues, lag %d, inflight %d", n, lag, inflight); q != wantQueues || sum != wantSummary {
			t.Fatalf("%s: pop's queues %s (%s), want %s (%s)", what, q, sum, wantQueues, wantSummary)
		}
		mfs := scrape(t, base)
		if v := value(mfs, "storaged_consumer_lag_messages", "group", "pop"); v != float64(lag) {
			t.Fatalf("%s: storaged_consumer_lag_messages{group=pop} %v, want %d", what, v, lag)
		}
		if v := value(mfs, "storaged_consumer_lag_messages", "group", "offsets"); v != 5 {
			t.Fatalf("%s: storaged_consumer_lag_messages{group=offsets} %v, want 5", what, v)
		}
		if v := value(mfs, "storaged_consumer_groups"); v != 2 {
			t.Fatalf("%s: storaged_consumer_groups %v, want 2", what, v)
		}
	}
	// Before any receive pop has only its committed offset.
	check("committed only", "P/0 pop=false c=2 [0,6) inflight=0 lag=4", 1, 4, 0)

	ms := receive(3) // offsets 2, 3, 4: from the committed offset
	if len(ms) != 3 {
		t.Fatalf("received %d", len(ms))
	}
	check("three in flight", "P/0 pop=true c=5 [0,6) inflight=3 lag=4", 1, 4, 3)
	if errs, err := st.PopAck(ctx, "pop", "P", []string{ms[0].Handle}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	check("one acknowledged", "P/0 pop=true c=5 [0,6) inflight=2 lag=3", 1, 3, 2)

	// The two unacknowledged come back through %RETRY%pop with the last
	// message of P.
	clk.Advance(11 * time.Second)
	if ms := receive(32); len(ms) != 3 {
		t.Fatalf("the receive after the invisible time got %d, want 2 retries and 1 new", len(ms))
	}
	check("redelivered", "%RETRY%pop/0 pop=true c=2 [0,2) inflight=2 lag=2; P/0 pop=true c=6 [0,6) inflight=1 lag=1", 2, 3, 3)

	page, err := admin.ListConsumerGroups(ctx, &storagedv1.ListConsumerGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range page.GetGroups() {
		got = append(got, fmt.Sprintf("%s:%d:%d:%d", g.GetName(), g.GetQueueCount(), g.GetLag(), g.GetInflight()))
	}
	if s := strings.Join(got, ","); s != "offsets:1:5:0,pop:2:3:3" {
		t.Fatalf("ListConsumerGroups: %s", s)
	}
}
