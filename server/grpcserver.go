package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage"
)

// ServiceName is the full name of the MessageStoreService, also its name in
// the health service (storagedv1.MessageStoreService_ServiceDesc.ServiceName).
const ServiceName = "storaged.v1.MessageStoreService"

// Defaults of GRPCConfig.
const (
	// RequestOverhead is what a request may carry beyond the store's message
	// size limit: topic, properties (up to 32 KiB per message), timestamps
	// and protobuf framing. The largest valid request is MaxMessageSize +
	// RequestOverhead; see MaxRecvMsgSize for what the transport takes.
	RequestOverhead              = 1 << 20
	DefaultMaxConcurrentStreams  = 1024
	DefaultMaxConnectionAge      = 10 * time.Minute
	DefaultMaxConnectionAgeGrace = 30 * time.Second
	// DefaultStreamWorkers is GRPCConfig.StreamWorkers' default.
	DefaultStreamWorkers = 64
	// KeepaliveMinTime is the shortest client ping interval the server
	// tolerates; clients that ping more often get GOAWAY "too_many_pings".
	KeepaliveMinTime = 10 * time.Second
)

// handlingTimeBuckets are the bounds of grpc_server_handling_seconds:
// 50 µs doubling up to 13.1 s. A unary put answers in 0.25-2 ms, which
// the client library's default buckets (lowest 5 ms) could not tell
// apart; long polls (up to DefaultMaxPullWait) land in +Inf.
var handlingTimeBuckets = prometheus.ExponentialBuckets(50e-6, 2, 19)

// MaxRecvMsgSize is the gRPC receive limit for a store whose message size
// limit is maxMessageSize: twice the largest valid request (maxMessageSize +
// RequestOverhead). gRPC refuses a larger request while reading it, with a
// bare RESOURCE_EXHAUSTED status (no ErrorInfo: grpc-go writes that status
// itself before any handler or interceptor runs, so nothing can add the
// details). The slack lets the usual mistake, a body or batch somewhat over
// the limit, reach the service, whose validation answers INVALID_ARGUMENT
// with ErrorInfo MESSAGE_ILLEGAL (or PROPERTIES_SIZE_EXCEEDED) and a
// BadRequest naming the field, while one request still cannot make the
// server hold more than this.
func MaxRecvMsgSize(maxMessageSize int) int { return 2 * (maxMessageSize + RequestOverhead) }

// GRPCConfig configures NewGRPCServer. The zero value is a plaintext server
// with the defaults above.
type GRPCConfig struct {
	// Logger receives the call log (one "finished call" line per call,
	// health checks excluded; successful calls at debug level, failures
	// with grpc.code and grpc.error_reason) and recovered panics.
	Logger zerolog.Logger
	// MaxMessageSize is the store's limit on a body and on a batch's summed
	// bodies (storage.Options.MaxMessageSize). Default
	// storage.DefaultMaxMessageSize.
	MaxMessageSize int
	// MaxConcurrentStreams bounds the concurrent calls per connection.
	// Default DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxConnectionAge makes clients reconnect now and then, so that
	// connection-level load balancers spread them (gRFC A9). Default
	// DefaultMaxConnectionAge; MaxConnectionAgeGrace is the time in-flight
	// calls get afterwards, default DefaultMaxConnectionAgeGrace.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// TLS, when set, serves TLS only (see LoadTLSConfig). Nil serves
	// plaintext HTTP/2 (h2c), the right choice behind a mesh sidecar.
	TLS *tls.Config
	// Reflection registers the server reflection service (grpcurl, ghz).
	Reflection bool
	// Registerer, when set, receives the gRPC server metrics
	// (grpc_server_handled_total, grpc_server_handling_seconds, …).
	Registerer prometheus.Registerer
	// Clock, when set, is the time PutMessageStream ends its streams by
	// (streamlife.go): tests move it. Default the system clock, with real
	// timers. grpc-go's own connection age always runs on real time.
	Clock storage.TimerClock
	// MaxConnections bounds the connections served at once (0: no
	// bound). Each costs a file descriptor; past the bound the server stops
	// accepting, so a further client waits in the kernel's accept backlog
	// (holding no descriptor of the process) until a served connection
	// closes, and the store keeps the descriptors its files need: without
	// it, idle connections could use up RLIMIT_NOFILE and make the store's
	// own opens fail with EMFILE. storaged derives its default from
	// RLIMIT_NOFILE (--max-connections).
	MaxConnections int
	// TracerProvider, when set, turns tracing on (tracing.go): a span per
	// call, child of the client's W3C traceparent, with the put's append
	// and flush-wait spans below it; trace ids in the call log and as
	// exemplars of the latency histograms. Nil (the default) installs none
	// of it.
	TracerProvider trace.TracerProvider
	// StreamWorkers is how many goroutines serve calls and are kept for
	// the next ones (grpc.NumStreamWorkers); a call that finds none idle
	// gets a goroutine of its own, as without workers. Why: a goroutine
	// per call starts on a small stack and grows it in every call (the
	// interceptors and the put path are deep), which cost 6 % of the
	// server's CPU in sync-mode unary puts (runtime.newstack/copystack,
	// BENCHMARKS.md); a kept worker keeps its grown stack. Default
	// DefaultStreamWorkers; negative: none.
	StreamWorkers int
}

