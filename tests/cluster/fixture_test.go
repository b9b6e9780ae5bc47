// Package cluster runs fault scenarios against real storaged processes on
// 127.0.0.1 (replication design §5.3–5.4, issue 14): clients put and read
// while a nemesis kills, pauses, stops or cuts off nodes; afterwards every
// fault is healed, everything is read back, and the history is checked
// (internal/history): nothing acked lost or moved, no unexplained
// duplicate, linearizable per queue (porcupine), and a minimum rate of
// successful operations.
//
// TestScenarios runs against one standalone node behind a client proxy.
// TestGroupScenarios runs against a replication group of 3 whose every
// directed peer link goes through its own proxy (group_test.go): kill -9
// of a random node and of the leader (chased), SIGSTOP of the leader,
// leader isolation, minority/majority splits, a bridge, one-way partitions,
// flapping links and a rolling SIGTERM restart, each for 30 s. Writers
// put through client.LeaderTracker, which finds the leader and retries
// only refusals that stored nothing; linearizable readers read through it
// too; follower readers read from any member (held to the weaker rule of
// history.WeakReads). The last 5 s of every scenario run healed under the
// same load: writes must succeed within 5 s of the final heal, and of
// every heal that stayed healed that long. After the heal the members must
// agree byte for byte on the commitlog up to the commit end and on every
// consume queue.
// TestGroupLong (-cluster.long, 5 members by default) and TestGroupCatchUp
// (-cluster.catchup) run by hand (RELIABILITY.md).
package cluster

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/nemesis"
	"github.com/storaged/storaged/internal/proctest"
)

var binary string

func TestMain(m *testing.M) { proctest.Main(m, &binary) }

// Client is the name of the clients' end in Proxy: Proxy(Client, node)
// is the link the clients reach that node through.
const Client = "client"

// Fixture is a set of storaged nodes with a proxy on every link a fault
// can cut: the clients' link to each node now, and each directed peer
// link once nodes replicate.
type Fixture interface {
	// Nodes are the processes, in a stable order.
	Nodes() []*proctest.Process
	// Leader is the node that takes puts now (for one node, that node);
	// it waits for one to be elected and fails the test if none is.
	Leader(t testing.TB) *proctest.Process
	// Proxy is the link from a to b (node names, or Client), nil if the
	// fixture has none there.
	Proxy(a, b string) *nemesis.Proxy
	// Name is a node's name in Proxy.
	Name(p *proctest.Process) string
	// ClientAddr is where clients dial to reach node p (its client proxy).
	ClientAddr(p *proctest.Process) string
	// Heal clears every link fault and resumes and restarts every node
	// that a nemesis paused or killed, then waits for them to be SERVING.
	Heal(t testing.TB)
}

// single is the Fixture of one standalone node in sync flush mode.
type single struct {
	node  *proctest.Process
	proxy *nemesis.Proxy
}

// newSingle starts a standalone storaged in sync flush mode, with small
// commitlog files so that runs cross segment boundaries, behind a client
// proxy seeded with seed.
func newSingle(t *testing.T, seed uint64, flags ...string) *single {
	t.Helper()
	node := proctest.Start(t, proctest.Options{Binary: binary, Name: "n1", DataDir: filepath.Join(t.TempDir(), "n1"),
		Flags: append([]string{"--flush-mode", "sync", "--file-size", "256KiB"}, flags...)})
	proxy, err := nemesis.New(nemesis.Options{Target: node.Addr(), Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return &single{node: node, proxy: proxy}
}

func (s *single) Nodes() []*proctest.Process          { return []*proctest.Process{s.node} }
func (s *single) Leader(testing.TB) *proctest.Process { return s.node }
func (s *single) Name(*proctest.Process) string       { return "n1" }
func (s *single) ClientAddr(*proctest.Process) string { return s.proxy.Addr() }
func (s *single) Proxy(a, b string) *nemesis.Proxy {
	if a == Client && b == "n1" {
		return s.proxy
	}
	return nil
}

func (s *single) Heal(t testing.TB) {
	t.Helper()
	s.proxy.Heal()
	// Bytes a blackhole dropped leave both HTTP/2 ends mid-frame: cut
	// those connections so that clients reconnect cleanly.
	s.proxy.ResetConns()
	if !s.node.Running() {
		s.node.Restart(t)
	}
	s.node.Resume(t) // SIGCONT to a running process is harmless
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := proctest.WaitServing(ctx, s.node.Conn(), proctest.StoreService); err != nil {
		t.Fatal(err)
	}
}
