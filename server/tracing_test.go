package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// A client's trace: the ids its traceparent carries.
const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
)

func traceparent(sampled bool) string {
	flags := "00"
	if sampled {
		flags = "01"
	}
	return "00-" + clientTraceID + "-" + clientSpanID + "-" + flags
}

// baggageStore records the W3C baggage member "tenant" each put's context
// carries, then puts into the real store.
type baggageStore struct {
	Store
	mu     sync.Mutex
	tenant []string
}

func (b *baggageStore) PutMessage(ctx context.Context, m *storage.Message) (storage.PutResult, error) {
	b.mu.Lock()
	b.tenant = append(b.tenant, baggage.FromContext(ctx).Member("tenant").Value())
	b.mu.Unlock()
	return b.Store.PutMessage(ctx, m)
}

func (b *baggageStore) tenants() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.tenant...)
}

// tracedServer serves a sync-mode store with tracing through tp, the call
// log at debug level into logs, and the gRPC and store metrics on a
// metrics endpoint (returned base URL).
func tracedServer(t *testing.T, tp trace.TracerProvider, logs *syncBuffer) (storagedv1.MessageStoreServiceClient, *baggageStore, string) {
	t.Helper()
	st, _ := openStore(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	bs := &baggageStore{Store: st}
	svc := New(bs, zerolog.Nop())
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st, WithPutExemplars(svc.Exemplars())))
	srv := startServer(t, svc, GRPCConfig{Registerer: reg, TracerProvider: tp, Logger: newLogger(logs)})
	srv.SetServing(true)
	return storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil)), bs, serveMetrics(t, reg)
}

// withTraceparent is ctx with the client's traceparent and a baggage
// member in its outgoing metadata, as a mesh or an instrumented client
// sends them.
func withTraceparent(ctx context.Context, sampled bool) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent(sampled), "baggage", "tenant=acme")
}

// spanEnded is a span processor that names each ended span on a channel,
// so that a test can wait for a span without polling.
type spanEnded chan string

func (c spanEnded) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c spanEnded) OnEnd(s sdktrace.ReadOnlySpan) {
	select {
	case c <- s.Name():
	default: // nobody waits for that many
	}
}
func (spanEnded) Shutdown(context.Context) error   { return nil }
func (spanEnded) ForceFlush(context.Context) error { return nil }

// recordingProvider is an SDK tracer provider exporting to an in-memory
// exporter and telling ended spans on the returned channel (after the
// exporter has them).
func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter, spanEnded) {
	exp := tracetest.NewInMemoryExporter()
	ended := make(spanEnded, 64)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(ended))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, exp, ended
}

// waitSpans waits until a span named name has ended (the server span ends
// after the answer is on its way, so a client can see the answer first)
// and returns the exported spans.
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, ended spanEnded, name string) tracetest.SpanStubs {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case n := <-ended:
			if n == name {
				return exp.GetSpans()
			}
		case <-timeout.C:
			t.Fatalf("no span %q after 10s; have %v", name, spanNames(exp.GetSpans()))
		}
	}
}

func spanNames(spans tracetest.SpanStubs) []string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	return names
}

func findSpan(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; have %v", len(found), name, spanNames(spans))
	}
	return found[0]
}

// finishedCalls returns the call log's "finished call" lines for method.
func finishedCalls(t *testing.T, logs *syncBuffer, method string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l["message"] == "finished call" && l["grpc.method"] == method {
			out = append(out, l)
		}
	}
	return out
}

// getOpenMetrics scrapes base/metrics in the OpenMetrics format, the one
// that carries exemplars.
func getOpenMetrics(t *testing.T, base string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q, want OpenMetrics", ct)
	}
	return string(b)
}

// exemplarLine matches a bucket line of metric (with labels containing
// labelPart) carrying the exemplar of traceID.
func exemplarLine(metric, labelPart, traceID string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + `_bucket\{[^}]*` + regexp.QuoteMeta(labelPart) +
		`[^}]*\} \d+ # \{trace_id="` + traceID + `"\} [0-9.e+-]+`)
}

