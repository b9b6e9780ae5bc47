package server

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/storaged/storaged/storage"
)

// diskStore is a StoreHealth whose disk the test fills and empties.
type diskStore struct{ full atomic.Bool }

func (d *diskStore) WriteErr() error { return nil }
func (d *diskStore) Writable() bool  { return !d.full.Load() }
func (d *diskStore) Stats() storage.Stats {
	return storage.Stats{Disk: storage.DiskStats{Full: d.full.Load(), UsedPercent: 95}}
}

// serveHealthHTTP serves srv's HealthHandler on a real loopback listener,
// the way cmd/storaged mounts it on the metrics port, and returns its base
// URL.
func serveHealthHTTP(t *testing.T, srv *testServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(LivezPath, srv.HealthHandler())
	mux.Handle(ReadyzPath, srv.HealthHandler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(lis) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("http Serve: %v", err)
		}
	})
	return "http://" + lis.Addr().String()
}

// httpGet returns the status code and body of a request to url.
func httpGet(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if cc := resp.Header.Get("Cache-Control"); resp.StatusCode != http.StatusNotFound && cc != "no-store" {
		t.Errorf("%s %s: Cache-Control %q, want no-store", method, url, cc)
	}
	return resp.StatusCode, string(body)
}

// TestHTTPHealthMirrorsGRPCHealth walks a real server through start,
// serving, disk full (and back), read-only and shutdown, and checks at every
// step that /livez and /readyz over real HTTP answer what grpc.health.v1
// answers for "" and ServiceName.
func TestHTTPHealthMirrorsGRPCHealth(t *testing.T) {
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerologNop()), GRPCConfig{})
	base := serveHealthHTTP(t, srv)
	hc := healthpb.NewHealthClient(dial(t, srv.addr, nil))
	watchCtx, stopWatch := contextWithCancel(t)
	watch, err := hc.Watch(watchCtx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		t.Fatal(err)
	}

	const serving, notServing = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	grpcUp := true // after Shutdown only the HTTP side can be asked
	expect := func(step string, live, ready healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, c := range []struct {
			path, service string
			want          healthpb.HealthCheckResponse_ServingStatus
		}{{LivezPath, "", live}, {ReadyzPath, ServiceName, ready}} {
			if grpcUp {
				checkStatus(t, hc, c.service, c.want) // the gRPC answer the HTTP one must equal
			}
			code, body := httpGet(t, http.MethodGet, base+c.path)
			wantCode := http.StatusServiceUnavailable
			if c.want == serving {
				wantCode = http.StatusOK
			}
			if code != wantCode || body != c.want.String()+"\n" {
				t.Errorf("%s: GET %s = %d %q, want %d %q", step, c.path, code, body, wantCode, c.want.String()+"\n")
			}
			if code, body := httpGet(t, http.MethodHead, base+c.path); code != wantCode || body != "" {
				t.Errorf("%s: HEAD %s = %d %q, want %d and no body", step, c.path, code, body, wantCode)
			}
		}
	}

	recvStatus(t, watch, notServing)
	expect("before the store is open", serving, notServing)

	srv.SetServing(true)
	recvStatus(t, watch, serving)
	expect("serving", serving, serving)

	// Disk above the warning watermark: not ready for writes, alive; and
	// ready again once usage is back down.
	var disk diskStore
	disk.full.Store(true)
	srv.WatchStore(&disk, time.Millisecond)
	recvStatus(t, watch, notServing)
	expect("disk full", serving, notServing)
	disk.full.Store(false)
	recvStatus(t, watch, serving)
	expect("disk back under the watermark", serving, serving)

	// Read-only after a failed sync: not ready until restart, alive.
	var ro writeErrStore
	srv.WatchStore(&ro, time.Millisecond)
	ro.err.Store(&errTest)
	recvStatus(t, watch, notServing)
	expect("read-only", serving, notServing)

	stopWatch() // an open Watch stream would hold the graceful stop until its timeout
	if !srv.Shutdown(5 * time.Second) {
		t.Error("Shutdown was not graceful")
	}
	grpcUp = false
	expect("after shutdown", notServing, notServing)
}

// TestHTTPHealthRequests covers what the endpoints refuse: other methods,
// other paths; and that a query string changes nothing.
func TestHTTPHealthRequests(t *testing.T) {
	srv := startServer(t, New(&fakeStore{}, zerologNop()), GRPCConfig{})
	srv.SetServing(true)
	base := serveHealthHTTP(t, srv)
	for _, c := range []struct {
		method, path string
		wantCode     int
	}{
		{http.MethodGet, LivezPath, http.StatusOK},
		{http.MethodGet, ReadyzPath + "?writes=1&verbose", http.StatusOK},
		{http.MethodPost, ReadyzPath, http.StatusMethodNotAllowed},
		{http.MethodPut, LivezPath, http.StatusMethodNotAllowed},
		{http.MethodGet, ReadyzPath + "/extra", http.StatusNotFound},
	} {
		if code, _ := httpGet(t, c.method, base+c.path); code != c.wantCode {
			t.Errorf("%s %s = %d, want %d", c.method, c.path, code, c.wantCode)
		}
	}
	// The handler alone (not behind the mux) refuses paths it does not own.
	rec := httptest.NewRecorder()
	srv.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("handler on /metrics: %d, want 404", rec.Code)
	}
}
