package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// targetR3 is a local replication group: three storaged processes on
// 127.0.0.1 (--raft-id 1..3, --raft-peers), each with its own data dir
// under --data-root, on this machine's one disk. The load goes through
// client.LeaderTracker, which finds the leader and follows it; the
// figures are the same as for one node, the server CPU being the three
// processes' together.
const targetR3 = "r3"

// targetR3Keyed is the r3 group (the same processes when both targets
// run) written to with a UNIQ_KEY on every put (client.UniqKeysStamped):
// what exactly-once puts cost beside unkeyed ones, measured in turns.
const targetR3Keyed = "r3-keyed"

// isGroupTarget: the target is the local group.
func isGroupTarget(t string) bool { return t == targetR3 || t == targetR3Keyed }

// groupSize is the number of members of the r3 target.
const groupSize = 3

// benchGroup is the r3 target's processes.
type benchGroup struct {
	bin     string
	extra   string
	peers   string // the --raft-peers value
	dirs    []string
	listen  []string // each member's client address, kept across restarts
	members []*proc
	logw    io.Writer
}

// freeLoopbackPorts reserves n loopback addresses (listen on :0, note,
// close): the members must know each other's peer addresses before any
// starts.
func freeLoopbackPorts(n int) ([]string, error) {
	var addrs []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// startGroup starts the three members one after the other (each waits
// for SERVING: followers serve reads) and waits for a ready leader.
func startGroup(ctx context.Context, bin, dataRoot, extra string, logw io.Writer) (*benchGroup, error) {
	peerAddrs, err := freeLoopbackPorts(groupSize)
	if err != nil {
		return nil, err
	}
	var peers []string
	for i, a := range peerAddrs {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	g := &benchGroup{bin: bin, extra: extra, peers: strings.Join(peers, ","), logw: logw,
		listen: make([]string, groupSize), members: make([]*proc, groupSize)}
	for i := range groupSize {
		dir, err := os.MkdirTemp(dataRoot, fmt.Sprintf("storaged-bench-r3-n%d-", i+1))
		if err != nil {
			g.Stop()
			return nil, err
		}
		g.dirs = append(g.dirs, dir)
		g.listen[i] = "127.0.0.1:0"
		if err := g.start(ctx, i); err != nil {
			g.Stop()
			return nil, err
		}
	}
	if _, err := g.leader(ctx); err != nil {
		g.Stop()
		return nil, err
	}
	return g, nil
}

// start (re)starts member i on its data dir and client address.
func (g *benchGroup) start(ctx context.Context, i int) error {
	args := storagedArgs(g.bin, g.dirs[i], g.extra, "--raft-id", fmt.Sprint(i+1), "--raft-peers", g.peers)
	args[1] = g.listen[i] // --listen
	name := fmt.Sprintf("r3-n%d", i+1)
	p, err := startProc(ctx, name, g.bin, args, &prefixWriter{w: g.logw, prefix: name + ": "}, nil)
	if err != nil {
		return err
	}
	g.members[i], g.listen[i] = p, p.grpc
	return nil
}

// Stop stops every running member and removes the data dirs.
func (g *benchGroup) Stop() error {
	var errs []error
	for _, p := range g.members {
		if p != nil {
			errs = append(errs, p.Stop())
		}
	}
	for _, d := range g.dirs {
		os.RemoveAll(d)
	}
	return errors.Join(errs...)
}

func (g *benchGroup) addrs() []string { return append([]string(nil), g.listen...) }

// pids are the running members' process ids.
func (g *benchGroup) pids() []int {
	var out []int
	for _, p := range g.members {
		if p != nil && p.running() {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

// leader waits (60 s at most) for a running member that says it is the
// ready leader and returns its index.
func (g *benchGroup) leader(ctx context.Context) (int, error) { return g.leaderOtherThan(ctx, -1) }

// leaderOtherThan is leader, not member not (it is going away).
func (g *benchGroup) leaderOtherThan(ctx context.Context, not int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, procStartTimeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		for i, p := range g.members {
			if p == nil || !p.running() || i == not {
				continue
			}
			if ri, err := replicaInfo(ctx, p.grpc); err == nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady() {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("r3: no ready leader: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func replicaInfo(ctx context.Context, addr string) (*storagedv1.GetReplicaInfoResponse, error) {
	conns, err := dialPlain(addr, 1)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return storagedv1.NewMessageStoreServiceClient(conns[0]).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
}

// trackerClient routes a generator's puts through a LeaderTracker; the
// embedded interface is nil: the generator calls nothing else on it.
type trackerClient struct {
	storagedv1.MessageStoreServiceClient
	tr       *client.LeaderTracker
	inFlight int // a stream case's messages in flight per stream
}

func (c trackerClient) PutMessage(ctx context.Context, in *storagedv1.PutMessageRequest, opts ...grpc.CallOption) (*storagedv1.PutMessageResponse, error) {
	return c.tr.PutMessage(ctx, in, opts...)
}

func (c trackerClient) PutMessages(ctx context.Context, in *storagedv1.PutMessagesRequest, opts ...grpc.CallOption) (*storagedv1.PutMessagesResponse, error) {
	return c.tr.PutMessages(ctx, in, opts...)
}

// uniqKeys is the trackers' key mode: the r3 targets write messages as
// given (unkeyed: the figures compare with the single node's and with
// earlier runs), r3-keyed and failover --keyed with the client's default,
// a key stamped on every message.
func uniqKeys(keyed bool) client.UniqKeyMode {
	if keyed {
		return client.UniqKeysStamped
	}
	return client.UniqKeysAsGiven
}

// trackers opens n LeaderTrackers over the members (each has its own
// connections, as --connections gives a single node n connections).
func (g *benchGroup) trackers(n int, keyed bool) ([]*client.LeaderTracker, error) {
	var out []*client.LeaderTracker
	for range n {
		tr, err := client.New(client.Options{Addrs: g.addrs(), UniqKeys: uniqKeys(keyed)})
		if err != nil {
			for _, t := range out {
				t.Close()
			}
			return nil, err
		}
		out = append(out, tr)
	}
	return out, nil
}

// PutMessageStream opens a client.Stream of the tracker (one per
// generator stream, as a single node's case has --streams gRPC streams),
// with room for the case's messages in flight per stream.
func (c trackerClient) PutMessageStream(ctx context.Context, _ ...grpc.CallOption) (
	grpc.BidiStreamingClient[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse], error) {
	st, err := c.tr.NewStream(client.StreamOptions{MaxInFlight: min(max(c.inFlight, 1), client.MaxStreamInFlight)})
	if err != nil {
		return nil, err
	}
	return &streamAdapter{ctx: ctx, st: st, closing: make(chan struct{}), answers: make(chan *storagedv1.PutMessageStreamResponse, max(c.inFlight, 1))}, nil
}

// streamAdapter is the gRPC stream the load generator drives, over a
// client.Stream: each Send is a Put on a goroutine of its own (the
// generator keeps at most its window in flight), whose outcome Recv
// returns as the stream's answer would be (code and reason of the error);
// after CloseSend and the last answer Recv returns io.EOF. The embedded
// ClientStream is nil: the generator calls nothing else.
type streamAdapter struct {
	grpc.ClientStream
	ctx     context.Context
	st      *client.Stream
	answers chan *storagedv1.PutMessageStreamResponse

	closing chan struct{} // closed by CloseSend

	mu        sync.Mutex
	inFlight  int
	halfClose bool
	done      bool // Recv returned its last: st closed
}

func (a *streamAdapter) Send(req *storagedv1.PutMessageStreamRequest) error {
	a.mu.Lock()
	if a.halfClose || a.done {
		a.mu.Unlock()
		return io.EOF
	}
	a.inFlight++
	a.mu.Unlock()
	// The generator reuses req and its message: the Put gets a copy (the
	// body shared).
	src := req.GetMessage().ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	m, id := dst.Interface().(*storagedv1.Message), req.GetRequestId()
	go func() {
		resp, err := a.st.Put(a.ctx, m)
		ans := &storagedv1.PutMessageStreamResponse{RequestId: id, Status: resp.GetStatus(), Result: resp.GetResult()}
		if err != nil {
			ans.Code, ans.Reason, ans.ErrorMessage = int32(status.Code(err)), client.Classify(err).Reason, err.Error()
			ans.Status = storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR
		}
		select {
		case a.answers <- ans:
		case <-a.ctx.Done():
		}
	}()
	return nil
}

func (a *streamAdapter) CloseSend() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.halfClose {
		a.halfClose = true
		close(a.closing)
	}
	return nil
}

func (a *streamAdapter) Recv() (*storagedv1.PutMessageStreamResponse, error) {
	for {
		a.mu.Lock()
		done, half, n := a.done, a.halfClose, a.inFlight
		a.mu.Unlock()
		if done {
			return nil, io.EOF
		}
		if half && n == 0 {
			a.finish()
			return nil, io.EOF
		}
		var closing <-chan struct{}
		if !half {
			closing = a.closing // CloseSend with nothing in flight wakes Recv
		}
		select {
		case ans := <-a.answers:
			a.mu.Lock()
			a.inFlight--
			a.mu.Unlock()
			return ans, nil
		case <-a.ctx.Done():
			a.finish()
			return nil, status.FromContextError(a.ctx.Err()).Err()
		case <-closing:
		}
	}
}

// finish closes the client.Stream (its Puts end with ctx or ErrClosed).
func (a *streamAdapter) finish() {
	a.mu.Lock()
	a.done = true
	a.mu.Unlock()
	a.st.Close()
}

// load runs one case against the group through fresh trackers (keyed:
// every put gets a UNIQ_KEY; a stream case through a client.Stream per
// generator stream, its messages keyed alike).
func (g *benchGroup) load(ctx context.Context, c caseSpec, cfg loadConfig, keyed bool) (*Summary, error) {
	trs, err := g.trackers(cfg.Connections, keyed)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, t := range trs {
			t.Close()
		}
	}()
	var clients []storagedv1.MessageStoreServiceClient
	for _, t := range trs {
		clients = append(clients, trackerClient{tr: t, inFlight: cfg.Concurrency})
	}
	return runLoadClients(ctx, cfg, clients, io.Discard)
}