// TestTracingSampledPut: a put whose traceparent is sampled gets a server
// span, child of the client's span, with the append and flush-wait spans
// below it in the order they happened; the baggage reaches the store's
// context; the call log names the trace; the latency histograms carry the
// trace id as an exemplar.
func TestTracingSampledPut(t *testing.T) {
	tp, exp, ended := recordingProvider(t)
	var logs syncBuffer
	client, bs, base := tracedServer(t, tp, &logs)

	ctx := withTraceparent(ctxT(t), true)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "traced", Body: []byte("hello")}}); err != nil {
		t.Fatal(err)
	}

	spans := waitSpans(t, exp, ended, "storaged.v1.MessageStoreService/PutMessage")
	srvSpan := findSpan(t, spans, "storaged.v1.MessageStoreService/PutMessage")
	if got := srvSpan.SpanContext.TraceID().String(); got != clientTraceID {
		t.Errorf("server span trace id %s, want the client's %s", got, clientTraceID)
	}
	if got := srvSpan.Parent.SpanID().String(); got != clientSpanID || !srvSpan.Parent.IsRemote() {
		t.Errorf("server span parent %s (remote %v), want the client's span %s", got, srvSpan.Parent.IsRemote(), clientSpanID)
	}
	if srvSpan.SpanKind != trace.SpanKindServer {
		t.Errorf("server span kind %v", srvSpan.SpanKind)
	}
	app := findSpan(t, spans, SpanAppend)
	fw := findSpan(t, spans, SpanFlushWait)
	for _, s := range []tracetest.SpanStub{app, fw} {
		if s.Parent.SpanID() != srvSpan.SpanContext.SpanID() || s.SpanContext.TraceID() != srvSpan.SpanContext.TraceID() {
			t.Errorf("%s: parent %s in trace %s, want the server span %s", s.Name, s.Parent.SpanID(), s.SpanContext.TraceID(), srvSpan.SpanContext.SpanID())
		}
		if s.StartTime.Before(srvSpan.StartTime) || s.EndTime.After(srvSpan.EndTime) || s.EndTime.Before(s.StartTime) {
			t.Errorf("%s [%v, %v] is not inside the server span [%v, %v]", s.Name, s.StartTime, s.EndTime, srvSpan.StartTime, srvSpan.EndTime)
		}
	}
	if fw.StartTime.Before(app.EndTime) {
		t.Errorf("flush wait starts at %v, before the append ended at %v", fw.StartTime, app.EndTime)
	}
	attrs := map[string]string{}
	for _, kv := range app.Attributes {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["messaging.destination.name"] != "traced" || attrs["storaged.commitlog.offset"] != "0" {
		t.Errorf("append span attributes %v", attrs)
	}

	if got := bs.tenants(); len(got) != 1 || got[0] != "acme" {
		t.Errorf("baggage tenant in the store's context: %q, want [acme]", got)
	}

	lines := finishedCalls(t, &logs, "PutMessage")
	if len(lines) != 1 {
		t.Fatalf("%d finished-call lines for PutMessage, want 1:\n%s", len(lines), logs.String())
	}
	if lines[0][traceIDKey] != clientTraceID || lines[0][spanIDKey] != srvSpan.SpanContext.SpanID().String() {
		t.Errorf("call log trace_id %v span_id %v, want %s %s", lines[0][traceIDKey], lines[0][spanIDKey], clientTraceID, srvSpan.SpanContext.SpanID())
	}

	om := getOpenMetrics(t, base)
	for _, c := range []struct{ metric, labels string }{
		{"grpc_server_handling_seconds", `grpc_method="PutMessage"`},
		{"storaged_store_append_duration_seconds", "le="},
		{"storaged_store_flush_wait_seconds", "le="},
	} {
		if !exemplarLine(c.metric, c.labels, clientTraceID).MatchString(om) {
			t.Errorf("no %s bucket with the exemplar trace_id=%s in:\n%s", c.metric, clientTraceID, grepLines(om, c.metric+"_bucket"))
		}
	}
}