// GRPCServer is the assembled gRPC server: the MessageStoreService, health
// and optional reflection, behind logging, metrics and recovery interceptors.
type GRPCServer struct {
	srv      *grpc.Server
	svc      *Service
	health   *health.Server
	log      zerolog.Logger
	maxConns int          // GRPCConfig.MaxConnections
	conns    *connTracker // when each connection was accepted (streamlife.go)

	stopWatch chan struct{} // closed by Shutdown: WatchStore goroutines end
	stopOnce  sync.Once
	watchers  sync.WaitGroup
}

// NewGRPCServer builds the server for svc. The health service starts with
// the overall status ("") SERVING and ServiceName NOT_SERVING: call
// WatchStore (or SetServing(true)) once the store is open.
func NewGRPCServer(svc *Service, cfg GRPCConfig) (*GRPCServer, error) {
	opts, srvMetrics, err := serverOptions(cfg, svc.inflight)
	if err != nil {
		return nil, err
	}
	svc.inflight.viaCodec = true // the codec releases read reservations after the send
	if cfg.TracerProvider != nil {
		svc.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	srv := grpc.NewServer(opts...)

	svc.Register(srv)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	if cfg.Reflection {
		reflection.Register(srv)
	}
	srvMetrics.InitializeMetrics(srv)
	d := cfg.withDefaults()
	life := &streamLife{age: d.MaxConnectionAge, grace: d.MaxConnectionAgeGrace, clock: cfg.Clock}
	life.conns = newConnTracker(life.now)
	svc.life = life
	return &GRPCServer{srv: srv, svc: svc, health: hs, log: cfg.Logger, maxConns: cfg.MaxConnections, conns: life.conns,
		stopWatch: make(chan struct{})}, nil
}

// GRPCServerOptions returns the options NewGRPCServer builds its
// grpc.Server with: the receive limit (MaxRecvMsgSize),
// the codec (see codec; the buffer pool is the process's, see
// NewBufferPool), MaxConcurrentStreams,
// the keepalive policy and parameters, the interceptor chain (Prometheus
// metrics, registered with cfg.Registerer when set; call logging to
// cfg.Logger; panic recovery), TLS when cfg.TLS is set and the
// OpenTelemetry stats handler when cfg.TracerProvider is set. Zero fields
// take the defaults NewGRPCServer applies; Reflection is ignored, since it
// is a service, not an option.
//
// It exists so that a server standing in for storaged's gRPC layer, such
// as the no-op floor of storaged-bench, pays exactly what storaged pays:
// built from this function, it cannot drift from NewGRPCServer the way a
// copy of the option list would. (Its main installs NewBufferPool as
// storaged's does.)
func GRPCServerOptions(cfg GRPCConfig) ([]grpc.ServerOption, error) {
	opts, _, err := serverOptions(cfg, nil)
	return opts, err
}

// withDefaults returns cfg with its zero limits set to the defaults.
func (cfg GRPCConfig) withDefaults() GRPCConfig {
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = storage.DefaultMaxMessageSize
	}
	if cfg.MaxConcurrentStreams == 0 {
		cfg.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if cfg.MaxConnectionAge <= 0 {
		cfg.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if cfg.MaxConnectionAgeGrace <= 0 {
		cfg.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	if cfg.StreamWorkers == 0 {
		cfg.StreamWorkers = DefaultStreamWorkers
	}
	return cfg
}

// serverOptions builds the options of GRPCServerOptions and returns the
// metrics they feed, for InitializeMetrics once the services are
// registered.
func serverOptions(cfg GRPCConfig, reads *inflight) ([]grpc.ServerOption, *grpcprom.ServerMetrics, error) {
	cfg = cfg.withDefaults()
	srvMetrics := newServerMetrics()
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(srvMetrics); err != nil {
			return nil, nil, fmt.Errorf("server: register grpc metrics: %w", err)
		}
	}
	unary, stream := interceptorChains(cfg, srvMetrics)
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize(cfg.MaxMessageSize)),
		// grpc-go's proto codec, read answers by reference (codec). The
		// buffers of the transport and of the codec come from gRPC's
		// default pool, which main sets to NewBufferPool.
		grpc.ForceServerCodecV2(newCodec(reads)),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
			Time:                  time.Minute,      // ping an idle client after a minute …
			Timeout:               20 * time.Second, // … and drop it when the ack does not come
		}),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}
	if cfg.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)))
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.TracerProvider != nil {
		opts = append(opts, grpc.StatsHandler(statsHandler(cfg.TracerProvider)))
	}
	return opts, srvMetrics, nil
}

