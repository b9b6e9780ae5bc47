package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/storaged/storaged/cmd/internal/gctune"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// Floor kinds.
const (
	// floorGRPC is the reference floor: a no-op MessageStoreService behind
	// the gRPC server options and interceptors of storaged, taken from
	// server.GRPCServerOptions (message size limit, concurrent streams,
	// keepalive, Prometheus metrics, call logging at info level, panic
	// recovery), plus a health service.
	floorGRPC = "grpc"
	// floorBare is a no-op MessageStoreService on grpc.NewServer with
	// default options: what gRPC alone costs.
	floorBare = "bare"
	// floorEdge is storaged's own server package (validation, proto to
	// domain conversion, error mapping, server.NewGRPCServer) over a store
	// that stores nothing: what the edge costs without storage.
	floorEdge = "edge"
)

func validFloorKind(k string) error {
	switch k {
	case floorGRPC, floorBare, floorEdge:
		return nil
	}
	return fmt.Errorf("--floor-kind %q: want grpc, bare or edge", k)
}

// floorService answers every put with PUT_OK and an AppendResult shaped
// like storaged's (msgIds, offsets that advance by a plausible record
// size, per-queue offsets, store time) without storing anything.
type floorService struct {
	storagedv1.UnimplementedMessageStoreServiceServer

	host   netip.AddrPort
	offset atomic.Int64
	queues [64]atomic.Int64 // queue offsets, by queue id modulo 64
	calls  atomic.Int64     // puts answered: calls, or streamed messages
	msgs   atomic.Int64     // messages received

	// answer, when set, decides the outcome of call n (counted from 1
	// over all methods and streamed messages): a non-nil error is returned
	// as is; otherwise a status other than UNSPECIFIED replaces PUT_OK.
	// Tests use it to inject failures.
	answer answerFunc
}

// recordSize is the commitlog record size of a message (RocketMQ layout,
// IPv4 hosts, no properties).
func recordSize(bodyLen, topicLen int) int32 {
	const fixed = 91
	return int32(fixed + bodyLen + topicLen)
}

// outcome counts a put of msgs messages and decides its answer.
func (f *floorService) outcome(msgs int) (storagedv1.PutMessageStatus, error) {
	f.msgs.Add(int64(msgs))
	n := f.calls.Add(1)
	st := storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK
	if f.answer != nil {
		s, err := f.answer(n)
		if err != nil {
			return 0, err
		}
		if s != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNSPECIFIED {
			st = s
		}
	}
	return st, nil
}

// appendResult reserves room for records of the given sizes in queue q.
func (f *floorService) appendResult(q int32, sizes []int32, batch bool) *storagedv1.AppendResult {
	var total int64
	for _, s := range sizes {
		total += int64(s)
	}
	end := f.offset.Add(total)
	first := end - total
	qo := f.queues[uint32(q)%uint32(len(f.queues))].Add(int64(len(sizes))) - int64(len(sizes))
	r := &storagedv1.AppendResult{
		MsgId:          storage.MsgID(f.host, first),
		WroteOffset:    first,
		WroteBytes:     int32(total),
		QueueId:        q,
		QueueOffset:    qo,
		StoreTimestamp: timestamppb.New(time.UnixMilli(time.Now().UnixMilli())),
		MessageCount:   int32(len(sizes)),
	}
	if batch {
		r.MsgIds = make([]string, len(sizes))
		off := first
		for i, s := range sizes {
			r.MsgIds[i] = storage.MsgID(f.host, off)
			off += int64(s)
		}
	}
	return r
}

// PutMessage implements storagedv1.MessageStoreServiceServer.
func (f *floorService) PutMessage(_ context.Context, req *storagedv1.PutMessageRequest) (*storagedv1.PutMessageResponse, error) {
	st, err := f.outcome(1)
	if err != nil {
		return nil, err
	}
	m := req.GetMessage()
	size := [1]int32{recordSize(len(m.GetBody()), len(m.GetTopic()))}
	return &storagedv1.PutMessageResponse{Status: st, Result: f.appendResult(m.GetQueueId(), size[:], false)}, nil
}

