package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// plan decides, call by call, whether the generator goes on and whether a
// call is measured: calls that start before warmupEnd are warmup; then
// either the clock (end) or a message budget (remaining) bounds the
// measured phase.
type plan struct {
	warmupEnd time.Time
	end       time.Time // zero in message-count mode
	remaining atomic.Int64
	byCount   bool
}

// claim reserves the next call of up to size messages. It returns the
// number of messages to send (0 when the run is over) and whether the
// call is measured.
func (p *plan) claim(ctx context.Context, size int) (n int, measured bool) {
	if ctx.Err() != nil {
		return 0, false
	}
	now := time.Now()
	if now.Before(p.warmupEnd) {
		return size, false
	}
	if !p.byCount {
		if !now.Before(p.end) {
			return 0, false
		}
		return size, true
	}
	left := p.remaining.Add(-int64(size)) + int64(size)
	if left <= 0 {
		return 0, false
	}
	return int(min(left, int64(size))), true
}

// generator is one load run against a set of client connections.
type generator struct {
	cfg     loadConfig
	clients []storagedv1.MessageStoreServiceClient
	plan    *plan
	rec     *recorder
	body    []byte
	connSeq atomic.Uint64 // round-robin over clients
	qSeq    atomic.Uint64 // round-robin over queue ids
}

// client returns the next client, round-robin.
func (g *generator) client() storagedv1.MessageStoreServiceClient {
	return g.clients[(g.connSeq.Add(1)-1)%uint64(len(g.clients))]
}

// queue returns the next queue id, round-robin.
func (g *generator) queue() int32 {
	return int32((g.qSeq.Add(1) - 1) % uint64(g.cfg.Queues))
}

// runLoad drives the load of cfg through conns until the measured phase
// ends or ctx is cancelled, writes a progress line per second to progress,
// and returns the summary of the measured phase.
func runLoad(ctx context.Context, cfg loadConfig, conns []*grpc.ClientConn, progress io.Writer) (*Summary, error) {
	var clients []storagedv1.MessageStoreServiceClient
	for _, c := range conns {
		clients = append(clients, storagedv1.NewMessageStoreServiceClient(c))
	}
	return runLoadClients(ctx, cfg, clients, progress)
}

// runLoadClients is runLoad over clients (the r3 target's route puts
// through a client.LeaderTracker).
func runLoadClients(ctx context.Context, cfg loadConfig, clients []storagedv1.MessageStoreServiceClient, progress io.Writer) (*Summary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(clients) == 0 {
		return nil, fmt.Errorf("no connections")
	}
	g := &generator{cfg: cfg, body: randomBody(cfg.BodySize), clients: clients}
	workers := cfg.Concurrency
	if cfg.Method == methodStream {
		workers = cfg.Streams
	}
	g.rec = newRecorder(min(workers, 4*runtime.GOMAXPROCS(0)))

	started := time.Now()
	g.plan = &plan{warmupEnd: started.Add(cfg.Warmup), byCount: cfg.Messages > 0}
	if g.plan.byCount {
		g.plan.remaining.Store(cfg.Messages)
	} else {
		g.plan.end = g.plan.warmupEnd.Add(cfg.Duration)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	heap := newHeapWatch()
	defer heap.close()
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		g.progressLoop(runCtx, progress, started, heap, stopProgress)
	}()

	var wg sync.WaitGroup
	var streamErr atomic.Pointer[error]
	for i := range workers {
		wg.Go(func() {
			switch cfg.Method {
			case methodUnary:
				g.unaryWorker(runCtx, i)
			case methodBatch:
				g.batchWorker(runCtx, i)
			case methodStream:
				if err := g.streamWorker(runCtx, i); err != nil {
					streamErr.CompareAndSwap(nil, &err)
					cancel()
				}
			}
		})
	}
	wg.Wait()
	finished := time.Now()
	close(stopProgress)
	<-progressDone
	if p := streamErr.Load(); p != nil {
		return nil, *p
	}
	g.rec.drain()

	elapsed := finished.Sub(g.plan.warmupEnd)
	if elapsed < 0 {
		elapsed = 0
	}
	s := newSummary(&cfg, g.rec.total, elapsed)
	s.Started = started.UTC().Format(time.RFC3339)
	s.Interrupted = ctx.Err() != nil
	s.ServerHeapInuseMaxBytes = heap.max.Load()
	return s, nil
}

// progressLoop prints one line per second until stop is closed.
func (g *generator) progressLoop(ctx context.Context, w io.Writer, started time.Time, heap *heapWatch, stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := started
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			iv := g.rec.drain()
			secs := now.Sub(last).Seconds()
			phase := ""
			if last.Before(g.plan.warmupEnd) {
				phase = " (warmup)"
			}
			last = now
			heapNote := ""
			if g.cfg.MetricsURL != "" {
				if b, err := heap.sample(ctx, g.cfg.MetricsURL, !now.Before(g.plan.warmupEnd)); err == nil {
					heapNote = fmt.Sprintf("  heap %.1fMiB", float64(b)/(1<<20))
				} else {
					heapNote = "  heap ?"
				}
			}
			fmt.Fprintf(w, "%5.0fs  msgs/s %8.0f  calls/s %7.0f  p50 %8s  p99 %8s  errors %d  degraded %d%s%s\n",
				now.Sub(started).Seconds(), float64(iv.msgs)/secs, float64(iv.calls+iv.errors)/secs,
				fmtLatency(iv.hist.ValueAtQuantile(50)), fmtLatency(iv.hist.ValueAtQuantile(99)),
				iv.errors, iv.degraded, heapNote, phase)
		}
	}
}

// fmtLatency formats a histogram value (µs) for the progress line.
func fmtLatency(us int64) string {
	return (time.Duration(us) * latencyUnit).Round(10 * time.Microsecond).String()
}

// randomBody returns n pseudo-random (incompressible) bytes, the same for
// every run.
func randomBody(n int) []byte {
	r := rand.New(rand.NewPCG(7, 11))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func (g *generator) unaryWorker(ctx context.Context, id int) {
	msg := &storagedv1.Message{Topic: g.cfg.Topic, Body: g.body, Tags: g.cfg.Tags}
	req := &storagedv1.PutMessageRequest{Message: msg}
	for {
		n, measured := g.plan.claim(ctx, 1)
		if n == 0 {
			return
		}
		msg.QueueId = g.queue()
		cctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
		start := time.Now()
		resp, err := g.client().PutMessage(cctx, req)
		o := outcome{msgs: 1, bytes: len(g.body), latency: time.Since(start), status: resp.GetStatus()}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // cut by the end of the run, not by the server
			}
			o.failure(err)
		}
		g.rec.record(id, measured, &o)
	}
}

func (g *generator) batchWorker(ctx context.Context, id int) {
	entries := make([]*storagedv1.BatchEntry, g.cfg.BatchSize)
	for i := range entries {
		entries[i] = &storagedv1.BatchEntry{Body: g.body, Tags: g.cfg.Tags}
	}
	req := &storagedv1.PutMessagesRequest{Topic: g.cfg.Topic}
	for {
		n, measured := g.plan.claim(ctx, g.cfg.BatchSize)
		if n == 0 {
			return
		}
		req.QueueId = g.queue()
		req.Messages = entries[:n]
		cctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
		start := time.Now()
		resp, err := g.client().PutMessages(cctx, req)
		o := outcome{msgs: n, bytes: n * len(g.body), latency: time.Since(start), status: resp.GetStatus()}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			o.failure(err)
		}
		g.rec.record(id, measured, &o)
	}
}
