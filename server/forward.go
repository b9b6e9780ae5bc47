package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// Forwarded puts (storaged --raft-forward-puts; design replication.md §7
// phase 2 (f)). A follower refuses a put with NOT_LEADER and the leader's
// address; a client that cannot follow that hint (any gRPC client behind
// a Kubernetes Service, which spreads its calls over every member) then
// fails two calls in three. With a Forwarder, a follower that knows the
// leader hands PutMessage, PutMessages, each PutMessageStream message and
// CommitOffset to it over the peer transport (one hop: the leader never
// forwards) and answers with the leader's answer. The cost is the hop,
// and an outcome a refusal would have made certain becomes unknown when
// the forwarded call itself fails (CauseForwardFailed below): the client
// must then treat the put as it treats FLUSH_SLAVE_TIMEOUT (retry with an
// idempotency key, or read before retrying; a commit may simply be sent
// again). Reads (linearizable ones included), POP calls and membership
// changes are not forwarded.

// CauseForwardFailed (DEADLINE_EXCEEDED, reason FLUSH_SLAVE_TIMEOUT, as a
// put not seen committed in time; metadata outcome unknown, leader_id,
// leader_addr) is a forwarded put whose call to the leader failed in
// transit: it may have been stored.
const CauseForwardFailed = "FORWARD_FAILED"

// Forwarder sends a put to the group's leader: peer.Transport.ForwardPut.
// Errors wrapping peer.ErrNoRoute, peer.ErrForwardTooLarge or
// peer.ErrPeerDown mean nothing was sent.
type Forwarder interface {
	ForwardPut(ctx context.Context, to uint64, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error)
}

// WithForwarder makes a follower forward the puts it would refuse with
// NOT_LEADER to the leader (storaged --raft-forward-puts).
func WithForwarder(f Forwarder) Option {
	return func(s *Service) { s.forwarder = f }
}

// ForwardStats counts forwarded puts by how they ended: answered by the
// leader (a PUT_OK or its refusal) or failed in transit (outcome unknown).
type ForwardStats struct {
	Answered, Failed uint64
}

// forwardCounts are ForwardStats' counters.
type forwardCounts struct {
	answered, failed atomic.Uint64
}

// ForwardStats returns the puts this member forwarded so far.
func (s *Service) ForwardStats() ForwardStats {
	return ForwardStats{Answered: s.fwd.answered.Load(), Failed: s.fwd.failed.Load()}
}

// forwardTarget returns the leader to forward a put to, if err is a
// follower's NOT_LEADER refusal naming it and this member forwards.
func (s *Service) forwardTarget(err error) (uint64, bool) {
	var nl *storage.NotLeaderError
	if s.forwarder == nil || !errors.As(err, &nl) || nl.Cause != CauseNotLeader || nl.LeaderID == 0 {
		return 0, false
	}
	return nl.LeaderID, true
}

// forward hands req, a write the store refused with refusal, to the
// leader, when refusal is a follower's NOT_LEADER naming it and this
// member forwards (forwardTarget). sent false: nothing was sent (no such
// refusal, no route, too large, the leader's connection down), and the
// caller answers refusal. Otherwise resp is the leader's answer, or err
// the status for the client: the leader's own, or CauseForwardFailed.
func (s *Service) forward(ctx context.Context, m method, refusal error, born netip.AddrPort, req *peerv1.ForwardPutRequest) (resp *peerv1.ForwardPutResponse, sent bool, err error) {
	to, ok := s.forwardTarget(refusal)
	if !ok {
		return nil, false, nil
	}
	req.BornHost = born.String()
	resp, err = s.forwarder.ForwardPut(ctx, to, req)
	if errors.Is(err, peer.ErrNoRoute) || errors.Is(err, peer.ErrForwardTooLarge) || errors.Is(err, peer.ErrPeerDown) {
		s.log.Debug().Err(err).Uint64("leader_id", to).Msg("put not forwarded")
		return nil, false, nil
	}
	if err == nil {
		s.fwd.answered.Add(1)
		return resp, true, nil
	}
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			s.fwd.answered.Add(1)
			return nil, true, err // the leader's answer, as its client port would give it
		}
	}
	s.fwd.failed.Add(1)
	if st.Code() == codes.Canceled || errors.Is(ctx.Err(), context.Canceled) {
		return nil, true, status.Error(codes.Canceled, "the put was cancelled while forwarded to the leader; it may have been stored")
	}
	addr := s.leaderAddr(to)
	s.logLimit.Event("put forwarded: failed", s.log.Warn()).Err(err).Str("grpc.method", string(m)).Uint64("leader_id", to).
		Msg("a put forwarded to the leader failed in transit; its outcome is unknown")
	info := &errdetails.ErrorInfo{Reason: storage.FlushSlaveTimeout.String(), Domain: ErrorDomain, Metadata: map[string]string{
		"cause": CauseForwardFailed, "outcome": "unknown", "leader_id": strconv.FormatUint(to, 10), "leader_addr": addr}}
	return nil, true, newStatus(codes.DeadlineExceeded, fmt.Sprintf("this replica forwarded the write to the group's leader, member %d at %s, "+
		"and the call failed (%s: %s); it may have been stored: read it, or retry it (a put with its idempotency key)", to, addr,
		st.Code(), st.Message()), info)
}

