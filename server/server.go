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
// Reads (read.go) return StoredMessages and map the store's read errors in
// readError: OUT_OF_RANGE with min/max, NOT_FOUND, DATA_LOSS, never wrong
// bytes. PutMessageStream (stream.go) answers each streamed message with what
// PutMessage would have said, with a bounded window per stream.
//
// rocketmq.go (and rocketmq_send.go, rocketmq_offsets.go, rocketmq_pull.go,
// rocketmq_pop.go) serves Apache RocketMQ 5's client protocol,
// apache.rocketmq.v2, on the same store and port, mapping its calls onto
// the same put, pull, offset and POP paths and its outcomes onto that protocol's status codes through
// the same error classification (grpcToV2).
//
// grpcserver.go assembles the *grpc.Server (interceptors, health,
// reflection, keepalive, TLS) and metrics.go exports the store's counters to
// Prometheus.
package server

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage"
)

// Store is what the service needs from the message store; *storage.Store
// implements it. See storage.Store.PutMessage for the result contract and
// storage/read.go for the reads and their errors.
type Store interface {
	PutMessage(ctx context.Context, m *storage.Message) (storage.PutResult, error)
	PutMessages(ctx context.Context, b *storage.Batch) (storage.PutResult, error)

	GetMessage(offset int64) (*storage.Record, error)
	GetMessageByID(msgID string) (*storage.Record, error)
	PullMessages(ctx context.Context, req storage.PullRequest) (storage.PullResult, error)
	QueueInfo(topic string, queueID int32) (minOffset, maxOffset int64, err error)
	// ReadBarrier makes the reads after it linearizable (the requests'
	// linearizable field): see storage.Store.ReadBarrier.
	ReadBarrier(ctx context.Context) error
}

var _ Store = (*storage.Store)(nil)

// DedupStore is a store that keeps puts carrying a UNIQ_KEY once within a
// window (GetReplicaInfo reports it: dedup_window); *storage.Store and
// DeferredStore implement it.
type DedupStore interface {
	// DedupHorizon: see storage.Store.DedupHorizon (0: off).
	DedupHorizon() time.Duration
}

var (
	_ DedupStore = (*storage.Store)(nil)
	_ DedupStore = (*DeferredStore)(nil)
)

// Defaults and limits of the service.
const (
	// DefaultMaxBatchMessages is the default limit on the number of entries
	// of a PutMessages request. The store separately limits the summed body
	// size.
	DefaultMaxBatchMessages = 1024

	// DefaultMaxPullWait caps PullMessagesRequest.wait (long polling). It
	// stays under the request timeouts of the proxies a client may sit
	// behind, so that a long poll ends with the server's (empty) answer,
	// never with the proxy's timeout (UNAVAILABLE or INTERNAL, no
	// ErrorInfo): Envoy's default route timeout, hence Istio's, is 15 s,
	// and RocketMQ's broker suspends a pull for 15 s at most. Deployments
	// whose proxies allow more can raise it (storaged --max-pull-wait).
	DefaultMaxPullWait = 10 * time.Second

	// DefaultStreamWindow is how many messages of one PutMessageStream the
	// server holds at once (received, not yet answered). While that many
	// are outstanding it stops reading the stream: HTTP/2 flow control then
	// slows the client down.
	DefaultStreamWindow = 256

	// Pull bounds: PullMessagesRequest.max_messages and max_bytes default
	// to these when zero and are lowered to the maxima. The default byte
	// bound keeps a default pull (even with include_raw, which sends each
	// record twice) under the 4 MiB default receive limit of gRPC clients.
	DefaultPullMessages = 32
	MaxPullMessages     = 1024
	DefaultPullBytes    = 1 << 20
	MaxPullBytes        = 16 << 20
	// MaxPullTags bounds PullMessagesRequest.tags.
	MaxPullTags = 64
)

