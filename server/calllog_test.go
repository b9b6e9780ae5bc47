package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// logLines decodes a JSON log, one object per line.
func logLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for l := range strings.Lines(s) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// callLogServer serves a real store with the call log at level to logs.
func callLogServer(t *testing.T, level zerolog.Level, logs *syncBuffer) *grpc.ClientConn {
	t.Helper()
	st, _ := openStore(t, nil)
	srv := startServer(t, New(st, zerologNop()), GRPCConfig{Logger: zerolog.New(logs).Level(level)})
	srv.SetServing(true)
	return dial(t, srv.addr, nil)
}

// TestCallLogAtInfo: at storaged's default level successful calls and
// health checks leave no line; a failed call leaves one with its code and
// ErrorInfo reason.
func TestCallLogAtInfo(t *testing.T) {
	var logs syncBuffer
	conn := callLogServer(t, zerolog.InfoLevel, &logs)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	ctx := ctxT(t)
	msg := &storagedv1.Message{Topic: "log", Body: []byte("b")}
	for range 3 {
		if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: msg}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "log",
		Messages: []*storagedv1.BatchEntry{{Body: []byte("a")}, {Body: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "log"}); err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil {
		t.Fatal(err)
	}
	if s := logs.String(); s != "" {
		t.Fatalf("successful calls logged at info level:\n%s", s)
	}

	_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "../etc", Body: []byte("b")}})
	details(t, err).want(t, codes.InvalidArgument, "MESSAGE_ILLEGAL", false)
	_, err = client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "nothing-here"})
	details(t, err).want(t, codes.NotFound, ReasonQueueNotFound, false)

	lines := logLines(t, logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d lines for 2 failed calls:\n%s", len(lines), logs.String())
	}
	for i, want := range []struct{ method, code, reason string }{
		{"PutMessage", "InvalidArgument", "MESSAGE_ILLEGAL"},
		{"GetQueueInfo", "NotFound", ReasonQueueNotFound},
	} {
		l := lines[i]
		if l["message"] != "finished call" || l["level"] != "info" || l["grpc.service"] != ServiceName ||
			l["grpc.method"] != want.method || l["grpc.method_type"] != "unary" ||
			l["grpc.code"] != want.code || l[errorReasonKey] != want.reason {
			t.Errorf("line %d: %v, want method %s, code %s, reason %s at info level", i, l, want.method, want.code, want.reason)
		}
		if e, _ := l["grpc.error"].(string); !strings.Contains(e, "code = "+want.code) {
			t.Errorf("line %d: grpc.error %q", i, e)
		}
		if a, _ := l["peer.address"].(string); !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("line %d: peer.address %q", i, a)
		}
	}
}

// TestCallLogAtDebug: at debug level every call but health checks is
// logged, successful ones at debug level, streams with their type.
func TestCallLogAtDebug(t *testing.T) {
	var logs syncBuffer
	conn := callLogServer(t, zerolog.DebugLevel, &logs)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	ctx := ctxT(t)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "log", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	stream, err := client.PutMessageStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(streamMsg(1, &storagedv1.Message{Topic: "log", Body: []byte("s")})); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if r := recvAll(stream); r.err != nil || len(r.acks) != 1 {
		t.Fatalf("stream: %v, %d answers", r.err, len(r.acks))
	}

	lines := logLines(t, logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (the put and the stream):\n%s", len(lines), logs.String())
	}
	for i, want := range []struct{ method, typ string }{{"PutMessage", "unary"}, {"PutMessageStream", "bidi_stream"}} {
		l := lines[i]
		if l["level"] != "debug" || l["grpc.method"] != want.method || l["grpc.method_type"] != want.typ || l["grpc.code"] != "OK" {
			t.Errorf("line %d: %v, want %s (%s), OK at debug level", i, l, want.method, want.typ)
		}
		if _, ok := l["grpc.error"]; ok {
			t.Errorf("line %d: grpc.error on a successful call", i)
		}
	}
}

// middlewareLogger adapts zerolog to go-grpc-middleware's logging.Logger:
// the adapter storaged used with the middleware's interceptor before
// callLog replaced it.
func middlewareLogger(l zerolog.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		l := l.With().Fields(fields).Logger()
		switch lvl {
		case logging.LevelDebug:
			l.Debug().Msg(msg)
		case logging.LevelInfo:
			l.Info().Msg(msg)
		case logging.LevelWarn:
			l.Warn().Msg(msg)
		default:
			l.Error().Msg(msg)
		}
	})
}

