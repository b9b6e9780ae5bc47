package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"
)

// Summary is the result of one load run: the measured phase only.
//
// Calls counts the calls that got a response (PUT_OK or a degraded status
// such as FLUSH_DISK_TIMEOUT); the latency histogram holds exactly those.
// Messages, Bytes and the rates count PUT_OK responses only: a degraded
// response stored its messages without the durability asked for. Failed
// calls (gRPC errors) are counted in Errors, by code and by ErrorInfo
// reason (the RocketMQ status name).
type Summary struct {
	Label       string `json:"label,omitempty"`
	Target      string `json:"target"`
	TLS         bool   `json:"tls,omitempty"`
	Method      string `json:"method"`
	BodySize    int    `json:"body_size"`
	BatchSize   int    `json:"batch_size"`
	Concurrency int    `json:"concurrency"`
	Streams     int    `json:"streams,omitempty"`
	Connections int    `json:"connections"`
	InFlight    int    `json:"in_flight_messages"`
	Started     string `json:"started"`
	Interrupted bool   `json:"interrupted,omitempty"`

	WarmupSeconds   float64 `json:"warmup_seconds"`
	DurationSeconds float64 `json:"duration_seconds"` // measured phase, wall clock

	Calls     int64 `json:"calls"`
	OKCalls   int64 `json:"ok_calls"`
	Messages  int64 `json:"messages"`
	Bytes     int64 `json:"bytes"`
	Errors    int64 `json:"errors"`
	ErrorMsgs int64 `json:"error_messages"`
	Degraded  int64 `json:"degraded"`

	MsgsPerSec  float64 `json:"msgs_per_sec"`
	CallsPerSec float64 `json:"calls_per_sec"`
	MBPerSec    float64 `json:"mb_per_sec"` // body bytes of PUT_OK messages, 10^6 bytes

	Latency Latency `json:"latency"`

	ErrorsByCode   map[string]int64 `json:"errors_by_code,omitempty"`
	ErrorsByReason map[string]int64 `json:"errors_by_reason,omitempty"`
	DegradedBy     map[string]int64 `json:"degraded_by_status,omitempty"`

	// ServerHeapInuseMaxBytes is the largest go_memstats_heap_inuse_bytes
	// read from --metrics-url during the measured phase (0: not read).
	ServerHeapInuseMaxBytes int64 `json:"server_heap_inuse_max_bytes,omitempty"`

	// Set by the matrix, which knows the server's process: CPU time (user
	// + system) the server and this generator used during the whole run
	// (warmup included) per PUT_OK message, and the host's 1-minute load
	// average at the end of the run. CPU per message is much less
	// sensitive to other load on the machine than msgs/s.
	ServerCPUSeconds  float64 `json:"server_cpu_seconds,omitempty"`
	ServerCPUPerMsgUs float64 `json:"server_cpu_per_msg_us,omitempty"`
	ClientCPUPerMsgUs float64 `json:"client_cpu_per_msg_us,omitempty"`
	HostLoad1         float64 `json:"host_load1,omitempty"`
	// Flush is read from a storaged target's /metrics (nil otherwise). Its
	// message count includes the warmup's share of the run.
	Flush *FlushStats `json:"flush,omitempty"`
}

// Latency is the latency distribution of the calls with a response, in
// microseconds (HDR histogram, 3 significant digits).
type Latency struct {
	Count  int64   `json:"count"`
	MinUs  int64   `json:"min_us"`
	MeanUs float64 `json:"mean_us"`
	P50Us  int64   `json:"p50_us"`
	P90Us  int64   `json:"p90_us"`
	P99Us  int64   `json:"p99_us"`
	P999Us int64   `json:"p999_us"`
	MaxUs  int64   `json:"max_us"`
}

func newSummary(cfg *loadConfig, t *tally, elapsed time.Duration) *Summary {
	s := &Summary{
		Label:           cfg.Label,
		Method:          cfg.Method,
		BodySize:        cfg.BodySize,
		BatchSize:       cfg.callSize(),
		Concurrency:     cfg.Concurrency,
		Connections:     cfg.Connections,
		InFlight:        cfg.inFlight(),
		WarmupSeconds:   cfg.Warmup.Seconds(),
		DurationSeconds: elapsed.Seconds(),
		Calls:           t.calls,
		OKCalls:         t.okCalls,
		Messages:        t.msgs,
		Bytes:           t.bytes,
		Errors:          t.errors,
		ErrorMsgs:       t.errorMsgs,
		Degraded:        t.degraded,
		ErrorsByCode:    maps.Clone(t.byCode),
		ErrorsByReason:  maps.Clone(t.byReason),
		DegradedBy:      maps.Clone(t.byStatus),
	}
	if cfg.Method == methodStream {
		s.Streams = cfg.Streams
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.MsgsPerSec = float64(t.msgs) / secs
		s.CallsPerSec = float64(t.calls+t.errors) / secs
		s.MBPerSec = float64(t.bytes) / 1e6 / secs
	}
	if h := t.hist; h.TotalCount() > 0 {
		s.Latency = Latency{
			Count:  h.TotalCount(),
			MinUs:  h.Min(),
			MeanUs: h.Mean(),
			P50Us:  h.ValueAtQuantile(50),
			P90Us:  h.ValueAtQuantile(90),
			P99Us:  h.ValueAtQuantile(99),
			P999Us: h.ValueAtQuantile(99.9),
			MaxUs:  h.Max(),
		}
	}
	return s
}

func marshalIndent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// printText writes the human summary.
func (s *Summary) printText(w io.Writer) {
	us := func(v int64) string { return fmtLatency(v) }
	label := ""
	if s.Label != "" {
		label = " [" + s.Label + "]"
	}
	fmt.Fprintf(w, "target %s%s: %s, body %d B, batch %d, concurrency %d", s.Target, label, s.Method, s.BodySize, s.BatchSize, s.Concurrency)
	if s.Streams > 0 {
		fmt.Fprintf(w, " per stream x %d streams", s.Streams)
	}
	fmt.Fprintf(w, ", %d connection(s)\n", s.Connections)
	if s.Interrupted {
		fmt.Fprintln(w, "interrupted: the figures cover the load until the signal")
	}
	fmt.Fprintf(w, "measured %.2fs after %.1fs warmup: %d msgs PUT_OK in %d calls\n", s.DurationSeconds, s.WarmupSeconds, s.Messages, s.OKCalls)
	fmt.Fprintf(w, "throughput  %.0f msgs/s  %.0f calls/s  %.2f MB/s\n", s.MsgsPerSec, s.CallsPerSec, s.MBPerSec)
	l := s.Latency
	fmt.Fprintf(w, "latency     p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s, %d calls)\n",
		us(l.P50Us), us(l.P90Us), us(l.P99Us), us(l.P999Us), us(l.MaxUs), us(int64(l.MeanUs)), l.Count)
	fmt.Fprintf(w, "errors      %d calls (%d msgs)%s\n", s.Errors, s.ErrorMsgs, fmtCounts(" by code", s.ErrorsByCode)+fmtCounts(", by reason", s.ErrorsByReason))
	fmt.Fprintf(w, "degraded    %d calls%s\n", s.Degraded, fmtCounts(" by status", s.DegradedBy))
	if s.ServerHeapInuseMaxBytes > 0 {
		fmt.Fprintf(w, "server heap max in use %.1f MiB\n", float64(s.ServerHeapInuseMaxBytes)/(1<<20))
	}
}

func fmtCounts(title string, m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	out := title + ":"
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out += fmt.Sprintf(" %s=%d", k, m[k])
	}
	return out
}
