// Package metricstest reads a real process's Prometheus page in tests:
// one GET of /metrics, parsed with the exposition format's own parser.
// Only tests import it.
package metricstest

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape GETs http://addr/metrics (addr: a --metrics-listen address) and
// returns its families by name, and the page for failure messages. Any
// error fails t.
func Scrape(t testing.TB, addr string) (map[string]*dto.MetricFamily, []byte) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %v", addr, resp.StatusCode, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", addr, err)
	}
	return mfs, body
}
