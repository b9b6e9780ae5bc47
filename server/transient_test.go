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

// TestTransientFaultHealthMetricsStatus: the checkpoint write hits ENOSPC
// (another process filled the disk for a moment). Through the real gRPC
// server the service health turns NOT_SERVING, a put is refused with
// RESOURCE_EXHAUSTED + RetryInfo (cause DISK_FULL, nothing stored), the
// fault is counted in storaged_store_write_faults_total{source="checkpoint"};
// once space is back, health is SERVING again and puts are taken, with no
// restart. Before, the store stayed read-only until restarted.
func TestTransientFaultHealthMetricsStatus(t *testing.T) {
	fs := vfs.NewMem()
	st, _ := openStore(t, func(o *storage.Options) {
		o.Dir, o.FS, o.CheckpointInterval = "/d", fs, 5*time.Millisecond
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
		if op == vfs.OpWriteFile && strings.Contains(path, "checkpoint") {
			return fmt.Errorf("write: %w", syscall.ENOSPC)
		}
		return nil
	})
	if err := putOne(t, client, "T"); err != nil { // the checkpoint after it fails
		t.Fatalf("put before the fault took effect: %v", err)
	}
	recvStatus(t, watch, healthpb.HealthCheckResponse_NOT_SERVING)

	d := details(t, putOne(t, client, "T"))
	d.want(t, codes.ResourceExhausted, storage.ServiceNotAvailable.String(), true)
	if d.info.GetMetadata()["cause"] != "DISK_FULL" {
		t.Errorf("ErrorInfo metadata %v, want cause DISK_FULL", d.info.GetMetadata())
	}
	mfs := scrape(t, base)
	if got := value(mfs, "storaged_store_write_faults_total", "source", "checkpoint"); got < 1 {
		t.Errorf("storaged_store_write_faults_total{source=checkpoint} = %v, want >= 1", got)
	}
	if got := value(mfs, "storaged_store_write_fault_active", "source", "checkpoint"); got != 1 {
		t.Errorf("storaged_store_write_fault_active{source=checkpoint} = %v, want 1", got)
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
	if got := value(mfs, "storaged_store_write_fault_active", "source", "checkpoint"); got != 0 {
		t.Errorf("storaged_store_write_fault_active{source=checkpoint} = %v after recovery, want 0", got)
	}
	waitQueue(t, client, "T", 0, 2) // both accepted puts are readable
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
