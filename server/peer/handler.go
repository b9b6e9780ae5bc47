package peer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// handler serves storaged.peer.v1.Raft for a Transport.
type handler struct {
	peerv1.UnimplementedRaftServer
	t *Transport
}

// Send checks each batch's header and steps its messages. A bad header ends
// the stream with PERMISSION_DENIED (a foreign group, cluster or member: it
// will not get better by retrying) or INVALID_ARGUMENT (over a bound). A
// first batch from a stranger (see the package doc) that names its peer
// address gets a link for the answers, which stops with the stream (or
// when another stream of the stranger replaces it).
func (h *handler) Send(st grpc.ClientStreamingServer[peerv1.RaftBatch, peerv1.SendSummary]) error {
	t := h.t
	var sum peerv1.SendSummary
	var from uint64 // fixed by the first batch
	// rb's msgs point into the codec's buffer (codec.go) until the next
	// RecvMsg frees it; StepPeer keeps none of them.
	var rb recvBatch
	defer rb.free()
	for {
		rb.free()
		err := st.RecvMsg(&rb)
		b := &rb.RaftBatch
		if errors.Is(err, io.EOF) {
			return st.SendAndClose(&sum)
		}
		if err != nil {
			return err
		}
		if from == 0 && t.peerLink(b.GetFrom()) == nil {
			if len(b.GetMsgs()) == 0 {
				// A hello (link.stream) from a member that is not a peer:
				// it says nothing raft needs, and a stranger is admitted
				// only with its first message, as before hellos.
				continue
			}
			// Every new stream of a stranger gets a new link (its previous
			// stream may not have ended on this side yet: its deferred
			// dropStranger then leaves the new link alone).
			l, err := h.admitStranger(st, b)
			if err != nil {
				t.log.Warn().Err(err).Uint64("from", b.GetFrom()).Str("from_peer_addr", trunc(b.GetFromPeerAddr())).Msg("peer stream refused")
				return err
			}
			if l != nil {
				defer t.dropStranger(b.GetFrom(), l)
			}
		}
		if err := h.check(b, from); err != nil {
			t.log.Warn().Err(err).Uint64("from", b.GetFrom()).Msg("peer batch refused")
			return err
		}
		if from == 0 {
			if err := h.checkCert(st, b.GetFrom()); err != nil {
				t.log.Warn().Err(err).Uint64("from", b.GetFrom()).Msg("peer stream refused")
				return err
			}
			from = b.GetFrom()
		}
		if a := b.GetFromClientAddr(); a != "" {
			t.setClientAddr(from, a)
		}
		if l := t.knownLink(from); l != nil {
			l.heardFrom() // the peer is up (link.run, link.pause)
		}
		sum.Batches++
		s := t.getStepper()
		if s == nil {
			continue // not attached yet: raft tolerates the loss
		}
		for _, m := range b.GetMsgs() {
			if err := s.StepPeer(m); err != nil {
				t.log.Debug().Err(err).Uint64("from", from).Msg("peer message not stepped")
				continue
			}
			sum.Msgs++
			t.received.Add(1)
		}
	}
}

func (h *handler) check(b *peerv1.RaftBatch, from uint64) error {
	o := &h.t.opts
	switch {
	case b.GetGroup() != o.Group:
		return status.Errorf(codes.PermissionDenied, "peer: batch for group %q, this member is in %q", trunc(b.GetGroup()), o.Group)
	case b.GetClusterId() != o.ClusterID:
		return status.Errorf(codes.PermissionDenied, "peer: batch for cluster %q, this member is in %q", trunc(b.GetClusterId()), o.ClusterID)
	case b.GetTo() != o.ID:
		return status.Errorf(codes.PermissionDenied, "peer: batch for member %d, this is member %d", b.GetTo(), o.ID)
	case h.t.knownLink(b.GetFrom()) == nil:
		return status.Errorf(codes.PermissionDenied, "peer: batch from member %d, not a peer of member %d", b.GetFrom(), o.ID)
	case from != 0 && b.GetFrom() != from:
		return status.Errorf(codes.InvalidArgument, "peer: batch from member %d on member %d's stream", b.GetFrom(), from)
	case len(b.GetFromClientAddr()) > maxClientAddrLen:
		return status.Errorf(codes.InvalidArgument, "peer: from_client_addr of %d bytes, at most %d", len(b.GetFromClientAddr()), maxClientAddrLen)
	case len(b.GetFromPeerAddr()) > maxClientAddrLen:
		return status.Errorf(codes.InvalidArgument, "peer: from_peer_addr of %d bytes, at most %d", len(b.GetFromPeerAddr()), maxClientAddrLen)
	case len(b.GetMsgs()) > o.MaxBatchMsgs:
		return status.Errorf(codes.InvalidArgument, "peer: %d messages in a batch, at most %d", len(b.GetMsgs()), o.MaxBatchMsgs)
	}
	// Each message is bounded by MaxRecvMsgSize (the whole batch).
	return nil
}