// ForwardedPut implements peer.PutHandler: the leader's side. The put is
// validated and stored as PutMessage and PutMessages do it, with the
// client's address the follower saw, and never forwarded again.
func (s *Service) ForwardedPut(ctx context.Context, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	born, err := netip.ParseAddrPort(req.GetBornHost())
	if err != nil {
		born = netip.AddrPort{}
	}
	switch p := req.GetPut().(type) {
	case *peerv1.ForwardPutRequest_Message:
		resp, err := s.putMessage(ctx, p.Message, born, false)
		if err != nil {
			return nil, err
		}
		return &peerv1.ForwardPutResponse{Result: &peerv1.ForwardPutResponse_Message{Message: resp}}, nil
	case *peerv1.ForwardPutRequest_Messages:
		resp, err := s.putMessages(ctx, p.Messages, born, false)
		if err != nil {
			return nil, err
		}
		return &peerv1.ForwardPutResponse{Result: &peerv1.ForwardPutResponse_Messages{Messages: resp}}, nil
	case *peerv1.ForwardPutRequest_CommitOffset:
		resp, err := s.commitOffset(ctx, p.CommitOffset, false)
		if err != nil {
			return nil, err
		}
		return &peerv1.ForwardPutResponse{Result: &peerv1.ForwardPutResponse_CommitOffset{CommitOffset: resp}}, nil
	}
	return nil, invalidArgument(&errdetails.ErrorInfo{Reason: storage.MessageIllegal.String(), Domain: ErrorDomain}, "put",
		"a forwarded call carries neither a message, a batch nor an offset commit")
}

var _ peer.PutHandler = (*Service)(nil)

// ForwardCollector exports the forwarded puts: those this member
// forwarded, by result, and those it took as the leader.
type ForwardCollector struct {
	stats func() ForwardStats
	taken func() uint64
	sent  *prometheus.Desc
	took  *prometheus.Desc
}

// NewForwardCollector returns the collector of stats (Service.ForwardStats)
// and taken (peer.Transport.Forwarded's second value).
func NewForwardCollector(stats func() ForwardStats, taken func() uint64) *ForwardCollector {
	return &ForwardCollector{stats: stats, taken: taken,
		sent: prometheus.NewDesc("storaged_forwarded_puts_total", "Puts this member, a follower, forwarded to the leader "+
			"(--raft-forward-puts), by result: answered (the leader's PUT_OK or refusal) or failed (in transit; outcome unknown).",
			[]string{"result"}, nil),
		took: prometheus.NewDesc("storaged_forwarded_puts_taken_total", "Puts followers forwarded to this member as the leader.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ForwardCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.sent; ch <- c.took }

// Collect implements prometheus.Collector.
func (c *ForwardCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(st.Answered), "answered")
	ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(st.Failed), "failed")
	ch <- prometheus.MustNewConstMetric(c.took, prometheus.CounterValue, float64(c.taken()))
}
