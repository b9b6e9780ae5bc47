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
	acked  [queues]atomic.Int64 // one past the highest acked queue offset
	wg     sync.WaitGroup
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
				off := max(0, w.acked[q].Load()-3+rng.Int64N(5))
				w.read(ctx, producers+r, q, off)
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
	out := history.Unknown
	w.rec.Finish(id, func(o *history.Op) {
		switch {
		case err != nil:
			o.Err = status.Code(err).String()
		case res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
			o.Err = res.Status.String() // stored, not known durable: not an ack
		default:
			out = history.OK
			o.Offset, o.CommitLogOffset = res.Result.QueueOffset, res.Result.WroteOffset
		}
		o.Outcome = out
	})
	if out == history.OK {
		for {
			cur := w.acked[q].Load()
			if cur > res.Result.QueueOffset || w.acked[q].CompareAndSwap(cur, res.Result.QueueOffset+1) {
				break
			}
		}
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
	w.rec.Finish(id, func(o *history.Op) {
		switch c := status.Code(err); {
		case err == nil && len(res.Messages) > 0 && res.Messages[0].QueueOffset == off:
			o.Outcome, o.Found, o.Value = history.OK, true, history.ValueOf(res.Messages[0].Body)
		case err == nil, c == codes.OutOfRange, c == codes.NotFound:
			// Absent. An empty answer below max_offset is recorded as
			// absent too, and the linearizability check then flags it.
			o.Outcome = history.OK
		default:
			o.Outcome, o.Err = history.Unknown, c.String()
		}
	})
}
