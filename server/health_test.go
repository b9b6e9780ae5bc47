package server

import (
	"errors"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// writeErrStore is a StoreHealth whose sticky write error the test sets;
// its disk is never full.
type writeErrStore struct{ err atomic.Pointer[error] }

func (w *writeErrStore) WriteErr() error {
	if p := w.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (w *writeErrStore) Writable() bool       { return w.WriteErr() == nil }
func (w *writeErrStore) Stats() storage.Stats { return storage.Stats{} }

func recvStatus(t *testing.T, w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	resp, err := w.Recv()
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	if resp.GetStatus() != want {
		t.Fatalf("watch: status %v, want %v", resp.GetStatus(), want)
	}
}

func checkStatus(t *testing.T, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("check %q: %v", service, err)
	}
	if resp.GetStatus() != want {
		t.Fatalf("check %q: %v, want %v", service, resp.GetStatus(), want)
	}
}

// TestHealthTransitions walks the service health through start (NOT_SERVING
// until the store is open), open (SERVING), read-only (NOT_SERVING through
// WatchStore) and shutdown (everything NOT_SERVING), watching it as a load
// balancer would.
func TestHealthTransitions(t *testing.T) {
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerologNop()), GRPCConfig{})
	hc := healthpb.NewHealthClient(dial(t, srv.addr, nil))
	ctx := ctxT(t)

	checkStatus(t, hc, "", healthpb.HealthCheckResponse_SERVING)
	checkStatus(t, hc, ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); codeOf(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}

	svcWatch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	recvStatus(t, svcWatch, healthpb.HealthCheckResponse_NOT_SERVING)
	srv.SetServing(true)
	recvStatus(t, svcWatch, healthpb.HealthCheckResponse_SERVING)

	// The store turns read-only: the watcher flips the service.
	var ro writeErrStore
	srv.WatchStore(&ro, time.Millisecond)
	ro.err.Store(&errTest)
	recvStatus(t, svcWatch, healthpb.HealthCheckResponse_NOT_SERVING)
	checkStatus(t, hc, "", healthpb.HealthCheckResponse_SERVING) // the process is alive

	// Shutdown: everything NOT_SERVING first. The open Watch streams never
	// end on their own, so the bounded GracefulStop falls back to Stop.
	allWatch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatal(err)
	}
	recvStatus(t, allWatch, healthpb.HealthCheckResponse_SERVING)
	graceful := make(chan bool, 1)
	go func() { graceful <- srv.Shutdown(200 * time.Millisecond) }()
	recvStatus(t, allWatch, healthpb.HealthCheckResponse_NOT_SERVING)
	if <-graceful {
		t.Error("Shutdown reported a graceful stop although Watch streams were open")
	}
	if _, err := allWatch.Recv(); err == nil {
		t.Error("watch stream still open after Shutdown")
	}
}

// TestWatchStoreStopsOnShutdown: Shutdown ends the watcher goroutine of a
// healthy store (goleak checks nothing is left behind) and a later watcher
// ends at once.
func TestWatchStoreStopsOnShutdown(t *testing.T) {
	srv := startServer(t, New(&fakeStore{}, zerologNop()), GRPCConfig{})
	srv.WatchStore(&writeErrStore{}, time.Millisecond)
	srv.WatchStore(&writeErrStore{}, time.Hour)
	if !srv.Shutdown(5 * time.Second) {
		t.Error("Shutdown was not graceful")
	}
}

// TestShutdownGraceful: without open streams the drain is graceful, and
// later calls are refused with UNAVAILABLE (nothing stored). The cleanup's
// second Shutdown is harmless.
func TestShutdownGraceful(t *testing.T) {
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerologNop()), GRPCConfig{})
	c := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	if _, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if !srv.Shutdown(5 * time.Second) {
		t.Error("Shutdown without open streams was not graceful")
	}
	if _, err := c.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}}); codeOf(err) != codes.Unavailable {
		t.Errorf("put after Shutdown: %v, want Unavailable", err)
	}
}

func TestReflection(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		srv := startServer(t, New(&fakeStore{}, zerologNop()), GRPCConfig{Reflection: enabled})
		rc := reflectionpb.NewServerReflectionClient(dial(t, srv.addr, nil))
		stream, err := rc.ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		// With reflection disabled the server may answer Unimplemented and
		// end the stream before the request is sent: Send then returns
		// io.EOF and the status comes from Recv (grpc.ClientStream.SendMsg).
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
		}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if !enabled {
			if codeOf(err) != codes.Unimplemented {
				t.Errorf("reflection disabled: %v, want Unimplemented", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		for _, want := range []string{ServiceName, "grpc.health.v1.Health"} {
			if !slices.Contains(names, want) {
				t.Errorf("reflection lists %v, missing %s", names, want)
			}
		}
		// grpcurl describes the service through its file descriptor.
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: ServiceName},
		}); err != nil {
			t.Fatal(err)
		}
		fd, err := stream.Recv()
		if err != nil || len(fd.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
			t.Errorf("file containing %s: %v %v", ServiceName, fd, err)
		}
		stream.CloseSend()
	}
}
