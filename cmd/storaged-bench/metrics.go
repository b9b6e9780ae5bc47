package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return int64(f), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s not found at %s", name, url)
}
