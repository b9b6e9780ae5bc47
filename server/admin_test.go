package server

import (
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/vfs"
)

// startAdmin serves an AdminService over store on 127.0.0.1:0.
func startAdmin(t *testing.T, store AdminStore) storagedv1.AdminServiceClient {
	t.Helper()
	srv, err := NewAdminServer(NewAdminService(store, zerolog.Nop()), GRPCConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return serveAdmin(t, srv)
}

// serveAdmin serves srv on 127.0.0.1:0 until the test ends.
func serveAdmin(t *testing.T, srv *AdminServer) storagedv1.AdminServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		if !srv.Shutdown(5 * time.Second) {
			t.Error("admin server: not a graceful stop")
		}
		if err := <-served; err != nil {
			t.Errorf("admin Serve: %v", err)
		}
	})
	return storagedv1.NewAdminServiceClient(dial(t, lis.Addr().String(), nil))
}

// TestTopicPutStatusesEndToEnd: the put statuses of the topic config and
// the reserved topics, through a real gRPC server, for PutMessage,
// PutMessages and PutMessageStream.
func TestTopicPutStatusesEndToEnd(t *testing.T) {
	client, st, _ := storeServer(t, func(o *storage.Options) { o.DefaultQueues, o.MaxTopics = 4, 2 })
	type outcome struct {
		code    codes.Code
		reason  string
		message string // in the status message
	}
	cases := []struct {
		topic string
		qid   int32
		want  outcome
	}{
		{"A", 3, outcome{codes.OK, "", ""}},
		{"A", 4, outcome{codes.InvalidArgument, "MESSAGE_ILLEGAL", "topic A has 4 queues"}},
		{storage.ScheduleTopic, math.MaxInt32, outcome{codes.InvalidArgument, "MESSAGE_ILLEGAL", "reserved"}},
		{"RMQ_SYS_TRANS_HALF_TOPIC", 0, outcome{codes.InvalidArgument, "MESSAGE_ILLEGAL", "reserved"}},
		{"B", 0, outcome{codes.OK, "", ""}},
		{"C", 0, outcome{codes.ResourceExhausted, "LMQ_CONSUME_QUEUE_NUM_EXCEEDED", "--max-topics"}},
	}
	stream, err := client.PutMessageStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		check := func(how string, err error) {
			t.Helper()
			if c.want.code == codes.OK {
				if err != nil {
					t.Fatalf("%s %s/%d: %v", how, c.topic, c.qid, err)
				}
				return
			}
			d := details(t, err)
			d.want(t, c.want.code, c.want.reason, false)
			if !strings.Contains(d.st.Message(), c.want.message) {
				t.Errorf("%s %s/%d: message %q, want it to name %q", how, c.topic, c.qid, d.st.Message(), c.want.message)
			}
		}
		_, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: c.topic, QueueId: c.qid, Body: []byte("b")}})
		check("PutMessage", err)
		_, err = client.PutMessages(ctxT(t), &storagedv1.PutMessagesRequest{Topic: c.topic, QueueId: c.qid,
			Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}}})
		check("PutMessages", err)
		if err := stream.Send(&storagedv1.PutMessageStreamRequest{RequestId: uint64(i),
			Message: &storagedv1.Message{Topic: c.topic, QueueId: c.qid, Body: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if codes.Code(resp.GetCode()) != c.want.code || resp.GetReason() != c.want.reason {
			t.Errorf("stream %s/%d: code %v reason %q, want %v %q", c.topic, c.qid, codes.Code(resp.GetCode()), resp.GetReason(), c.want.code, c.want.reason)
		}
	}
	stream.CloseSend()
	if n := len(st.Stats().Schedule.Levels); n != 18 {
		t.Errorf("%d schedule levels", n)
	}

	t.Run("auto-create off", func(t *testing.T) {
		client, _, _ := storeServer(t, func(o *storage.Options) { o.NoAutoCreateTopics = true })
		_, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Unknown", Body: []byte("b")}})
		details(t, err).want(t, codes.NotFound, ReasonTopicNotExist, false)
	})
	t.Run("topic config not persisted", func(t *testing.T) {
		fs := vfs.NewMem()
		full := true
		fs.SetInjector(func(op vfs.Op, path string) error {
			if full && op == vfs.OpWriteFile && strings.Contains(path, "topics.json") {
				return vfs.ErrNoSpace
			}
			return nil
		})
		client, _, _ := storeServer(t, func(o *storage.Options) {
			o.Dir, o.FS = "/d", fs
			o.StatDisk = func(string) (storage.DiskUsage, error) { return storage.DiskUsage{Size: 100, Used: 10, Avail: 90}, nil }
		})
		req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "New", Body: []byte("b")}}
		_, err := client.PutMessage(ctxT(t), req)
		d := details(t, err)
		d.want(t, codes.Unavailable, "SERVICE_NOT_AVAILABLE", true)
		if d.info.GetMetadata()["cause"] != "TOPIC_CONFIG_NOT_PERSISTED" {
			t.Errorf("metadata %v", d.info.GetMetadata())
		}
		fs.SetInjector(nil)
		if _, err := client.PutMessage(ctxT(t), req); err != nil {
			t.Fatalf("after the disk cleared: %v", err)
		}
	})
}

