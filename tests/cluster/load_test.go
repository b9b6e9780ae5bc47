package cluster

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/history"
)

const (
	topic     = "Nemesis"
	queues    = 2
	opTimeout = time.Second // a put or read not answered by then is unknown
	bodySize  = 200
	retries   = 2 // resends of a put whose outcome was unknown
)

// dial connects to addr with a short reconnect backoff, so that clients
// come back within a second of a restart or heal (the default grows to
// 120 s).
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// workload is the clients of a scenario: producers put (producer, seq)
// messages round-robin over the queues, resending a put of unknown outcome
// up to retries times; readers read single offsets near each queue's acked
// end, where a read races with puts.
type workload struct {
	rec    *history.Recorder
	client storagedv1.MessageStoreServiceClient
	acked  ackedEnds
	wg     sync.WaitGroup
}

// ackedEnds is, per queue, one past the highest acked queue offset: where
// readers read, racing with the puts.
type ackedEnds [queues]atomic.Int64

func (a *ackedEnds) ack(q int32, off int64) {
	for {
		cur := a[q].Load()
		if cur > off || a[q].CompareAndSwap(cur, off+1) {
			return
		}
	}
}

// near is an offset around queue q's acked end.
func (a *ackedEnds) near(q int32, rng *rand.Rand) int64 { return max(0, a[q].Load()-3+rng.Int64N(5)) }

// finishPut records a put's answer on o: ok with its offsets for PUT_OK,
// else the error's code (or the status) and the outcome notOK.
func finishPut(o *history.Op, res *storagedv1.PutMessageResponse, err error, notOK history.Outcome) {
	switch {
	case err != nil:
		o.Outcome, o.Err = notOK, status.Code(err).String()
	case res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
		// Standalone: stored, not known durable; never expected in a
		// group. Not an ack.
		o.Outcome, o.Err = notOK, res.Status.String()
	default:
		o.Outcome, o.Offset, o.CommitLogOffset = history.OK, res.Result.QueueOffset, res.Result.WroteOffset
	}
}

// finishRead records the answer to a read of offset off on o: found, or
// absent (past the end: OUT_OF_RANGE, or NOT_FOUND for a queue not created
// yet; an empty answer below the end is recorded absent too, and the
// checks then flag it), else the error's code and the outcome failed.
func finishRead(o *history.Op, off int64, res *storagedv1.PullMessagesResponse, err error, failed history.Outcome) {
	switch c := status.Code(err); {
	case err == nil && len(res.Messages) > 0 && res.Messages[0].QueueOffset == off:
		o.Outcome, o.Found, o.Value = history.OK, true, history.ValueOf(res.Messages[0].Body)
	case err == nil, c == codes.OutOfRange, c == codes.NotFound:
		o.Outcome = history.OK
	default:
		o.Outcome, o.Err = failed, c.String()
	}
}

func startLoad(ctx context.Context, rec *history.Recorder, conn *grpc.ClientConn, seed uint64, producers, readers int) *workload {
	w := &workload{rec: rec, client: storagedv1.NewMessageStoreServiceClient(conn)}
	for p := range producers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for seq := 0; ctx.Err() == nil; seq++ {
				q := int32((p + seq) % queues)
				for attempt := 0; attempt <= retries && ctx.Err() == nil; attempt++ {
					if w.put(ctx, p, q, history.Value(p, seq), attempt) != history.Unknown {
						break
					}
				}
			}
		}()
	}
	for r := range readers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(r)))
			for ctx.Err() == nil {
				q := int32(rng.IntN(queues))
				w.read(ctx, producers+r, q, w.acked.near(q, rng))
			}
		}()
	}
	return w
}

func (w *workload) wait() { w.wg.Wait() }

// put sends one message and records it. It waits for a connection
// (WaitForReady) instead of failing fast while the node is down, so that a
// restart costs each producer one open put, not thousands. Every error is an unknown outcome:
// on one connection a timeout, a reset or a crash cannot tell stored from
// not stored; only the future leader-hint errors ("nothing stored") will be
// definite failures.
func (w *workload) put(ctx context.Context, client int, q int32, value string, attempt int) history.Outcome {
	id := w.rec.Invoke(history.Op{Client: client, Kind: history.Put, Queue: q, Value: value, Attempt: attempt})
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := w.client.PutMessage(cctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: topic, QueueId: q, Body: history.Body(value, bodySize)}}, grpc.WaitForReady(true))
	var out history.Outcome
	w.rec.Finish(id, func(o *history.Op) {
		finishPut(o, res, err, history.Unknown)
		out = o.Outcome
	})
	if out == history.OK {
		w.acked.ack(q, res.Result.QueueOffset)
	}
	return out
}

// read asks for the message at (q, off). Offsets past the end answer
// OUT_OF_RANGE (past max) or NotFound (queue not created yet): absent.
func (w *workload) read(ctx context.Context, client int, q int32, off int64) {
	id := w.rec.Invoke(history.Op{Client: client, Kind: history.Read, Queue: q, Offset: off})
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := w.client.PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off, MaxMessages: 1},
		grpc.WaitForReady(true)) // like puts: no spinning on a down node
	w.rec.Finish(id, func(o *history.Op) { finishRead(o, off, res, err, history.Unknown) })
}