// TestCallLogMatchesMiddleware: callLog writes the line go-grpc-middleware's
// logging interceptor wrote (same keys in the same order, same values but
// for the timings), plus grpc.error_reason.
func TestCallLogMatchesMiddleware(t *testing.T) {
	ctx := peer.NewContext(t.Context(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4567}})
	ctx, cancel := context.WithDeadline(ctx, time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC))
	defer cancel()
	info := &errdetails.ErrorInfo{Reason: "MESSAGE_ILLEGAL", Domain: ErrorDomain}
	unary := &grpc.UnaryServerInfo{FullMethod: "/" + ServiceName + "/PutMessage"}
	stream := &grpc.StreamServerInfo{FullMethod: "/" + ServiceName + "/PutMessageStream", IsClientStream: true, IsServerStream: true}

	for _, c := range []struct {
		name string
		err  error
	}{
		{"ok", nil},
		{"invalid", newStatus(codes.InvalidArgument, "invalid request: message.topic: bad", info, &errdetails.BadRequest{})},
		{"internal", newStatus(codes.Internal, "internal error", info)},
		{"unavailable", newStatus(codes.Unavailable, "busy")}, // no ErrorInfo
		{"plain", errTest},
	} {
		t.Run(c.name, func(t *testing.T) {
			var old, cur bytes.Buffer
			oldLog := logging.UnaryServerInterceptor(middlewareLogger(zerolog.New(&old)),
				logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(codeToLevel))
			oldStream := logging.StreamServerInterceptor(middlewareLogger(zerolog.New(&old)),
				logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(codeToLevel))
			curLog := callLog{log: zerolog.New(&cur)}
			handler := func(context.Context, any) (any, error) { return nil, c.err }
			shandler := func(any, grpc.ServerStream) error { return c.err }
			ss := &fakeServerStream{ctx: ctx}
			oldLog(ctx, nil, unary, handler)
			oldStream(nil, ss, stream, shandler)
			curLog.unary(ctx, nil, unary, handler)
			curLog.stream(nil, ss, stream, shandler)

			want, got := logLines(t, old.String()), logLines(t, cur.String())
			if len(want) != 2 || len(got) != 2 {
				t.Fatalf("middleware wrote %d lines, callLog %d; want 2 each", len(want), len(got))
			}
			wantKeys, gotKeys := jsonKeys(t, old.String()), jsonKeys(t, cur.String())
			for i := range want {
				if r := errorReason(c.err); r != "" {
					if got[i][errorReasonKey] != r {
						t.Errorf("line %d: %s = %v, want %s", i, errorReasonKey, got[i][errorReasonKey], r)
					}
					delete(got[i], errorReasonKey)
					gotKeys[i] = slices.DeleteFunc(gotKeys[i], func(k string) bool { return k == errorReasonKey })
				}
				if !slices.Equal(gotKeys[i], wantKeys[i]) {
					t.Errorf("line %d keys:\n got %v\nwant %v", i, gotKeys[i], wantKeys[i])
				}
				for _, k := range []string{"grpc.time_ms", "grpc.start_time"} {
					if _, ok := got[i][k]; !ok {
						t.Errorf("line %d: no %s", i, k)
					}
					delete(got[i], k)
					delete(want[i], k)
				}
				if g, w := toJSON(t, got[i]), toJSON(t, want[i]); g != w {
					t.Errorf("line %d:\n got %s\nwant %s", i, g, w)
				}
			}
		})
	}
}

type fakeServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *fakeServerStream) Context() context.Context { return s.ctx }

// jsonKeys returns the keys of each JSON object line, in order.
func jsonKeys(t *testing.T, s string) [][]string {
	t.Helper()
	var out [][]string
	for l := range strings.Lines(s) {
		dec := json.NewDecoder(strings.NewReader(l))
		var keys []string
		if _, err := dec.Token(); err != nil { // {
			t.Fatal(err)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k.(string))
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, keys)
	}
	return out
}

func toJSON(t *testing.T, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m) // sorted keys
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
