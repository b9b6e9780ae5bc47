package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// Limits on StreamOptions.
const (
	// DefaultStreamInFlight is StreamOptions.MaxInFlight's default: what
	// storaged reads of one stream before it stops reading.
	DefaultStreamInFlight = 256
	// MaxStreamInFlight bounds StreamOptions.MaxInFlight.
	MaxStreamInFlight = 4096
)

// StreamOptions configure a Stream. Zero values take the defaults.
type StreamOptions struct {
	// MaxInFlight bounds the messages sent and not answered yet, on all of
	// the Stream's gRPC streams together: a Put waits for room. Default
	// 256 (storaged holds at most 256 of a stream in flight, and beyond
	// that HTTP/2 flow control holds the rest); 1 to MaxStreamInFlight.
	MaxInFlight int
	// CallOptions are passed to every PutMessageStream call the Stream
	// makes (compression, per-call credentials, message size limits): a
	// gRPC stream carries many Puts, so they are the Stream's, not a
	// Put's.
	CallOptions []grpc.CallOption
}

// Stream sends single messages on PutMessageStreams to the group's ready
// leader (NewStream). Safe for concurrent use: Puts of many goroutines
// share one gRPC stream.
//
// It keeps one gRPC stream open at a time, to the member the tracker says
// is the ready leader, with at most MaxInFlight messages sent and not
// answered (a Put waits for room, within its ctx). Request ids are unique
// per Stream. Each message's answer decides its Put:
//
//   - code 0: the answer (status and result) is the Put's response;
//   - code 14 UNAVAILABLE: nothing was stored (not the leader, too few
//     in-sync replicas, the server is draining or ends the stream): the
//     member is doubted, the stream is half-closed (the answers still due
//     on it are read) and the message is sent again on a new stream to the
//     leader (a lookup), after a jittered backoff when that is the same
//     member, at most MaxAttempts sends per message;
//   - another code: a gRPC status error with that code, the ErrorInfo
//     reason storaged named and its message (status.Code and Classify see
//     it; only code 14 is NothingStored). A keyed message whose answer is
//     an unknown outcome PutMessage would retry (DEADLINE_EXCEEDED, as
//     FLUSH_SLAVE_TIMEOUT; CANCELLED) is sent again as PutMessage would.
//
// The gRPC stream breaks (a Recv error), or a keyed message waits longer
// than Options.AttemptTimeout for its answer, or waits while the leader
// check (Options.LeaderCheckAfter) finds another member leading in a later
// term (the stream is then cut):
// every message sent and not answered on it has an unknown outcome. A
// keyed one (a UNIQ_KEY property; by default the tracker stamps one, on a
// copy of the message) is sent again on the next stream to the leader,
// while the dedup window that member reports covers twice the time since
// its Put began and attempts remain, as PutMessage retries; an unkeyed one
// fails with an error Classify does not call NothingStored. A stream that
// ended OK (io.EOF) stored no message it did not answer: those are sent
// again. Once a send's outcome was unknown, the Put's final error says so
// (that error first, where status.Code and Classify look), whatever later
// sends answered. A Put whose ctx ends while its message is unanswered
// returns an unknown outcome; the stream is half-closed and the member
// doubted, as PutMessage does after a deadline.
//
// Order: messages are stored in the order the leader takes them, which
// for concurrent Puts is not the order of the calls, and a message sent
// again after a refusal or an unknown outcome may be stored after
// messages put later.
//
// Bounds: one sender and one receiver goroutine per open gRPC stream (a
// half-closed one lives until its answers are in or it breaks: each holds
// room of MaxInFlight, so at most MaxInFlight+1 are open), MaxInFlight
// messages in flight, MaxAttempts sends per message, LeaderWait per Put
// while no member is the ready leader, and the Put's ctx. Close stops
// them all.
type Stream struct {
	t       *LeaderTracker
	opts    StreamOptions
	room    chan struct{} // a token per message sent and not answered
	openSem chan struct{} // one stream opened at a time
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	cur    *streamConn // the stream new messages go to; nil: open one
	nextID uint64
	closed bool

	// roomWait, if set (tests), is called when a Put finds no room and
	// is about to wait for it.
	roomWait func()
}

