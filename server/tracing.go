package server

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"

	"github.com/storaged/storaged/storage"
)

// Tracing (OpenTelemetry) is on when GRPCConfig.TracerProvider is set.
// Then:
//
//   - the otelgrpc stats handler starts a server span per call (health
//     checks excepted), the child of the W3C traceparent the client sent;
//     W3C baggage is extracted too (Propagator);
//   - PutMessage and PutMessages get two child spans built from the
//     timings the store hands back (storage.PutResult), so the storage
//     package needs no tracing of its own: SpanAppend, the time the append
//     held the commitlog lock, and SpanFlushWait, the sync-mode wait for
//     the flush covering the put (no such wait, no span);
//   - the call log carries trace_id and span_id (calllog.go);
//   - the gRPC latency histograms, and the store's append and flush-wait
//     histograms, carry the trace id of sampled calls as exemplars
//     (exposed in the OpenMetrics format only).
//
// When it is nil nothing of this is installed: no stats handler, no
// exemplar function, one nil check per put. BENCHMARKS.md ("Tracing
// overhead") has the cost of each.
//
// PutMessageStream gets its server span but no per-message spans: a
// stream carries any number of messages, and its span lasts as long as
// the stream.

// Names of the put's child spans.
const (
	SpanAppend    = "storage.append"
	SpanFlushWait = "storage.flush_wait"
)

// Propagator is what the server extracts from a call's metadata: W3C trace
// context and W3C baggage.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracerName is the instrumentation scope of the put spans.
const tracerName = "github.com/storaged/storaged/server"

// statsHandler is the otelgrpc server handler for tp. Its OpenTelemetry
// metrics go to a no-op meter: the Prometheus interceptors already count
// and time every call.
func statsHandler(tp trace.TracerProvider) stats.Handler {
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(Propagator),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	)
}

// traceExemplar is the exemplar of a call for the gRPC metrics: its trace
// id when the call's span is recorded and sampled (so the trace has
// storaged's spans), else none: a sampled traceparent seen through a no-op
// tracer provider adds nothing.
func traceExemplar(ctx context.Context) prometheus.Labels {
	span := trace.SpanFromContext(ctx)
	if sc := span.SpanContext(); sc.IsSampled() && span.IsRecording() {
		return prometheus.Labels{exemplarTraceID: sc.TraceID().String()}
	}
	return nil
}

// exemplarTraceID is the exemplar label of a trace id, as Grafana and the
// OpenTelemetry Prometheus exporter name it.
const exemplarTraceID = "trace_id"

// tracePut adds the append and flush-wait spans of a put to the call's
// span, if it is recording, and the put's latencies to the store
// exemplars, if it is sampled. REQUIRES: s.tracer != nil.
func (s *Service) tracePut(ctx context.Context, res *storage.PutResult, err error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return
	}
	a := &res.Append
	sc := parent.SpanContext()
	var traceID string
	if sc.IsSampled() {
		traceID = sc.TraceID().String()
	}
	if !a.LockedAt.IsZero() {
		end := a.LockedAt.Add(a.LockHeld)
		_, span := s.tracer.Start(ctx, SpanAppend, trace.WithTimestamp(a.LockedAt), trace.WithAttributes(
			semconv.MessagingDestinationName(a.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(a.QueueID))),
			semconv.MessagingBatchMessageCount(int(a.MsgNum)),
			attribute.Int64("storaged.commitlog.offset", a.WroteOffset),
			attribute.Int("storaged.commitlog.bytes", int(a.WroteBytes)),
		))
		span.End(trace.WithTimestamp(end))
		if traceID != "" {
			s.exemplars.append.add(a.LockHeld, traceID, end)
		}
	}
	if !res.FlushWaitStart.IsZero() {
		end := res.FlushWaitStart.Add(res.FlushWait)
		_, span := s.tracer.Start(ctx, SpanFlushWait, trace.WithTimestamp(res.FlushWaitStart), trace.WithAttributes(
			attribute.Int64("storaged.commitlog.next_offset", a.NextOffset()),
			attribute.String("storaged.put.status", res.Status.String()),
		))
		switch {
		case err != nil:
			span.SetStatus(codes.Error, err.Error())
		case res.Status != storage.PutOK: // FLUSH_DISK_TIMEOUT: stored, durability not confirmed in time
			span.SetStatus(codes.Error, res.Status.String())
		}
		span.End(trace.WithTimestamp(end))
		if traceID != "" {
			s.exemplars.flushWait.add(res.FlushWait, traceID, end)
		}
	}
}

// PutExemplars keeps the trace ids of the latest sampled puts for the
// store's append and flush-wait histograms, which the store exports as
// snapshots without trace ids (it knows nothing of tracing); a
// StoreCollector given WithPutExemplars attaches them. Service.Exemplars
// returns the service's.
type PutExemplars struct {
	append, flushWait exemplarRing
}

// exemplarRingSize is how many exemplars a histogram keeps: the newest
// per bucket is exposed, so a few cover the buckets in use.
const exemplarRingSize = 16

// exemplarRing holds the last exemplarRingSize exemplars of one
// histogram. Only sampled puts touch it.
type exemplarRing struct {
	mu   sync.Mutex
	buf  [exemplarRingSize]prometheus.Exemplar
	next int // total added
}

func (r *exemplarRing) add(d time.Duration, traceID string, at time.Time) {
	e := prometheus.Exemplar{Value: d.Seconds(), Labels: prometheus.Labels{exemplarTraceID: traceID}, Timestamp: at}
	r.mu.Lock()
	r.buf[r.next%exemplarRingSize] = e
	r.next++
	r.mu.Unlock()
}

// snapshot returns the kept exemplars, oldest first (the newest of a
// bucket wins in prometheus.NewMetricWithExemplars).
func (r *exemplarRing) snapshot() []prometheus.Exemplar {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(r.next, exemplarRingSize)
	out := make([]prometheus.Exemplar, 0, n)
	for i := r.next - n; i < r.next; i++ {
		out = append(out, r.buf[i%exemplarRingSize])
	}
	return out
}

// withExemplars attaches r's exemplars to the histogram m.
func withExemplars(m prometheus.Metric, r *exemplarRing) prometheus.Metric {
	ex := r.snapshot()
	if len(ex) == 0 {
		return m
	}
	if mm, err := prometheus.NewMetricWithExemplars(m, ex...); err == nil {
		return mm
	}
	return m // cannot happen: a trace id is far below the label limit
}