// PutMessages implements storagedv1.MessageStoreServiceServer.
func (f *floorService) PutMessages(_ context.Context, req *storagedv1.PutMessagesRequest) (*storagedv1.PutMessagesResponse, error) {
	st, err := f.outcome(len(req.GetMessages()))
	if err != nil {
		return nil, err
	}
	sizes := make([]int32, len(req.GetMessages()))
	for i, e := range req.GetMessages() {
		sizes[i] = recordSize(len(e.GetBody()), len(req.GetTopic()))
	}
	return &storagedv1.PutMessagesResponse{Status: st, Result: f.appendResult(req.GetQueueId(), sizes, true)}, nil
}

// floor is a running no-op server.
type floor struct {
	kind    string
	srv     *grpc.Server
	svc     *floorService // nil for the edge kind
	lis     net.Listener
	reg     *prometheus.Registry
	stopFn  func()
	done    chan struct{}
	stopped sync.Once
}

// answerFunc decides the outcome of the nth put a floor answers (see
// floorService.answer); nil answers PUT_OK.
type answerFunc func(n int64) (storagedv1.PutMessageStatus, error)

// startFloor starts a floor of the given kind on addr (host:port, port 0
// picks one). answer applies to the grpc and bare kinds.
func startFloor(kind, addr string, answer answerFunc) (*floor, error) {
	if err := validFloorKind(kind); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("floor listener: %w", err)
	}
	host := lis.Addr().(*net.TCPAddr).AddrPort()
	f := &floor{kind: kind, lis: lis, reg: prometheus.NewRegistry(), done: make(chan struct{})}
	f.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	logger := zerolog.New(io.Discard).Level(zerolog.InfoLevel)

	switch kind {
	case floorEdge:
		svc := server.New(nopStore{host: host}, logger)
		gs, err := server.NewGRPCServer(svc, server.GRPCConfig{Logger: logger, Registerer: f.reg})
		if err != nil {
			lis.Close()
			return nil, err
		}
		gs.SetServing(true)
		go func() {
			defer close(f.done)
			gs.Serve(lis)
		}()
		f.stopFn = func() { gs.Shutdown(5 * time.Second) }
		return f, nil
	case floorBare:
		f.srv = grpc.NewServer(grpc.MaxRecvMsgSize(server.MaxRecvMsgSize(storage.DefaultMaxMessageSize)))
	default:
		opts, err := server.GRPCServerOptions(server.GRPCConfig{Logger: logger, Registerer: f.reg})
		if err != nil {
			lis.Close()
			return nil, err
		}
		f.srv = grpc.NewServer(opts...)
	}
	f.svc = &floorService{host: host, answer: answer}
	storagedv1.RegisterMessageStoreServiceServer(f.srv, f.svc)
	hs := health.NewServer()
	hs.SetServingStatus(server.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(f.srv, hs)
	go func() {
		defer close(f.done)
		f.srv.Serve(lis)
	}()
	f.stopFn = f.srv.Stop
	return f, nil
}

// Addr is the address the floor listens on.
func (f *floor) Addr() string { return f.lis.Addr().String() }

// Stop closes the floor and waits for its server goroutine.
func (f *floor) Stop() {
	f.stopped.Do(func() {
		f.stopFn()
		<-f.done
	})
}

// nopStore is a server.Store that stores nothing: every put is PUT_OK at
// an offset that advances by a plausible record size.
type nopStore struct {
	server.Store // nil: reads panic (the load generator only puts)
	host         netip.AddrPort
}

var nopOffset atomic.Int64 // shared by the nopStores of a process; only plausibility matters