func grepLines(text, substr string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, substr) {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// TestTracingUnsampledPut: a traceparent that is not sampled records no
// span and no exemplar, but the call log still names the trace, so that
// logs can be joined with the client's.
func TestTracingUnsampledPut(t *testing.T) {
	tp, exp, ended := recordingProvider(t)
	var logs syncBuffer
	client, _, base := tracedServer(t, tp, &logs)

	ctx := withTraceparent(ctxT(t), false)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "traced", Body: []byte("hello")}}); err != nil {
		t.Fatal(err)
	}
	// A sampled call afterwards: once its server span is exported, the
	// first call's span would have been too (calls end in order here).
	if _, err := client.PutMessages(withTraceparentID(ctxT(t), "0af7651916cd43dd8448eb211c80319c"), &storagedv1.PutMessagesRequest{
		Topic: "traced", Messages: []*storagedv1.BatchEntry{{Body: []byte("a")}},
	}); err != nil {
		t.Fatal(err)
	}
	spans := waitSpans(t, exp, ended, "storaged.v1.MessageStoreService/PutMessages")
	for _, s := range spans {
		if s.SpanContext.TraceID().String() == clientTraceID {
			t.Errorf("unsampled call recorded span %q", s.Name)
		}
	}
	lines := finishedCalls(t, &logs, "PutMessage")
	if len(lines) != 1 || lines[0][traceIDKey] != clientTraceID || lines[0][spanIDKey] == nil {
		t.Errorf("call log lines %v, want one with trace_id %s and a span_id", lines, clientTraceID)
	}
	if om := getOpenMetrics(t, base); strings.Contains(om, clientTraceID) {
		t.Errorf("exemplar of the unsampled trace in:\n%s", grepLines(om, clientTraceID))
	}
}

// withTraceparentID is ctx with a sampled traceparent of trace id.
func withTraceparentID(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+id+"-"+clientSpanID+"-01")
}

// TestTracingNoopProvider: with a no-op tracer provider (tracing on,
// nothing recorded or exported) the client's trace context still reaches
// the call log, but no exemplar names a trace that has no storaged span.
func TestTracingNoopProvider(t *testing.T) {
	var logs syncBuffer
	client, bs, base := tracedServer(t, noop.NewTracerProvider(), &logs)
	ctx := withTraceparent(ctxT(t), true)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "traced", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	lines := finishedCalls(t, &logs, "PutMessage")
	if len(lines) != 1 || lines[0][traceIDKey] != clientTraceID || lines[0][spanIDKey] != clientSpanID {
		t.Errorf("call log lines %v, want trace_id %s span_id %s", lines, clientTraceID, clientSpanID)
	}
	if got := bs.tenants(); len(got) != 1 || got[0] != "acme" {
		t.Errorf("baggage tenant %q, want [acme]", got)
	}
	if om := getOpenMetrics(t, base); strings.Contains(om, "trace_id") {
		t.Errorf("no-op provider, exemplars in:\n%s", grepLines(om, "trace_id"))
	}
}

// TestTracingOff: without a TracerProvider a traceparent is ignored: no
// trace in the call log, no exemplar.
func TestTracingOff(t *testing.T) {
	var logs syncBuffer
	client, bs, base := tracedServer(t, nil, &logs)
	ctx := withTraceparent(ctxT(t), true)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "traced", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	lines := finishedCalls(t, &logs, "PutMessage")
	if len(lines) != 1 {
		t.Fatalf("%d finished-call lines, want 1", len(lines))
	}
	if v, ok := lines[0][traceIDKey]; ok {
		t.Errorf("tracing off, call log has trace_id %v", v)
	}
	if got := bs.tenants(); len(got) != 1 || got[0] != "" {
		t.Errorf("tracing off, baggage tenant %q reached the store", got)
	}
	if om := getOpenMetrics(t, base); strings.Contains(om, "trace_id") {
		t.Errorf("tracing off, exemplars in:\n%s", grepLines(om, "trace_id"))
	}
}

