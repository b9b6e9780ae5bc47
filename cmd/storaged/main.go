// Command storaged serves the storaged message store over gRPC.
//
// Start order: the gRPC and metrics listeners come up first, with the health
// of storaged.v1.MessageStoreService NOT_SERVING (overall health SERVING, so
// liveness passes during a long recovery); then the store opens and recovers
// its commitlog; then the service turns SERVING. Puts that arrive before are
// refused with UNAVAILABLE. If the store turns read-only after a failed write
// or sync, the service goes NOT_SERVING until restart; while the disk is
// above --disk-warning-percent it is NOT_SERVING (puts RESOURCE_EXHAUSTED)
// until usage is back at --disk-clean-percent.
//
// SIGTERM or SIGINT drains. In a replication group a leader first hands
// leadership to its most up-to-date active follower and waits (at most two
// election timeouts) for it to lead, refusing puts meanwhile with
// UNAVAILABLE cause TRANSFERRING, so the group takes writes again after
// one election round instead of an election timeout; a follower just
// stops. Then: every health status NOT_SERVING, GracefulStop
// bounded by --shutdown-timeout (then Stop), the store's final flush and
// close, exit 0. A second signal during the drain kills the process.
//
// Configuration: see config.go, or run storaged -h. Exit status: 0 after a
// clean shutdown, 1 on a runtime error (including a data dir held by another
// process, or acknowledged data found damaged at start), 2 on a
// configuration error.
//
// Offline commands, with the server stopped (offline.go):
//
//	storaged check  [--data-dir D] [--file-size S]    verify the commitlog, print a JSON report (exit 1 on damage)
//	storaged repair [--data-dir D] [--file-size S] --truncate-at OFFSET
//	storaged repair [--data-dir D] [--file-size S] --rebuild-checkpoint
//	storaged replica repair --from ID=HOST:PORT [--data-dir D] [--file-size S]
//	                                                  re-fetch a group member's damaged raft entries from a peer
//
// And a client of the running server (health.go), the image's HEALTHCHECK:
//
//	storaged health [-addr HOST:PORT] [-service NAME]   exit 0 when grpc.health.v1 says SERVING
//
// Clients of a running group member changing the membership (members.go):
//
//	storaged replica members --addr HOST:PORT          the membership and cluster id a member applied
//	storaged replica add --addr ADMIN --id N --peer-addr HOST:PORT
//	storaged replica promote|remove --addr ADMIN --id N
//
// When the store refuses to open because acknowledged data is damaged
// (*storage.CorruptionError), the log and the exit message name the file
// and offset and the two commands to run; for a corrupt checkpoint
// (*storage.CheckpointError), the file and `storaged repair
// --rebuild-checkpoint`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/experimental"

	"github.com/storaged/storaged/cmd/internal/gctune"
	"github.com/storaged/storaged/internal/buildinfo"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/internal/tracing"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// watchInterval is how often the store is polled for the health status
// (sticky write error, disk above the warning watermark).
const watchInterval = time.Second

func main() {
	// storaged's buffer pool for gRPC's transports and its proto codec
	// (server.NewBufferPool). Process-wide, so here, before anything runs.
	experimental.SetDefaultBufferPool(server.NewBufferPool())
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "check":
			os.Exit(runCheck(os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		case "repair":
			os.Exit(runRepair(os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		case "replica":
			os.Exit(runReplica(os.Args[2:], os.LookupEnv, os.Stdout, os.Stderr))
		case "health":
			os.Exit(runHealth(os.Args[2:], os.Stdout, os.Stderr))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		stop() // a second signal gets the default action: the process dies
	}()
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &uerr):
		os.Exit(2)
	default:
		os.Exit(1)
	}
}

// run is the whole program: it parses the configuration, serves until ctx
// ends and shuts down. Errors are logged (or printed, before the logger
// exists) and returned; run never exits the process.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) error {
	cfg, err := parseConfig(args, lookupEnv, stderr)
	if err != nil {
		return err
	}
	if cfg.Version {
		fmt.Fprintln(stderr, "storaged", buildinfo.Get())
		return nil
	}
	gogc := gctune.ApplyDefaultGOGC(lookupEnv)
	memLimit := gctune.ApplyDefaultMemoryLimit(lookupEnv, cfg.MaxPullInflightBytes)
	logger := newLogger(cfg, stderr)
	cfg.log(logger.With().Str("gogc", gogc).Int64("gomemlimit", memLimit).Logger())
	if err := serve(ctx, cfg, logger); err != nil {
		logger.Error().Err(err).Msg("storaged stopped with an error")
		var cerr *storage.CorruptionError
		var cperr *storage.CheckpointError
		if errors.As(err, &cerr) || errors.As(err, &cperr) { // what the operator must do, in plain text too
			fmt.Fprintf(stderr, "storaged: %v\n", err)
		}
		return err
	}
	logger.Info().Msg("storaged stopped")
	return nil
}

