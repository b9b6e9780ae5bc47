package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// heapMetric is the Go collector's gauge of heap bytes in in-use spans.
const heapMetric = "go_memstats_heap_inuse_bytes"

// heapWatch keeps the largest server heap seen during the measured phase.
// Its HTTP client keeps one connection to the metrics server alive between
// samples; close drops it.
type heapWatch struct {
	max    atomic.Int64
	client http.Client
}

func newHeapWatch() *heapWatch {
	return &heapWatch{client: http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
}

func (h *heapWatch) close() { h.client.CloseIdleConnections() }

// sample reads the heap gauge from the Prometheus endpoint url and, when
// measured, folds it into the maximum.
func (h *heapWatch) sample(ctx context.Context, url string, measured bool) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancel()
	v, err := scrapeGauge(ctx, &h.client, url, heapMetric)
	if err != nil {
		return 0, err
	}
	if measured {
		for {
			cur := h.max.Load()
			if v <= cur || h.max.CompareAndSwap(cur, v) {
				break
			}
		}
	}
	return v, nil
}

// scrapeGauge returns the value of the unlabelled metric name from a
// Prometheus text exposition at url.
func scrapeGauge(ctx context.Context, client *http.Client, url, name string) (int64, error) {
	m, err := scrapeMetrics(ctx, client, url, name)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("%s not found at %s", name, url)
	}
	return int64(v), nil
}

// scrapeMetrics returns the values of the unlabelled metrics names (a
// gauge, a counter, a histogram's _sum or _count) found at url.
func scrapeMetrics(ctx context.Context, client *http.Client, url string, names ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	err := scrapeSeries(ctx, client, url, func(m model.Metric, v float64) {
		name := string(m[model.MetricNameLabel])
		if len(m) == 1 && slices.Contains(names, name) {
			out[name] = v
		}
	})
	return out, err
}

// maxExposition bounds what scrapeSeries reads of one exposition; storaged's
// is ~60 KiB.
const maxExposition = 16 << 20

// scrapeSeries calls f with every sample of the Prometheus exposition at
// url, as prometheus/common/expfmt decodes it (text or protobuf, as the
// server answers): the series (its __name__ and labels; a histogram's
// samples are name_bucket{le=…}, name_sum and name_count) and its value.
func scrapeSeries(ctx context.Context, client *http.Client, url string, f func(m model.Metric, v float64)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return decodeSamples(io.LimitReader(resp.Body, maxExposition), expfmt.ResponseFormat(resp.Header), f)
}

// decodeSamples calls f with every sample of the exposition r in format.
func decodeSamples(r io.Reader, format expfmt.Format, f func(m model.Metric, v float64)) error {
	dec := expfmt.SampleDecoder{Dec: expfmt.NewDecoder(r, format), Opts: &expfmt.DecodeOptions{}}
	for {
		var vec model.Vector
		err := dec.Decode(&vec)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("metrics exposition: %w", err)
		}
		for _, s := range vec {
			f(s.Metric, float64(s.Value))
		}
	}
}

// inflightCalls is the number of calls of the gRPC method (e.g.
// "PullMessages") the server has started and not yet answered: the
// go-grpc-middleware counters grpc_server_started_total minus
// grpc_server_handled_total, summed over their other labels.
func inflightCalls(ctx context.Context, client *http.Client, url, method string) (int64, error) {
	var started, handled float64
	err := scrapeSeries(ctx, client, url, func(m model.Metric, v float64) {
		if string(m["grpc_method"]) != method {
			return
		}
		switch m[model.MetricNameLabel] {
		case "grpc_server_started_total":
			started += v
		case "grpc_server_handled_total":
			handled += v
		}
	})
	return int64(started - handled), err
}

// Store metrics of storaged (server/metrics.go) the matrix reads before and
// after each run to explain sync-mode figures.
const (
	syncSecondsSum      = "storaged_store_sync_duration_seconds_sum"
	syncSecondsCount    = "storaged_store_sync_duration_seconds_count"
	flushWaitSecondsSum = "storaged_store_flush_wait_seconds_sum"
	flushWaitCount      = "storaged_store_flush_wait_seconds_count"
)

// FlushStats describes the flusher of a storaged target during one run
// (all zero for a floor, or when the metrics were not readable).
type FlushStats struct {
	Syncs         int64   `json:"syncs"`         // msync rounds of the commitlog flusher
	SyncMeanUs    float64 `json:"sync_mean_us"`  // mean duration of a round
	MsgsPerSync   float64 `json:"msgs_per_sync"` // PUT_OK messages per round
	FlushWaits    int64   `json:"flush_waits"`   // sync-mode puts that waited for a flush
	FlushWaitMean float64 `json:"flush_wait_mean_us"`
	// Busy is the fraction of the run (warm-up included: the metrics are
	// read around both) the flusher spent in syncs.
	Busy float64 `json:"busy_fraction"`
}

func flushStats(before, after map[string]float64, msgs int64, wall time.Duration) *FlushStats {
	d := func(k string) float64 { return after[k] - before[k] }
	f := &FlushStats{Syncs: int64(d(syncSecondsCount)), FlushWaits: int64(d(flushWaitCount))}
	if f.Syncs > 0 {
		f.SyncMeanUs = d(syncSecondsSum) / float64(f.Syncs) * 1e6
		f.MsgsPerSync = float64(msgs) / float64(f.Syncs)
	}
	if wall > 0 {
		f.Busy = d(syncSecondsSum) / wall.Seconds()
	}
	if f.FlushWaits > 0 {
		f.FlushWaitMean = d(flushWaitSecondsSum) / float64(f.FlushWaits) * 1e6
	}
	if f.Syncs == 0 && f.FlushWaits == 0 {
		return nil
	}
	return f
}
