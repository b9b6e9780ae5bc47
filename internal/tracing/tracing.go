// Package tracing builds storaged's OpenTelemetry tracer provider from the
// standard OTEL_* environment, so that operators configure it as they
// configure any other OpenTelemetry service, with no storaged flag.
//
// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter: unset,
// empty and "none" are off, and so is OTEL_SDK_DISABLED=true. Off, FromEnv
// returns nil and the server installs no tracing at all (server/tracing.go).
// The OpenTelemetry default for an unset OTEL_TRACES_EXPORTER is "otlp";
// storaged does not follow it, so that a plain start never tries to reach
// a collector.
//
// On, the process environment configures the rest, read by the
// OpenTelemetry libraries themselves:
//
//   - the exporter (go.opentelemetry.io/contrib/exporters/autoexport):
//     OTEL_TRACES_EXPORTER=otlp|console, OTEL_EXPORTER_OTLP_PROTOCOL or
//     OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (http/protobuf by default, or
//     grpc), OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, …;
//   - the sampler: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
//     (default parentbased_always_on: a call is sampled when its
//     traceparent says so, or when it has none);
//   - the batch span processor: OTEL_BSP_*;
//   - the resource: OTEL_SERVICE_NAME (default "storaged") and
//     OTEL_RESOURCE_ATTRIBUTES; service.version is storaged's version.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Environment variables read by FromEnv itself.
const (
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// ServiceName is service.name unless OTEL_SERVICE_NAME says otherwise.
const ServiceName = "storaged"

// Enabled reports whether the environment (looked up with lookupEnv) turns
// tracing on, and the exporter it names.
func Enabled(lookupEnv func(string) (string, bool)) (exporter string, on bool) {
	if v, _ := lookupEnv(EnvSDKDisabled); strings.EqualFold(strings.TrimSpace(v), "true") {
		return "", false
	}
	v, _ := lookupEnv(EnvTracesExporter)
	v = strings.TrimSpace(v)
	if v == "" || v == "none" {
		return "", false
	}
	return v, true
}

// FromEnv returns the tracer provider the process environment asks for, or
// nil when tracing is off (see the package doc). The caller must Shutdown
// the provider after the server has stopped, which exports the spans still
// queued.
func FromEnv(ctx context.Context, version string) (*sdktrace.TracerProvider, error) {
	if _, on := Enabled(os.LookupEnv); !on {
		return nil, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: %s=%q: %w", EnvTracesExporter, os.Getenv(EnvTracesExporter), err)
	}
	if autoexport.IsNoneSpanExporter(exp) { // "none" among others: nothing would leave the process
		return nil, exp.Shutdown(ctx)
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the above
		resource.WithTelemetrySDK(),
		resource.WithProcessPID(),
		resource.WithHost(),
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
