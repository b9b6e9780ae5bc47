package peer

import (
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// recorder is a Stepper that keeps every message (bounded by the test's
// own sends) and every unreachable and gone report.
type recorder struct {
	mu          sync.Mutex
	msgs        [][]byte
	unreachable map[uint64]int
	gone        map[uint64]int
	refuse      bool
}

func (r *recorder) StepPeer(m []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse {
		return errors.New("refused")
	}
	r.msgs = append(r.msgs, append([]byte(nil), m...))
	return nil
}

func (r *recorder) ReportUnreachable(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unreachable == nil {
		r.unreachable = make(map[uint64]int)
	}
	r.unreachable[id]++
}

func (r *recorder) PeerGone(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone == nil {
		r.gone = make(map[uint64]int)
	}
	r.gone[id]++
}

func (r *recorder) goneCount(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone[id]
}

// all is a copy of the messages kept so far.
func (r *recorder) all() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) unreachableCount(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unreachable[id]
}

func (r *recorder) has(m string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.msgs {
		if string(b) == m {
			return true
		}
	}
	return false
}

// listeners opens n loopback listeners and the peer map naming them 1..n.
func listeners(t testing.TB, n int) ([]net.Listener, map[uint64]string) {
	t.Helper()
	lis := make([]net.Listener, n)
	peers := make(map[uint64]string, n)
	for i := range lis {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
		peers[uint64(i+1)] = l.Addr().String()
	}
	return lis, peers
}

func testOptions(id uint64, peers map[uint64]string) Options {
	return Options{
		Group: "g1", ClusterID: "c1", ID: id, Peers: peers,
		ClientAddr: "127.0.0.1:" + strconv.Itoa(9000+int(id)),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}
}

// group starts n transports, each with a recorder, on loopback.
func group(t *testing.T, n int, mod func(*Options)) ([]*Transport, []*recorder) {
	t.Helper()
	lis, peers := listeners(t, n)
	trs := make([]*Transport, n)
	recs := make([]*recorder, n)
	for i := range trs {
		recs[i] = &recorder{}
		o := testOptions(uint64(i+1), peers)
		if mod != nil {
			mod(&o)
		}
		tr, err := New(lis[i], recs[i], o)
		if err != nil {
			t.Fatal(err)
		}
		trs[i] = tr
		t.Cleanup(func() {
			if err := tr.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	return trs, recs
}

// wildcardListener is a loopback listener that reports the unspecified
// address, standing in for ":9191" without listening beyond loopback.
type wildcardListener struct{ net.Listener }

func (wildcardListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 9191} }

func newWildcardListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return wildcardListener{l}
}
