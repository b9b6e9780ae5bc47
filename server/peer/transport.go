// Package peer is the replica-to-replica transport of a replication group:
// it carries marshalled etcd-raft messages between the storaged processes of
// one group over the storaged.peer.v1.Raft gRPC service (design
// replication.md §4).
//
// A Transport is both ends. Send queues a message for one peer without
// blocking; one goroutine per peer drains that queue into a long-lived client
// stream, reconnecting with backoff. The set of peers starts as
// Options.Peers and follows raft's membership changes through SetPeer and
// RemovePeer. The server side checks every batch's header (group, cluster,
// this member, a current peer as sender), bounds its size, records the
// sender's client address (so that a follower can name the leader's address
// in its "not leader" answers) and hands each message to the Stepper. Raft
// tolerates loss, so a full queue or a broken stream drops messages and
// tells raft the peer is unreachable instead of waiting. A peer that was
// heard from, whose stream then ended and the next two attempts failed
// with nothing heard from it meanwhile, is reported gone (PeerGone,
// link.run), so that a dead leader's followers elect another without
// waiting out raft's election timeout.
//
// A sender that is not a peer yet, but names its peer address in the
// header and was never removed, is a stranger: a member added while this
// one was cut off, which may since have become the leader. Its stream is
// taken (the Stepper decides which of its messages raft sees) and, for as
// long as the stream lasts, a link at that address carries the answers,
// so that this member can catch up with the membership it missed.
//
// The store knows nothing of gRPC: it sees the Transport through a one-method
// interface (Send), and the Transport sees the store through Stepper.
package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// Stepper is what the transport needs from the raft node: hand it a
// received message, tell it a peer could not be reached (raft then
// probes that peer instead of streaming to it), and that a peer's process
// is gone. All may be called from several goroutines at once and must not
// block for long.
type Stepper interface {
	// StepPeer steps one marshalled raftpb.Message. An error refuses that
	// message only (it is logged and dropped). msg points into the
	// transport's receive buffer, reused once StepPeer returns: keep a
	// copy, never msg itself.
	StepPeer(msg []byte) error
	// ReportUnreachable says a message to peer id was dropped or its stream
	// broke.
	ReportUnreachable(id uint64)
	// PeerGone says peer id, which was heard from, has gone silent: the
	// stream to it ended and the next two attempts failed (refused, or a
	// proxy in front of it answered) with nothing from it meanwhile. Its
	// process has most likely died. It is reported once per such loss,
	// after ReportUnreachable.
	PeerGone(id uint64)
}

// Defaults of Options.
const (
	// DefaultMaxMsgSize bounds one gRPC message (a RaftBatch), both ways:
	// raft's MaxSizePerMsg (1 MiB) plus the largest entry (4 MiB), rounded
	// up (replication.md §4).
	DefaultMaxMsgSize = 16 << 20
	// DefaultQueueLen bounds the messages waiting for one peer (etcd's
	// rafthttp uses 4096 for its stream buffer).
	DefaultQueueLen = 4096
	// DefaultQueueBytes bounds the bytes waiting for one peer.
	DefaultQueueBytes = 64 << 20
	// Window and ConnWindow are the HTTP/2 flow-control windows of every
	// peer connection (a stream's, a connection's), fixed on both ends.
	// Left to grpc-go, the receiving end estimates the link's
	// bandwidth-delay product: after each read of data it sends a window
	// update and a PING, and the sender answers the PING, until the
	// estimate reaches 16 MiB, which raft's small messages on a short link
	// never make it. Every append and every answer then cost each side a
	// frame written, a frame read and a wakeup more (BENCHMARKS.md,
	// "Fixed windows on the peer links"). Any window of 64 KiB or more
	// turns the estimator off; these hold the largest message
	// (DefaultMaxMsgSize) and bound what a connection buffers to the
	// estimator's own limit. Only members connect (mutual TLS, or
	// plaintext on loopback), and what they send is read at once.
	Window     = 16 << 20
	ConnWindow = 16 << 20
	// DefaultMaxBatchMsgs bounds the messages of one RaftBatch, on both sides.
	DefaultMaxBatchMsgs = 1024
	// DefaultMinBackoff and DefaultMaxBackoff bound the wait between two
	// attempts to open a stream to a peer; it doubles on every failure.
	DefaultMinBackoff = 50 * time.Millisecond
	DefaultMaxBackoff = 2 * time.Second
	// DefaultKeepalive is the ping period on an idle connection, and the
	// wait for its answer, so a dead peer behind a silent network is
	// noticed without raft traffic.
	DefaultKeepalive = 5 * time.Second
	// maxClientAddrLen bounds a batch's from_client_addr.
	maxClientAddrLen = 256
	// maxGroupLen bounds the group and cluster names.
	maxGroupLen = 128
	// maxStrangers bounds the senders that are not peers (strangers) with
	// a stream open at once; each has a link for the answers. One is the
	// expected case (the leader this member has not heard of).
	maxStrangers = 8
	// maxStreamsPerConn bounds the concurrent streams of one incoming
	// connection (gRPC applies MaxConcurrentStreams per connection, not
	// per server). A member needs few on its connection: its Send stream,
	// one InstallSnapshot, and a repair's fetches; 64 leaves room for
	// streams still being torn down after a reconnect, while a client
	// that opens streams without end is still stopped. It is a constant
	// rather than a multiple of the member count, so a member added at
	// run time (SetPeer) can never be refused for exceeding a bound sized
	// for the initial group.
	maxStreamsPerConn = 64
)