// Service implements storagedv1.MessageStoreServiceServer on top of a Store.
type Service struct {
	storagedv1.UnimplementedMessageStoreServiceServer

	// producers are the RocketMQ producers connected, for transaction
	// checks (rocketmq_txn.go).
	producers *producerRegistry

	store            Store
	log              zerolog.Logger
	logLimit         *logthrottle.Throttle // the repeating error lines of errors.go
	maxBatchMessages int
	maxPullWait      time.Duration
	// consumerMaxAttempts is a consumer group's POP delivery attempts
	// when its client names none (rocketmq_pop.go).
	consumerMaxAttempts int32
	// fifoGroups are the consumer groups configured to consume in order
	// (WithFifoConsumerGroups; rocketmq_pop.go).
	fifoGroups     map[string]bool
	streamWindow   int
	now            func() int64 // Unix ms; the default born timestamp
	maxMessageSize int          // the store's; a read reserves room for one record of it
	inflight       *inflight    // bytes of read answers in flight
	// life ends PutMessageStreams before their connection's age limit
	// (streamlife.go); set by NewGRPCServer, nil without it.
	life *streamLife

	// draining is cancelled by Drain: long polls end, streams stop taking
	// messages.
	draining context.Context
	drain    context.CancelFunc

	// tracer makes the puts' append and flush-wait spans (tracing.go); nil
	// while tracing is off. NewGRPCServer sets it from
	// GRPCConfig.TracerProvider.
	tracer    trace.Tracer
	exemplars PutExemplars

	// Replication (replica.go): nil when standalone.
	replicaInfo func() ReplicaInfo
	clientAddr  func(id uint64) string
	// forwarder, when set, takes a follower's puts to the leader
	// (forward.go); fwd counts them.
	forwarder Forwarder
	fwd       forwardCounts
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

// WithMaxPullWait caps the long-poll wait of PullMessages (default
// DefaultMaxPullWait). d <= 0 keeps the default.
func WithMaxPullWait(d time.Duration) Option {
	return func(s *Service) {
		if d > 0 {
			s.maxPullWait = d
		}
	}
}

// WithConsumerMaxAttempts sets the delivery attempts of a RocketMQ
// consumer group whose client's settings name none (default 17: RocketMQ's
// 16 retries): a message received that many times without an ack goes to
// the group's dead-letter topic. n outside [1, storage.MaxPopAttempts]
// keeps the default.
func WithConsumerMaxAttempts(n int) Option {
	return func(s *Service) {
		if n >= 1 && n <= storage.MaxPopAttempts {
			s.consumerMaxAttempts = int32(n)
		}
	}
}

// WithFifoConsumerGroups makes groups FIFO consumer groups (RocketMQ's
// consumeMessageOrderly group setting): their POP receives consume each
// queue in order (storage.PopRequest.Fifo) and their clients' settings
// say fifo, so the SDKs consume a message group's messages one after the
// other. Names that are not valid groups are ignored (the command line
// checks them).
func WithFifoConsumerGroups(groups []string) Option {
	return func(s *Service) {
		for _, g := range groups {
			if storage.GroupProblem(g) == "" {
				if s.fifoGroups == nil {
					s.fifoGroups = map[string]bool{}
				}
				s.fifoGroups[g] = true
			}
		}
	}
}

// WithStreamWindow sets how many messages of one PutMessageStream may be
// outstanding (default DefaultStreamWindow). n <= 0 keeps the default.
func WithStreamWindow(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.streamWindow = n
		}
	}
}

// WithMaxPullInflightBytes bounds the bytes of read answers (PullMessages,
// GetMessage) held at once, read and not yet sent (default
// DefaultMaxPullInflightBytes); reads beyond it are refused with
// RESOURCE_EXHAUSTED and a RetryInfo. n <= 0 keeps the default.
func WithMaxPullInflightBytes(n int64) Option {
	return func(s *Service) {
		if n > 0 {
			s.inflight.limit = n
		}
	}
}

// WithMaxMessageSize tells the service the store's MaxMessageSize (default
// storage.DefaultMaxMessageSize): GetMessage, and a pull whose max_bytes
// is smaller, reserve room for one record of that size before they read.
// n <= 0 keeps the default.
func WithMaxMessageSize(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.maxMessageSize = n
		}
	}
}

