package server

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// testStoreHost is the store host of every test store: it is what msgIds
// decode to.
var testStoreHost = netip.MustParseAddrPort("127.0.0.1:10911")

// Small limits so that the tests exercise them cheaply.
const (
	testFileSize       = 64 << 10
	testMaxMessageSize = 1 << 10
)

// openStore opens a real store in a fresh temporary directory. It is closed
// when the test ends (after the server registered later has stopped).
func openStore(t *testing.T, mutate func(*storage.Options)) (*storage.Store, storage.Options) {
	t.Helper()
	opts := storage.Options{
		Dir:            t.TempDir(),
		FileSize:       testFileSize,
		MaxMessageSize: testMaxMessageSize,
		StoreHost:      testStoreHost,
	}
	if mutate != nil {
		mutate(&opts)
	}
	st, err := storage.Open(opts)
	if err != nil {
		t.Fatalf("storage.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("store.Close: %v", err)
		}
	})
	return st, opts
}

// testServer is a GRPCServer listening on 127.0.0.1:0.
type testServer struct {
	*GRPCServer
	addr string
}

// startServer serves svc on a real TCP listener. The server is shut down
// (and its Serve goroutine waited for) when the test ends.
func startServer(t testing.TB, svc *Service, cfg GRPCConfig) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return serveOn(t, svc, cfg, lis)
}

// serveOn is startServer on a listener of the test's (which may watch
// the connections).
func serveOn(t testing.TB, svc *Service, cfg GRPCConfig, lis net.Listener) *testServer {
	t.Helper()
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = testMaxMessageSize
	}
	gs, err := NewGRPCServer(svc, cfg)
	if err != nil {
		lis.Close()
		t.Fatalf("NewGRPCServer: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Shutdown(5 * time.Second)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testServer{GRPCServer: gs, addr: lis.Addr().String()}
}

// dial connects to addr (plaintext unless creds is given); the connection
// is closed when the test ends.
func dial(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// storeServer opens a store, serves it and returns a client.
func storeServer(t *testing.T, mutate func(*storage.Options), opts ...Option) (storagedv1.MessageStoreServiceClient, *storage.Store, storage.Options) {
	t.Helper()
	st, sopts := openStore(t, mutate)
	srv := startServer(t, New(st, zerolog.Nop(), opts...), GRPCConfig{})
	srv.SetServing(true)
	return storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil)), st, sopts
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// statusDetails splits a gRPC error into its status and typed details.
type statusDetails struct {
	st         *status.Status
	info       *errdetails.ErrorInfo
	badRequest *errdetails.BadRequest
	retry      *errdetails.RetryInfo
}

func details(t *testing.T, err error) statusDetails {
	t.Helper()
	if err == nil {
		t.Fatal("want an error, got nil")
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a gRPC status: %v", err)
	}
	d := statusDetails{st: st}
	for _, x := range st.Details() {
		switch v := x.(type) {
		case *errdetails.ErrorInfo:
			if d.info != nil {
				t.Errorf("two ErrorInfo details")
			}
			d.info = v
		case *errdetails.BadRequest:
			d.badRequest = v
		case *errdetails.RetryInfo:
			d.retry = v
		case error:
			t.Errorf("undecodable detail: %v", v)
		default:
			t.Errorf("unexpected detail %T", v)
		}
	}
	if d.info == nil {
		t.Fatalf("%v: no ErrorInfo detail", err)
	}
	if d.info.GetDomain() != ErrorDomain {
		t.Errorf("ErrorInfo domain = %q, want %q", d.info.GetDomain(), ErrorDomain)
	}
	return d
}

// wantStatus checks code, ErrorInfo reason and the presence of a RetryInfo.
func (d statusDetails) want(t *testing.T, code codes.Code, reason string, retry bool) {
	t.Helper()
	if d.st.Code() != code {
		t.Errorf("code = %v (%q), want %v", d.st.Code(), d.st.Message(), code)
	}
	if d.info.GetReason() != reason {
		t.Errorf("ErrorInfo reason = %q, want %q", d.info.GetReason(), reason)
	}
	if (d.retry != nil) != retry {
		t.Errorf("RetryInfo present = %v, want %v", d.retry != nil, retry)
	}
	if d.retry != nil && d.retry.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("RetryInfo delay = %v, want > 0", d.retry.GetRetryDelay().AsDuration())
	}
}

// fakeStore answers every put with a fixed result, or panics; every read
// fails with readErr (errTest when nil).
type fakeStore struct {
	res     storage.PutResult
	err     error
	panic   any
	readErr error
	// barrierErr is ReadBarrier's answer (a linearizable read's refusal).
	barrierErr error
}

func (f *fakeStore) ReadBarrier(context.Context) error { return f.barrierErr }

func (f *fakeStore) readError() error {
	if f.readErr != nil {
		return f.readErr
	}
	return errTest
}

func (f *fakeStore) GetMessage(int64) (*storage.Record, error)      { return nil, f.readError() }
func (f *fakeStore) GetMessageByID(string) (*storage.Record, error) { return nil, f.readError() }
func (f *fakeStore) QueueInfo(string, int32) (int64, int64, error)  { return 0, 0, f.readError() }
func (f *fakeStore) PullMessages(context.Context, storage.PullRequest) (storage.PullResult, error) {
	return storage.PullResult{}, f.readError()
}

func (f *fakeStore) PutMessage(context.Context, *storage.Message) (storage.PutResult, error) {
	if f.panic != nil {
		panic(f.panic)
	}
	return f.res, f.err
}

func (f *fakeStore) PutMessages(context.Context, *storage.Batch) (storage.PutResult, error) {
	return f.PutMessage(context.Background(), nil)
}

var errTest = errors.New("test error")

func zerologNop() zerolog.Logger { return zerolog.Nop() }

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	return ctx, cancel
}

func codeOf(err error) codes.Code { return status.Code(err) }

// syncBuffer is a log sink that tests can read while the server writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger(w *syncBuffer) zerolog.Logger {
	return zerolog.New(w).Level(zerolog.DebugLevel)
}