// streamConn is one gRPC stream to addr and the messages on it.
type streamConn struct {
	addr   string
	cancel context.CancelFunc
	sendq  chan *storagedv1.PutMessageStreamRequest // capacity MaxInFlight: never full
	// Guarded by Stream.mu:
	pending  map[uint64]*streamPending
	retired  bool  // half-closed (sendq closed): no new messages
	done     bool  // the receiver ended: pending is empty for good
	breakErr error // why the client cut it (AttemptTimeout), if it did
}

// streamPending is a message sent on a stream, waiting for its answer.
type streamPending struct {
	ch        chan streamResult // buffered 1: whoever removes it from pending sends once
	abandoned bool              // its Put returned (ctx ended)
}

// streamResult is a message's answer, or its stream's end.
type streamResult struct {
	resp *storagedv1.PutMessageStreamResponse
	err  error // the stream ended without an answer: io.EOF (ended OK) or the break
}

// NewStream opens a producer that sends single messages on
// PutMessageStreams to the group's ready leader (see Stream). The gRPC
// stream is opened by the first Put.
func (t *LeaderTracker) NewStream(opts StreamOptions) (*Stream, error) {
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = DefaultStreamInFlight
	}
	if opts.MaxInFlight < 1 || opts.MaxInFlight > MaxStreamInFlight {
		return nil, fmt.Errorf("client: MaxInFlight %d, want 1 to %d", opts.MaxInFlight, MaxStreamInFlight)
	}
	s := &Stream{t: t, opts: opts, room: make(chan struct{}, opts.MaxInFlight), openSem: make(chan struct{}, 1)}
	s.ctx, s.cancel = context.WithCancel(t.ctx) // the tracker's Close ends it too
	return s, nil
}

// Close cuts the open streams, fails the waiting Puts with ErrClosed (an
// unknown outcome for a message sent and not answered) and waits for the
// Stream's goroutines. The tracker stays open.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// errStreamTimeout cuts a stream on which a keyed message waited longer
// than AttemptTimeout.
var errStreamTimeout = status.Error(codes.DeadlineExceeded, "client: no answer within AttemptTimeout: stream cut")

// Put sends m and waits for its answer (see Stream for the retries and
// what the error says). m must not change until Put returns.
func (s *Stream) Put(ctx context.Context, m *storagedv1.Message) (*storagedv1.PutMessageResponse, error) {
	t := s.t
	if t.opts.UniqKeys == UniqKeysStamped && m != nil && !keyed(m.GetProperties()) {
		m = withKey(m, t.newKey())
	}
	isKeyed := keyed(m.GetProperties())
	// Close ends the Put's waits too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	closedOr := func(err error) error {
		if s.ctx.Err() != nil {
			return ErrClosed
		}
		return err
	}

	r := t.newRetry()
	for {
		sc, err := s.open(ctx)
		var delay time.Duration
		switch {
		case errors.Is(err, ErrNoLeader):
			if delay, err = r.noLeader(err); err != nil {
				return nil, err
			}
		case err != nil: // ctx ended, closed
			return nil, r.fail(errors.Join(closedOr(err), r.last))
		case r.hold(sc.addr) > 0:
			delay = r.hold(sc.addr) // the same member: its backoff first
		case r.uncovered(sc.addr):
			return nil, r.unknown
		default:
			res, sent := s.send(ctx, sc, m, isKeyed)
			if !sent {
				if res.err != nil { // ctx ended or closed while waiting for room
					return nil, r.fail(errors.Join(closedOr(res.err), r.last))
				}
				continue // the stream was retired meanwhile: another
			}
			more := r.sent()
			if res.resp != nil && res.resp.GetCode() == 0 {
				return &storagedv1.PutMessageResponse{Status: res.resp.GetStatus(), Result: res.resp.GetResult()}, nil
			}
			if res.resp == nil && errors.Is(res.err, io.EOF) {
				// The stream ended OK without answering it: not stored.
				r.last = fmt.Errorf("client: stream to %s (attempt %d) %w", sc.addr, r.attempt, errUnanswered)
				if !more {
					return nil, r.fail(r.last)
				}
				continue
			}
			var rerr error // the answer's error, or the stream's
			if res.resp != nil {
				rerr = answerError(res.resp)
			} else {
				rerr = res.err
			}
			if res.resp != nil && res.resp.GetCode() == int32(codes.Unavailable) {
				s.t.doubt(sc.addr)
				s.retire(sc)
				err := fmt.Errorf("client: stream put refused at %s (attempt %d), nothing stored: %w", sc.addr, r.attempt, rerr)
				if !more {
					return nil, r.fail(err)
				}
				r.refused(sc.addr, err, 0, false)
				break
			}
			what := "answered"
			switch {
			case res.resp == nil && ctx.Err() != nil:
				what = "unanswered when the call's ctx ended"
			case res.resp == nil:
				what = "stream broke" // s.send doubted it; it is retired
			}
			err := fmt.Errorf("client: stream put at %s (attempt %d, %s), %w: %w",
				sc.addr, r.attempt, what, errOutcomeUnknown, closedOr(rerr))
			if errors.Is(err, ErrClosed) || ctx.Err() != nil || !isKeyed || !more ||
				(res.resp != nil && !unknownRetried(rerr)) {
				return nil, r.fail(err)
			}
			// A keyed message: the same again, on a stream to whichever
			// member leads now (the same after a backoff when it
			// answered).
			if res.resp != nil {
				s.t.doubt(sc.addr)
				s.retire(sc)
			}
			r.unknownOutcome(sc.addr, err, res.resp != nil)
		}
		if err := r.wait(ctx, s.ctx, delay); err != nil {
			return nil, err
		}
	}
}