// Options configures a Transport. ID, Peers and a Stepper (New's argument or
// SetStepper) are required; zero values of the rest take the defaults.
type Options struct {
	// Group and ClusterID name the replication group; a batch naming
	// another group or cluster is refused.
	Group     string
	ClusterID string
	// ID is this member's raft id; Peers maps every member's id to its
	// peer address (host:port). This member's own entry is optional.
	ID    uint64
	Peers map[uint64]string
	// ClientAddr is this member's client gRPC address, sent in every batch
	// header.
	ClientAddr string
	// PeerAddr is this member's own peer address as the group knows it,
	// sent in every batch header so that a member that has not heard of
	// this one can answer (see strangers); "" takes Peers[ID], and
	// SetPeer(ID, addr) replaces it.
	PeerAddr string
	// TLS, when set, is used for the listener and for every outgoing
	// stream (see TLSFiles.Load). Nil means plaintext, which New allows only
	// when every peer address and the listener are loopback.
	TLS *TLS

	MaxMsgSize   int // bytes of one gRPC message, both ways
	QueueLen     int // messages waiting per peer
	QueueBytes   int // bytes waiting per peer
	MaxBatchMsgs int // messages per batch, both ways
	MinBackoff   time.Duration
	MaxBackoff   time.Duration
	Keepalive    time.Duration
	// SnapshotRate bounds the snapshot bytes sent per second, over all
	// peers (0: DefaultSnapshotRate).
	SnapshotRate int
	Logger       *zerolog.Logger
}

// TLS holds the two sides of a peer TLS configuration: Server for the
// listener (RequireAndVerifyClientCert) and Client for outgoing streams.
// Client's ServerName is set per peer from its address.
type TLS struct {
	Server *tls.Config
	Client *tls.Config
}

// ErrClosed: SetPeer on a Transport that Close stopped; nothing was
// started.
var ErrClosed = errors.New("peer: transport closed")

// ErrPlaintextNotLoopback refuses a plaintext transport with a peer or
// listener address that is not loopback.
var ErrPlaintextNotLoopback = errors.New("peer: plaintext peer traffic is allowed on loopback addresses only; " +
	"set --peer-tls-cert, --peer-tls-key and --peer-tls-ca")

