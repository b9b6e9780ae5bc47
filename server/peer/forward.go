package peer

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// Forwarded puts (storaged --raft-forward-puts, design replication.md §7
// phase 2 (f)): a follower that a client sent a put to hands it to the
// leader it knows over this transport, and the leader stores it as if the
// client had called it. One hop only: the leader never forwards again.
// The forwarded calls travel on a connection of their own per peer (not
// the raft stream's), so client traffic never queues raft's heartbeats
// behind it on one TCP connection.

// PutHandler is what a leader does with a forwarded put (the server's
// Service). Its errors are gRPC statuses, returned to the forwarding
// follower as they are.
type PutHandler interface {
	ForwardedPut(ctx context.Context, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error)
}

type putHandlerBox struct{ h PutHandler }

// SetPutHandler makes this member take forwarded puts; until it is set
// they are refused (UNAVAILABLE, cause NOT_FORWARDED, nothing stored).
func (t *Transport) SetPutHandler(h PutHandler) { t.putHandler.Store(&putHandlerBox{h}) }

// Errors of ForwardPut that mean nothing was sent.
var (
	// ErrNoRoute: no peer address is known for the member.
	ErrNoRoute = errors.New("peer: no address known for the leader")
	// ErrForwardTooLarge: the request is over the transport's message
	// size bound.
	ErrForwardTooLarge = errors.New("peer: the put is too large to forward")
	// ErrPeerDown: the connection to the member is failing (its last
	// attempt to connect failed), so the put is not sent: a call on it
	// would fail before anything leaves, but with a status that cannot be
	// told apart from one lost after the leader took it.
	ErrPeerDown = errors.New("peer: the connection to the leader is down")
)

// errorDomain is the domain of storaged's ErrorInfo details.
const errorDomain = "storaged"

// ForwardPut sends req, with this member's header, to member to and
// returns the leader's answer. ErrNoRoute, ErrForwardTooLarge and
// ErrPeerDown mean nothing was sent; any other error is the call's status: the leader's
// own (with storaged's ErrorInfo) or a failure of the call, after which
// the put may or may not have been stored.
func (t *Transport) ForwardPut(ctx context.Context, to uint64, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	l := t.peerLink(to)
	if l == nil {
		return nil, fmt.Errorf("%w (member %d)", ErrNoRoute, to)
	}
	req.Group, req.ClusterId, req.From, req.To = t.opts.Group, t.opts.ClusterID, t.opts.ID, to
	if n := proto.Size(req); n > t.opts.MaxMsgSize-1024 {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrForwardTooLarge, n, t.opts.MaxMsgSize-1024)
	}
	if st := l.fwd.GetState(); st == connectivity.TransientFailure || st == connectivity.Shutdown {
		return nil, fmt.Errorf("%w (member %d at %s: %v)", ErrPeerDown, to, l.addr, st)
	}
	t.forwarded.Add(1)
	return peerv1.NewRaftClient(l.fwd).ForwardPut(ctx, req)
}

// Forwarded returns how many puts this member forwarded, and how many
// forwarded puts it took as the leader.
func (t *Transport) Forwarded() (sent, taken uint64) {
	return t.forwarded.Load(), t.forwardTaken.Load()
}

// newForwardConn is the connection forwarded puts take to a peer: lazy
// (it connects at the first forwarded put), with the peer credentials.
func (t *Transport) newForwardConn(addr string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(t.opts.MaxMsgSize), grpc.MaxCallRecvMsgSize(t.opts.MaxMsgSize)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: t.opts.Keepalive, Timeout: t.opts.Keepalive}),
		grpc.WithInitialWindowSize(Window), grpc.WithInitialConnWindowSize(ConnWindow),
	)
}

// peerCreds are the credentials of an outgoing connection to addr.
func (t *Transport) peerCreds(addr string) credentials.TransportCredentials {
	if t.opts.TLS == nil {
		return insecure.NewCredentials()
	}
	host, _, _ := net.SplitHostPort(addr) // Validate checked it
	c := t.opts.TLS.Client.Clone()
	c.ServerName = host // the peer's certificate must name its --raft-peers host
	return credentials.NewTLS(c)
}

// ForwardPut serves a follower's forwarded put, after the checks
// FetchState makes of its header and certificate.
func (h *handler) ForwardPut(ctx context.Context, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	t := h.t
	refused := func(err error) error {
		st := status.Convert(err)
		s, _ := status.New(st.Code(), "the leader refused the forwarded put: "+st.Message()).WithDetails(
			&errdetails.ErrorInfo{Reason: "FORWARD_REFUSED", Domain: errorDomain})
		return s.Err()
	}
	if err := h.checkFetchHeader(req.GetGroup(), req.GetClusterId(), req.GetFrom(), req.GetTo()); err != nil {
		t.log.Warn().Err(err).Uint64("from", req.GetFrom()).Msg("forwarded put refused")
		return nil, refused(err)
	}
	if err := h.checkCertCtx(ctx, req.GetFrom()); err != nil {
		t.log.Warn().Err(err).Uint64("from", req.GetFrom()).Msg("forwarded put refused")
		return nil, refused(err)
	}
	b := t.putHandler.Load()
	if b == nil {
		s, _ := status.New(codes.Unavailable, "member takes no forwarded puts yet (starting); nothing stored").WithDetails(
			&errdetails.ErrorInfo{Reason: "SERVICE_NOT_AVAILABLE", Domain: errorDomain, Metadata: map[string]string{"cause": "NOT_FORWARDED"}})
		return nil, s.Err()
	}
	t.forwardTaken.Add(1)
	return b.h.ForwardedPut(ctx, req)
}
