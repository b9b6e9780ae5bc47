package tracing

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		exp  string
		on   bool
	}{
		{"unset", nil, "", false},
		{"empty", map[string]string{EnvTracesExporter: " "}, "", false},
		{"none", map[string]string{EnvTracesExporter: "none"}, "", false},
		{"otlp", map[string]string{EnvTracesExporter: "otlp"}, "otlp", true},
		{"console", map[string]string{EnvTracesExporter: "console"}, "console", true},
		{"sdk disabled", map[string]string{EnvTracesExporter: "otlp", EnvSDKDisabled: "TRUE"}, "", false},
		{"sdk not disabled", map[string]string{EnvTracesExporter: "otlp", EnvSDKDisabled: "false"}, "otlp", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			exp, on := Enabled(func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
			if exp != c.exp || on != c.on {
				t.Errorf("Enabled = %q, %v; want %q, %v", exp, on, c.exp, c.on)
			}
		})
	}
}

// TestFromEnv: the provider exists exactly when the environment turns
// tracing on; an exporter name the SDK does not know is an error.
func TestFromEnv(t *testing.T) {
	for _, c := range []struct {
		name     string
		env      map[string]string
		provider bool
		err      bool
	}{
		{"unset", nil, false, false},
		{"none", map[string]string{EnvTracesExporter: "none"}, false, false},
		{"disabled", map[string]string{EnvTracesExporter: "console", EnvSDKDisabled: "true"}, false, false},
		{"console", map[string]string{EnvTracesExporter: "console"}, true, false},
		// OTLP exporters connect lazily: building and shutting down one
		// without spans sends nothing.
		{"otlp http", map[string]string{EnvTracesExporter: "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true, false},
		{"otlp grpc", map[string]string{EnvTracesExporter: "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true, false},
		{"unknown exporter", map[string]string{EnvTracesExporter: "zipkin-typo"}, false, true},
		{"unknown protocol", map[string]string{EnvTracesExporter: "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{EnvTracesExporter, EnvSDKDisabled, "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, c.env[k])
			}
			tp, err := FromEnv(context.Background(), "test")
			if (err != nil) != c.err {
				t.Fatalf("FromEnv error %v, want error %v", err, c.err)
			}
			if (tp != nil) != c.provider {
				t.Fatalf("FromEnv provider %v, want one: %v", tp, c.provider)
			}
			if tp != nil {
				if err := tp.Shutdown(context.Background()); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			}
		})
	}
}