func (o *Options) setDefaults() {
	if o.MaxMsgSize <= 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	if o.QueueLen <= 0 {
		o.QueueLen = DefaultQueueLen
	}
	if o.QueueBytes <= 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	if o.MaxBatchMsgs <= 0 {
		o.MaxBatchMsgs = DefaultMaxBatchMsgs
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	if o.Keepalive <= 0 {
		o.Keepalive = DefaultKeepalive
	}
	if o.SnapshotRate <= 0 {
		o.SnapshotRate = DefaultSnapshotRate
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
}

// Validate checks the options without a listener.
func (o *Options) Validate() error {
	var errs []error
	if o.ID == 0 {
		errs = append(errs, errors.New("peer: ID must not be 0"))
	}
	if len(o.Group) > maxGroupLen || len(o.ClusterID) > maxGroupLen {
		errs = append(errs, fmt.Errorf("peer: group and cluster id at most %d bytes", maxGroupLen))
	}
	if len(o.ClientAddr) > maxClientAddrLen {
		errs = append(errs, fmt.Errorf("peer: client address at most %d bytes", maxClientAddrLen))
	}
	if o.PeerAddr != "" {
		if err := o.checkPeer(o.ID, o.PeerAddr); err != nil {
			errs = append(errs, err)
		}
	}
	others := 0
	for id, addr := range o.Peers {
		if err := o.checkPeer(id, addr); err != nil {
			errs = append(errs, err)
			continue
		}
		if id != o.ID {
			others++
		}
	}
	if others == 0 {
		errs = append(errs, errors.New("peer: no other peer"))
	}
	if o.TLS != nil && (o.TLS.Server == nil || o.TLS.Client == nil) {
		errs = append(errs, errors.New("peer: TLS needs both its server and client configs"))
	}
	return errors.Join(errs...)
}

// checkPeer is Validate's check of one peer entry. SetPeer makes it too,
// so a member added at run time is held to the rules of the initial set
// (in particular, no plaintext off loopback).
func (o *Options) checkPeer(id uint64, addr string) error {
	var errs []error
	if id == 0 {
		errs = append(errs, errors.New("peer: peer id 0"))
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		errs = append(errs, fmt.Errorf("peer: peer %d address %q: %w", id, addr, err))
	} else if len(addr) > maxClientAddrLen {
		errs = append(errs, fmt.Errorf("peer: peer %d address of %d bytes, at most %d", id, len(addr), maxClientAddrLen))
	} else if o.TLS == nil && !IsLoopback(addr) {
		errs = append(errs, fmt.Errorf("%w (peer %d is %s)", ErrPlaintextNotLoopback, id, addr))
	}
	return errors.Join(errs...)
}

// IsLoopback reports whether a host:port address names a loopback host
// ("localhost" or a loopback IP).
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Transport sends raft messages to the peers of one group and serves the
// messages they send. Create it with New; Close stops everything it started.
type Transport struct {
	opts    Options
	log     zerolog.Logger
	stepper atomic.Pointer[stepperBox]
	ranger  atomic.Pointer[rangerBox] // FetchRange's store
	// putHandler takes forwarded puts (forward.go); forwarded and
	// forwardTaken count them, sent and taken.
	putHandler   atomic.Pointer[putHandlerBox]
	forwarded    atomic.Uint64
	forwardTaken atomic.Uint64
	// peers is every member but this one, with its outgoing link. The map
	// is never changed in place: SetPeer and RemovePeer store a new one.
	// Send reads it on raft's hot path with raft's lock held, and the
	// handler on every batch, so a reader must never wait for a
	// membership change nor take a lock.
	peers atomic.Pointer[peerSet]
	// strangers are the senders with a stream open that are not peers
	// (see the package doc), each with a link for the answers; like peers,
	// replaced whole, never changed in place. A stranger made a peer by
	// SetPeer leaves it.
	strangers atomic.Pointer[peerSet]
	// selfAddr is this member's peer address as sent in batch headers.
	selfAddr atomic.Pointer[string]
	srv      *grpc.Server
	lis      net.Listener

	// mu orders the changes of peers (SetPeer, RemovePeer) among
	// themselves and with Close, so that no link starts once Close has
	// begun waiting for the goroutines.
	mu     sync.Mutex
	closed bool
	// removed are the ids RemovePeer was given, refused as strangers
	// (ids are never reused); SetPeer clears an id, the caller's
	// membership knowing better. Guarded by mu.
	removed map[uint64]bool

	addrMu      sync.Mutex
	clientAddrs map[uint64]string // learned from batch headers

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// wake tells reportLoop that a link has an unreachable report pending
	// (link.unreachable).
	wake chan struct{}

	received atomic.Uint64 // messages handed to the stepper

	snapRate          *rate.Limiter // snapshot bytes sent, over all peers
	receiving         atomic.Bool   // an InstallSnapshot is being received
	snapshotsReceived atomic.Uint64
}

// peerSet maps a member's id to its link; see Transport.peers.
type peerSet map[uint64]*link

type stepperBox struct{ s Stepper }

// New starts a Transport: it serves storaged.peer.v1.Raft on lis and opens
// one outgoing stream per other peer. st may be nil and set later with
// SetStepper (the store and the transport each need the other); until then
// received messages are dropped, which raft tolerates. New takes ownership
// of lis: Close closes it.
func New(lis net.Listener, st Stepper, opts Options) (*Transport, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		_ = lis.Close()
		return nil, err
	}
	if opts.TLS == nil {
		if tcp, ok := lis.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
			_ = lis.Close()
			return nil, fmt.Errorf("%w (listener %v)", ErrPlaintextNotLoopback, lis.Addr())
		}
	}
	t := &Transport{
		opts:        opts,
		log:         opts.Logger.With().Str("component", "peer").Uint64("raft_id", opts.ID).Logger(),
		lis:         lis,
		clientAddrs: make(map[uint64]string),
		wake:        make(chan struct{}, 1),
		snapRate:    newSnapshotLimiter(opts.SnapshotRate),
		removed:     make(map[uint64]bool),
	}
	self := opts.PeerAddr
	if self == "" {
		self = opts.Peers[opts.ID]
	}
	t.selfAddr.Store(&self)
	t.strangers.Store(&peerSet{})
	if st != nil {
		t.SetStepper(st)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	initial := make(peerSet, len(opts.Peers))
	for id, addr := range opts.Peers {
		if id == opts.ID {
			continue
		}
		l, err := t.newLink(id, addr)
		if err != nil {
			t.cancel()
			for _, l := range initial {
				_ = l.conn.Close()
				_ = l.fwd.Close()
			}
			_ = lis.Close()
			return nil, err
		}
		initial[id] = l
	}
	t.peers.Store(&initial)

	sopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(opts.MaxMsgSize),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.Keepalive, Timeout: opts.Keepalive}),
		// Peers ping every Keepalive even without a stream; the default
		// policy (5 min) would answer them with GOAWAY too_many_pings.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: opts.Keepalive / 2, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(newCodec()), // RaftBatch's msgs uncopied (codec.go)
		grpc.InitialWindowSize(Window), grpc.InitialConnWindowSize(ConnWindow),
	}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(opts.TLS.Server)))
	}
	t.srv = grpc.NewServer(sopts...)
	peerv1.RegisterRaftServer(t.srv, &handler{t: t})

	t.wg.Add(2)
	go func() {
		defer t.wg.Done()
		if err := t.srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.log.Error().Err(err).Msg("peer listener stopped")
		}
	}()
	go func() {
		defer t.wg.Done()
		t.reportLoop()
	}()
	for _, l := range initial {
		t.start(l)
	}
	return t, nil
}

