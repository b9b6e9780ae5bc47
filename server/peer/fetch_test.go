package peer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/testcert"
)

// sliceRanger serves n entries whose payload is 600 KiB each (so two do
// not fit one chunk); entry damaged (if non-zero) is damaged.
type sliceRanger struct {
	n       uint64
	damaged atomic.Uint64
	calls   atomic.Int64 // the server's goroutines write, the test reads
}

func payload(i uint64) []byte { return bytes.Repeat([]byte{byte(i)}, 600<<10) }

func (s *sliceRanger) ReadRange(lo, hi uint64, maxBytes int) (Range, error) {
	s.calls.Add(1)
	out := Range{Commit: s.n - 1, Last: s.n}
	size := 0
	for i := lo; i < hi && i <= s.n; i++ {
		if i == s.damaged.Load() {
			return out, fmt.Errorf("%w: entry %d", ErrDamaged, i)
		}
		if len(out.Entries) > 0 && size+len(payload(i)) > maxBytes {
			break
		}
		out.Entries = append(out.Entries, RangeEntry{Index: i, Unit: []byte{byte(i)}, Data: payload(i)})
		size += len(payload(i))
	}
	return out, nil
}

func (s *sliceRanger) State() (State, error) {
	s.calls.Add(1)
	return State{NodeID: 2, Group: "g1", ClusterID: "c1", FileSize: 1 << 20, LogBase: 0, Voters: []uint64{1, 2, 3},
		Term: 7, Commit: s.n - 1, First: 1, Last: s.n}, nil
}

// TestFetchState: a member repairing its raft/meta or raft/hardstate
// reads a peer's identity and raft state; a foreign header is refused
// as FetchRange refuses it, and a member whose store is not open yet
// answers UNAVAILABLE.
func TestFetchState(t *testing.T) {
	trs, _ := group(t, 3, nil)
	addr := trs[0].opts.Peers[2]
	client := func(mod func(*FetchOptions)) *RangeClient {
		o := FetchOptions{Addr: addr, Group: "g1", ClusterID: "c1", From: 1, To: 2}
		if mod != nil {
			mod(&o)
		}
		c, err := NewRangeClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := context.Background()
	if _, err := client(nil).State(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("before the store is open: %v, want UNAVAILABLE", err)
	}
	r := &sliceRanger{n: 5}
	trs[1].SetRanger(r)
	got, err := client(nil).State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != 2 || got.Group != "g1" || got.ClusterID != "c1" || got.FileSize != 1<<20 || got.Term != 7 || got.Commit != 4 ||
		got.Last != 5 || got.First != 1 || len(got.Voters) != 3 {
		t.Fatalf("state %+v", got)
	}
	calls := r.calls.Load()
	for name, mod := range map[string]func(*FetchOptions){
		"foreign group":   func(o *FetchOptions) { o.Group = "g2" },
		"foreign cluster": func(o *FetchOptions) { o.ClusterID = "c2" },
		"unknown member":  func(o *FetchOptions) { o.From = 7 },
		"another member":  func(o *FetchOptions) { o.To = 1 },
	} {
		if _, err := client(mod).State(ctx); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PERMISSION_DENIED", name, err)
		}
	}
	if r.calls.Load() != calls {
		t.Fatal("a refused request read the state")
	}
}

