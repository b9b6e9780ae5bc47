package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/storagetest"
)

// alarmClock is the fake storage.TimerClock of storagetest: Set and Advance
// fire the waits they pass.
type alarmClock = storagetest.Clock

var _ storage.TimerClock = (*alarmClock)(nil)

var newAlarmClock = storagetest.NewClock

// TestDelayedDeliveryEndToEnd is issue 5's "done when" over gRPC: a put
// with delay level 3 (10 s) is answered with the schedule queue it went to,
// is not in its topic before its time, and is pulled from its topic (a
// long poll) once the store's clock has passed it, without the delay
// properties, with a new store time. The clock is a fake TimerClock, so the
// test never sleeps: the scheduler runs exactly when the clock moves.
func TestDelayedDeliveryEndToEnd(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 1, 0, 0, 0, time.Local) // not in the DeleteWhen hour
	clock := newAlarmClock(t0)
	const parked = 3 // the disk check, the delay scheduler, the timer service
	st, _ := openStore(t, func(o *storage.Options) {
		o.Clock = clock
		o.StatDisk = newFakeDisk(10).stat
		// The disk check waits on the clock too; a day keeps it out of
		// the way: the only other wait is the scheduler's.
		o.DiskCheckInterval = 24 * time.Hour
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st))
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{})
	srv.SetServing(true)
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	base := serveMetrics(t, reg)
	ctx := ctxT(t)

	// The disk check, the scheduler and the timer-message service are
	// all parked on the clock: nothing runs until it moves. Every wait
	// below counts all three: counting two let the timer service's
	// wait stand in for a scheduler that was still delivering.
	clock.WaitPending(t, parked)

	born := time.UnixMilli(1_700_000_000_000)
	resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "later", QueueId: 5, Body: []byte("in ten seconds"), Tags: "TagA", Keys: "k1", DelayLevel: 3,
		BornTimestamp: timestamppb.New(born), Properties: map[string]string{"trace": "abc"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResult()
	if res.GetQueueId() != 2 || res.GetQueueOffset() != 0 || !res.GetStoreTimestamp().AsTime().Equal(t0) {
		t.Fatalf("delayed put answered queue %d offset %d store time %v, want queue 2 (level 3 - 1) offset 0 at %v",
			res.GetQueueId(), res.GetQueueOffset(), res.GetStoreTimestamp().AsTime(), t0)
	}
	got, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: res.GetMsgId()}})
	if err != nil {
		t.Fatal(err)
	}
	if m := got.GetMessage(); m.GetTopic() != storage.ScheduleTopic || m.GetQueueId() != 2 ||
		m.GetProperties()["DELAY"] != "3" || m.GetProperties()["REAL_TOPIC"] != "later" || m.GetProperties()["REAL_QID"] != "5" {
		t.Fatalf("the put's msgId reads %s/%d with properties %v, want %s/2 with DELAY=3 REAL_TOPIC=later REAL_QID=5",
			m.GetTopic(), m.GetQueueId(), m.GetProperties(), storage.ScheduleTopic)
	}
	pullLater := func(wait time.Duration) (*storagedv1.PullMessagesResponse, error) {
		return client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "later", QueueId: 5, Wait: durationpb.New(wait)})
	}
	if r, err := pullLater(0); codeOf(err) != codes.NotFound {
		t.Fatalf("pull of the real topic before delivery: %v %v, want NOT_FOUND (nothing there yet)", r, err)
	}
	waitQueue(t, client, storage.ScheduleTopic, 2, 1) // visible to the scheduler
	mfs := scrape(t, base)
	if p, d := value(mfs, "storaged_schedule_pending_messages", "level", "3"), value(mfs, "storaged_schedule_delivered_total", "level", "3"); p != 1 || d != 0 {
		t.Errorf("before delivery: level 3 pending %v delivered %v, want 1 and 0", p, d)
	}

	// 1 ms before its time: the scheduler runs (and parks again) without
	// delivering it.
	clock.Set(t0.Add(10*time.Second - time.Millisecond))
	clock.WaitPending(t, parked)
	if r, err := pullLater(0); codeOf(err) != codes.NotFound {
		t.Fatalf("pull of the real topic 1 ms before the delivery time: %v %v, want NOT_FOUND", r, err)
	}

	// Past its time: a long poll on the real topic gets it.
	deliveredAt := t0.Add(11 * time.Second)
	clock.Set(deliveredAt)
	pr, err := pullLater(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.GetMessages()) != 1 {
		t.Fatalf("long poll after the delivery time: %d messages, want 1", len(pr.GetMessages()))
	}
	m := pr.GetMessages()[0]
	if m.GetTopic() != "later" || m.GetQueueId() != 5 || m.GetQueueOffset() != 0 || string(m.GetBody()) != "in ten seconds" ||
		m.GetTags() != "TagA" || m.GetKeys() != "k1" || m.GetProperties()["trace"] != "abc" {
		t.Errorf("delivered message %v", m)
	}
	for _, k := range []string{"DELAY", "REAL_TOPIC", "REAL_QID"} {
		if v, ok := m.GetProperties()[k]; ok {
			t.Errorf("delivered message keeps %s=%q", k, v)
		}
	}
	if !m.GetStoreTimestamp().AsTime().Equal(deliveredAt) || !m.GetBornTimestamp().AsTime().Equal(born) {
		t.Errorf("delivered store time %v born %v, want a new store time %v and the born time %v",
			m.GetStoreTimestamp().AsTime(), m.GetBornTimestamp().AsTime(), deliveredAt, born)
	}
	if m.GetMsgId() == res.GetMsgId() {
		t.Error("the delivered message has the schedule record's msgId")
	}

	// Once the scheduler has parked again its counters are final.
	clock.WaitPending(t, parked)
	mfs = scrape(t, base)
	for _, c := range []struct {
		name string
		want float64
	}{
		{"storaged_schedule_pending_messages", 0},
		{"storaged_schedule_delivered_total", 1},
		{"storaged_schedule_lag_seconds", 0},
	} {
		if got := value(mfs, c.name, "level", "3"); got != c.want {
			t.Errorf("after delivery: %s{level=3} = %v, want %v", c.name, got, c.want)
		}
	}
}