// New returns a Service that stores messages in store and logs unexpected
// failures to logger.
func New(store Store, logger zerolog.Logger, opts ...Option) *Service {
	s := &Service{
		store:               store,
		log:                 logger,
		logLimit:            logthrottle.New(logthrottle.DefaultInterval, nil),
		maxBatchMessages:    DefaultMaxBatchMessages,
		maxPullWait:         DefaultMaxPullWait,
		consumerMaxAttempts: consumerMaxAttempts,
		streamWindow:        DefaultStreamWindow,
		now:                 unixMilliNow,
		maxMessageSize:      storage.DefaultMaxMessageSize,
		inflight:            newInflight(DefaultMaxPullInflightBytes),
		producers:           newProducerRegistry(),
	}
	s.draining, s.drain = context.WithCancel(context.Background())
	for _, o := range opts {
		o(s)
	}
	if ts, ok := store.(TransactionStore); ok {
		ts.SetTransactionChecker(s) // the store's transaction checks go to producers' Telemetry streams
	}
	return s
}

// Exemplars returns the trace ids of the latest sampled puts, for
// NewStoreCollector's WithPutExemplars. They are only recorded while
// tracing is on (GRPCConfig.TracerProvider).
func (s *Service) Exemplars() *PutExemplars { return &s.exemplars }

// Drain tells the service that the server is shutting down: waiting pulls
// answer at once with what is there, and PutMessageStream answers every
// further message with UNAVAILABLE (nothing stored) so that clients move to
// another server while in-flight work finishes. GRPCServer.Shutdown calls
// it before GracefulStop. Calling it again is harmless.
func (s *Service) Drain() { s.drain() }

// Register registers the service on r: storaged.v1.MessageStoreService and,
// on the same port, Apache RocketMQ 5's client protocol
// (apache.rocketmq.v2.MessagingService, rocketmq.go) over the same store.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	storagedv1.RegisterMessageStoreServiceServer(r, s)
	rocketmqv2.RegisterMessagingServiceServer(r, &rocketMQ{svc: s})
}

// PutMessage implements storagedv1.MessageStoreServiceServer.
func (s *Service) PutMessage(ctx context.Context, req *storagedv1.PutMessageRequest) (*storagedv1.PutMessageResponse, error) {
	return s.putMessage(ctx, req, bornHost(ctx), true)
}

// putMessage is PutMessage for a client at born; forward: a follower may
// forward it to the leader (forward.go), false for a forwarded put.
func (s *Service) putMessage(ctx context.Context, req *storagedv1.PutMessageRequest, born netip.AddrPort, forward bool) (*storagedv1.PutMessageResponse, error) {
	m, fe := toMessage(req, s.now(), born)
	if fe != nil {
		return nil, s.rejected(ctx, methodPutMessage, fe)
	}
	res, err := s.store.PutMessage(ctx, m)
	if s.tracer != nil {
		s.tracePut(ctx, &res, err)
	}
	if err != nil && forward {
		if resp, sent, ferr := s.forward(ctx, methodPutMessage, err, born,
			&peerv1.ForwardPutRequest{Put: &peerv1.ForwardPutRequest_Message{Message: req}}); sent {
			return resp.GetMessage(), ferr
		}
	}
	if err != nil {
		return nil, s.putError(ctx, methodPutMessage, res, err)
	}
	resp := toPutMessageResponse(&res)
	if at := req.GetMessage().GetDeliverAt(); at != nil && res.Append.Topic == storage.TimerTopic {
		resp.RecallHandle = encodeRecallHandle(recallHandle{Topic: req.GetMessage().GetTopic(), Broker: BrokerName,
			DueMS: at.AsTime().UnixMilli(), MsgID: resp.GetResult().GetMsgId()})
	}
	return resp, nil
}

// PutMessages implements storagedv1.MessageStoreServiceServer.
func (s *Service) PutMessages(ctx context.Context, req *storagedv1.PutMessagesRequest) (*storagedv1.PutMessagesResponse, error) {
	return s.putMessages(ctx, req, bornHost(ctx), true)
}

// putMessages is PutMessages for a client at born (forward: as putMessage).
func (s *Service) putMessages(ctx context.Context, req *storagedv1.PutMessagesRequest, born netip.AddrPort, forward bool) (*storagedv1.PutMessagesResponse, error) {
	b, fe := toBatch(req, s.now(), born, s.maxBatchMessages)
	if fe != nil {
		return nil, s.rejected(ctx, methodPutMessages, fe)
	}
	res, err := s.store.PutMessages(ctx, b)
	if s.tracer != nil {
		s.tracePut(ctx, &res, err)
	}
	if err != nil && forward {
		if resp, sent, ferr := s.forward(ctx, methodPutMessages, err, born,
			&peerv1.ForwardPutRequest{Put: &peerv1.ForwardPutRequest_Messages{Messages: req}}); sent {
			return resp.GetMessages(), ferr
		}
	}
	if err != nil {
		return nil, s.putError(ctx, methodPutMessages, res, err)
	}
	return toPutMessagesResponse(&res), nil
}