// TestFetchRange: a member fetches a range in bounded chunks, each entry
// with its unit and payload, up to where the serving log ends; a request
// with a foreign header, an empty or oversized range, or for a damaged
// entry is refused with the documented status.
func TestFetchRange(t *testing.T) {
	trs, _ := group(t, 2, nil)
	r := &sliceRanger{n: 5}
	trs[1].SetRanger(r)
	addr := trs[0].opts.Peers[2]
	client := func(mod func(*FetchOptions)) *RangeClient {
		o := FetchOptions{Addr: addr, Group: "g1", ClusterID: "c1", From: 1, To: 2}
		if mod != nil {
			mod(&o)
		}
		c, err := NewRangeClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := context.Background()
	got, err := client(nil).Fetch(ctx, 2, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 4 || got.Commit != 4 || got.Last != 5 {
		t.Fatalf("fetched %d entries (commit %d, last %d), want 2..5 (commit 4, last 5)", len(got.Entries), got.Commit, got.Last)
	}
	for k, e := range got.Entries {
		if i := uint64(k + 2); e.Index != i || !bytes.Equal(e.Unit, []byte{byte(i)}) || !bytes.Equal(e.Data, payload(i)) {
			t.Fatalf("entry %d: index %d, %d unit bytes, %d data bytes", i, e.Index, len(e.Unit), len(e.Data))
		}
	}
	if r.calls.Load() < 4 {
		t.Fatalf("%d reads for 4 entries of 600 KiB: the chunks are not bounded by %d bytes", r.calls.Load(), FetchChunkBytes)
	}
	if got, err := client(nil).Fetch(ctx, 9, 12); err != nil || len(got.Entries) != 0 || got.Last != 5 {
		t.Fatalf("past the end: %d entries, last %d, %v; want none, last 5", len(got.Entries), got.Last, err)
	}

	r.damaged.Store(3)
	for name, c := range map[string]struct {
		mod    func(*FetchOptions)
		lo, hi uint64
		code   codes.Code
	}{
		"foreign group":   {func(o *FetchOptions) { o.Group = "g2" }, 1, 2, codes.PermissionDenied},
		"foreign cluster": {func(o *FetchOptions) { o.ClusterID = "c2" }, 1, 2, codes.PermissionDenied},
		"unknown member":  {func(o *FetchOptions) { o.From = 7 }, 1, 2, codes.PermissionDenied},
		"another member":  {func(o *FetchOptions) { o.To = 1 }, 1, 2, codes.PermissionDenied},
		"empty range":     {nil, 4, 4, codes.InvalidArgument},
		"index 0":         {nil, 0, 2, codes.InvalidArgument},
		"damaged entry":   {nil, 1, 5, codes.DataLoss},
	} {
		_, err := client(c.mod).Fetch(ctx, c.lo, c.hi)
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", name, err, c.code)
		}
	}
	// An oversized range is refused by the server (the client caps its own).
	st, err := peerv1Client(t, addr).FetchRange(ctx, fetchReq(1, 1+MaxFetchEntries+1))
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("oversized range: %v, want InvalidArgument", err)
	}
}

func peerv1Client(t *testing.T, addr string) peerv1.RaftClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peerv1.NewRaftClient(conn)
}

func fetchReq(lo, hi uint64) *peerv1.FetchRangeRequest {
	return &peerv1.FetchRangeRequest{Group: "g1", ClusterId: "c1", From: 1, To: 2, Lo: lo, Hi: hi}
}

// TestFetchRangeTLS: over peer mTLS, a member fetches with its own
// certificate; a client whose certificate does not name the member it
// claims to be, and a plaintext client, are refused and read nothing.
func TestFetchRangeTLS(t *testing.T) {
	ca := testcert.NewCA(t, "group ca")
	dir := t.TempDir()
	_, certPEM, keyPEM := leaf(t, ca, "127.0.0.1")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tlsCfg, err := LoadTLS(write("cert.pem", certPEM), write("key.pem", keyPEM), write("ca.pem", ca.PEM))
	if err != nil {
		t.Fatal(err)
	}
	lis, peers := listeners(t, 2)
	lis[0].Close()
	peers[3] = "localhost:1" // member 3's certificate would have to name "localhost"
	o := testOptions(2, peers)
	o.TLS = tlsCfg
	tr, err := New(lis[1], &recorder{}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	r := &sliceRanger{n: 3}
	tr.SetRanger(r)
	fetch := func(from uint64, tls *TLS) (Range, error) {
		c, err := NewRangeClient(FetchOptions{Addr: peers[2], TLS: tls, Group: "g1", ClusterID: "c1", From: from, To: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Fetch(ctx, 1, 4)
	}
	if got, err := fetch(1, tlsCfg); err != nil || len(got.Entries) != 3 {
		t.Fatalf("member 1 over TLS: %d entries, %v", len(got.Entries), err)
	}
	calls := r.calls.Load()
	if _, err := fetch(3, tlsCfg); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "member 3's certificate") {
		t.Fatalf("a certificate not naming member 3: %v, want PERMISSION_DENIED", err)
	}
	if _, err := fetch(1, nil); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext: %v, want UNAVAILABLE", err)
	}
	if r.calls.Load() != calls {
		t.Fatal("a refused client read entries")
	}
}