// PutMessage implements server.Store.
func (s nopStore) PutMessage(_ context.Context, m *storage.Message) (storage.PutResult, error) {
	size := recordSize(len(m.Body), len(m.Topic))
	off := nopOffset.Add(int64(size)) - int64(size)
	return storage.PutResult{Status: storage.PutOK, Append: storage.AppendResult{
		Status: storage.AppendOK, WroteOffset: off, WroteBytes: size, StoreTimestamp: time.Now().UnixMilli(),
		Topic: m.Topic, QueueID: m.QueueID, MsgNum: 1, StoreHost: s.host,
	}}, nil
}

// PutMessages implements server.Store.
func (s nopStore) PutMessages(_ context.Context, b *storage.Batch) (storage.PutResult, error) {
	offsets := make([]int64, len(b.Messages))
	var total int64
	for i := range b.Messages {
		offsets[i] = total
		total += int64(recordSize(len(b.Messages[i].Body), len(b.Topic)))
	}
	first := nopOffset.Add(total) - total
	for i := range offsets {
		offsets[i] += first
	}
	return storage.PutResult{Status: storage.PutOK, Append: storage.AppendResult{
		Status: storage.AppendOK, WroteOffset: first, WroteBytes: int32(total), StoreTimestamp: time.Now().UnixMilli(),
		Topic: b.Topic, QueueID: b.QueueID, MsgNum: int32(len(b.Messages)), StoreHost: s.host, Offsets: offsets,
	}}, nil
}

// runFloorCommand is the floor subcommand: it serves a floor until ctx
// ends, and prints a JSON line like storaged's
// {"grpc":"127.0.0.1:N","metrics":"127.0.0.1:M",…,"message":"listening"}
// on stderr, so scripts start it the way they start storaged.
func runFloorCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("storaged-bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "gRPC listen `address`")
	metricsListen := fs.String("metrics-listen", "127.0.0.1:0", "Prometheus /metrics and pprof listen `address`; empty disables it")
	kind := fs.String("floor-kind", floorGRPC, "floor `kind`: grpc, bare or edge (see storaged-bench -h)")
	pprofOn := fs.Bool("pprof", false, "serve /debug/pprof on the metrics address")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := validFloorKind(*kind); err != nil {
		fmt.Fprintln(stderr, "storaged-bench:", err)
		return usageError{err}
	}
	// The same GC target as storaged (gctune.DefaultGOGC), so that the
	// floor stays the same server minus the store.
	gogc := gctune.ApplyDefaultGOGC(os.LookupEnv)
	f, err := startFloor(*kind, *listen, nil)
	if err != nil {
		return err
	}
	defer f.Stop()
	line := map[string]any{"service": "storaged-bench-floor", "floor_kind": *kind, "grpc": f.Addr(), "gogc": gogc, "message": "listening"}
	var ms *http.Server
	if *metricsListen != "" {
		mlis, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		ms = &http.Server{Handler: server.MetricsHandler(f.reg, *pprofOn), ReadHeaderTimeout: 10 * time.Second}
		go ms.Serve(mlis)
		line["metrics"] = mlis.Addr().String()
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	stderr.Write(append(b, '\n'))
	<-ctx.Done()
	if ms != nil {
		ms.Close()
	}
	return nil
}

// PutMessageStream implements storagedv1.MessageStoreServiceServer: it
// answers each request as it reads it, in order.
func (f *floorService) PutMessageStream(stream storagedv1.MessageStoreService_PutMessageStreamServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &storagedv1.PutMessageStreamResponse{RequestId: req.GetRequestId()}
		st, err := f.outcome(1)
		if err != nil {
			s := status.Convert(err)
			resp.Code, resp.ErrorMessage = int32(s.Code()), s.Message()
			for _, d := range s.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					resp.Reason = ei.GetReason()
				}
			}
		} else {
			m := req.GetMessage()
			size := [1]int32{recordSize(len(m.GetBody()), len(m.GetTopic()))}
			resp.Status, resp.Result = st, f.appendResult(m.GetQueueId(), size[:], false)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