// TestAdminServiceEndToEnd: every AdminService call and its error
// statuses through a real gRPC server.
func TestAdminServiceEndToEnd(t *testing.T) {
	client, st, _ := storeServer(t, func(o *storage.Options) { o.MaxTopics = 4 })
	admin := startAdmin(t, st)
	ctx := ctxT(t)

	created, err := admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: "Orders", QueueCount: 2})
	if err != nil || created.GetTopic().GetQueueCount() != 2 || len(created.GetTopic().GetQueues()) != 2 {
		t.Fatalf("CreateTopic: %v %v", created, err)
	}
	for _, c := range []struct {
		req    *storagedv1.CreateTopicRequest
		code   codes.Code
		reason string
	}{
		{&storagedv1.CreateTopicRequest{Name: "Orders", QueueCount: 2}, codes.AlreadyExists, ReasonTopicExist},
		{&storagedv1.CreateTopicRequest{Name: "X", QueueCount: 0}, codes.InvalidArgument, ReasonInvalidRequest},
		{&storagedv1.CreateTopicRequest{Name: "X", QueueCount: math.MaxInt32}, codes.InvalidArgument, ReasonInvalidRequest},
		{&storagedv1.CreateTopicRequest{Name: storage.ScheduleTopic, QueueCount: 1}, codes.InvalidArgument, ReasonInvalidRequest},
		{&storagedv1.CreateTopicRequest{Name: "a/b", QueueCount: 1}, codes.InvalidArgument, ReasonInvalidRequest},
	} {
		_, err := admin.CreateTopic(ctx, c.req)
		details(t, err).want(t, c.code, c.reason, false)
	}
	// A put to queue 2 of 2 is refused until UpdateTopic raises the count.
	put := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Orders", QueueId: 2, Body: []byte("b")}}
	_, err = client.PutMessage(ctx, put)
	details(t, err).want(t, codes.InvalidArgument, "MESSAGE_ILLEGAL", false)
	_, err = admin.UpdateTopic(ctx, &storagedv1.UpdateTopicRequest{Name: "Orders", QueueCount: 1})
	details(t, err).want(t, codes.FailedPrecondition, ReasonQueueCountLowered, false)
	_, err = admin.UpdateTopic(ctx, &storagedv1.UpdateTopicRequest{Name: "Nope", QueueCount: 1})
	details(t, err).want(t, codes.NotFound, ReasonTopicNotExist, false)
	if up, err := admin.UpdateTopic(ctx, &storagedv1.UpdateTopicRequest{Name: "Orders", QueueCount: 3}); err != nil || up.GetTopic().GetQueueCount() != 3 {
		t.Fatalf("UpdateTopic: %v %v", up, err)
	}
	if _, err := client.PutMessage(ctx, put); err != nil {
		t.Fatal(err)
	}
	waitQueue(t, client, "Orders", 2, 1)
	got, err := admin.GetTopic(ctx, &storagedv1.GetTopicRequest{Name: "Orders"})
	if err != nil || len(got.GetTopic().GetQueues()) != 3 || got.GetTopic().GetQueues()[2].GetMaxOffset() != 1 ||
		got.GetTopic().GetQueues()[2].GetQueueId() != 2 {
		t.Fatalf("GetTopic: %v %v", got, err)
	}
	_, err = admin.GetTopic(ctx, &storagedv1.GetTopicRequest{Name: "Nope"})
	details(t, err).want(t, codes.NotFound, ReasonTopicNotExist, false)

	for i := range 3 {
		if _, err := admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: fmt.Sprint("P", i), QueueCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: "Full", QueueCount: 1})
	d := details(t, err)
	d.want(t, codes.ResourceExhausted, ReasonTooManyTopics, false)
	if d.info.GetMetadata()["cause"] != "TOO_MANY_TOPICS" {
		t.Errorf("metadata %v", d.info.GetMetadata())
	}
	var names []string
	token := ""
	for {
		page, err := admin.ListTopics(ctx, &storagedv1.ListTopicsRequest{PageSize: 3, PageToken: token})
		if err != nil || len(page.GetTopics()) > 3 {
			t.Fatalf("ListTopics: %v %v", page, err)
		}
		for _, tp := range page.GetTopics() {
			names = append(names, tp.GetName())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if strings.Join(names, ",") != "Orders,P0,P1,P2" {
		t.Fatalf("listed %v", names)
	}
	_, err = admin.ListTopics(ctx, &storagedv1.ListTopicsRequest{PageToken: "../x"})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)

	_, err = admin.DeleteTopic(ctx, &storagedv1.DeleteTopicRequest{Name: storage.ScheduleTopic})
	details(t, err).want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
	_, err = admin.DeleteTopic(ctx, &storagedv1.DeleteTopicRequest{Name: "Nope"})
	details(t, err).want(t, codes.NotFound, ReasonTopicNotExist, false)
	del, err := admin.DeleteTopic(ctx, &storagedv1.DeleteTopicRequest{Name: "Orders"})
	if err != nil || del.GetDeletedAtOffset() <= 0 {
		t.Fatalf("DeleteTopic: %v %v", del, err)
	}
	_, err = client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "Orders", QueueId: 2})
	details(t, err).want(t, codes.NotFound, ReasonQueueNotFound, false)
	if _, err := admin.CreateTopic(ctx, &storagedv1.CreateTopicRequest{Name: "Full", QueueCount: 1}); err != nil {
		t.Fatalf("CreateTopic after a delete: %v", err)
	}

	t.Run("starting", func(t *testing.T) {
		admin := startAdmin(t, &DeferredAdminStore{})
		_, err := admin.GetTopic(ctxT(t), &storagedv1.GetTopicRequest{Name: "x"})
		details(t, err).want(t, codes.Unavailable, ReasonUnavailable, true)
	})
}

