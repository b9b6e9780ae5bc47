package server

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/vfs"
)

// TestTransientFaultHealthMetricsStatus: a background write hits ENOSPC
// (another process filled the disk for a moment): the checkpoint, a
// consume-queue write, the delay progress. Through the real gRPC server
// the service health turns NOT_SERVING, a put is refused with
// RESOURCE_EXHAUSTED + RetryInfo (cause DISK_FULL, nothing stored), the
// fault is counted in storaged_store_write_faults_total{source}; once space
// is back, health is SERVING again and puts are taken, with no restart,
// and every accepted message is readable. Before, the store stayed
// read-only until restarted.
func TestTransientFaultHealthMetricsStatus(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 1, 0, 0, 0, time.Local) // not in the DeleteWhen hour
	tests := []struct {
		source string
		op     vfs.Op
		path   string
		// trigger makes the component write; it returns the topic/queue
		// the message it put is read back from.
		trigger func(t *testing.T, c storagedv1.MessageStoreServiceClient, clock *alarmClock) (string, int32)
	}{
		{"checkpoint", vfs.OpWriteFile, "checkpoint", func(t *testing.T, c storagedv1.MessageStoreServiceClient, _ *alarmClock) (string, int32) {
			if err := putOne(t, c, "T"); err != nil { // the checkpoint after it fails
				t.Fatalf("put before the fault took effect: %v", err)
			}
			return "T", 0
		}},
		{"consume_queue", vfs.OpFileWrite, "consumequeue", func(t *testing.T, c storagedv1.MessageStoreServiceClient, _ *alarmClock) (string, int32) {
			if err := putOne(t, c, "T"); err != nil { // taken; its index entry fails
				t.Fatalf("put before the fault took effect: %v", err)
			}
			return "T", 0
		}},
		{"delay_progress", vfs.OpWriteFile, "delayOffset", func(t *testing.T, c storagedv1.MessageStoreServiceClient, clock *alarmClock) (string, int32) {
			if _, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
				Topic: "D", Body: []byte("delayed"), DelayLevel: 1}}); err != nil {
				t.Fatal(err)
			}
			waitQueue(t, c, storage.ScheduleTopic, 0, 1)
			clock.Set(t0.Add(2 * time.Second)) // due: delivered, then the progress persist fails
			return "D", 0
		}},
	}
	for _, tt := range tests {
		t.Run(tt.source, func(t *testing.T) {
			fs := vfs.NewMem()
			clock := newAlarmClock(t0)
			st, _ := openStore(t, func(o *storage.Options) {
				o.Dir, o.FS, o.CheckpointInterval = "/d", fs, 5*time.Millisecond
				o.Clock, o.StatDisk, o.DiskCheckInterval = clock, newFakeDisk(10).stat, 24*time.Hour
			})
			reg := prometheus.NewRegistry()
			reg.MustRegister(NewStoreCollector(st))
			base := serveMetrics(t, reg)
			srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{})
			conn := dial(t, srv.addr, nil)
			client := storagedv1.NewMessageStoreServiceClient(conn)
			hc := healthpb.NewHealthClient(conn)
			srv.WatchStore(st, time.Millisecond)
			watch, err := hc.Watch(ctxT(t), &healthpb.HealthCheckRequest{Service: ServiceName})
			if err != nil {
				t.Fatal(err)
			}
			recvUntil(t, watch, healthpb.HealthCheckResponse_SERVING)

			fs.SetInjector(func(op vfs.Op, path string) error {
				if op == tt.op && strings.Contains(path, tt.path) {
					return fmt.Errorf("write: %w", syscall.ENOSPC)
				}
				return nil
			})
			topic, qid := tt.trigger(t, client, clock)
			recvStatus(t, watch, healthpb.HealthCheckResponse_NOT_SERVING)

			d := details(t, putOne(t, client, "T"))
			d.want(t, codes.ResourceExhausted, storage.ServiceNotAvailable.String(), true)
			if d.info.GetMetadata()["cause"] != "DISK_FULL" {
				t.Errorf("ErrorInfo metadata %v, want cause DISK_FULL", d.info.GetMetadata())
			}
			mfs := scrape(t, base)
			if got := value(mfs, "storaged_store_write_faults_total", "source", tt.source); got < 1 {
				t.Errorf("storaged_store_write_faults_total{source=%s} = %v, want >= 1", tt.source, got)
			}
			if got := value(mfs, "storaged_store_write_fault_active", "source", tt.source); got != 1 {
				t.Errorf("storaged_store_write_fault_active{source=%s} = %v, want 1", tt.source, got)
			}
			if got := value(mfs, "storaged_store_writable"); got != 0 {
				t.Errorf("storaged_store_writable = %v during the fault, want 0", got)
			}

			fs.SetInjector(nil) // space freed
			recvStatus(t, watch, healthpb.HealthCheckResponse_SERVING)
			if err := putOne(t, client, "T"); err != nil {
				t.Fatalf("put after the fault cleared: %v", err)
			}
			mfs = scrape(t, base)
			if got := value(mfs, "storaged_store_write_fault_active", "source", tt.source); got != 0 {
				t.Errorf("storaged_store_write_fault_active{source=%s} = %v after recovery, want 0", tt.source, got)
			}
			waitQueue(t, client, topic, qid, 1) // the message accepted before the fault is readable
			if topic == "T" {
				waitQueue(t, client, "T", 0, 2)
			}
		})
	}
}

// recvUntil reads the health stream until it reports want.
func recvUntil(t *testing.T, w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for {
		resp, err := w.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if resp.GetStatus() == want {
			return
		}
	}
}
