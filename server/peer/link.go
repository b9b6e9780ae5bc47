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
	// when the peer took a stream and then did not take the next one: its
	// process is gone (reportLoop tells the Stepper PeerGone).
	unreachable, gone atomic.Bool

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
// one after a backoff, until ctx ends. A stream the peer took (its
// handler's header arrived) followed by one it did not (the connection
// refused, or not made within the connect timeout; a proxy or sidecar in
// between that took the connection ends the stream without that header)
// reports the peer gone, once until the peer takes a stream again: a
// process that dies has its connections ended by the kernel and its port
// refuses the next one, so its peers learn within a backoff what raft's
// election timeout would tell them a second or two later
// (storage/replica's PeerGone). A peer of a version without the header
// is never counted up, so never reported gone.
func (l *link) run(ctx context.Context) {
	backoff := l.t.opts.MinBackoff
	up := false // the peer took the last stream
	for ctx.Err() == nil {
		start := time.Now()
		took, err := l.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		l.log.Debug().Err(err).Bool("taken", took).Msg("peer stream ended")
		if up && !took {
			l.log.Info().Err(err).Msg("peer gone: its stream ended and it took no new one")
			l.gone.Store(true)
		}
		up = took
		l.drop(0) // the stream broke: report the peer unreachable (and gone, if so)
		if time.Since(start) > l.t.opts.MaxBackoff {
			backoff = l.t.opts.MinBackoff // it worked for a while: retry soon
		}
		if !l.wait(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, l.t.opts.MaxBackoff)
	}
}

// wait sleeps d or until ctx ends (false).
func (l *link) wait(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
}

// stream runs one client stream until a send fails, the stream ends, or
// ctx ends; took says whether the peer's handler took it (its header
// arrived).
func (l *link) stream(ctx context.Context) (took bool, err error) {
	var wg sync.WaitGroup
	var taken atomic.Bool                  // set by the watcher below
	defer func() { took = taken.Load() }() // run last: once the watcher has returned
	defer wg.Wait()                        // the watcher, once cancel (deferred after, run before) ended it
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := peerv1.NewRaftClient(l.conn).Send(sctx)
	if err != nil {
		return false, err
	}
	l.connects.Add(1)
	// The peer sends its header when it takes the stream (run) and
	// answers only when the stream ends, so a read returns when the
	// stream is over: the peer restarted, closed it, or the connection
	// broke. Without it an idle stream (a follower's to another follower,
	// used only in elections) that broke went unnoticed until the next
	// send failed on it and dropped its batch: the first vote or pre-vote
	// after the peer restarted was lost, and the election took another
	// election timeout (BENCHMARKS.md "A real run on Kubernetes").
	ended := make(chan error, 1)
	wg.Go(func() {
		if md, err := st.Header(); err == nil && len(md.Get(upHeader)) > 0 {
			taken.Store(true)
		}
		var sum peerv1.SendSummary
		ended <- st.RecvMsg(&sum)
	})
	o := &l.t.opts
	batch := &peerv1.RaftBatch{Group: o.Group, ClusterId: o.ClusterID, From: o.ID, To: l.id, FromClientAddr: o.ClientAddr,
		FromPeerAddr: *l.t.selfAddr.Load()}
	budget := o.MaxMsgSize - 1024 // header and framing
	var next []byte               // a message that did not fit the previous batch
	for {
		first := next
		next = nil
		if first == nil {
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case err := <-ended:
				return false, streamEnded(err)
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
			return false, err
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