// start runs l's goroutine, counted in t.wg so that Close waits for it,
// and closing l.done so that stop can wait for this link alone.
func (t *Transport) start(l *link) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer close(l.done)
		l.run(l.ctx)
	}()
}

// SetPeer adds member id at addr, or moves it there: raft applied a
// membership change adding it (as a voter or a learner), or the member
// now listens elsewhere. Moving it stops the old link first and drops what
// was queued for the old address (raft resends what it still needs); its
// PeerStats start again from zero. The same address again changes
// nothing, so that SetPeer may be called for every applied change without
// breaking a working stream. This member's own id sets the peer address
// it names itself by in batch headers (Options.PeerAddr). A stranger
// made a peer loses its stranger's link (the new one takes over). addr is
// checked as Options.Validate checks the initial peers: a member added
// later gets no laxer rules (no plaintext off loopback). After Close it
// returns ErrClosed and starts nothing.
//
// SetPeer waits for a replaced link to stop, but never for the Stepper
// (see reportLoop): it may be called with raft's lock held.
func (t *Transport) SetPeer(id uint64, addr string) error {
	if err := t.opts.checkPeer(id, addr); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if id == t.opts.ID {
		t.selfAddr.Store(&addr)
		return nil
	}
	delete(t.removed, id) // the caller's membership knows better
	cur := *t.peers.Load()
	old := cur[id]
	if old != nil && old.addr == addr {
		return nil
	}
	l, err := t.newLink(id, addr)
	if err != nil {
		return err
	}
	next := maps.Clone(cur)
	next[id] = l
	t.peers.Store(&next)
	if old != nil {
		// After the swap Send queues for the new link only, so what the
		// old one still holds is all it will ever have: dropped.
		old.stop()
		t.log.Info().Uint64("peer", id).Str("old_addr", old.addr).Str("peer_addr", addr).Msg("peer moved")
	} else {
		t.log.Info().Uint64("peer", id).Str("peer_addr", addr).Msg("peer added")
	}
	t.start(l)
	t.dropStrangerLocked(id, nil)
	return nil
}

