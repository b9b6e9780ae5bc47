package peer

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// sliceRanger serves n entries whose payload is 600 KiB each (so two do
// not fit one chunk); entry damaged (if non-zero) is damaged.
type sliceRanger struct {
	n, damaged uint64
	calls      int
}

func payload(i uint64) []byte { return bytes.Repeat([]byte{byte(i)}, 600<<10) }

func (s *sliceRanger) ReadRange(lo, hi uint64, maxBytes int) (Range, error) {
	s.calls++
	out := Range{Commit: s.n - 1, Last: s.n}
	size := 0
	for i := lo; i < hi && i <= s.n; i++ {
		if i == s.damaged {
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
	if r.calls < 4 {
		t.Fatalf("%d reads for 4 entries of 600 KiB: the chunks are not bounded by %d bytes", r.calls, FetchChunkBytes)
	}
	if got, err := client(nil).Fetch(ctx, 9, 12); err != nil || len(got.Entries) != 0 || got.Last != 5 {
		t.Fatalf("past the end: %d entries, last %d, %v; want none, last 5", len(got.Entries), got.Last, err)
	}

	r.damaged = 3
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
