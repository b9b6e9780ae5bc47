package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
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
