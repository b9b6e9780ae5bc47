package server

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// serveMetrics serves MetricsHandler(reg) on 127.0.0.1:0 until the test ends.
func serveMetrics(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: MetricsHandler(reg, true)}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(lis) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("metrics server: %v", err)
		}
	})
	return "http://" + lis.Addr().String()
}

func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(get(t, base+"/metrics")))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// value returns the value of the series of name whose labels include
// labels: counter, gauge, or a histogram's sample count. Missing → -1.
func value(mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf := mfs[name]
	if mf == nil {
		return -1
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// TestMetricsEndpoint: /metrics exposes the gRPC and store metrics, and the
// counters move after puts.
func TestMetricsEndpoint(t *testing.T) {
	st, _ := openStore(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st))
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{Registerer: reg})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	base := serveMetrics(t, reg)

	before := scrape(t, base)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"storaged_store_puts_total", []string{"status", "PUT_OK"}, 0},
		{"storaged_store_puts_total", []string{"status", "WHEEL_TIMER_NOT_ENABLE"}, 0},
		{"storaged_store_flush_wait_seconds", nil, 0},
		{"storaged_commitlog_flush_lag_bytes", nil, 0},
		{"storaged_dispatch_lag_bytes", nil, 0},
		{"storaged_recovery_torn_tails_total", nil, 0},
		{"storaged_store_writable", nil, 1},
	} {
		if got := value(before, c.name, c.labels...); got != c.want {
			t.Errorf("before: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := value(before, "grpc_server_handled_total", "grpc_method", "PutMessage", "grpc_code", "OK"); got != 0 {
		t.Errorf("before: grpc_server_handled_total{PutMessage,OK} = %v, want 0 (initialized)", got)
	}

	ctx := ctxT(t)
	for range 3 {
		if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "m", Body: []byte("hello")}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "m", Messages: []*storagedv1.BatchEntry{
		{Body: []byte("a")}, {Body: []byte("b")},
	}}); err != nil {
		t.Fatal(err)
	}
	// A keyed put and its retry: stored once, the retry counted as a dedup
	// hit only.
	for range 2 {
		if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "m", Body: []byte("keyed"),
			Properties: map[string]string{"UNIQ_KEY": "0A0B0C0D0E0F00000000000000000001"}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Refused by the store (body above its limit): counted as MESSAGE_ILLEGAL.
	_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "m", Body: make([]byte, testMaxMessageSize+1)}})
	if codeOf(err) != codes.InvalidArgument {
		t.Fatalf("oversized put: %v", err)
	}

	after := scrape(t, base)
	s := st.Stats()
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"storaged_store_puts_total", []string{"status", "PUT_OK"}, 5},
		{"storaged_store_messages_total", []string{"status", "PUT_OK"}, 6},
		{"storaged_store_bytes_total", []string{"status", "PUT_OK"}, float64(s.MaxOffset)},
		{"storaged_store_puts_total", []string{"status", "MESSAGE_ILLEGAL"}, 1},
		{"storaged_store_puts_total", []string{"status", "FLUSH_DISK_TIMEOUT"}, 0},
		{"storaged_store_flush_wait_seconds", nil, 5},
		{"storaged_store_append_duration_seconds", nil, 5},
		{"storaged_commitlog_max_offset_bytes", nil, float64(s.MaxOffset)},
		{"storaged_commitlog_flushed_offset_bytes", nil, float64(s.MaxOffset)}, // sync mode: acked means flushed
		{"storaged_commitlog_flush_lag_bytes", nil, 0},
		{"storaged_commitlog_min_offset_bytes", nil, 0},
		{"storaged_commitlog_files", nil, 1},
		{"storaged_store_writable", nil, 1},
		{"grpc_server_handled_total", []string{"grpc_method", "PutMessage", "grpc_code", "OK"}, 5},
		{"grpc_server_handled_total", []string{"grpc_method", "PutMessages", "grpc_code", "OK"}, 1},
		{"grpc_server_handled_total", []string{"grpc_method", "PutMessage", "grpc_code", "InvalidArgument"}, 1},
		{"grpc_server_handling_seconds", []string{"grpc_method", "PutMessage"}, 6},
		{"storaged_dedup_hits_total", nil, 1},
		{"storaged_dedup_keys", nil, 1},
		{"storaged_dedup_messages", nil, 1},
		{"storaged_dedup_evicted_total", nil, 0},
	}
	for _, c := range checks {
		if got := value(after, c.name, c.labels...); got != c.want {
			t.Errorf("after: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := value(after, "storaged_store_sync_duration_seconds"); got < 1 {
		t.Errorf("sync histogram count %v, want >= 1 in sync mode", got)
	}
	if !strings.Contains(get(t, base+"/debug/pprof/"), "goroutine") {
		t.Error("/debug/pprof/ index does not list profiles")
	}
}

// TestConstHistogram: bucket bounds are the snapshot's exclusive upper
// bounds, cumulative, with the last (unbounded) bucket only in the count.
func TestConstHistogram(t *testing.T) {
	desc := prometheus.NewDesc("h", "h", nil, nil)
	snap := storage.HistogramSnapshot{
		Bounds: []time.Duration{time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond},
		Counts: []uint64{1, 2, 5},
		Sum:    9 * time.Microsecond,
	}
	var m dto.Metric
	if err := constHistogram(desc, snap).Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 8 || h.GetSampleSum() != 9e-6 {
		t.Errorf("count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
	}
	want := map[float64]uint64{1e-6: 1, 2e-6: 3}
	if len(h.GetBucket()) != len(want) {
		t.Fatalf("buckets %v", h.GetBucket())
	}
	for _, b := range h.GetBucket() {
		if want[b.GetUpperBound()] != b.GetCumulativeCount() {
			t.Errorf("bucket le=%v count %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want[b.GetUpperBound()])
		}
	}
}
