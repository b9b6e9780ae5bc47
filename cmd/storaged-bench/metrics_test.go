package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// goldenExposition is storaged's /metrics after 2,599 sync-mode puts
// (storaged --flush-mode sync, storaged-bench --method unary
// --concurrency 4 --duration 2s), as the text format serves it.
const goldenExposition = "testdata/storaged-metrics.txt"

// serveExposition serves body with content type ct on every request.
func serveExposition(t *testing.T, ct string, body []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ct)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// allSeries scrapes url into series (model.Metric.String()) → value.
func allSeries(t *testing.T, srv *httptest.Server) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	err := scrapeSeries(context.Background(), srv.Client(), srv.URL, func(m model.Metric, v float64) {
		k := m.String()
		if _, dup := out[k]; dup {
			t.Errorf("series %s twice", k)
		}
		out[k] = v
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestScrapeGoldenExposition: what the matrix and the limits read from a
// real storaged exposition (heap gauge, flusher histograms' _sum and
// _count, the gRPC counters), served as text and as delimited protobuf
// (promhttp's two formats), and every sample of the file decoded.
func TestScrapeGoldenExposition(t *testing.T) {
	text, err := os.ReadFile(goldenExposition)
	if err != nil {
		t.Fatal(err)
	}
	samples := 0
	for line := range strings.Lines(string(text)) {
		if line != "\n" && !strings.HasPrefix(line, "#") {
			samples++
		}
	}
	// The same families as delimited protobuf, encoded by expfmt.
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	var proto bytes.Buffer
	enc := expfmt.NewEncoder(&proto, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		if err := enc.Encode(fams[name]); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{
		heapMetric:          6.545408e+06,
		syncSecondsSum:      1.139090548,
		syncSecondsCount:    902,
		flushWaitSecondsSum: 5.313739366,
		flushWaitCount:      2599,
	}
	var bySeries []map[string]float64
	for _, tc := range []struct {
		name, ct string
		body     []byte
	}{
		{"text", string(expfmt.NewFormat(expfmt.TypeTextPlain)), text},
		{"protobuf", string(expfmt.NewFormat(expfmt.TypeProtoDelim)), proto.Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := serveExposition(t, tc.ct, tc.body)
			got, err := scrapeMetrics(context.Background(), srv.Client(), srv.URL, slices.Collect(maps.Keys(want))...)
			if err != nil || !maps.Equal(got, want) {
				t.Errorf("scrapeMetrics = %v, %v; want %v", got, err, want)
			}
			h := newHeapWatch()
			defer h.close()
			if v, err := h.sample(context.Background(), srv.URL, true); err != nil || v != 6545408 || h.max.Load() != 6545408 {
				t.Errorf("heap sample = %d (max %d), %v", v, h.max.Load(), err)
			}
			if n, err := inflightCalls(context.Background(), srv.Client(), srv.URL, "PutMessage"); err != nil || n != 0 {
				t.Errorf("inflightCalls(PutMessage) = %d, %v; want 2599 - 2599", n, err)
			}
			all := allSeries(t, srv)
			if len(all) != samples {
				t.Errorf("%d series decoded, the file has %d samples", len(all), samples)
			}
			k := `grpc_server_handled_total{grpc_code="OK", grpc_method="PutMessage", grpc_service="storaged.v1.MessageStoreService", grpc_type="unary"}`
			if all[k] != 2599 {
				t.Errorf("%s = %v, want 2599", k, all[k])
			}
			bySeries = append(bySeries, all)
		})
	}
	if len(bySeries) == 2 && !maps.Equal(bySeries[0], bySeries[1]) {
		t.Error("text and protobuf decode to different series")
	}
}

// TestDecodeSamples: what the line splitter this replaced got wrong or
// could not read (a timestamp after the value, a quote or a brace in a
// label value) and malformed expositions, which are errors.
func TestDecodeSamples(t *testing.T) {
	text := `# TYPE storaged_store_flush_wait_seconds histogram
storaged_store_flush_wait_seconds_bucket{le="0.001"} 3
storaged_store_flush_wait_seconds_bucket{le="+Inf"} 7
storaged_store_flush_wait_seconds_sum 0.25
storaged_store_flush_wait_seconds_count 7
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.5e+07 1733000000000
go_memstats_heap_inuse_bytes_other{note="a } b \" c"} 9
`
	got := map[string]float64{}
	err := decodeSamples(strings.NewReader(text), expfmt.NewFormat(expfmt.TypeTextPlain), func(m model.Metric, v float64) {
		got[m.String()] = v
	})
	want := map[string]float64{
		`storaged_store_flush_wait_seconds_bucket{le="0.001"}`:  3,
		`storaged_store_flush_wait_seconds_bucket{le="+Inf"}`:   7,
		`storaged_store_flush_wait_seconds_sum`:                 0.25,
		`storaged_store_flush_wait_seconds_count`:               7,
		`go_memstats_heap_inuse_bytes`:                          1.5e7,
		`go_memstats_heap_inuse_bytes_other{note="a } b \" c"}`: 9,
	}
	if err != nil || !maps.Equal(got, want) {
		t.Errorf("decodeSamples = %v, %v\nwant %v", got, err, want)
	}
	srv := serveExposition(t, string(expfmt.NewFormat(expfmt.TypeTextPlain)), []byte(text))
	m, err := scrapeMetrics(context.Background(), srv.Client(), srv.URL, heapMetric, flushWaitCount, "storaged_store_flush_wait_seconds_bucket")
	// A labelled series is not the unlabelled metric of its name.
	if w := map[string]float64{heapMetric: 1.5e7, flushWaitCount: 7}; err != nil || !maps.Equal(m, w) {
		t.Errorf("scrapeMetrics = %v, %v; want %v", m, err, w)
	}

	for _, bad := range []string{
		"go_memstats_heap_inuse_bytes abc\n",
		"go_memstats_heap_inuse_bytes{le=} 1\n",
		"# TYPE x gauge\n# TYPE x counter\nx 1\n",
		"go_memstats_heap_inuse_bytes 1", // no final newline
	} {
		err := decodeSamples(strings.NewReader(bad), expfmt.NewFormat(expfmt.TypeTextPlain), func(model.Metric, float64) {})
		if err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for _, tc := range []struct {
		status int
		body   string
	}{{http.StatusInternalServerError, "x 1\n"}, {http.StatusOK, "x{ 1\n"}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(tc.status)
			fmt.Fprint(w, tc.body)
		}))
		if _, err := scrapeGauge(context.Background(), srv.Client(), srv.URL, "x"); err == nil {
			t.Errorf("status %d, %q: no error", tc.status, tc.body)
		}
		srv.Close()
	}
}
