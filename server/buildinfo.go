package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/storaged/storaged/internal/buildinfo"
)

// NewBuildInfoCollector returns the storaged_build_info gauge: always 1,
// its labels say which build runs, so a query can join any series with
// the version (`... * on(instance) group_left(version) storaged_build_info`)
// and a rollout shows as two versions side by side. go_build_info (from
// collectors.NewBuildInfoCollector) reads only the go command's record,
// which is "(devel)" for a binary stamped with -ldflags -X; this one reads
// buildinfo.Get, which prefers the stamp.
func NewBuildInfoCollector(info buildinfo.Info) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "storaged_build_info",
		Help: "Always 1; the labels name the running build: version, source revision, Go toolchain.",
		ConstLabels: prometheus.Labels{
			"version":   info.Version,
			"revision":  info.Revision,
			"goversion": info.GoVersion,
		},
	}, func() float64 { return 1 })
}
