package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage"
)

// TestRepeatedErrorsThrottled: 1,000 puts refused the same way within one
// interval leave one call-log line and one service error line each, the
// next after the interval carries suppressed=999, and a different code or
// reason is logged at once. Before, every refused call logged two lines.
func TestRepeatedErrorsThrottled(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	var logs syncBuffer
	log := zerolog.New(&logs)
	svc := New(&fakeStore{err: storage.ErrCreateFile}, log)
	svc.logLimit = logthrottle.New(10*time.Second, clock)
	calls := callLog{log: log, limit: logthrottle.New(10*time.Second, clock)}
	info := &grpc.UnaryServerInfo{FullMethod: "/" + ServiceName + "/PutMessage"}
	put := func(context.Context, any) (any, error) {
		return svc.PutMessage(context.Background(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "T", Body: []byte("x")}})
	}
	for range 1000 {
		if _, err := calls.unary(context.Background(), nil, info, put); codeOf(err) != codes.Unavailable {
			t.Fatalf("put: %v, want Unavailable", err)
		}
	}
	if n := strings.Count(logs.String(), "\n"); n != 2 {
		t.Fatalf("%d lines for 1,000 identical failures in one interval, want 2 (call log + service):\n%s", n, logs.String())
	}
	// Another code/reason is its own key: logged at once.
	other := func(context.Context, any) (any, error) {
		return nil, newStatus(codes.Unavailable, "busy", &errdetails.ErrorInfo{Reason: "OS_PAGE_CACHE_BUSY", Domain: ErrorDomain})
	}
	calls.unary(context.Background(), nil, info, other)
	if n := strings.Count(logs.String(), "\n"); n != 3 {
		t.Fatalf("a different failure was not logged at once: %d lines", n)
	}
	now = now.Add(10 * time.Second)
	calls.unary(context.Background(), nil, info, put)
	lines := logLines(t, logs.String())
	if len(lines) != 5 {
		t.Fatalf("%d lines after the interval, want 5", len(lines))
	}
	for _, l := range lines[3:] {
		if l[logthrottle.SuppressedKey] != float64(999) {
			t.Errorf("line after the interval: %v, want suppressed 999", l)
		}
	}
}
