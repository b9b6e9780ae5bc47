package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"testing"

	"google.golang.org/grpc/metadata"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// exportedSpan is the part of a span the console exporter (stdouttrace)
// writes that the test reads.
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Resource    []struct {
		Key   string
		Value struct{ Value any }
	}
}

// TestTracingFromEnvironment: storaged started with
// OTEL_TRACES_EXPORTER=console traces a put that carries a traceparent:
// its server span (child of the client's span), append and flush-wait
// spans reach the exporter by the time the process has shut down, under
// the service name of OTEL_SERVICE_NAME; the call log names the trace.
func TestTracingFromEnvironment(t *testing.T) {
	const traceID, clientSpan = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "",
		"--data-dir", t.TempDir(), "--flush-mode", "sync", "--log-level", "debug")
	cmd.Env = []string{"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=storaged-under-test"}
	var stdout bytes.Buffer // read only after the process is reaped
	cmd.Stdout = &stdout
	p := startCmd(t, cmd)
	listening := p.logs.waitFor(t, "listening")
	if got := listening.str("tracing"); got != "console" {
		t.Errorf("listening line: tracing %q, want console", got)
	}
	conn := dial(t, listening.str("grpc"))
	waitServing(t, conn)

	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	if _, err := storagedv1.NewMessageStoreServiceClient(conn).PutMessage(ctx, &storagedv1.PutMessageRequest{
		Message: &storagedv1.Message{Topic: "traced", Body: []byte("hello")},
	}); err != nil {
		t.Fatal(err)
	}
	call := p.logs.waitFor(t, "finished call")
	if call.str("grpc.method") != "PutMessage" || call.str("trace_id") != traceID || call.str("span_id") == "" {
		t.Errorf("call log line %v: want PutMessage with trace_id %s and a span_id", call, traceID)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, p.logs.String())
	}

	spans := map[string]exportedSpan{}
	dec := json.NewDecoder(&stdout)
	for {
		var s exportedSpan
		if err := dec.Decode(&s); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("stdout is not a stream of JSON spans: %v\n%s", err, stdout.String())
		}
		if s.SpanContext.TraceID == traceID {
			spans[s.Name] = s
		}
	}
	srv, ok := spans["storaged.v1.MessageStoreService/PutMessage"]
	if !ok {
		t.Fatalf("no server span of trace %s; spans of the trace: %v", traceID, spans)
	}
	if srv.Parent.SpanID != clientSpan || srv.SpanContext.SpanID != call.str("span_id") {
		t.Errorf("server span %s parent %s; want parent %s and the call log's span %s", srv.SpanContext.SpanID, srv.Parent.SpanID, clientSpan, call.str("span_id"))
	}
	for _, name := range []string{"storage.append", "storage.flush_wait"} {
		if s, ok := spans[name]; !ok || s.Parent.SpanID != srv.SpanContext.SpanID {
			t.Errorf("span %s: found %v, parent %s; want a child of the server span %s", name, ok, s.Parent.SpanID, srv.SpanContext.SpanID)
		}
	}
	service := ""
	for _, kv := range srv.Resource {
		if kv.Key == "service.name" {
			service, _ = kv.Value.Value.(string)
		}
	}
	if service != "storaged-under-test" {
		t.Errorf("resource service.name %q, want OTEL_SERVICE_NAME's", service)
	}
}

// TestTracingBadEnvironment: an exporter name the SDK does not know is a
// configuration error (exit status 2), not a silent start without traces.
func TestTracingBadEnvironment(t *testing.T) {
	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "", "--data-dir", t.TempDir())
	cmd.Env = []string{"OTEL_TRACES_EXPORTER=zipkin-typo"}
	p := startCmd(t, cmd)
	if code := p.exitCode(t); code != 2 {
		t.Errorf("exit status %d, want 2:\n%s", code, p.logs.String())
	}
}