// answerError is the gRPC status error a message's non-zero answer
// stands for: its code and message, and an ErrorInfo of storaged's domain
// with its reason, marked stored "unknown" when the answer carries a
// result (appended, durability unknown), so that Classify calls it
// NothingStored only for code 14 without a result.
func answerError(r *storagedv1.PutMessageStreamResponse) error {
	st := status.New(codes.Code(r.GetCode()), r.GetErrorMessage())
	info := &errdetails.ErrorInfo{Reason: r.GetReason(), Domain: errorDomain}
	if r.GetResult() != nil {
		info.Metadata = map[string]string{"stored": "unknown"}
	}
	if d, err := st.WithDetails(info); err == nil {
		st = d
	}
	return st.Err()
}

// open returns the stream new messages go to, opening one to the ready
// leader when there is none (one Put opens it, the others wait).
func (s *Stream) open(ctx context.Context) (*streamConn, error) {
	if sc, err := s.current(); sc != nil || err != nil {
		return sc, err
	}
	select {
	case s.openSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.openSem }()
	if sc, err := s.current(); sc != nil || err != nil {
		return sc, err
	}
	addr, conn, err := s.t.target(ctx, "", 0)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(s.ctx)
	st, err := storagedv1.NewMessageStoreServiceClient(conn).PutMessageStream(sctx, s.opts.CallOptions...)
	if err != nil {
		cancel()
		s.t.release(addr)
		s.t.doubt(addr)
		if s.ctx.Err() != nil {
			return nil, ErrClosed // Close (the Put's ctx follows it, asynchronously)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Nothing was sent: as when no leader answers.
		return nil, errors.Join(ErrNoLeader, fmt.Errorf("client: open a stream to %s: %w", addr, err))
	}
	sc := &streamConn{addr: addr, cancel: cancel, sendq: make(chan *storagedv1.PutMessageStreamRequest, s.opts.MaxInFlight),
		pending: map[uint64]*streamPending{}}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		s.t.release(addr)
		return nil, ErrClosed
	}
	s.cur = sc
	s.wg.Add(2)
	s.mu.Unlock()
	go s.sender(sc, st)
	go s.receiver(sc, st)
	return sc, nil
}

// current is the open stream new messages go to (nil: none).
func (s *Stream) current() (*streamConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.cur, nil
}