func newLogger(cfg config, w io.Writer) zerolog.Logger {
	if cfg.LogFormat == "console" {
		w = zerolog.ConsoleWriter{Out: w, NoColor: true, TimeFormat: logTimeLayout}
	}
	return zerolog.New(w).Level(cfg.LogLevel).Hook(logTime{}).With().
		Str("service", "storaged").Str("version", buildinfo.Get().Version).Logger()
}

// logTimeLayout is the log lines' "time": RFC 3339 in UTC with
// milliseconds. zerolog's default has whole seconds, too coarse to order
// what the members of a group did within one failover (BENCHMARKS.md
// "Failover"); its format is a package global, which a hook avoids.
const logTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// logTime stamps every event with the time in logTimeLayout.
type logTime struct{}

func (logTime) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().UTC().Format(logTimeLayout))
}

// serve runs the servers and the store until ctx ends, then shuts down in
// order: gRPC drain, metrics server, store close.
func serve(ctx context.Context, cfg config, logger zerolog.Logger) (err error) {
	tlsCfg, err := server.LoadTLSConfig(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(), server.NewBuildInfoCollector(buildinfo.Get()))

	tp, err := tracing.FromEnv(ctx, buildinfo.Get().Version)
	if err != nil {
		return usageError{err} // an OTEL_* variable with a value the SDK does not know
	}
	var tracerProvider trace.TracerProvider // nil (tracing off) unless tp is set
	if tp != nil {
		tracerProvider = tp
		limit := logthrottle.New(logthrottle.DefaultInterval, nil)
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { // e.g. the collector is unreachable
			if ev := limit.Event("opentelemetry", logger.Warn()); ev != nil {
				ev.Err(err).Msg("opentelemetry: exporting spans failed")
			}
		}))
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if terr := tp.Shutdown(sctx); terr != nil { // the last spans are lost, nothing else
				logger.Warn().Err(terr).Msg("opentelemetry: exporting the last spans failed")
			}
		}()
	}

	var store server.DeferredStore
	svcOpts := []server.Option{server.WithMaxPullInflightBytes(cfg.MaxPullInflightBytes),
		server.WithMaxMessageSize(int(cfg.MaxMessageSize)), server.WithMaxPullWait(cfg.MaxPullWait),
		server.WithConsumerMaxAttempts(cfg.ConsumerMaxAttempts), server.WithFifoConsumerGroups(cfg.fifoGroups())}
	var group groupRuntime // group mode: the transport and the open store, for GetReplicaInfo and leader hints
	var adminOpts []server.AdminOption
	if cfg.Replication.group() {
		if err := cfg.Replication.resolveCluster(cfg.DataDir); err != nil {
			return err
		}
		group.name, group.cluster = cfg.Replication.GroupName, cfg.Replication.groupClusterID()
		group.selfID, group.selfAddr = cfg.Replication.RaftID, cfg.Replication.RaftPeers.addr(cfg.Replication.RaftID)
		group.peerTLS = cfg.Replication.PeerTLSCert != ""
		adminOpts = append(adminOpts, group.adminOption())
		svcOpts = append(svcOpts, group.serverOption(cfg.Replication.RaftID))
		if cfg.Replication.ForwardPuts {
			svcOpts = append(svcOpts, server.WithForwarder(group.forwarder()))
		}
	}
	svc := server.New(&store, logger, svcOpts...)
	gs, err := server.NewGRPCServer(svc, server.GRPCConfig{
		Logger:         logger,
		MaxMessageSize: int(cfg.MaxMessageSize),
		TLS:            tlsCfg,
		Reflection:     cfg.Reflection,
		Registerer:     reg,
		MaxConnections: max(cfg.MaxConnections, 0),
		TracerProvider: tracerProvider,
	})
	if err != nil {
		return err
	}
	// A gRPC server starts its stream workers when it is made, not when
	// it serves: until the drain below owns them, an exit stops the
	// servers made so far, or their workers would outlive serve (64
	// goroutines each; goleak in this package's tests found them).
	var adminSrv *server.AdminServer // nil without --admin-listen
	draining := false
	defer func() {
		if draining {
			return
		}
		gs.Shutdown(cfg.ShutdownTimeout) // never served: returns at once
		if adminSrv != nil {
			adminSrv.Shutdown(cfg.ShutdownTimeout)
		}
	}()

	var admin server.DeferredAdminStore
	if cfg.AdminListen != "" {
		adminSrv, err = server.NewAdminServer(server.NewAdminService(&admin, logger, adminOpts...), server.GRPCConfig{
			Logger:     logger.With().Str("component", "admin").Logger(),
			TLS:        tlsCfg,
			Reflection: cfg.Reflection,
		})
		if err != nil {
			return err
		}
	}

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	host, err := cfg.storeHost(lis.Addr())
	if err != nil {
		lis.Close()
		return err
	}
	var metricsLis net.Listener
	if cfg.MetricsListen != "" {
		if metricsLis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			lis.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	var adminLis net.Listener
	if cfg.AdminListen != "" {
		if adminLis, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			lis.Close()
			if metricsLis != nil {
				metricsLis.Close()
			}
			return fmt.Errorf("admin listener: %w", err)
		}
	}

	grpcDone := make(chan error, 1)
	go func() { grpcDone <- gs.Serve(lis) }()
	// The metrics port also serves the health statuses over HTTP, for
	// probes and meshes that cannot do gRPC (server.LivezPath, ReadyzPath).
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/", server.MetricsHandler(reg, cfg.Pprof))
	metricsMux.Handle(server.LivezPath, gs.HealthHandler())
	metricsMux.Handle(server.ReadyzPath, gs.HealthHandler())
	metricsSrv := &http.Server{Handler: metricsMux, ReadHeaderTimeout: 10 * time.Second}
	var metricsErr chan error // nil (never ready) without a metrics server
	metricsStopped := make(chan struct{})
	ev := logger.Info().Str("grpc", lis.Addr().String()).Str("store_host", host.String()).Bool("tls", tlsCfg != nil)
	if exp, on := tracing.Enabled(os.LookupEnv); on && tp != nil {
		ev = ev.Str("tracing", exp)
	} else {
		ev = ev.Str("tracing", "off")
	}
	if metricsLis != nil {
		metricsErr = make(chan error, 1)
		go func() {
			defer close(metricsStopped)
			if err := metricsSrv.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				metricsErr <- err
			}
		}()
		ev = ev.Str("metrics", metricsLis.Addr().String())
	} else {
		close(metricsStopped)
	}
	var adminDone chan error // nil (never ready) without an admin server
	if adminLis != nil {
		adminDone = make(chan error, 1)
		go func() { adminDone <- adminSrv.Serve(adminLis) }()
		ev = ev.Str("admin", adminLis.Addr().String())
	}
	ev.Msg("listening")

	// From here on every exit path drains the servers.
	draining = true
	var st *storage.Store
	defer func() {
		logger.Info().Stringer("shutdown_timeout", cfg.ShutdownTimeout).Msg("shutting down: health NOT_SERVING, draining gRPC calls")
		graceful := gs.Shutdown(cfg.ShutdownTimeout)
		if serr := <-grpcDone; serr != nil {
			err = errors.Join(err, fmt.Errorf("gRPC server: %w", serr))
		}
		if adminLis != nil {
			if !adminSrv.Shutdown(cfg.ShutdownTimeout) {
				graceful = false
			}
			if aerr := <-adminDone; aerr != nil {
				err = errors.Join(err, fmt.Errorf("admin server: %w", aerr))
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		metricsSrv.Shutdown(sctx) // a no-op without a metrics listener
		cancel()
		<-metricsStopped
		if st != nil {
			if cerr := st.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close store (final flush): %w", cerr))
			} else {
				logger.Info().Msg("store closed after its final flush")
			}
		}
		if tr := group.transport.Load(); tr != nil { // after the store: its raft loop sends until Close
			if terr := tr.Close(); terr != nil {
				err = errors.Join(err, fmt.Errorf("peer transport: %w", terr))
			}
		}
		logger.Info().Bool("graceful", graceful).Msg("shutdown complete")
	}()

	storeLog := logger.With().Str("component", "storage").Logger()
	start := time.Now()
	opts := cfg.storageOptions(host, &storeLog)
	var members *memberSync
	if cfg.Replication.group() {
		peerLog := logger.With().Str("component", "peer").Logger()
		tr, terr := cfg.Replication.startTransport(host.String(), &peerLog)
		if terr != nil {
			return terr
		}
		group.transport.Store(tr)
		tr.SetPutHandler(svc) // as the leader, take the puts followers forward
		opts.Group = cfg.Replication.groupOptions(tr)
		members = &memberSync{tr: tr, self: cfg.Replication.RaftID, flags: cfg.Replication.RaftPeers.peerMap(), log: &peerLog}
		opts.Group.OnMembership = members.apply
		logger.Info().Str("peer", tr.Addr().String()).Uint64("raft_id", cfg.Replication.RaftID).Str("cluster_id", group.cluster).
			Stringer("raft_peers", &cfg.Replication.RaftPeers).Msg("peer transport listening")
	}
	st, err = storage.Open(opts)
	if err != nil {
		if errors.Is(err, storage.ErrLocked) {
			return fmt.Errorf("data dir %s is in use by another storaged process (%w)", cfg.DataDir, err)
		}
		var cerr *storage.CorruptionError
		if errors.As(err, &cerr) && cfg.Replication.group() {
			o := offlineFlags{dataDir: cfg.DataDir, fileSize: cfg.FileSize}
			repair := fmt.Sprintf("storaged replica repair %s --from %s", o.args(), cfg.Replication.repairSource())
			if cerr.File == "raft/meta" || cerr.File == "raft/hardstate" {
				repair += cfg.Replication.repairIdentity()
				logger.Error().Str("file", cerr.File).Str("reason", cerr.Reason).Str("repair", repair).
					Msg("this replica's raft state is damaged: refusing to start; run storaged replica repair with the other members up")
				return fmt.Errorf("damaged %s (%s): with this member stopped and the other members running, run `%s` to "+
					"rebuild it from them, then start it again: %w", cerr.File, cerr.Reason, repair, err)
			}
			logger.Error().Str("file", cerr.File).Int64("offset", cerr.Offset).Int64("flushed", cerr.Flushed).
				Str("reason", cerr.Reason).Str("repair", repair).
				Msg("this replica's acknowledged raft entries are damaged: refusing to start (a replica that cut them could " +
					"elect a leader lacking them); run storaged replica repair --from a healthy member")
			return fmt.Errorf("damaged raft entry data in %s at commitlog offset %d (%s): this member will not cut entries "+
				"it may have acknowledged, since the group could then lose them; with this member stopped, run `%s` "+
				"(the leader is the best source) to fetch the damaged entries from a healthy member, then start it again: %w",
				cerr.File, cerr.Offset, cerr.Reason, repair, err)
		}
		if errors.As(err, &cerr) {
			o := offlineFlags{dataDir: cfg.DataDir, fileSize: cfg.FileSize}
			check := "storaged check " + o.args()
			repair := fmt.Sprintf("storaged repair %s --truncate-at %d", o.args(), cerr.Offset)
			logger.Error().Str("file", cerr.File).Int64("offset", cerr.Offset).Int64("flushed", cerr.Flushed).
				Str("reason", cerr.Reason).Str("check", check).Str("repair", repair).
				Msg("acknowledged data is damaged: refusing to start; run storaged check, then storaged repair --truncate-at OFFSET")
			return fmt.Errorf("damaged record in %s at commitlog offset %d, below the flushed offset %d (%s): "+
				"storaged will not drop acknowledged messages on its own; run `%s` to see the damage, then `%s` "+
				"to cut the log there (the cut bytes are kept in .broken files): %w",
				cerr.File, cerr.Offset, cerr.Flushed, cerr.Reason, check, repair, err)
		}
		var cperr *storage.CheckpointError
		if errors.As(err, &cperr) {
			o := offlineFlags{dataDir: cfg.DataDir, fileSize: cfg.FileSize}
			check := "storaged check " + o.args()
			repair := "storaged repair " + o.args() + " --rebuild-checkpoint"
			logger.Error().Str("file", cperr.File).Str("reason", cperr.Reason).Str("check", check).Str("repair", repair).
				Msg("the checkpoint file is corrupt: refusing to start; run storaged check, then storaged repair --rebuild-checkpoint")
			return fmt.Errorf("the checkpoint file %s is corrupt (%s): every message is still in the commitlog, but "+
				"storaged cannot tell which were acknowledged durable and will not guess; with storaged stopped, run `%s`, "+
				"then `%s` (it keeps the old file as checkpoint.corrupt-<time>, writes a new one from a full check of "+
				"the commitlog, and the next start rebuilds the consume queues): %w",
				cperr.File, cperr.Reason, check, repair, err)
		}
		return fmt.Errorf("open store in %s: %w", cfg.DataDir, err)
	}
	store.Set(st)
	admin.Set(st)
	if tr := group.transport.Load(); tr != nil {
		group.store.Store(st)
		// Members added or removed by conf changes, whatever the flags
		// list: a restarted member reaches (or forgets) them too.
		if u, merr := st.Membership(); merr == nil {
			members.apply(u)
		}
		tr.SetStepper(st)
		tr.SetRanger(storeRanger{st})
	}
	reg.MustRegister(server.NewStoreCollector(st, server.WithPutExemplars(svc.Exemplars())),
		server.NewConsumerCollector(st, server.DefaultLagMetricGroups))
	if cfg.Replication.group() {
		reg.MustRegister(server.NewReplicaCollector(group.info(cfg.Replication.RaftID)),
			server.NewPeerCollector(func() server.PeerLinks {
				if tr := group.transport.Load(); tr != nil {
					return tr
				}
				return nil // not a typed nil: the collector skips it
			}),
			server.NewForwardCollector(svc.ForwardStats, func() uint64 {
				if tr := group.transport.Load(); tr != nil {
					_, taken := tr.Forwarded()
					return taken
				}
				return 0
			}))
	}
	stats := st.Stats()
	logger.Info().Stringer("recovery", time.Since(start)).Int64("max_offset", stats.MaxOffset).Int("files", stats.Files).
		Str("flush_mode", st.FlushMode().String()).Msg("store open")

	if ctx.Err() != nil {
		logger.Info().Msg("signal received while the store was opening")
		return nil
	}
	// The watcher sets the service SERVING now, unless the store is
	// read-only or its disk is above the warning watermark, and keeps the
	// health following the store.
	gs.WatchStore(st, watchInterval)
	if st.WriteErr() == nil {
		logger.Info().Str("health_service", server.ServiceName).Msg("serving")
	}

	select {
	case <-ctx.Done():
		logger.Info().Msg("signal received")
		if cfg.Replication.group() {
			transferLeadership(st, logger)
		}
		return nil
	case serr := <-grpcDone:
		grpcDone <- nil // for the deferred drain
		if serr == nil {
			serr = errors.New("stopped")
		}
		return fmt.Errorf("gRPC server stopped unexpectedly: %w", serr)
	case merr := <-metricsErr:
		return fmt.Errorf("metrics server stopped unexpectedly: %w", merr)
	case aerr := <-adminDone:
		adminDone <- nil // for the deferred drain
		if aerr == nil {
			aerr = errors.New("stopped")
		}
		return fmt.Errorf("admin server stopped unexpectedly: %w", aerr)
	}
}

// transferLeadership is a group member's first step on SIGTERM (design
// replication.md §4): a leader hands over before the drain, so the group
// is not left leaderless for an election timeout; puts in flight are
// committed by the new leader and answered during the drain. A failure is
// logged, and the shutdown goes on: the others elect a leader the slow
// way.
func transferLeadership(st *storage.Store, logger zerolog.Logger) {
	began := time.Now()
	was := st.ReplicaInfo()
	lead, err := st.TransferLeadership(context.Background())
	switch {
	case err != nil:
		logger.Warn().Err(err).Stringer("took", time.Since(began)).Msg("leadership transfer failed; stopping anyway")
	case was.Role == "leader":
		logger.Info().Uint64("new_leader", lead).Stringer("took", time.Since(began)).Msg("leadership transferred")
	}
}
