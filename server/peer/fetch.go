package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// Bounds of FetchRange (design replication.md §3.4: range repair).
const (
	// MaxFetchEntries bounds hi - lo of one FetchRange request.
	MaxFetchEntries = 1 << 16
	// FetchChunkBytes bounds the payload of one RangeChunk (one entry at
	// least: an entry is at most 4 MiB, under MaxMsgSize).
	FetchChunkBytes = 1 << 20
	// fetchClientBytes bounds what one RangeClient.Fetch collects before
	// it stops reading (the caller asks again from where it stopped).
	fetchClientBytes = 16 << 20
)

// Range is a run of raft entries as FetchRange carries them.
type Range struct {
	Commit, Last uint64 // the serving member's commit index and last synced index
	Entries      []RangeEntry
}

// RangeEntry is one raft entry: its index unit as on disk and its payload.
type RangeEntry struct {
	Index      uint64
	Unit, Data []byte
}

// Ranger is what FetchRange needs from the store: up to maxBytes of
// payload (one entry at least) of the synced entries [lo, hi), each
// checked against its unit; empty where the log ends. An error wrapping
// ErrDamaged says an entry is damaged here.
type Ranger interface {
	ReadRange(lo, hi uint64, maxBytes int) (Range, error)
}

// ErrDamaged is what a Ranger wraps when its own copy of an entry is
// damaged (FetchRange answers DATA_LOSS).
var ErrDamaged = errors.New("peer: the entry is damaged on this member")

type rangerBox struct{ r Ranger }

// SetRanger sets the store FetchRange reads from; until then it answers
// UNAVAILABLE.
func (t *Transport) SetRanger(r Ranger) { t.ranger.Store(&rangerBox{r}) }

// FetchRange streams the entries [lo, hi) to a repairing member, after
// the checks Send makes of its header and certificate.
func (h *handler) FetchRange(req *peerv1.FetchRangeRequest, st grpc.ServerStreamingServer[peerv1.RangeChunk]) error {
	t := h.t
	o := &t.opts
	switch {
	case req.GetGroup() != o.Group:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for group %q, this member is in %q", trunc(req.GetGroup()), o.Group)
	case req.GetClusterId() != o.ClusterID:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for cluster %q, this member is in %q", trunc(req.GetClusterId()), o.ClusterID)
	case req.GetTo() != o.ID:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for member %d, this is member %d", req.GetTo(), o.ID)
	case !t.known[req.GetFrom()]:
		return status.Errorf(codes.PermissionDenied, "peer: fetch from member %d, not a peer of member %d", req.GetFrom(), o.ID)
	case req.GetLo() == 0 || req.GetHi() <= req.GetLo():
		return status.Errorf(codes.InvalidArgument, "peer: fetch [%d, %d): want 1 <= lo < hi", req.GetLo(), req.GetHi())
	case req.GetHi()-req.GetLo() > MaxFetchEntries:
		return status.Errorf(codes.InvalidArgument, "peer: fetch of %d entries, at most %d", req.GetHi()-req.GetLo(), MaxFetchEntries)
	}
	if err := h.checkCert(st, req.GetFrom()); err != nil {
		t.log.Warn().Err(err).Uint64("from", req.GetFrom()).Msg("peer fetch refused")
		return err
	}
	b := t.ranger.Load()
	if b == nil {
		return status.Error(codes.Unavailable, "peer: the store is not open yet")
	}
	t.log.Info().Uint64("from", req.GetFrom()).Uint64("lo", req.GetLo()).Uint64("hi", req.GetHi()).Msg("serving a range repair")
	for lo := req.GetLo(); lo < req.GetHi(); {
		if err := st.Context().Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		r, err := b.r.ReadRange(lo, req.GetHi(), FetchChunkBytes)
		if err != nil {
			code := codes.Unavailable
			if errors.Is(err, ErrDamaged) {
				code = codes.DataLoss
			}
			return status.Errorf(code, "peer: read entries from %d: %v", lo, err)
		}
		c := &peerv1.RangeChunk{Commit: r.Commit, Last: r.Last}
		for _, e := range r.Entries {
			c.Entries = append(c.Entries, &peerv1.RangeEntry{Index: e.Index, Unit: e.Unit, Data: e.Data})
		}
		if err := st.Send(c); err != nil {
			return err
		}
		if len(r.Entries) == 0 {
			return nil // the log ends before lo
		}
		lo = r.Entries[len(r.Entries)-1].Index + 1
	}
	return nil
}

// FetchOptions name the member a RangeClient fetches from and who asks.
type FetchOptions struct {
	Addr      string // the serving member's peer address (host:port)
	TLS       *TLS   // nil: plaintext, loopback only
	Group     string
	ClusterID string
	From, To  uint64 // the repairing member, the serving one
}

// RangeClient fetches ranges of a peer's raft log (storaged replica
// repair). Close releases its connection.
type RangeClient struct {
	o    FetchOptions
	conn *grpc.ClientConn
}

// NewRangeClient connects (lazily) to o.Addr.
func NewRangeClient(o FetchOptions) (*RangeClient, error) {
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		host, _, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return nil, fmt.Errorf("peer: address %q: %w", o.Addr, err)
		}
		c := o.TLS.Client.Clone()
		c.ServerName = host
		creds = credentials.NewTLS(c)
	} else if !IsLoopback(o.Addr) {
		return nil, fmt.Errorf("%w (peer %s)", ErrPlaintextNotLoopback, o.Addr)
	}
	conn, err := grpc.NewClient("passthrough:///"+o.Addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(DefaultMaxMsgSize)))
	if err != nil {
		return nil, err
	}
	return &RangeClient{o: o, conn: conn}, nil
}

// Fetch reads entries from lo on (before hi): all of them, or fewer when
// the peer's log ends or 16 MiB of payload came (ask again from there).
func (c *RangeClient) Fetch(ctx context.Context, lo, hi uint64) (Range, error) {
	hi = min(hi, lo+MaxFetchEntries)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the stream when Fetch returns early
	st, err := peerv1.NewRaftClient(c.conn).FetchRange(ctx, &peerv1.FetchRangeRequest{Group: c.o.Group, ClusterId: c.o.ClusterID,
		From: c.o.From, To: c.o.To, Lo: lo, Hi: hi})
	if err != nil {
		return Range{}, err
	}
	var out Range
	size := 0
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out.Commit, out.Last = ch.GetCommit(), ch.GetLast()
		for _, e := range ch.GetEntries() {
			out.Entries = append(out.Entries, RangeEntry{Index: e.GetIndex(), Unit: e.GetUnit(), Data: e.GetData()})
			size += len(e.GetData())
		}
		if size >= fetchClientBytes {
			return out, nil
		}
	}
}

// Close closes the connection.
func (c *RangeClient) Close() error { return c.conn.Close() }
