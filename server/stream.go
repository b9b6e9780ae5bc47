package server

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// PutMessageStream implements storagedv1.MessageStoreServiceServer.
//
// Three kinds of goroutine share a stream:
//
//   - the handler goroutine reads requests. Before each read it takes one of
//     window tokens; with none left it stops reading, so at most window
//     messages are between "received" and "answered" and HTTP/2 flow control
//     pushes back on the client. Nothing is buffered beyond that.
//   - workers put messages into the store concurrently (a sync put waits for
//     group commit, so concurrency is what makes one stream fast). They are
//     started on demand, at most window of them, and live as long as the
//     stream.
//   - one sender writes the answers (grpc-go allows one sender at a time) and
//     gives a token back after each. The acks channel has room for window
//     answers, so a worker never blocks on it.
//
// The stream ends with OK once the client has half-closed and every answer
// has been sent. When the client goes away (cancel, deadline, broken
// connection) the in-flight puts see the cancelled context, the workers and
// the sender finish, and the handler returns the stream's error.
//
// On a connection served by GRPCServer the stream also ends itself before
// the connection's age limit would cut it (streamlife.go): from its soft
// end every further message is answered UNAVAILABLE (ErrStreamEnding,
// nothing stored), and at its hard end the handler stops reading, sends
// the answers of the puts under way and returns OK. The reading then runs
// on a goroutine of its own, so that the handler can stop waiting for it.
func (s *Service) PutMessageStream(stream grpc.BidiStreamingServer[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	born := bornHost(ctx)
	window := s.streamWindow

	tokens := make(chan struct{}, window)
	acks := make(chan *storagedv1.PutMessageStreamResponse, window)
	sent := make(chan error, 1)
	go func() {
		var err error
		for ack := range acks {
			if err == nil {
				if err = stream.Send(ack); err != nil {
					cancel() // the stream is broken: stop the puts and the reads
				}
			}
			<-tokens
		}
		sent <- err
	}()

	// softC is closed at the soft end (nil: never): from then on every
	// message is answered ErrStreamEnding. The workers look at it
	// themselves, so a message read after the soft end is refused however
	// the goroutines are scheduled.
	var softC, hardC <-chan struct{}
	soft, hard, scheduled := s.life.schedule(ctx, s.life.now())
	if scheduled {
		var release func()
		softC, release = s.life.at(soft)
		defer release()
		hardC, release = s.life.at(hard)
		defer release()
	}
	w := &streamWorkers{
		work: make(chan *streamItem),
		max:  window,
		run: func(it *streamItem) {
			acks <- s.streamPut(ctx, it, born, softC)
		},
	}
	r := &streamReader{stream: stream, tokens: tokens, w: w, stop: make(chan struct{})}
	var recvErr error
	if scheduled {
		done := make(chan error, 1)
		go func() { done <- r.read(ctx) }()
		select {
		case recvErr = <-done:
		case <-hardC:
			r.halt() // the reader may still be in RecvMsg: it ends with the stream
		}
	} else {
		recvErr = r.read(ctx)
	}
	w.close()
	close(acks)
	if err := <-sent; err != nil {
		return err
	}
	return recvErr
}

// streamReader reads a stream's messages and hands them to the workers,
// taking a token before each read. halt stops it from another goroutine:
// once halt returns, it submits nothing more.
type streamReader struct {
	stream grpc.BidiStreamingServer[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]
	tokens chan struct{}
	w      *streamWorkers
	stop   chan struct{} // closed by halt

	mu     sync.Mutex
	halted bool // guarded by mu
}

// read runs until the client half-closes (nil), the stream fails or ctx
// ends (its error), or halt (nil).
func (r *streamReader) read(ctx context.Context) error {
	for {
		select {
		case r.tokens <- struct{}{}:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-r.stop:
			return nil
		}
		it := itemPool.Get().(*streamItem)
		if err := r.stream.RecvMsg(&it.req); err != nil {
			it.release()
			<-r.tokens
			if !errors.Is(err, io.EOF) {
				return err
			}
			return nil
		}
		r.mu.Lock()
		if r.halted {
			r.mu.Unlock()
			it.release() // read after the hard end: never answered, never stored
			return nil
		}
		r.w.submit(it)
		r.mu.Unlock()
	}
}

// halt stops the reader; after it returns the reader submits nothing.
func (r *streamReader) halt() {
	r.mu.Lock()
	r.halted = true
	r.mu.Unlock()
	close(r.stop)
}

// streamPut puts one stream message and builds its answer. It gives the
// item back to the pool. A panic (the recovery interceptor only guards the
// handler goroutine, not the workers) becomes an INTERNAL answer, logged,
// as it does for PutMessage, and the stream goes on.
func (s *Service) streamPut(ctx context.Context, it *streamItem, born netip.AddrPort, softEnd <-chan struct{}) (resp *storagedv1.PutMessageStreamResponse) {
	id := it.req.GetRequestId()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error().Interface("panic", p).Bytes("stack", debug.Stack()).Uint64("request_id", id).
				Msg("recovered a panic while putting a stream message")
			st := status.Convert(panicError())
			resp = &storagedv1.PutMessageStreamResponse{RequestId: id, Code: int32(st.Code()), ErrorMessage: st.Message(),
				Status: storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR, Reason: storage.UnknownError.String()}
		}
	}()
	ack := new(streamAck)
	ack.resp.RequestId = it.req.GetRequestId()
	var (
		res storage.PutResult
		err error
	)
	if s.draining.Err() != nil {
		res, err = storage.PutResult{Status: storage.ServiceNotAvailable}, ErrDraining
	} else if ended(softEnd) {
		res, err = storage.PutResult{Status: storage.ServiceNotAvailable}, ErrStreamEnding
	} else if fe := fillMessage(&it.msg, it.props[:0], it.req.GetMessage(), s.now(), born); fe != nil {
		res, err = storage.PutResult{Status: fe.Status}, fe
	} else {
		res, err = s.store.PutMessage(ctx, &it.msg)
		if err != nil {
			if fresp, sent, ferr := s.forward(ctx, methodPutMessageStream, err, born, &peerv1.ForwardPutRequest{
				Put: &peerv1.ForwardPutRequest_Message{Message: &storagedv1.PutMessageRequest{Message: it.req.GetMessage()}}}); sent {
				it.release()
				return forwardedStreamAck(id, fresp.GetMessage(), ferr)
			}
		}
	}
	it.release()

	if res.Appended() {
		ack.resp.Result = ack.fillResult(&res.Append)
	}
	if err == nil {
		ack.resp.Status = toProtoStatus(res.Status)
		return &ack.resp
	}
	// The one mapping (errors.go) decides code, reason and message, exactly
	// as PutMessage would report them.
	reason := res.Status
	if reason == 0 {
		reason = storage.UnknownError
	}
	ack.resp.Status = toProtoStatus(reason)
	st := status.Convert(s.putError(ctx, methodPutMessageStream, res, err))
	ack.resp.Code = int32(st.Code())
	ack.resp.ErrorMessage = st.Message()
	ack.resp.Reason = reason.String()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			ack.resp.Reason = info.GetReason()
		}
	}
	return &ack.resp
}