// TestTracingOffAddsNoAllocations: the unary handler path (interceptor
// chain and PutMessage on a store answering at once) allocates as much
// with tracing off when the context carries a recording span as when it
// carries none, and creates no span: nothing of tracing runs when it is
// off. With tracing on, the same call allocates more (its spans), which
// shows the count would see an addition.
func TestTracingOffAddsNoAllocations(t *testing.T) {
	now := time.Now()
	res := storage.PutResult{Status: storage.PutOK, FlushWaitStart: now.Add(time.Microsecond), FlushWait: time.Microsecond,
		Append: storage.AppendResult{Status: storage.AppendOK, StoreHost: testStoreHost, MsgNum: 1, Topic: "t", WroteBytes: 100,
			LockedAt: now, LockHeld: time.Microsecond}}
	req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("hello")}}
	info := &grpc.UnaryServerInfo{FullMethod: "/" + ServiceName + "/PutMessage"}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	traced, parent := tp.Tracer("test").Start(context.Background(), "client")
	defer parent.End()

	// handlerPath returns one call through the server's interceptors and
	// PutMessage, built as NewGRPCServer builds them with tracer provider
	// p (nil: off).
	handlerPath := func(p trace.TracerProvider) func(ctx context.Context) {
		svc := New(&fakeStore{res: res}, zerolog.Nop())
		cfg := GRPCConfig{Logger: zerolog.New(io.Discard).Level(zerolog.InfoLevel), TracerProvider: p}.withDefaults()
		if p != nil {
			svc.tracer = p.Tracer(tracerName)
		}
		unary, _ := interceptorChains(cfg, newServerMetrics())
		h := func(ctx context.Context, req any) (any, error) {
			return svc.PutMessage(ctx, req.(*storagedv1.PutMessageRequest))
		}
		for i := len(unary) - 1; i >= 0; i-- {
			ic, next := unary[i], h
			h = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, next) }
		}
		return func(ctx context.Context) {
			if _, err := h(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}

	off := handlerPath(nil)
	plain := testing.AllocsPerRun(200, func() { off(context.Background()) })
	withSpan := testing.AllocsPerRun(200, func() { off(traced) })
	if withSpan != plain {
		t.Errorf("tracing off: %v allocations per call with a span in the context, %v without: tracing code ran", withSpan, plain)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("tracing off: %d spans ended, want 0", n)
	}

	on := handlerPath(tp)
	traceOn := testing.AllocsPerRun(200, func() { on(traced) })
	if traceOn <= plain {
		t.Errorf("tracing on: %v allocations per call, off %v: the count does not see the spans", traceOn, plain)
	}
	if n := len(rec.Ended()); n == 0 {
		t.Error("tracing on: no span ended")
	}
	t.Logf("allocations per call: off %v, off with a span in the context %v, on and sampled %v", plain, withSpan, traceOn)
}

// TestHandlingTimeBuckets: grpc_server_handling_seconds resolves the
// sub-millisecond latencies of unary puts: its lowest bound is 50 µs and
// it still reaches 10 s.
func TestHandlingTimeBuckets(t *testing.T) {
	b := handlingTimeBuckets
	if b[0] != 50e-6 || b[len(b)-1] < 10 {
		t.Errorf("buckets %v: want 50µs up to at least 10s", b)
	}
	under1ms := 0
	for i, v := range b {
		if i > 0 && v <= b[i-1] {
			t.Fatalf("buckets not increasing: %v", b)
		}
		if v < 1e-3 {
			under1ms++
		}
	}
	if under1ms < 4 {
		t.Errorf("%d buckets under 1 ms, want at least 4: %v", under1ms, b)
	}
}
