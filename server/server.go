// Package server is the gRPC edge of storaged: it validates requests,
// converts them from storaged.v1 protos to storage messages, calls the store
// and maps the outcome back to a response or a rich gRPC status.
//
// The edge is thin on purpose. What a put means is decided by the storage
// package; this package only decides how that outcome is told to a client:
//
//   - appended (PUT_OK, FLUSH_DISK_TIMEOUT, …): an OK response that carries
//     the status and the append result;
//   - rejected, nothing stored: a gRPC error whose details hold an ErrorInfo
//     (domain "storaged", reason the RocketMQ status name) and, depending on
//     the cause, a BadRequest or a RetryInfo (errors.go is the one mapping);
//   - appended, durability unknown: a gRPC error that says so and names the
//     msgId and offset in the ErrorInfo metadata.
//
// grpcserver.go assembles the *grpc.Server (interceptors, health,
// reflection, keepalive, TLS) and metrics.go exports the store's counters to
// Prometheus.
package server

import (
	"context"
	"sync/atomic"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// Store is what the service needs from the message store; *storage.Store
// implements it. See storage.Store.PutMessage for the result contract.
type Store interface {
	PutMessage(ctx context.Context, m *storage.Message) (storage.PutResult, error)
	PutMessages(ctx context.Context, b *storage.Batch) (storage.PutResult, error)
}

var _ Store = (*storage.Store)(nil)

// DefaultMaxBatchMessages is the default limit on the number of entries of a
// PutMessages request. The store separately limits the summed body size.
const DefaultMaxBatchMessages = 1024

// Service implements storagedv1.MessageStoreServiceServer on top of a Store.
type Service struct {
	storagedv1.UnimplementedMessageStoreServiceServer

	store            Store
	log              zerolog.Logger
	maxBatchMessages int
	now              func() int64 // Unix ms; the default born timestamp
}

// Option configures a Service.
type Option func(*Service)

// WithMaxBatchMessages limits the number of entries of a PutMessages request
// (default DefaultMaxBatchMessages). n <= 0 keeps the default.
func WithMaxBatchMessages(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.maxBatchMessages = n
		}
	}
}

// New returns a Service that stores messages in store and logs unexpected
// failures to logger.
func New(store Store, logger zerolog.Logger, opts ...Option) *Service {
	s := &Service{
		store:            store,
		log:              logger,
		maxBatchMessages: DefaultMaxBatchMessages,
		now:              unixMilliNow,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Register registers the service on r.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	storagedv1.RegisterMessageStoreServiceServer(r, s)
}

// PutMessage implements storagedv1.MessageStoreServiceServer.
func (s *Service) PutMessage(ctx context.Context, req *storagedv1.PutMessageRequest) (*storagedv1.PutMessageResponse, error) {
	m, fe := toMessage(req, s.now(), bornHost(ctx))
	if fe != nil {
		return nil, s.rejected(ctx, methodPutMessage, fe)
	}
	res, err := s.store.PutMessage(ctx, m)
	if err != nil {
		return nil, s.putError(ctx, methodPutMessage, res, err)
	}
	return &storagedv1.PutMessageResponse{
		Status: toProtoStatus(res.Status),
		Result: toAppendResult(&res.Append, false),
	}, nil
}

// PutMessages implements storagedv1.MessageStoreServiceServer.
func (s *Service) PutMessages(ctx context.Context, req *storagedv1.PutMessagesRequest) (*storagedv1.PutMessagesResponse, error) {
	b, fe := toBatch(req, s.now(), bornHost(ctx), s.maxBatchMessages)
	if fe != nil {
		return nil, s.rejected(ctx, methodPutMessages, fe)
	}
	res, err := s.store.PutMessages(ctx, b)
	if err != nil {
		return nil, s.putError(ctx, methodPutMessages, res, err)
	}
	return &storagedv1.PutMessagesResponse{
		Status: toProtoStatus(res.Status),
		Result: toAppendResult(&res.Append, true),
	}, nil
}

// rejected reports a request refused by validation, before the store.
func (s *Service) rejected(ctx context.Context, m method, fe *fieldError) error {
	return s.putError(ctx, m, storage.PutResult{Status: fe.Status}, fe)
}

// DeferredStore is a Store whose real store is set later: until Set is
// called every put is refused with SERVICE_NOT_AVAILABLE (ErrStarting). It
// lets the gRPC server (and its health service) listen while the store is
// still recovering its commitlog.
type DeferredStore struct {
	p atomic.Pointer[storeBox]
}

type storeBox struct{ s Store }

var _ Store = (*DeferredStore)(nil)

// Set makes every later put go to s.
func (d *DeferredStore) Set(s Store) { d.p.Store(&storeBox{s}) }

// PutMessage implements Store.
func (d *DeferredStore) PutMessage(ctx context.Context, m *storage.Message) (storage.PutResult, error) {
	if b := d.p.Load(); b != nil {
		return b.s.PutMessage(ctx, m)
	}
	return storage.PutResult{Status: storage.ServiceNotAvailable}, ErrStarting
}

// PutMessages implements Store.
func (d *DeferredStore) PutMessages(ctx context.Context, b *storage.Batch) (storage.PutResult, error) {
	if sb := d.p.Load(); sb != nil {
		return sb.s.PutMessages(ctx, b)
	}
	return storage.PutResult{Status: storage.ServiceNotAvailable}, ErrStarting
}
