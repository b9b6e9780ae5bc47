package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// startTestFloor starts a floor on 127.0.0.1:0 and returns it with n
// client connections; both are closed when the test ends.
func startTestFloor(t *testing.T, kind string, answer answerFunc) *floor {
	t.Helper()
	f, err := startFloor(kind, "127.0.0.1:0", answer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return f
}

func testLoad(t *testing.T, addr string, cfg loadConfig) *Summary {
	t.Helper()
	creds, _ := (&tlsOptions{}).credentials()
	conns, err := dial(addr, cfg.Connections, creds)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(conns)
	s, err := runLoad(context.Background(), cfg, conns, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countConfig is a load of exactly msgs measured messages and no warmup.
func countConfig(method string, msgs int64) loadConfig {
	c := defaultLoadConfig()
	c.Method, c.Messages, c.Duration, c.Warmup = method, msgs, 0, 0
	c.Concurrency, c.Connections, c.BodySize = 8, 2, 100
	return c
}

// checkConsistent checks the invariants between a summary's counters and
// its histogram, and that its JSON form says the same.
func checkConsistent(t *testing.T, s *Summary) {
	t.Helper()
	if s.Calls != s.OKCalls+s.Degraded {
		t.Errorf("calls %d != ok %d + degraded %d", s.Calls, s.OKCalls, s.Degraded)
	}
	if s.Latency.Count != s.Calls {
		t.Errorf("histogram holds %d values, want one per call with a response (%d)", s.Latency.Count, s.Calls)
	}
	if s.Messages != s.OKCalls*int64(s.BatchSize) && s.Method != methodBatch {
		t.Errorf("messages %d, ok calls %d of %d", s.Messages, s.OKCalls, s.BatchSize)
	}
	if s.Bytes != s.Messages*int64(s.BodySize) {
		t.Errorf("bytes %d, want messages %d x body %d", s.Bytes, s.Messages, s.BodySize)
	}
	var byCode int64
	for _, n := range s.ErrorsByCode {
		byCode += n
	}
	if byCode != s.Errors {
		t.Errorf("errors by code sum to %d, errors %d", byCode, s.Errors)
	}
	var byStatus int64
	for _, n := range s.DegradedBy {
		byStatus += n
	}
	if byStatus != s.Degraded {
		t.Errorf("degraded by status sum to %d, degraded %d", byStatus, s.Degraded)
	}
	if s.Latency.Count > 0 {
		l := s.Latency
		if !(l.MinUs <= l.P50Us && l.P50Us <= l.P90Us && l.P90Us <= l.P99Us && l.P99Us <= l.P999Us && l.P999Us <= l.MaxUs) {
			t.Errorf("quantiles out of order: %+v", l)
		}
	}
	b, err := marshalIndent(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Summary
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Messages != s.Messages || back.Calls != s.Calls || back.Errors != s.Errors || back.Latency != s.Latency {
		t.Errorf("JSON round trip changed the summary:\n%s", b)
	}
}

func TestCountsPerMethod(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       func() loadConfig
		msgs      int64
		wantCalls int64 // calls (streamed messages) the server answers
	}{
		{"unary", func() loadConfig { return countConfig(methodUnary, 500) }, 500, 500},
		{"batch", func() loadConfig {
			c := countConfig(methodBatch, 1050)
			c.BatchSize = 100
			return c
		}, 1050, 11}, // ten full batches and one of 50
		{"stream", func() loadConfig {
			c := countConfig(methodStream, 700)
			c.Streams, c.Concurrency = 3, 16
			return c
		}, 700, 700},
	} {
		for _, kind := range []string{floorGRPC, floorBare} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				f := startTestFloor(t, kind, nil)
				s := testLoad(t, f.Addr(), tc.cfg())
				checkConsistent(t, s)
				if s.Messages != tc.msgs || s.Errors != 0 || s.Degraded != 0 {
					t.Errorf("messages %d errors %d degraded %d, want %d, 0, 0", s.Messages, s.Errors, s.Degraded, tc.msgs)
				}
				if got := f.svc.msgs.Load(); got != tc.msgs {
					t.Errorf("server received %d messages, want %d", got, tc.msgs)
				}
				if got := f.svc.calls.Load(); got != tc.wantCalls || s.OKCalls != tc.wantCalls {
					t.Errorf("server answered %d puts, summary %d ok calls, want %d", got, s.OKCalls, tc.wantCalls)
				}
				if s.MsgsPerSec <= 0 || s.DurationSeconds <= 0 {
					t.Errorf("msgs/s %v over %vs", s.MsgsPerSec, s.DurationSeconds)
				}
			})
		}
	}
}