// rejected reports a request refused by validation, before the store.
func (s *Service) rejected(ctx context.Context, m method, fe *fieldError) error {
	return s.putError(ctx, m, storage.PutResult{Status: fe.Status}, fe)
}

// DeferredStore is a Store whose real store is set later: until Set is
// called every put is refused with SERVICE_NOT_AVAILABLE (ErrStarting), and
// every read too. It
// lets the gRPC server (and its health service) listen while the store is
// still recovering its commitlog.
type DeferredStore struct {
	p       atomic.Pointer[storeBox]
	checker deferredChecker
}

type storeBox struct{ s Store }

// checker is the transaction checker given before Set (TransactionStore).
type deferredChecker struct {
	mu sync.Mutex
	c  storage.TransactionChecker
}

var _ Store = (*DeferredStore)(nil)

// Set makes every later put go to s (and gives s the transaction checker
// set before).
func (d *DeferredStore) Set(s Store) {
	d.checker.mu.Lock()
	defer d.checker.mu.Unlock()
	if ts, ok := s.(TransactionStore); ok && d.checker.c != nil {
		ts.SetTransactionChecker(d.checker.c)
	}
	d.p.Store(&storeBox{s})
}

// SetTransactionChecker implements TransactionStore.
func (d *DeferredStore) SetTransactionChecker(c storage.TransactionChecker) {
	d.checker.mu.Lock()
	defer d.checker.mu.Unlock()
	d.checker.c = c
	if b := d.p.Load(); b != nil {
		if ts, ok := b.s.(TransactionStore); ok {
			ts.SetTransactionChecker(c)
		}
	}
}

// EndTransaction implements TransactionStore.
func (d *DeferredStore) EndTransaction(ctx context.Context, topic string, phys int64, commit bool) (storage.TransactionResult, error) {
	b := d.p.Load()
	if b == nil {
		return storage.TransactionResult{}, ErrStarting
	}
	ts, ok := b.s.(TransactionStore)
	if !ok {
		return storage.TransactionResult{}, errNoTransactionStore
	}
	return ts.EndTransaction(ctx, topic, phys, commit)
}

// errNoTransactionStore: the store set keeps no transactional messages.
var errNoTransactionStore = errors.New("server: this store keeps no transactional messages")

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

// GetMessage implements Store.
func (d *DeferredStore) GetMessage(offset int64) (*storage.Record, error) {
	if b := d.p.Load(); b != nil {
		return b.s.GetMessage(offset)
	}
	return nil, ErrStarting
}

// GetMessageByID implements Store.
func (d *DeferredStore) GetMessageByID(msgID string) (*storage.Record, error) {
	if b := d.p.Load(); b != nil {
		return b.s.GetMessageByID(msgID)
	}
	return nil, ErrStarting
}

// PullMessages implements Store.
func (d *DeferredStore) PullMessages(ctx context.Context, req storage.PullRequest) (storage.PullResult, error) {
	if b := d.p.Load(); b != nil {
		return b.s.PullMessages(ctx, req)
	}
	return storage.PullResult{}, ErrStarting
}

// QueueInfo implements Store.
func (d *DeferredStore) QueueInfo(topic string, queueID int32) (minOffset, maxOffset int64, err error) {
	if b := d.p.Load(); b != nil {
		return b.s.QueueInfo(topic, queueID)
	}
	return 0, 0, ErrStarting
}

// DedupHorizon implements DedupStore: 0 before the store is set (a
// client then retries nothing it does not know the outcome of).
func (d *DeferredStore) DedupHorizon() time.Duration {
	if b := d.p.Load(); b != nil {
		if ds, ok := b.s.(DedupStore); ok {
			return ds.DedupHorizon()
		}
	}
	return 0
}

// ReadBarrier implements Store.
func (d *DeferredStore) ReadBarrier(ctx context.Context) error {
	if b := d.p.Load(); b != nil {
		return b.s.ReadBarrier(ctx)
	}
	return ErrStarting
}
