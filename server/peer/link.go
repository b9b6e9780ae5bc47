package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
)

// link is the outgoing half to one peer at one address: a bounded queue,
// drained by one goroutine (run) into one client stream at a time. A
// member that moves gets a new link (SetPeer); a link's address never
// changes.
type link struct {
	t    *Transport
	id   uint64
	addr string
	conn *grpc.ClientConn
	// fwd carries forwarded puts (forward.go), apart from raft's stream.
	fwd *grpc.ClientConn
	log zerolog.Logger
	// ctx ends with the Transport or when the link alone is stopped
	// (RemovePeer, or SetPeer moving the member): it bounds run and the
	// snapshots sent over the link, so neither outlives the membership.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned

	queue       chan []byte
	queuedBytes atomic.Int64
	// unreachable is set by drop; the Transport's reportLoop reports the
	// peer unreachable, outside the caller's locks. gone is set by run
	// when the peer's process is gone (reportLoop tells the Stepper
	// PeerGone). heard counts the batches that arrived from the peer on
	// its own stream to this member (the handler).
	unreachable, gone atomic.Bool
	heard             atomic.Uint64
	// waiting is set while run waits between two attempts; a batch from
	// the peer then wakes it through redial (heardFrom).
	waiting atomic.Bool
	redial  chan struct{}

	sent, dropped, connects atomic.Uint64

	snapshotting                 atomic.Bool // a snapshot to this peer is in flight
	snapshotsSent, snapshotBytes atomic.Uint64
}

func (t *Transport) newLink(id uint64, addr string) (*link, error) {
	creds := t.peerCreds(addr)
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(t.opts.MaxMsgSize), grpc.MaxCallRecvMsgSize(1<<20),
			grpc.ForceCodecV2(newCodec())), // RaftBatch's msgs uncopied (codec.go)
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: t.opts.Keepalive, Timeout: t.opts.Keepalive, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(Window), grpc.WithInitialConnWindowSize(ConnWindow),
		// gRPC's own reconnect backoff grows to 120 s by default: a peer
		// down for a few minutes would then stay unreached for up to two
		// minutes after it is back. Bound it like the stream's.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: t.opts.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: t.opts.MaxBackoff},
			MinConnectTimeout: t.opts.Keepalive,
		}),
	)
	if err != nil {
		return nil, err
	}
	fwd, err := t.newForwardConn(addr, creds)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(t.ctx)
	return &link{
		t: t, id: id, addr: addr, conn: conn, fwd: fwd,
		log:    t.log.With().Uint64("peer", id).Str("peer_addr", addr).Logger(),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		queue:  make(chan []byte, t.opts.QueueLen),
		redial: make(chan struct{}, 1),
	}, nil
}

// stop ends a started link and returns once its goroutine has, so that
// after SetPeer or RemovePeer nothing more goes to the old address.
// Closing the connection also ends a stream still being opened.
func (l *link) stop() {
	l.cancel()
	if err := l.conn.Close(); err != nil {
		l.log.Debug().Err(err).Msg("peer connection close")
	}
	if err := l.fwd.Close(); err != nil {
		l.log.Debug().Err(err).Msg("peer forwarding connection close")
	}
	<-l.done
}

// enqueue adds msg without blocking, or drops it: too large for one
// batch, over the queue's byte bound, or the queue is full.
func (l *link) enqueue(msg []byte) {
	n := int64(len(msg))
	if len(msg) > l.t.opts.MaxMsgSize-1024 {
		l.drop(1)
		return
	}
	if l.queuedBytes.Add(n) > int64(l.t.opts.QueueBytes) {
		l.queuedBytes.Add(-n)
		l.drop(1)
		return
	}
	select {
	case l.queue <- msg:
	default:
		l.queuedBytes.Add(-n)
		l.drop(1)
	}
}