// TestEdgeFloor runs the load through storaged's own server package over
// a store that stores nothing.
func TestEdgeFloor(t *testing.T) {
	f := startTestFloor(t, floorEdge, nil)
	for _, m := range []string{methodUnary, methodBatch, methodStream} {
		c := countConfig(m, 300)
		c.BatchSize = 30
		s := testLoad(t, f.Addr(), c)
		checkConsistent(t, s)
		if s.Messages != 300 || s.Errors != 0 {
			t.Errorf("%s: messages %d errors %v", m, s.Messages, s.ErrorsByCode)
		}
	}
}

// failingAnswer fails every third put with UNAVAILABLE and an ErrorInfo
// reason OS_PAGE_CACHE_BUSY, and answers every fifth other one
// FLUSH_DISK_TIMEOUT.
func failingAnswer(n int64) (storagedv1.PutMessageStatus, error) {
	switch {
	case n%3 == 0:
		st, err := status.New(codes.Unavailable, "busy").
			WithDetails(&errdetails.ErrorInfo{Reason: "OS_PAGE_CACHE_BUSY", Domain: "storaged"})
		if err != nil {
			panic(err)
		}
		return 0, st.Err()
	case n%5 == 0:
		return storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT, nil
	}
	return 0, nil
}

func TestErrorsByCodeAndStatus(t *testing.T) {
	const puts = 300
	const failed = puts / 3             // n%3 == 0
	const degraded = puts/5 - puts/15   // n%5 == 0 but not n%3 == 0
	const ok = puts - failed - degraded // 160
	for _, m := range []string{methodUnary, methodBatch, methodStream} {
		t.Run(m, func(t *testing.T) {
			f := startTestFloor(t, floorGRPC, failingAnswer)
			c := countConfig(m, puts)
			if m == methodBatch {
				c.BatchSize = 2
				c.Messages = 2 * puts
			}
			s := testLoad(t, f.Addr(), c)
			checkConsistent(t, s)
			size := int64(c.callSize())
			if s.Errors != failed || s.ErrorMsgs != failed*size {
				t.Errorf("errors %d (%d msgs), want %d (%d)", s.Errors, s.ErrorMsgs, failed, failed*size)
			}
			if s.ErrorsByCode["Unavailable"] != failed || s.ErrorsByReason["OS_PAGE_CACHE_BUSY"] != failed {
				t.Errorf("errors by code %v, by reason %v", s.ErrorsByCode, s.ErrorsByReason)
			}
			if s.Degraded != degraded || s.DegradedBy["FLUSH_DISK_TIMEOUT"] != degraded {
				t.Errorf("degraded %d %v, want %d FLUSH_DISK_TIMEOUT", s.Degraded, s.DegradedBy, degraded)
			}
			if s.OKCalls != ok || s.Messages != ok*size || s.Calls != ok+degraded {
				t.Errorf("ok calls %d, messages %d, calls %d; want %d, %d, %d", s.OKCalls, s.Messages, s.Calls, ok, ok*size, ok+degraded)
			}
		})
	}
}

// TestRunCommandJSON runs the command line against an in-process floor and
// checks that the JSON summary says what the text summary says.
func TestRunCommandJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"--floor", "--messages", "250", "--warmup", "0", "--concurrency", "4",
		"--body-size", "64", "--label", "test", "--json", path, "--quiet"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, &s)
	if s.Messages != 250 || s.Label != "test" || s.Target != "floor:grpc" || s.BodySize != 64 || s.Concurrency != 4 {
		t.Errorf("summary %+v", s)
	}
	if !strings.Contains(stdout.String(), "250 msgs PUT_OK in 250 calls") {
		t.Errorf("text summary:\n%s", stdout.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},                                   // no target
		{"--floor", "--addr", "127.0.0.1:1"}, // both
		{"--floor", "--duration", "1s", "--messages", "5"},
		{"--floor", "--method", "nope"},
		{"--floor", "--tls"},
		{"--floor", "--floor-kind", "nope"},
		{"--addr", "nohostport"},
		{"bogus-subcommand"},
		{"matrix", "--targets", "async"}, // needs --storaged
		{"matrix", "--cases", "unary-x"},
	} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		if _, ok := err.(usageError); !ok {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

func TestPlanClaimsExactly(t *testing.T) {
	p := &plan{byCount: true}
	p.remaining.Store(250)
	var got []int
	for {
		n, measured := p.claim(context.Background(), 100)
		if n == 0 {
			break
		}
		if !measured {
			t.Fatal("no warmup, yet a call is not measured")
		}
		got = append(got, n)
	}
	if len(got) != 3 || got[0] != 100 || got[1] != 100 || got[2] != 50 {
		t.Errorf("claims %v, want [100 100 50]", got)
	}
}
