package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/storaged/storaged/internal/buildinfo"
)

// TestBuildInfoMetric scrapes the gauge through MetricsHandler, the way
// Prometheus sees it: one gauge series, the three labels, the value 1.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewBuildInfoCollector(buildinfo.Info{Version: "v1.2.3", Revision: "abc-modified", GoVersion: "go1.26.8"}))
	mf := scrape(t, serveMetrics(t, reg))["storaged_build_info"]
	if mf == nil || mf.GetType() != dto.MetricType_GAUGE || len(mf.GetMetric()) != 1 {
		t.Fatalf("storaged_build_info = %v, want one gauge series", mf)
	}
	m := mf.GetMetric()[0]
	got := map[string]string{}
	for _, lp := range m.GetLabel() {
		got[lp.GetName()] = lp.GetValue()
	}
	want := map[string]string{"version": "v1.2.3", "revision": "abc-modified", "goversion": "go1.26.8"}
	if len(got) != len(want) {
		t.Errorf("labels = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q", k, got[k], v)
		}
	}
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("value = %v, want 1", v)
	}
}
