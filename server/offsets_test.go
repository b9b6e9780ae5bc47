package server

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

func TestConsumerOffsetsOverGRPC(t *testing.T) {
	c, st, opts := storeServer(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	ctx := ctxT(t)
	var stored []int64
	for i := 0; i < 5; i++ {
		resp, err := c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("m")}})
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, resp.GetResult().GetStoreTimestamp().AsTime().UnixMilli())
	}
	_, err := c.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "g", Topic: "T"})
	details(t, err).want(t, codes.NotFound, ReasonQueryNotFound, false)

	if _, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 3}); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "g", Topic: "T"})
	if err != nil || got.GetOffset() != 3 {
		t.Fatalf("GetOffset = %v, %v", got, err)
	}
	// Committed through gRPC, read from the store directly: the same state.
	if off, err := st.GetOffset("g", "T", 0); err != nil || off != 3 {
		t.Fatalf("store GetOffset = %d, %v", off, err)
	}

	byTime, err := c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "T", Time: timestamppb.New(time.UnixMilli(stored[0]).Add(-time.Hour))})
	if err != nil || byTime.GetOffset() != 0 {
		t.Fatalf("GetOffsetByTime before the first = %v, %v", byTime, err)
	}
	byTime, err = c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "T", Time: timestamppb.New(time.UnixMilli(stored[4]).Add(time.Hour))})
	if err != nil || byTime.GetOffset() != 5 {
		t.Fatalf("GetOffsetByTime after the last = %v, %v", byTime, err)
	}

	// Clients can neither read nor write the offset topic.
	_, err = c.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: storage.OffsetTopic})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = c.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: storage.OffsetTopic})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: storage.OffsetTopic, Body: []byte("forged")}})
	details(t, err).want(t, codes.InvalidArgument, storage.MessageIllegal.String(), false)

	// A restart of the store serves the same offset.
	st.Close()
	st2, err := storage.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	srv := startServer(t, New(st2, zerolog.Nop()), GRPCConfig{})
	srv.SetServing(true)
	c2 := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	got, err = c2.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "g", Topic: "T"})
	if err != nil || got.GetOffset() != 3 {
		t.Fatalf("GetOffset after restart = %v, %v", got, err)
	}
}

func TestConsumerOffsetsHostileRequests(t *testing.T) {
	c, st, _ := storeServer(t, func(o *storage.Options) { o.MaxConsumerOffsets = 1 })
	ctx := ctxT(t)
	if _, err := c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		req    *storagedv1.CommitOffsetRequest
		code   codes.Code
		reason string
		field  string
	}{
		{"huge group", &storagedv1.CommitOffsetRequest{ConsumerGroup: strings.Repeat("g", 1<<20), Topic: "T"}, codes.InvalidArgument, ReasonInvalidRequest, "consumer_group"},
		{"no group", &storagedv1.CommitOffsetRequest{Topic: "T"}, codes.InvalidArgument, ReasonInvalidRequest, "consumer_group"},
		{"group charset", &storagedv1.CommitOffsetRequest{ConsumerGroup: "../g", Topic: "T"}, codes.InvalidArgument, ReasonInvalidRequest, "consumer_group"},
		{"bad topic", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "a/b"}, codes.InvalidArgument, ReasonInvalidRequest, "topic"},
		{"unknown topic", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "U"}, codes.NotFound, ReasonTopicNotExist, ""},
		{"negative queue", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", QueueId: -1}, codes.InvalidArgument, ReasonInvalidRequest, "queue_id"},
		{"queue past the topic", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", QueueId: 1 << 30}, codes.InvalidArgument, ReasonInvalidRequest, "queue_id"},
		{"offset past max", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 2}, codes.OutOfRange, ReasonOffsetOutOfRange, ""},
		{"negative offset", &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: -5}, codes.OutOfRange, ReasonOffsetOutOfRange, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CommitOffset(ctx, tc.req)
			d := details(t, err)
			d.want(t, tc.code, tc.reason, false)
			if tc.field != "" && (d.badRequest == nil || d.badRequest.GetFieldViolations()[0].GetField() != tc.field) {
				t.Errorf("BadRequest = %v, want field %s", d.badRequest, tc.field)
			}
			if tc.code == codes.OutOfRange && (d.info.GetMetadata()["min_offset"] != "0" || d.info.GetMetadata()["max_offset"] != "1") {
				t.Errorf("range metadata %v", d.info.GetMetadata())
			}
		})
	}
	if _, err := st.GetOffset("g", "T", 0); err == nil {
		t.Fatal("a refused commit stored an offset")
	}
	// The key bound: one key may exist, a second is RESOURCE_EXHAUSTED.
	if _, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "h", Topic: "T", Offset: 1})
	d := details(t, err)
	d.want(t, codes.ResourceExhausted, ReasonSystemBusy, false)
	if d.info.GetMetadata()["cause"] != "TOO_MANY_CONSUMER_OFFSETS" {
		t.Errorf("metadata %v", d.info.GetMetadata())
	}

	_, err = c.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: strings.Repeat("x", 300), Topic: "T"})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "T"})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "T", QueueId: 3, Time: timestamppb.Now()})
	details(t, err).want(t, codes.NotFound, ReasonQueueNotFound, false)
	_, err = c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "U", Time: timestamppb.Now()})
	details(t, err).want(t, codes.NotFound, ReasonTopicNotExist, false)
	_, err = c.GetOffsetByTime(ctx, &storagedv1.GetOffsetByTimeRequest{Topic: "T", Time: &timestamppb.Timestamp{Seconds: 1 << 60}})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
}

func TestConsumerOffsetsUnavailable(t *testing.T) {
	c, st, _ := storeServer(t, nil)
	ctx := ctxT(t)
	if _, err := c.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	st.SetRole(storage.RoleSlave)
	_, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 1})
	details(t, err).want(t, codes.Unavailable, ReasonUnavailable, true)
	st.SetRole(storage.RoleMaster)
	if _, err := c.CommitOffset(ctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: "g", Topic: "T", Offset: 1}); err != nil {
		t.Fatal(err)
	}
	// A deferred store not set yet answers UNAVAILABLE.
	srv := startServer(t, New(&DeferredStore{}, zerolog.Nop()), GRPCConfig{})
	srv.SetServing(true)
	c2 := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	_, err = c2.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: "g", Topic: "T"})
	details(t, err).want(t, codes.Unavailable, ReasonUnavailable, true)
}
