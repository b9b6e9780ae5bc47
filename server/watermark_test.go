package server

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/vfs"
)

// callCounter counts calls and lets a test wait, without sleeping, until
// there have been at least n.
type callCounter struct {
	mu     sync.Mutex
	n      int
	called chan struct{} // closed and replaced at every call
}

func (c *callCounter) add() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.called != nil {
		close(c.called)
	}
	c.called = make(chan struct{})
}

func (c *callCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *callCounter) waitFor(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got := c.n
		if c.called == nil {
			c.called = make(chan struct{})
		}
		ch := c.called
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: %d calls after 10s, want %d", what, got, n)
		}
	}
}

// fakeDisk is a storage.Options.StatDisk (the store's disk seam) whose
// usage the test sets.
type fakeDisk struct {
	mu    sync.Mutex
	pct   float64
	calls callCounter
}

// fakeDiskSize is the size of the fake file system: usage in percent maps
// to whole bytes.
const fakeDiskSize = 1000

func newFakeDisk(pct float64) *fakeDisk { return &fakeDisk{pct: pct} }

func (d *fakeDisk) stat(string) (storage.DiskUsage, error) {
	d.mu.Lock()
	used := uint64(d.pct * fakeDiskSize / 100)
	d.calls.add() // under mu: a call counted after set reads the new usage
	d.mu.Unlock()
	return storage.DiskUsage{Size: fakeDiskSize, Used: used, Avail: fakeDiskSize - used}, nil
}

// set sets the usage and returns once the store has finished a disk check
// that read it: the first check counted after set reads it, and the store
// checks one at a time, so it has finished once the next one has started.
// The store must check on its own (a real clock and a short
// DiskCheckInterval).
func (d *fakeDisk) set(t *testing.T, pct float64) {
	t.Helper()
	d.mu.Lock()
	d.pct = pct
	want := d.calls.count() + 2
	d.mu.Unlock()
	d.calls.waitFor(t, want, "disk checks")
}

// polledStore is a real store whose Writable calls (one per WatchStore
// poll) are counted.
type polledStore struct {
	*storage.Store
	polls callCounter
}

func (p *polledStore) Writable() bool {
	p.polls.add()
	return p.Store.Writable()
}

// waitPolls returns once WatchStore has finished a poll that started after
// the call: the poll counted next reads the store after now, and has
// finished (status set) once the one after it has started.
func (p *polledStore) waitPolls(t *testing.T) {
	t.Helper()
	p.polls.waitFor(t, p.polls.count()+2, "WatchStore polls")
}

// watermarkOptions makes a store check its (fake) disk every millisecond.
func watermarkOptions(disk *fakeDisk) func(*storage.Options) {
	return func(o *storage.Options) {
		o.StatDisk = disk.stat
		o.DiskCheckInterval = time.Millisecond
	}
}

func putOne(t *testing.T, c storagedv1.MessageStoreServiceClient, topic string) error {
	t.Helper()
	_, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: topic, Body: []byte("x")}})
	return err
}

// TestHealthFollowsDiskWatermark watches the readiness health of a real
// store through the disk watermarks (with the hysteresis between them) and
// a sticky write error, as a load balancer would: NOT_SERVING above the
// warning watermark, still NOT_SERVING between the two, SERVING at the
// clean watermark, and NOT_SERVING for good after a failed sync, whatever
// the disk does afterwards.
func TestHealthFollowsDiskWatermark(t *testing.T) {
	disk := newFakeDisk(10)
	mem := vfs.NewMem()
	opts := storage.Options{Dir: "/data", FS: mem, FileSize: testFileSize, MaxMessageSize: testMaxMessageSize,
		StoreHost: testStoreHost, FlushMode: storage.FlushSync}
	watermarkOptions(disk)(&opts)
	st, err := storage.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); !errors.Is(err, storage.ErrWriteFailed) {
			t.Errorf("store.Close: %v, want the sticky write error", err)
		}
	})
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{})
	conn := dial(t, srv.addr, nil)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	hc := healthpb.NewHealthClient(conn)

	probe := &polledStore{Store: st}
	srv.WatchStore(probe, time.Millisecond)
	probe.waitPolls(t) // the watcher has set the status from the store
	w, err := hc.Watch(ctxT(t), &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	recvStatus(t, w, healthpb.HealthCheckResponse_SERVING)
	if err := putOne(t, client, "t"); err != nil {
		t.Fatalf("put at 10%%: %v", err)
	}

	disk.set(t, 95) // above the warning watermark (90)
	recvStatus(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	if err := putOne(t, client, "t"); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("put at 95%%: %v, want ResourceExhausted", err)
	}

	disk.set(t, 88) // between the watermarks: still refused
	probe.waitPolls(t)
	checkStatus(t, hc, ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if err := putOne(t, client, "t"); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("put at 88%%: %v, want ResourceExhausted", err)
	}

	disk.set(t, 85) // at the clean watermark: writes resume
	recvStatus(t, w, healthpb.HealthCheckResponse_SERVING)
	if err := putOne(t, client, "t"); err != nil {
		t.Fatalf("put at 85%%: %v", err)
	}

	// A failed sync: read-only until restart.
	mem.SetInjector(vfs.OnCall(vfs.OpSync, 1, errors.New("input/output error"), true))
	if err := putOne(t, client, "t"); err == nil {
		t.Fatal("sync-mode put with a failing sync succeeded")
	}
	recvStatus(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	polls := probe.polls.count() // final: the watcher has ended
	disk.set(t, 95)
	disk.set(t, 10)
	checkStatus(t, hc, ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if got := probe.polls.count(); got != polls {
		t.Errorf("WatchStore polled %d more times after the sticky write error", got-polls)
	}
	checkStatus(t, hc, "", healthpb.HealthCheckResponse_SERVING) // the process is alive
}

// TestPutRefusedAboveDiskWarning: above the warning watermark every put
// path answers RESOURCE_EXHAUSTED with reason SERVICE_NOT_AVAILABLE, cause
// DISK_FULL and a RetryInfo, nothing is stored, reads still work, and
// writes resume once usage is back at the clean watermark.
func TestPutRefusedAboveDiskWarning(t *testing.T) {
	disk := newFakeDisk(10)
	client, st, _ := storeServer(t, watermarkOptions(disk))
	ctx := ctxT(t)
	if err := putOne(t, client, "t"); err != nil {
		t.Fatal(err)
	}
	disk.set(t, 91)
	before := st.Stats().MaxOffset

	check := func(name string, err error) {
		t.Helper()
		d := details(t, err)
		d.want(t, codes.ResourceExhausted, "SERVICE_NOT_AVAILABLE", true)
		if got := d.info.GetMetadata()["cause"]; got != "DISK_FULL" {
			t.Errorf("%s: metadata cause %q, want DISK_FULL", name, got)
		}
	}
	_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("x")}})
	check("PutMessage", err)
	_, err = client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("x"), DelayLevel: 2}})
	check("delayed PutMessage", err)
	_, err = client.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{{Body: []byte("a")}, {Body: []byte("b")}}})
	check("PutMessages", err)

	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&storagedv1.PutMessageStreamRequest{RequestId: 1, Message: &storagedv1.Message{Topic: "t", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCode() != int32(codes.ResourceExhausted) || resp.GetReason() != "SERVICE_NOT_AVAILABLE" {
		t.Errorf("stream answer code %d reason %q, want %d SERVICE_NOT_AVAILABLE", resp.GetCode(), resp.GetReason(), codes.ResourceExhausted)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err == nil {
		t.Error("stream: a second answer")
	}

	if got := st.Stats().MaxOffset; got != before {
		t.Errorf("refused puts moved the log from %d to %d", before, got)
	}
	if _, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "t"}); err != nil {
		t.Errorf("read while the disk is full: %v", err)
	}

	disk.set(t, 85)
	if err := putOne(t, client, "t"); err != nil {
		t.Errorf("put once back at the clean watermark: %v", err)
	}
}