// RemovePeer forgets member id: raft applied its removal. Its link stops
// (RemovePeer returns once the link's goroutine has ended and its
// connection is closed), what was queued for it is dropped, Send to it
// drops silently, and its batches, snapshots and range fetches are
// refused as a stranger's, so a removed member steps nothing into the
// group it left. Its client address is forgotten too, so that no "not
// leader" answer points a client at it. The id is refused as a stranger
// too (until a SetPeer), even when it was not a peer (a removal applied
// before this start). This member's own id, or a call after Close,
// changes nothing.
//
// Like SetPeer it never waits for the Stepper and may be called with
// raft's lock held; an unreachable report already under way may still
// name id, which raft ignores for a member it no longer tracks.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || id == t.opts.ID {
		return
	}
	t.removed[id] = true
	t.dropStrangerLocked(id, nil)
	cur := *t.peers.Load()
	l := cur[id]
	if l == nil {
		return
	}
	next := maps.Clone(cur)
	delete(next, id)
	t.peers.Store(&next)
	l.stop()
	// After the store above: setClientAddr checks membership under
	// addrMu, so a batch that passed its check before the removal cannot
	// bring the address back.
	t.addrMu.Lock()
	delete(t.clientAddrs, id)
	t.addrMu.Unlock()
	t.log.Info().Uint64("peer", id).Str("peer_addr", l.addr).Msg("peer removed")
}

// Peers returns a copy of the current members but this one, by id, with
// their peer addresses, for metrics and tests.
func (t *Transport) Peers() map[uint64]string { return t.peers.Load().addrs() }

// addrs maps each id of the set to its link's address.
func (s *peerSet) addrs() map[uint64]string {
	out := make(map[uint64]string, len(*s))
	for id, l := range *s {
		out[id] = l.addr
	}
	return out
}

// peerLink is the current link to member id, nil when id is not a peer.
func (t *Transport) peerLink(id uint64) *link { return (*t.peers.Load())[id] }

// strangerLink is the link to stranger id, nil when it has no stream open.
func (t *Transport) strangerLink(id uint64) *link { return (*t.strangers.Load())[id] }

// knownLink is id's link as a peer, else as a stranger.
func (t *Transport) knownLink(id uint64) *link {
	if l := t.peerLink(id); l != nil {
		return l
	}
	return t.strangerLink(id)
}

// PeerAddr is this member's own peer address as its batches name it
// (Options.PeerAddr, or the latest SetPeer of its own id).
func (t *Transport) PeerAddr() string { return *t.selfAddr.Load() }

// Strangers returns the strangers with a stream open, by id, with the
// peer addresses they gave, for metrics and tests.
func (t *Transport) Strangers() map[uint64]string { return t.strangers.Load().addrs() }

// addStranger starts a link to stranger id at addr, for the answers to
// the stream it opened, or returns a status refusing it: removed, or too
// many strangers. Another stream of the same stranger replaces its link
// (the sender's previous stream broke, or it moved). The caller passes
// the link to dropStranger when its stream ends.
func (t *Transport) addStranger(id uint64, addr string) (*link, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, status.Error(codes.Unavailable, "peer: transport closed")
	}
	if t.removed[id] {
		return nil, status.Errorf(codes.PermissionDenied, "peer: member %d was removed from the group", id)
	}
	if t.peerLink(id) != nil {
		return nil, nil // made a peer meanwhile: its stream goes on as a peer's
	}
	cur := *t.strangers.Load()
	if cur[id] == nil && len(cur) >= maxStrangers {
		return nil, status.Errorf(codes.ResourceExhausted, "peer: %d members this one does not know are streaming already", len(cur))
	}
	l, err := t.newLink(id, addr)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "peer: member %d's address %q: %v", id, trunc(addr), err)
	}
	t.dropStrangerLocked(id, nil)
	next := maps.Clone(*t.strangers.Load())
	next[id] = l
	t.strangers.Store(&next)
	t.start(l)
	t.log.Info().Uint64("peer", id).Str("peer_addr", addr).Msg("stream from a member not known yet: answering it at its address")
	return l, nil
}

// dropStranger stops stranger id's link l, unless another stream or
// SetPeer replaced it already.
func (t *Transport) dropStranger(id uint64, l *link) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropStrangerLocked(id, l)
}