// send sends m on sc, once there is room, and waits for its answer or the
// stream's end. sent is false when nothing was sent: r.err is then the
// reason (ctx ended, closed), or nil when sc was retired meanwhile. A
// keyed message waits at most AttemptTimeout, then cuts the stream.
func (s *Stream) send(ctx context.Context, sc *streamConn, m *storagedv1.Message, isKeyed bool) (r streamResult, sent bool) {
	select {
	case s.room <- struct{}{}:
	default:
		if s.roomWait != nil {
			s.roomWait()
		}
		select {
		case s.room <- struct{}{}:
		case <-ctx.Done():
			return streamResult{err: ctx.Err()}, false
		}
	}
	p := &streamPending{ch: make(chan streamResult, 1)}
	s.mu.Lock()
	if sc.retired {
		s.mu.Unlock()
		<-s.room
		return streamResult{}, false
	}
	s.nextID++
	id := s.nextID
	sc.pending[id] = p
	sc.sendq <- &storagedv1.PutMessageStreamRequest{RequestId: id, Message: m} // never full: pending <= MaxInFlight
	s.mu.Unlock()

	var timeout <-chan time.Time
	if isKeyed {
		if s.t.opts.AttemptTimeout > 0 {
			timer := time.NewTimer(s.t.opts.AttemptTimeout)
			defer timer.Stop()
			timeout = timer.C
		}
		stop := s.t.watchSend(sc.addr, func(movedTo string) {
			s.cut(sc, status.Errorf(codes.Canceled, "client: %s leads in a later term than %s: stream cut", movedTo, sc.addr))
		})
		defer stop()
	}
	select {
	case r = <-p.ch:
	case <-timeout:
		s.cut(sc, errStreamTimeout)
		r = <-p.ch // the receiver ends at once and answers every message
	case <-ctx.Done():
		s.mu.Lock()
		if _, ok := sc.pending[id]; ok {
			p.abandoned = true
			s.retireLocked(sc)
			s.mu.Unlock()
			s.t.doubt(sc.addr)
			return streamResult{err: status.FromContextError(ctx.Err()).Err()}, true
		}
		s.mu.Unlock()
		r = <-p.ch // answered meanwhile
	}
	if r.resp == nil && !errors.Is(r.err, io.EOF) {
		s.t.doubt(sc.addr)
	}
	return r, true
}

// cut breaks sc: every message unanswered on it ends with why (unless
// it ended already, or was cut before).
func (s *Stream) cut(sc *streamConn, why error) {
	s.mu.Lock()
	if !sc.done && sc.breakErr == nil {
		sc.breakErr = why
	}
	s.mu.Unlock()
	sc.cancel()
}

// retire half-closes sc: no new messages go to it; its receiver reads
// the answers still due.
func (s *Stream) retire(sc *streamConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retireLocked(sc)
}

// retireLocked is retire; it also cuts a retired stream whose unanswered
// messages all lost their Puts (no one waits for their answers, and a
// paused member would hold their room forever). REQUIRES: s.mu.
func (s *Stream) retireLocked(sc *streamConn) {
	if s.cur == sc {
		s.cur = nil
	}
	if !sc.retired {
		sc.retired = true
		close(sc.sendq)
	}
	for _, p := range sc.pending {
		if !p.abandoned {
			return
		}
	}
	if len(sc.pending) > 0 {
		sc.cancel()
	}
}

// sender sends sc's messages in order, and half-closes the stream once
// sc is retired.
func (s *Stream) sender(sc *streamConn, st grpc.BidiStreamingClient[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]) {
	defer s.wg.Done()
	for req := range sc.sendq {
		if err := st.Send(req); err != nil {
			return // broken: the receiver sees why
		}
	}
	_ = st.CloseSend()
}

// receiver hands each answer to its message's Put until the stream ends,
// then ends every message still unanswered with the stream's end.
func (s *Stream) receiver(sc *streamConn, st grpc.BidiStreamingClient[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]) {
	defer s.wg.Done()
	for {
		resp, err := st.Recv()
		if err != nil {
			s.end(sc, err)
			return
		}
		s.mu.Lock()
		p, ok := sc.pending[resp.GetRequestId()]
		if ok {
			delete(sc.pending, resp.GetRequestId())
			<-s.room
			p.ch <- streamResult{resp: resp}
			if sc.retired {
				s.retireLocked(sc) // cut it if only abandoned messages remain
			}
		}
		s.mu.Unlock()
	}
}

// end ends sc: every unanswered message gets err (the client's own
// reason if it cut the stream), and sc's connection is released.
func (s *Stream) end(sc *streamConn, err error) {
	s.mu.Lock()
	if sc.breakErr != nil {
		err = sc.breakErr
	} else if s.closed {
		err = ErrClosed
	}
	sc.done = true
	if s.cur == sc {
		s.cur = nil
	}
	if !sc.retired {
		sc.retired = true
		close(sc.sendq)
	}
	for id, p := range sc.pending {
		delete(sc.pending, id)
		<-s.room
		p.ch <- streamResult{err: err}
	}
	s.mu.Unlock()
	sc.cancel()
	s.t.release(sc.addr)
}
