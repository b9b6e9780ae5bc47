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

// State is a member's identity and durable raft state as FetchState
// carries them: what a member repairing its raft/meta or raft/hardstate
// rebuilds them from.
type State struct {
	NodeID            uint64
	Group, ClusterID  string
	FileSize, LogBase int64
	Voters, Learners  []uint64
	// Term and Commit are the HardState on disk; First and Last the first
	// index and the last synced one.
	Term, Commit, First, Last uint64
	// Joining: bootstrapped empty and not caught up with a leader yet.
	Joining bool
}

// Ranger is what FetchRange and FetchState need from the store:
// ReadRange returns up to maxBytes of payload (one entry at least) of the
// synced entries [lo, hi), each checked against its unit, empty where the
// log ends (an error wrapping ErrDamaged says an entry is damaged here);
// State returns the member's identity and durable raft state.
type Ranger interface {
	ReadRange(lo, hi uint64, maxBytes int) (Range, error)
	State() (State, error)
}

// ErrDamaged is what a Ranger wraps when its own copy of an entry is
// damaged (FetchRange answers DATA_LOSS).
var ErrDamaged = errors.New("peer: the entry is damaged on this member")

type rangerBox struct{ r Ranger }

// SetRanger sets the store FetchRange reads from; until then it answers
// UNAVAILABLE.
func (t *Transport) SetRanger(r Ranger) { t.ranger.Store(&rangerBox{r}) }

// checkFetchHeader checks the header of a FetchRange or FetchState
// request as Send checks a batch's.
func (h *handler) checkFetchHeader(group, cluster string, from, to uint64) error {
	t := h.t
	o := &t.opts
	switch {
	case group != o.Group:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for group %q, this member is in %q", trunc(group), o.Group)
	case cluster != o.ClusterID:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for cluster %q, this member is in %q", trunc(cluster), o.ClusterID)
	case to != o.ID:
		return status.Errorf(codes.PermissionDenied, "peer: fetch for member %d, this is member %d", to, o.ID)
	case t.peerLink(from) == nil:
		return status.Errorf(codes.PermissionDenied, "peer: fetch from member %d, not a peer of member %d", from, o.ID)
	}
	return nil
}

// FetchState returns this member's identity and durable raft state to a
// member repairing its raft/meta or raft/hardstate, after the checks
// FetchRange makes.
func (h *handler) FetchState(ctx context.Context, req *peerv1.FetchStateRequest) (*peerv1.FetchStateResponse, error) {
	t := h.t
	if err := h.checkFetchHeader(req.GetGroup(), req.GetClusterId(), req.GetFrom(), req.GetTo()); err != nil {
		return nil, err
	}
	if err := h.checkCertCtx(ctx, req.GetFrom()); err != nil {
		t.log.Warn().Err(err).Uint64("from", req.GetFrom()).Msg("peer state fetch refused")
		return nil, err
	}
	b := t.ranger.Load()
	if b == nil {
		return nil, status.Error(codes.Unavailable, "peer: the store is not open yet")
	}
	s, err := b.r.State()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "peer: read the raft state: %v", err)
	}
	t.log.Info().Uint64("from", req.GetFrom()).Msg("serving a repair's state fetch")
	return &peerv1.FetchStateResponse{NodeId: s.NodeID, Group: s.Group, ClusterId: s.ClusterID, FileSize: s.FileSize,
		LogBase: s.LogBase, Voters: s.Voters, Learners: s.Learners, Term: s.Term, Commit: s.Commit, First: s.First,
		Last: s.Last, Joining: s.Joining}, nil
}

// FetchRange streams the entries [lo, hi) to a repairing member, after
// the checks Send makes of its header and certificate.
func (h *handler) FetchRange(req *peerv1.FetchRangeRequest, st grpc.ServerStreamingServer[peerv1.RangeChunk]) error {
	t := h.t
	if err := h.checkFetchHeader(req.GetGroup(), req.GetClusterId(), req.GetFrom(), req.GetTo()); err != nil {
		return err
	}
	switch {
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

// State asks the member for its identity and durable raft state.
func (c *RangeClient) State(ctx context.Context) (State, error) {
	r, err := peerv1.NewRaftClient(c.conn).FetchState(ctx, &peerv1.FetchStateRequest{Group: c.o.Group, ClusterId: c.o.ClusterID,
		From: c.o.From, To: c.o.To})
	if err != nil {
		return State{}, err
	}
	return State{NodeID: r.GetNodeId(), Group: r.GetGroup(), ClusterID: r.GetClusterId(), FileSize: r.GetFileSize(),
		LogBase: r.GetLogBase(), Voters: r.GetVoters(), Learners: r.GetLearners(), Term: r.GetTerm(), Commit: r.GetCommit(),
		First: r.GetFirst(), Last: r.GetLast(), Joining: r.GetJoining()}, nil
}

// Close closes the connection.
func (c *RangeClient) Close() error { return c.conn.Close() }