// forwardedStreamAck is the answer to a stream message a follower
// forwarded: the leader's answer, or its error as streamPut reports one.
func forwardedStreamAck(id uint64, resp *storagedv1.PutMessageResponse, err error) *storagedv1.PutMessageStreamResponse {
	r := &storagedv1.PutMessageStreamResponse{RequestId: id}
	if err == nil {
		r.Status, r.Result = resp.GetStatus(), resp.GetResult()
		return r
	}
	st := status.Convert(err)
	r.Code, r.ErrorMessage = int32(st.Code()), st.Message()
	r.Status, r.Reason = storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR, storage.UnknownError.String()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			r.Reason = info.GetReason()
			if v, ok := storagedv1.PutMessageStatus_value["PUT_MESSAGE_STATUS_"+info.GetReason()]; ok {
				r.Status = storagedv1.PutMessageStatus(v)
			}
			r.Result = appendResultOf(info.GetMetadata())
		}
	}
	return r
}

// appendResultOf rebuilds the AppendResult of a put the leader appended
// with its durability unknown, from the metadata of the leader's error
// (appendedError): a stream answer carries the result on such an error,
// and a forwarded stream message's answer must carry the same one as the
// leader's own stream would. Nil when the error says nothing was appended,
// or when a field is missing or malformed (a leader of an older version).
func appendResultOf(md map[string]string) *storagedv1.AppendResult {
	if md["stored"] != "unknown" {
		return nil
	}
	var bad bool
	num := func(k string, bits int) int64 {
		v, err := strconv.ParseInt(md[k], 10, bits)
		bad = bad || err != nil
		return v
	}
	r := &storagedv1.AppendResult{
		MsgId:        md["msg_id"],
		WroteOffset:  num("wrote_offset", 64),
		WroteBytes:   int32(num("wrote_bytes", 32)),
		QueueId:      int32(num("queue_id", 32)),
		QueueOffset:  num("queue_offset", 64),
		MessageCount: int32(num("message_count", 32)),
	}
	ms := num("store_timestamp_ms", 64)
	if bad || r.MsgId == "" {
		return nil
	}
	r.StoreTimestamp = timestamppb.New(time.UnixMilli(ms))
	return r
}

// ended reports whether ch is closed; a nil ch never is.
func ended(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// streamAck is an answer with its result and timestamp in one allocation.
type streamAck = withResult[storagedv1.PutMessageStreamResponse]

// streamItem is one stream message from its read to its put: the request
// (read into with RecvMsg), the storage message and room for its system
// properties. Items are pooled; the store keeps no reference to a message
// after its put returns.
type streamItem struct {
	req storagedv1.PutMessageStreamRequest
	messageWithProps
}

var itemPool = sync.Pool{New: func() any { return new(streamItem) }}

// release clears the item (so the pool holds no bodies) and pools it.
func (it *streamItem) release() {
	it.req.Reset()
	it.msg = storage.Message{}
	clear(it.props[:])
	itemPool.Put(it)
}

// streamWorkers runs items on up to max goroutines, started when no idle
// one is there to take an item. submit is called by one goroutine only.
type streamWorkers struct {
	work    chan *streamItem // unbuffered: a send succeeds only into an idle worker
	max     int
	started int
	run     func(*streamItem)
	wg      sync.WaitGroup
}

// submit hands it to an idle worker, or starts one, or (all max busy)
// waits for one. The caller's token bounds what is outstanding to max, so
// with max workers busy one of them is about to be free.
func (w *streamWorkers) submit(it *streamItem) {
	select {
	case w.work <- it:
		return
	default:
	}
	if w.started < w.max {
		w.started++
		w.wg.Go(func() {
			w.run(it)
			for it := range w.work {
				w.run(it)
			}
		})
		return
	}
	w.work <- it
}

// close stops the workers after their items and waits for them.
func (w *streamWorkers) close() {
	close(w.work)
	w.wg.Wait()
}