// newServerMetrics returns the gRPC server metrics, with the handling-time
// histogram (handlingTimeBuckets).
func newServerMetrics() *grpcprom.ServerMetrics {
	return grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(handlingTimeBuckets)))
}

// interceptorChains returns the interceptor chains of serverOptions, outermost
// first: metrics see every call, logging sees the final status, recovery
// turns a panic into that status. With tracing on (cfg.TracerProvider)
// the metrics take the trace id of sampled calls as exemplars.
func interceptorChains(cfg GRPCConfig, srvMetrics *grpcprom.ServerMetrics) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	log := cfg.Logger
	calls := callLog{log: log, limit: logthrottle.New(logthrottle.DefaultInterval, nil)}
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.Error().Interface("panic", p).Bytes("stack", debug.Stack()).Msg("recovered a panic in a gRPC handler")
		return panicError()
	})
	var metricOpts []grpcprom.Option
	if cfg.TracerProvider != nil {
		metricOpts = append(metricOpts, grpcprom.WithExemplarFromContext(traceExemplar))
	}
	return []grpc.UnaryServerInterceptor{
			srvMetrics.UnaryServerInterceptor(metricOpts...),
			calls.unary,
			recovery.UnaryServerInterceptor(recoveryOpt),
		}, []grpc.StreamServerInterceptor{
			srvMetrics.StreamServerInterceptor(metricOpts...),
			calls.stream,
			recovery.StreamServerInterceptor(recoveryOpt),
		}
}

// Serve accepts connections on lis until Shutdown, at most
// GRPCConfig.MaxConnections at once. It returns nil after Shutdown, or the
// listener's error.
func (g *GRPCServer) Serve(lis net.Listener) error {
	if g.maxConns > 0 {
		lis = netutil.LimitListener(lis, g.maxConns)
	}
	lis = g.conns.listen(lis)
	if err := g.srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// SetServing sets the health status of ServiceName: SERVING when the store
// takes writes, NOT_SERVING otherwise. It has no effect after Shutdown.
func (g *GRPCServer) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	g.health.SetServingStatus(ServiceName, st)
}

// StoreHealth is what WatchStore polls; *storage.Store implements it.
type StoreHealth interface {
	// WriteErr is the sticky write error: once set, the store takes no
	// writes until the process restarts.
	WriteErr() error
	// Writable reports whether puts are accepted right now.
	Writable() bool
	// Stats says why not: Disk.Full while the data dir's file system is
	// above the warning watermark (until usage is back at the clean one).
	Stats() storage.Stats
}

var _ StoreHealth = (*storage.Store)(nil)

