package server

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// BenchmarkPutMessageTracing: BenchmarkPutMessageUnary's calls (1 KiB,
// 32 × GOMAXPROCS at once, real gRPC over loopback, async store) with
// tracing off, on with a no-op tracer provider, and on with the SDK (batch
// processor, exporter discarding) not sampling and sampling every call.
// Sampled calls send a traceparent, as a mesh does. For BENCHMARKS.md
// "Tracing overhead": run the cases interleaved, one round per process.
func BenchmarkPutMessageTracing(b *testing.B) {
	sdk := func(s sdktrace.Sampler) trace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(s))
		b.Cleanup(func() { tp.Shutdown(context.Background()) })
		return tp
	}
	for _, c := range []struct {
		name        string
		tp          func() trace.TracerProvider
		traceparent bool
	}{
		{"off", func() trace.TracerProvider { return nil }, false},
		{"noop", func() trace.TracerProvider { return noop.NewTracerProvider() }, true},
		{"sdk-unsampled", func() trace.TracerProvider { return sdk(sdktrace.NeverSample()) }, false},
		{"sdk-sampled", func() trace.TracerProvider { return sdk(sdktrace.AlwaysSample()) }, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			st, err := storage.Open(storage.Options{Dir: b.TempDir(), FileSize: 64 << 20, StoreHost: testStoreHost})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			srv := startServer(b, New(st, zerolog.Nop()), GRPCConfig{MaxMessageSize: storage.DefaultMaxMessageSize, TracerProvider: c.tp()})
			srv.SetServing(true)
			client := storagedv1.NewMessageStoreServiceClient(dial(b, srv.addr, nil))
			ctx := context.Background()
			if c.traceparent {
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+clientTraceID+"-"+clientSpanID+"-01")
			}
			req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "bench", Body: benchBody}}
			b.ReportAllocs()
			b.SetBytes(int64(len(benchBody)))
			b.SetParallelism(32)
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := client.PutMessage(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			// CPU time of the process (client and server) per call: on a
			// shared machine less noisy than ns/op, which counts the time
			// other jobs had the cores.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