func (l *link) drop(n uint64) {
	l.dropped.Add(n)
	// Set before the wake-up: reportLoop empties wake before it looks at
	// the flags, so a report is never lost between the two.
	l.unreachable.Store(true)
	select {
	case l.t.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// run opens a stream, sends batches until it breaks, and opens the next
// one, until ctx ends: at once after a stream that lived longer than
// MaxBackoff, else a backoff after the last one was opened (doubling up to
// MaxBackoff), so that attempts that fail come no faster than one a
// backoff.
//
// It also tells when the peer's process is gone: the peer was heard from
// while a stream to it was open (a batch of its own arrived on its stream
// to this member; a leader sends heartbeats every tick), then two
// attempts in a row ended within MaxBackoff of their start (refused, or
// ended at once by a proxy or a mesh's sidecar answering for a member
// that is gone), the first right after the stream ended, the second a
// backoff later, and nothing came from the peer between the end of the
// first and the end of the second. That is reported once, until the peer
// is heard from again over an open stream. A process that dies has its
// connections ended by the kernel and its port refuses the next, so a
// leader's followers learn within a backoff what raft's election timeout
// would tell them a second or two later (storage/replica's PeerGone). The
// second attempt is there for a connection that broke while the peer
// lives (the first may fail at once on the connection being torn down,
// and a live leader is heard from within a backoff), and for the last
// batches of a dying peer, which may arrive just after its stream ended.
// Every stream begins with a hello (stream), so a follower is heard from
// too and may be reported gone; raft acts only on its leader's loss.
func (l *link) run(ctx context.Context) {
	backoff := l.t.opts.MinBackoff
	up := false             // heard from while a stream was open, since the last report (run's doc)
	short := 0              // attempts in a row that ended within MaxBackoff
	heard := l.heard.Load() // as the last attempt ended
	for ctx.Err() == nil {
		start := time.Now()
		opened, err := l.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		// Heard from between the end of the attempt before and this one's.
		// Only the last such stretch must be silent: the batches a dying
		// peer sent last may arrive as its stream ends, or just after.
		h := l.heard.Load()
		silent := h == heard
		heard = h
		up = up || (opened && !silent) // heard while a stream was open
		lived := time.Since(start)
		if lived > l.t.opts.MaxBackoff {
			short = 0
		} else {
			short++
		}
		l.log.Debug().Err(err).Bool("silent", silent).Int("short", short).Msg("peer stream ended")
		if up && silent && short >= 2 {
			l.log.Info().Err(err).Msg("peer gone: its stream ended, two attempts failed and it was not heard from")
			l.gone.Store(true)
			up = false
		}
		l.drop(0) // the stream broke: report the peer unreachable (and gone, if so)
		if lived > l.t.opts.MaxBackoff {
			backoff = l.t.opts.MinBackoff // it worked for a while: open the next at once
			continue
		}
		ok, back := l.pause(ctx, start, backoff, heard)
		if !ok {
			return
		}
		if back {
			backoff = l.t.opts.MinBackoff
		} else {
			backoff = min(2*backoff, l.t.opts.MaxBackoff)
		}
	}
}

// heardFrom counts a batch that arrived from the peer on its own stream
// to this member (the handler), and wakes run if it is waiting to try
// again: the peer is up.
func (l *link) heardFrom() {
	l.heard.Add(1)
	if l.waiting.Load() {
		select {
		case l.redial <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// pause waits between two attempts: until backoff after start, the
// last attempt's, or, once the peer has been heard from since that
// attempt ended (heard: the count then), until MinBackoff after start,
// with gRPC's own reconnect backoff reset (back). A member that comes
// back opens its stream to this one at once, and its first batch says so
// (stream's hello): without the wake-up, this side would reach it only
// at its next attempt, up to MaxBackoff later, and so would raft's
// heartbeats and appends (a leader reached a restarted follower 2 s late,
// BENCHMARKS.md "A restarted member, reached at once"). Attempts stay at
// least MinBackoff apart however often the peer is heard (a peer that
// reaches this member while this member's way to it fails). ok is false
// when ctx ended.
func (l *link) pause(ctx context.Context, start time.Time, backoff time.Duration, heard uint64) (ok, back bool) {
	l.waiting.Store(true)
	defer l.waiting.Store(false)
	at := start.Add(backoff)
	soon := start.Add(l.t.opts.MinBackoff) // backoff is never less
	// A batch that came before waiting was set woke nobody: the count
	// tells.
	back = l.heard.Load() != heard
	if back {
		at = soon
	}
	timer := time.NewTimer(time.Until(at))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, back
		case <-l.redial:
			if !back {
				back = true
				timer.Reset(time.Until(soon))
			}
		case <-timer.C:
			if back {
				l.conn.ResetConnectBackoff()
			}
			return true, back
		}
	}
}

// stream runs one client stream until a send fails, the stream ends, or
// ctx ends; opened says whether the stream was opened at all.
func (l *link) stream(ctx context.Context) (opened bool, err error) {
	var wg sync.WaitGroup
	defer wg.Wait() // the watcher below, once cancel (deferred after, run before) ended it
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := peerv1.NewRaftClient(l.conn).Send(sctx)
	if err != nil {
		return false, err
	}
	l.connects.Add(1)
	// The peer answers a stream only when it ends, so a read returns when
	// the stream is over: the peer restarted, closed it, or the connection
	// broke. Without it an idle stream (a follower's to another follower,
	// used only in elections) that broke went unnoticed until the next
	// send failed on it and dropped its batch: the first vote or pre-vote
	// after the peer restarted was lost, and the election took another
	// election timeout (BENCHMARKS.md "A real run on Kubernetes").
	ended := make(chan error, 1)
	wg.Go(func() {
		var sum peerv1.SendSummary
		ended <- st.RecvMsg(&sum)
	})
	o := &l.t.opts
	batch := &peerv1.RaftBatch{Group: o.Group, ClusterId: o.ClusterID, From: o.ID, To: l.id, FromClientAddr: o.ClientAddr,
		FromPeerAddr: *l.t.selfAddr.Load()}
	// The hello: a batch without messages, so that the peer hears from
	// this member as soon as its stream is up, not at raft's first message
	// to it (a follower's comes only with an election). A peer waiting to
	// try its own stream to this member again tries at once (pause).
	if err := l.sendBatch(st, batch, nil, ended); err != nil {
		return true, err
	}
	budget := o.MaxMsgSize - 1024 // header and framing
	var next []byte               // a message that did not fit the previous batch
	for {
		first := next
		next = nil
		if first == nil {
			select {
			case <-ctx.Done():
				return true, ctx.Err()
			case err := <-ended:
				return true, streamEnded(err)
			case first = <-l.queue:
				l.queuedBytes.Add(-int64(len(first)))
			}
		}
		msgs := [][]byte{first}
		size := len(first) + 8
	fill:
		for len(msgs) < o.MaxBatchMsgs {
			select {
			case m := <-l.queue:
				l.queuedBytes.Add(-int64(len(m)))
				if size+len(m)+8 > budget {
					next = m // starts the next batch
					break fill
				}
				msgs = append(msgs, m)
				size += len(m) + 8
			default:
				break fill
			}
		}
		if err := l.sendBatch(st, batch, msgs, ended); err != nil {
			if next != nil {
				l.drop(1)
			}
			return true, err
		}
	}
}

// streamEnded is the error of a stream whose read (the watcher's) ended
// with err.
func streamEnded(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return errors.New("peer: the stream ended")
	}
	return fmt.Errorf("peer: the stream ended: %w", err)
}

// sendBatch sends msgs on st; ended is the stream's watcher (stream).
func (l *link) sendBatch(st grpc.ClientStreamingClient[peerv1.RaftBatch, peerv1.SendSummary], batch *peerv1.RaftBatch, msgs [][]byte,
	ended <-chan error) error {
	batch.Msgs = msgs
	if err := st.Send(batch); err != nil {
		l.drop(uint64(len(msgs)))
		if errors.Is(err, io.EOF) {
			// The server ended the stream: its status, which the
			// watcher's read returns, says why.
			return streamEnded(<-ended)
		}
		return err
	}
	l.sent.Add(uint64(len(msgs)))
	return nil
}
