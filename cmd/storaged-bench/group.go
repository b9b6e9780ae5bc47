package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"

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
// run) written to with a UNIQ_KEY on every put (client.Options.StampUniqKeys):
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
	tr *client.LeaderTracker
}

func (c trackerClient) PutMessage(ctx context.Context, in *storagedv1.PutMessageRequest, opts ...grpc.CallOption) (*storagedv1.PutMessageResponse, error) {
	return c.tr.PutMessage(ctx, in, opts...)
}

func (c trackerClient) PutMessages(ctx context.Context, in *storagedv1.PutMessagesRequest, opts ...grpc.CallOption) (*storagedv1.PutMessagesResponse, error) {
	return c.tr.PutMessages(ctx, in, opts...)
}

// trackers opens n LeaderTrackers over the members (each has its own
// connections, as --connections gives a single node n connections).
func (g *benchGroup) trackers(n int, keyed bool) ([]*client.LeaderTracker, error) {
	var out []*client.LeaderTracker
	for range n {
		tr, err := client.New(client.Options{Addrs: g.addrs(), StampUniqKeys: keyed})
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

// load runs one case against the group through fresh trackers (keyed:
// every put gets a UNIQ_KEY); nil for the stream cases (the tracker routes
// unary and batch puts only).
func (g *benchGroup) load(ctx context.Context, c caseSpec, cfg loadConfig, keyed bool) (*Summary, error) {
	if c.Method == methodStream {
		return nil, nil
	}
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
		clients = append(clients, trackerClient{tr: t})
	}
	return runLoadClients(ctx, cfg, clients, io.Discard)
}