// dropStrangerLocked stops stranger id's link: l only, or any when l is
// nil. Its client address goes unless id is a peer. REQUIRES: t.mu.
func (t *Transport) dropStrangerLocked(id uint64, l *link) {
	if t.closed {
		return // Close stops every link, strangers' too; stopping one here too would close its connections twice
	}
	cur := *t.strangers.Load()
	old := cur[id]
	if old == nil || (l != nil && old != l) {
		return
	}
	next := maps.Clone(cur)
	delete(next, id)
	t.strangers.Store(&next)
	old.stop()
	if t.peerLink(id) == nil {
		t.addrMu.Lock()
		delete(t.clientAddrs, id)
		t.addrMu.Unlock()
	}
}

// SetStepper sets (or replaces) the raft node messages are stepped into and
// unreachable peers reported to.
func (t *Transport) SetStepper(s Stepper) { t.stepper.Store(&stepperBox{s}) }

func (t *Transport) getStepper() Stepper {
	if b := t.stepper.Load(); b != nil {
		return b.s
	}
	return nil
}

// Addr is the address the peer service listens on.
func (t *Transport) Addr() net.Addr { return t.lis.Addr() }

// Send queues msg (a marshalled raftpb.Message) for peer to. It never
// blocks: a message for an unknown peer is dropped, and so is one that does
// not fit the peer's queue, which is then reported unreachable (from the
// transport's goroutine, never from inside Send, so raft may call Send with
// its own lock held). msg is sent by reference (codec.go), possibly after
// Send returned: the caller must not change it afterwards.
func (t *Transport) Send(to uint64, msg []byte) {
	l := t.knownLink(to)
	if l == nil {
		return
	}
	l.enqueue(msg)
}

// reportLoop tells the Stepper which peers had messages dropped, and
// which are gone (link.run). It runs on a goroutine of its own because
// ReportUnreachable and PeerGone take raft's lock:
// Send is called with that lock held, a link may be stuck opening a
// stream to a silent peer, and SetPeer and RemovePeer, which may also be
// called with it held, wait for a link to stop. One goroutine for all
// links rather than one per link, so that stopping a link never waits
// for the Stepper.
func (t *Transport) reportLoop() {
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-t.wake:
			for id, l := range *t.peers.Load() {
				if !l.unreachable.Swap(false) {
					continue
				}
				gone := l.gone.Swap(false)
				if s := t.getStepper(); s != nil {
					s.ReportUnreachable(id)
					if gone {
						s.PeerGone(id)
					}
				}
			}
		}
	}
}

// ClientAddr is the client gRPC address of member id: this member's own
// from Options, another's as its latest batch header said ("" if none has
// arrived yet).
func (t *Transport) ClientAddr(id uint64) string {
	if id == t.opts.ID {
		return t.opts.ClientAddr
	}
	t.addrMu.Lock()
	defer t.addrMu.Unlock()
	return t.clientAddrs[id]
}

// Stats counts one peer's outgoing traffic.
type Stats struct {
	Sent, Dropped uint64 // messages written to a stream; dropped (queue full, too large, stream broken)
	Connects      uint64 // streams opened
}

// PeerStats returns the outgoing counters for peer id (zero for a member
// that is not a peer now).
func (t *Transport) PeerStats(id uint64) Stats {
	l := t.peerLink(id)
	if l == nil {
		return Stats{}
	}
	return Stats{Sent: l.sent.Load(), Dropped: l.dropped.Load(), Connects: l.connects.Load()}
}

// Received counts the messages handed to the stepper.
func (t *Transport) Received() uint64 { return t.received.Load() }

// Close stops the outgoing streams and the listener and waits for every
// goroutine the Transport started. Messages still queued are dropped. A
// second Close does nothing.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed { // closed already: nothing left to stop
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	links := slices.Collect(maps.Values(*t.peers.Load()))
	links = slices.AppendSeq(links, maps.Values(*t.strangers.Load()))
	t.mu.Unlock()
	t.cancel()
	// Stop, not GracefulStop: peers' streams are long-lived and would hold
	// a graceful stop until they end.
	t.srv.Stop()
	var errs []error
	for _, l := range links {
		if err := l.conn.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := l.fwd.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	t.wg.Wait()
	return errors.Join(errs...)
}

func (t *Transport) setClientAddr(id uint64, addr string) {
	t.addrMu.Lock()
	defer t.addrMu.Unlock()
	// A batch checked just before RemovePeer may get here after it: a
	// removed member's address must not come back.
	if t.knownLink(id) == nil {
		return
	}
	t.clientAddrs[id] = addr
}