// WatchStore starts a goroutine that sets the health of ServiceName from s,
// at once and then every interval, so that load balancers and readiness
// probes send writes only where they can succeed:
//
//   - disk above the warning watermark (Stats().Disk.Full): NOT_SERVING,
//     and SERVING again once the store takes writes again (usage back at
//     or below the clean watermark);
//   - a background write failing and being retried (a Stats().Faults
//     entry Failing: the checkpoint, a consume queue or the delay
//     progress hit ENOSPC, EMFILE or another I/O error):
//     NOT_SERVING, and SERVING again once a retry succeeds;
//   - sticky write error (a write or sync failed): NOT_SERVING, and the
//     goroutine ends: the store takes no writes until the process restarts,
//     so the service never turns SERVING again.
//
// Anything else (a slave, which refuses writes by design) is SERVING.
// Shutdown stops the goroutine and waits for it. Call it once, before
// Shutdown.
func (g *GRPCServer) WatchStore(s StoreHealth, interval time.Duration) {
	g.watchers.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		var set, serving bool // set: the watcher has set the status once
		for {
			select {
			case <-g.stopWatch:
				return
			default:
			}
			// The disk first and the sticky error last: a write error that
			// happens meanwhile is never followed by SERVING from here.
			var disk storage.DiskStats
			var fault storage.FaultStats
			full := false
			if !s.Writable() {
				st := s.Stats()
				disk, full = st.Disk, st.Disk.Full
				for _, f := range st.Faults {
					if f.Failing {
						fault = f
						break
					}
				}
			}
			if err := s.WriteErr(); err != nil {
				g.SetServing(false)
				g.log.Error().Err(err).Str("health_service", ServiceName).
					Msg("store is read-only after a failed write or sync; health set to NOT_SERVING until restart")
				return
			}
			down := full || fault.Failing
			if !set || serving == down {
				g.SetServing(!down)
				switch {
				case full:
					g.log.Error().Str("health_service", ServiceName).Float64("used_percent", disk.UsedPercent).
						Uint64("avail_bytes", disk.Avail).
						Msg("disk above the warning watermark: puts refused (RESOURCE_EXHAUSTED), health NOT_SERVING until usage is back at the clean watermark")
				case fault.Failing:
					g.log.Error().Str("health_service", ServiceName).Str("source", fault.Source).Str("error", fault.Error).
						Msg("a background write of the store is failing and being retried: puts refused, health NOT_SERVING until a retry succeeds")
				case set:
					g.log.Info().Str("health_service", ServiceName).
						Msg("the store takes writes again; health SERVING")
				}
				set, serving = true, !down
			}
			select {
			case <-g.stopWatch:
				return
			case <-t.C:
			}
		}
	})
}

// Shutdown drains the server: the store watchers stop, every health status
// becomes NOT_SERVING, the service drains (Service.Drain: long polls answer,
// streams refuse further messages), then GracefulStop lets in-flight calls
// finish. If they
// have not finished after timeout (open Health/Watch streams never do on
// their own), Stop closes the remaining connections. It reports whether the
// drain was graceful. Calling it again is harmless.
func (g *GRPCServer) Shutdown(timeout time.Duration) bool {
	g.stopOnce.Do(func() { close(g.stopWatch) })
	g.watchers.Wait()
	g.health.Shutdown()
	g.svc.Drain()
	return stopGracefully(g.srv, timeout, g.log, "graceful stop timed out; closing the remaining connections")
}

// stopGracefully runs srv.GracefulStop and, if it has not returned after
// timeout, logs msg and cuts the remaining calls with srv.Stop. It reports
// whether the stop was graceful; either way srv is stopped when it returns.
func stopGracefully(srv *grpc.Server, timeout time.Duration, log zerolog.Logger, msg string) bool {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		log.Warn().Stringer("timeout", timeout).Msg(msg)
		srv.Stop()
		<-done
		return false
	}
}

// LoadTLSConfig loads a server certificate and key (PEM). With clientCAFile
// it also requires and verifies client certificates signed by that CA
// (mTLS). TLS 1.3 is the minimum. All three empty means no TLS (nil, nil).
func LoadTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && clientCAFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("server: load TLS key pair: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
	}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("server: read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server: client CA file %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
