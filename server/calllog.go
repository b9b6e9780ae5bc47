package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/internal/logthrottle"
)

// callLog is the call-logging interceptor: one "finished call" line per
// call (health checks excepted) at codeToLevel of its code. The line has
// the fields go-grpc-middleware's logging interceptor (v2.3.4, with
// WithLogOnEvents(FinishCall)) writes, in its order, plus
// grpc.error_reason, the ErrorInfo reason of a failed call (the RocketMQ
// status name for puts), and trace_id and span_id when the call has a
// trace (tracing on, tracing.go).
//
// It replaces that interceptor because the middleware builds the line's
// fields (the peer address and start time as strings, several slices and
// a map) for every call before the logger decides to drop it; successful
// calls are logged at debug level, so in production it built them for
// nothing, 57 allocations per unary call. Here a call whose line is not
// enabled costs a clock read and a level check.
//
// Failed calls logged at warn or error level go through a log throttle
// keyed by method, code and ErrorInfo reason: the first at once, then at
// most one line per logthrottle.DefaultInterval carrying the count of the
// suppressed ones. A full disk refusing every put logged a line per call
// (≈ 26,700 error lines in 6 s with the store's own); each call is still
// counted in grpc_server_handled_total.
type callLog struct {
	log   zerolog.Logger
	limit *logthrottle.Throttle // nil: every line is logged
}

// Fields of the line that go-grpc-middleware's logging does not name.
const (
	peerAddressKey = "peer.address"
	startTimeKey   = "grpc.start_time"
	deadlineKey    = "grpc.request.deadline"
	codeKey        = "grpc.code"
	errorKey       = "grpc.error"
	// errorReasonKey is ours: the ErrorInfo reason of the status.
	errorReasonKey = "grpc.error_reason"
	// traceIDKey and spanIDKey name the call's trace, in hex, as the
	// OpenTelemetry log data model does.
	traceIDKey = "trace_id"
	spanIDKey  = "span_id"
)

func (c callLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	c.finished(ctx, info.FullMethod, interceptors.Unary, start, err, rocketMQFailure(resp))
	return resp, err
}

func (c callLog) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	typ := interceptors.BidiStream
	switch {
	case info.IsClientStream && !info.IsServerStream:
		typ = interceptors.ClientStream
	case !info.IsClientStream && info.IsServerStream:
		typ = interceptors.ServerStream
	}
	c.finished(ss.Context(), info.FullMethod, typ, start, err, nil)
	return err
}

// rocketMQFailure is the Status of a RocketMQ protocol answer that reports
// a failure, nil for any other answer. That protocol answers its failures
// with gRPC status OK and the outcome in the body (rocketmq.go), which the
// call log would otherwise log as successes.
func rocketMQFailure(resp any) *rocketmqv2.Status {
	r, ok := resp.(interface{ GetStatus() *rocketmqv2.Status })
	if !ok {
		return nil
	}
	switch st := r.GetStatus(); st.GetCode() {
	case rocketmqv2.Code_OK, rocketmqv2.Code_MULTIPLE_RESULTS:
		return nil
	default:
		return st
	}
}

// Fields of a RocketMQ protocol failure (rocketMQFailure).
const (
	rocketMQCodeKey    = "rocketmq.code"
	rocketMQMessageKey = "rocketmq.message"
)

// finished logs the line of a call that started at start and ended with
// err, if its level is enabled. A RocketMQ protocol call answered with a
// failure status (rmq, err nil) is logged at info level when the request
// was refused (4xx codes) and at warn level when the server failed (5xx),
// with the status's code and message.
func (c callLog) finished(ctx context.Context, fullMethod string, typ interceptors.GRPCType, start time.Time, err error, rmq *rocketmqv2.Status) {
	service, method := splitMethod(fullMethod)
	if service == healthpb.Health_ServiceDesc.ServiceName {
		return
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	level := zerologLevel(codeToLevel(code))
	if err != nil {
		rmq = nil
	}
	if rmq != nil {
		level = zerolog.InfoLevel
		if rmq.GetCode() >= rocketmqv2.Code_INTERNAL_ERROR {
			level = zerolog.WarnLevel
		}
	}
	ev := c.log.WithLevel(level)
	if ev == nil { // level disabled: nothing is built
		return
	}
	var reason string
	if err != nil {
		reason = errorReason(err)
	}
	if rmq != nil {
		reason = rmq.GetCode().String()
	}
	if level >= zerolog.WarnLevel && c.limit != nil {
		if ev = c.limit.Event(fullMethod+" "+code.String()+" "+reason, ev); ev == nil {
			return
		}
	}
	fields := logging.Fields{
		logging.SystemTag[0], logging.SystemTag[1],
		logging.ComponentFieldKey, logging.KindServerFieldValue,
		logging.ServiceFieldKey, service,
		logging.MethodFieldKey, method,
		logging.MethodTypeFieldKey, string(typ),
	}
	if p, ok := peer.FromContext(ctx); ok {
		fields = append(fields, peerAddressKey, p.Addr.String())
	}
	fields = append(fields, startTimeKey, start.Format(time.RFC3339))
	if d, ok := ctx.Deadline(); ok {
		fields = append(fields, deadlineKey, d.Format(time.RFC3339))
	}
	fields = append(fields, codeKey, code.String())
	if rmq != nil {
		fields = append(fields, rocketMQCodeKey, rmq.GetCode().String(), rocketMQMessageKey, rmq.GetMessage())
	}
	if err != nil {
		fields = append(fields, errorKey, fmt.Sprintf("%v", err))
		if reason != "" {
			fields = append(fields, errorReasonKey, reason)
		}
	}
	fields = append(fields, logging.DurationToTimeMillisFields(time.Since(start))...)
	// A trace is present only while tracing is on (GRPCConfig.TracerProvider):
	// the server span's ids, or the client's with a no-op tracer provider.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		fields = append(fields, traceIDKey, sc.TraceID().String(), spanIDKey, sc.SpanID().String())
	}
	ev.Fields([]any(fields)).Msg("finished call")
}

// splitMethod splits "/package.Service/Method" as go-grpc-middleware does.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.Index(fullMethod, "/"); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", "unknown"
}

// errorReason is the reason of err's ErrorInfo detail, "" without one.
func errorReason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// codeToLevel logs successful calls at debug level (puts are the hot path)
// and everything else as go-grpc-middleware does by default.
func codeToLevel(c codes.Code) logging.Level {
	if c == codes.OK {
		return logging.LevelDebug
	}
	return logging.DefaultServerCodeToLevel(c)
}

func zerologLevel(l logging.Level) zerolog.Level {
	switch l {
	case logging.LevelDebug:
		return zerolog.DebugLevel
	case logging.LevelInfo:
		return zerolog.InfoLevel
	case logging.LevelWarn:
		return zerolog.WarnLevel
	}
	return zerolog.ErrorLevel
}