// admitStranger takes the first batch of a stream from a sender that is
// not a peer: with the header otherwise right (group, cluster, this
// member), a peer address that a peer's would pass (SetPeer's rules:
// host:port, no plaintext off loopback), and with TLS a client
// certificate naming that address's host, the sender becomes a stranger
// with a link to that address. The Stepper still decides which of its
// messages raft sees (a leader's or a candidate's only). A nil link and
// no error: it became a peer meanwhile.
func (h *handler) admitStranger(st grpc.ServerStream, b *peerv1.RaftBatch) (*link, error) {
	t := h.t
	o := &t.opts
	switch {
	case b.GetGroup() != o.Group || b.GetClusterId() != o.ClusterID || b.GetTo() != o.ID:
		return nil, h.check(b, 0) // the usual refusal
	case b.GetFrom() == 0 || b.GetFrom() == o.ID:
		return nil, status.Errorf(codes.PermissionDenied, "peer: batch from member %d on member %d", b.GetFrom(), o.ID)
	case b.GetFromPeerAddr() == "":
		return nil, status.Errorf(codes.PermissionDenied, "peer: batch from member %d, not a peer of member %d, and no from_peer_addr", b.GetFrom(), o.ID)
	}
	addr := b.GetFromPeerAddr()
	if err := o.checkPeer(b.GetFrom(), addr); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "peer: batch from member %d, not a peer of member %d: %v", b.GetFrom(), o.ID, err)
	}
	if err := h.checkCertHost(st.Context(), b.GetFrom(), addr); err != nil {
		return nil, err
	}
	return t.addStranger(b.GetFrom(), addr)
}

// checkCert, with TLS, requires the client certificate (already verified
// against the CA) to name the host --raft-peers gives for member from, so
// one member's certificate cannot speak for another.
func (h *handler) checkCert(st grpc.ServerStream, from uint64) error {
	return h.checkCertCtx(st.Context(), from)
}

// checkCertCtx is checkCert for the context of a unary call. A stranger's
// certificate must name the host of the address it gave (the calls that
// take no stranger refuse it before they get here).
func (h *handler) checkCertCtx(ctx context.Context, from uint64) error {
	if h.t.opts.TLS == nil {
		return nil
	}
	// The address of the moment: a member moved by SetPeer must present a
	// certificate for its new host, a removed one is no peer at all, and a
	// stranger's is the address it gave.
	l := h.t.knownLink(from)
	if l == nil {
		return status.Errorf(codes.PermissionDenied, "peer: member %d is not a peer of member %d", from, h.t.opts.ID)
	}
	return h.checkCertHost(ctx, from, l.addr)
}

// checkCertHost, with TLS, requires the client certificate to name addr's
// host.
func (h *handler) checkCertHost(ctx context.Context, from uint64, addr string) error {
	if h.t.opts.TLS == nil {
		return nil
	}
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "peer: no peer information")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return status.Error(codes.Unauthenticated, "peer: no client certificate")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return status.Errorf(codes.Internal, "peer: member %d address: %v", from, err)
	}
	if err := verifyHost(ti.State.PeerCertificates[0], host); err != nil {
		return status.Errorf(codes.PermissionDenied, "peer: member %d's certificate: %v", from, err)
	}
	return nil
}

func verifyHost(c *x509.Certificate, host string) error { return c.VerifyHostname(host) }

func trunc(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%s…", s[:64])
	}
	return s
}