// TestMetricsDiskRetentionSchedule: /metrics shows the store's disk check,
// retention counters and one series per delay level, as storage.Stats
// reports them.
func TestMetricsDiskRetentionSchedule(t *testing.T) {
	disk := newFakeDisk(10)
	st, _ := openStore(t, watermarkOptions(disk))
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st))
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	base := serveMetrics(t, reg)
	ctx := ctxT(t)

	// A message two hours away (level 18) on a real clock: pending, not due.
	resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "later", Body: []byte("x"), DelayLevel: 18}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetResult().GetQueueId() != 17 {
		t.Fatalf("delayed put answered queue %d, want 17", resp.GetResult().GetQueueId())
	}
	waitQueue(t, client, storage.ScheduleTopic, 17, 1)
	disk.set(t, 10)

	mfs := scrape(t, base)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"storaged_schedule_pending_messages", []string{"level", "18"}, 1},
		{"storaged_schedule_pending_messages", []string{"level", "1"}, 0},
		{"storaged_schedule_lag_seconds", []string{"level", "18"}, 0},
		{"storaged_schedule_delivered_total", []string{"level", "18"}, 0},
		{"storaged_schedule_skipped_total", nil, 0},
		{"storaged_schedule_refused_total", nil, 0},
		{"storaged_retention_deleted_files_total", nil, 0},
		{"storaged_retention_deleted_bytes_total", nil, 0},
		{"storaged_retention_trimmed_queue_files_total", nil, 0},
		{"storaged_store_disk_size_bytes", nil, fakeDiskSize},
		{"storaged_store_disk_free_bytes", nil, 900},
		{"storaged_store_disk_used_bytes", nil, 100},
		{"storaged_store_disk_used_percent", nil, 10},
		{"storaged_store_disk_full", nil, 0},
		{"storaged_store_writable", nil, 1},
	} {
		if got := value(mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"storaged_schedule_pending_messages", "storaged_schedule_lag_seconds", "storaged_schedule_delivered_total"} {
		if n := len(mfs[name].GetMetric()); n != 18 {
			t.Errorf("%s: %d series, want one per delay level (18)", name, n)
		}
	}

	disk.set(t, 95)
	mfs = scrape(t, base)
	for name, want := range map[string]float64{
		"storaged_store_disk_used_percent": 95,
		"storaged_store_disk_free_bytes":   50,
		"storaged_store_disk_full":         1,
		"storaged_store_writable":          0,
	} {
		if got := value(mfs, name); got != want {
			t.Errorf("above the warning watermark: %s = %v, want %v", name, got, want)
		}
	}
}

// waitQueue long-polls topic/queueID until it holds at least n messages
// (they are visible: dispatched).
func waitQueue(t *testing.T, c storagedv1.MessageStoreServiceClient, topic string, queueID int32, n int64) {
	t.Helper()
	off := int64(0)
	for off < n {
		resp, err := c.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: topic, QueueId: queueID, QueueOffset: off,
			Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatalf("pull %s/%d at %d: %v", topic, queueID, off, err)
		}
		if len(resp.GetMessages()) == 0 {
			t.Fatalf("pull %s/%d at %d: nothing after the long poll", topic, queueID, off)
		}
		off = resp.GetNextOffset()
	}
}