// groupAdminStore is an AdminStore whose topic changes fail with err (a
// replication group's refusals); embedding the interface leaves the other
// calls unimplemented (they are not called).
type groupAdminStore struct {
	AdminStore
	err error
}

func (g groupAdminStore) CreateTopic(string, int32) (storage.TopicConfig, error) {
	return storage.TopicConfig{}, g.err
}

func (g groupAdminStore) UpdateTopic(string, int32) (storage.TopicConfig, error) {
	return storage.TopicConfig{}, g.err
}

// TestAdminGroupRefusals: a replication group's refusals of a topic
// change reach the client: a follower's with the leader's id, a change
// not seen applied in time as an unknown outcome.
func TestAdminGroupRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		md   map[string]string
	}{
		{"follower", &storage.NotLeaderError{Cause: CauseNotLeader, LeaderID: 3, Term: 7}, codes.Unavailable,
			map[string]string{"cause": "NOT_LEADER", "leader_id": "3", "term": "7"}},
		{"timeout", fmt.Errorf("%w: %w", storage.ErrTopicConfig, storage.ErrTopicChangeTimeout), codes.DeadlineExceeded,
			map[string]string{"outcome": "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startAdmin(t, groupAdminStore{err: tc.err})
			_, err1 := c.CreateTopic(ctxT(t), &storagedv1.CreateTopicRequest{Name: "T", QueueCount: 8})
			_, err2 := c.UpdateTopic(ctxT(t), &storagedv1.UpdateTopicRequest{Name: "T", QueueCount: 9})
			for _, err := range []error{err1, err2} {
				d := details(t, err)
				if d.st.Code() != tc.code || d.info.GetReason() != ReasonUnavailable {
					t.Fatalf("%v %q (%q), want %v %s", d.st.Code(), d.info.GetReason(), d.st.Message(), tc.code, ReasonUnavailable)
				}
				for k, v := range tc.md {
					if got := d.info.GetMetadata()[k]; got != v {
						t.Errorf("metadata %s = %q, want %q (all %v)", k, got, v, d.info.GetMetadata())
					}
				}
			}
		})
	}
}
