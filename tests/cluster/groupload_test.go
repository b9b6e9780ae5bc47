package cluster

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/history"
)

// groupOpTimeout bounds one put or read in a group scenario: longer than
// the members' --replication-timeout (groupReplicationTimeout), so that a
// put proposed and not committed is answered by the server (outcome
// unknown) rather than cut by the client, and short enough that a writer
// stuck on a paused or isolated leader moves on.
const (
	groupOpTimeout          = 4 * time.Second
	groupReplicationTimeout = "2s"
)

// groupLoad is the clients of a group scenario. Writers put (producer,
// seq) messages round-robin over the queues to the member they believe
// leads, follow the leader hint of a refusal (UNAVAILABLE with ErrorInfo
// SERVICE_NOT_AVAILABLE and metadata leader_addr), and resend a message
// only after a refusal that says nothing was stored; a put of unknown
// outcome is never resent (the next message goes out instead). Readers
// read single offsets near each queue's acked end from a random member:
// follower reads, recorded Weak (replication design §5.4 d). Strong
// readers read the same way with linearizable: true from the member they
// believe leads, following hints like the writers.
type groupLoad struct {
	rec     *history.Recorder
	clients []storagedv1.MessageStoreServiceClient // by member index
	byAddr  map[string]int                         // client address -> member index
	acked   [queues]atomic.Int64
	wg      sync.WaitGroup
}

func newGroupLoad(t testing.TB, g *group, rec *history.Recorder) *groupLoad {
	l := &groupLoad{rec: rec, byAddr: map[string]int{}}
	for i, p := range g.nodes {
		// Own connections, not p.Conn(): those close on kill and are
		// replaced on restart, while the address stays.
		l.clients = append(l.clients, storagedv1.NewMessageStoreServiceClient(dial(t, p.Addr())))
		l.byAddr[p.Addr()] = i
	}
	return l
}

// start runs producers writers and readers readers until ctx ends; leader
// is the member index writers try first.
func (l *groupLoad) start(ctx context.Context, seed uint64, leader, producers, readers, strongReaders int) {
	for p := range producers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			target := leader
			for seq := 0; ctx.Err() == nil; seq++ {
				q := int32((p + seq) % queues)
				for attempt := 0; ctx.Err() == nil; attempt++ {
					out, next, delay := l.put(ctx, p, target, q, history.Value(p, seq), attempt)
					target = next
					hold(ctx, delay)
					if out != history.Fail {
						break
					}
				}
			}
		}()
	}
	for r := range readers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(r)))
			// About 100 reads/s per reader: reads check the replicas,
			// and left unpaced they would take the CPU from the writes.
			for hold(ctx, between(rng, 5*time.Millisecond, 15*time.Millisecond)) {
				q := int32(rng.IntN(queues))
				off := max(0, l.acked[q].Load()-3+rng.Int64N(5))
				if !l.read(ctx, producers+r, rng.IntN(len(l.clients)), q, off) {
					hold(ctx, 20*time.Millisecond) // that member is down: no spinning on it
				}
			}
		}()
	}
	for r := range strongReaders {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(readers+r)))
			target := leader
			for hold(ctx, between(rng, 5*time.Millisecond, 15*time.Millisecond)) {
				q := int32(rng.IntN(queues))
				off := max(0, l.acked[q].Load()-3+rng.Int64N(5))
				next, delay := l.strongRead(ctx, producers+readers+r, target, q, off)
				target = next
				hold(ctx, delay)
			}
		}()
	}
}

func (l *groupLoad) wait() { l.wg.Wait() }

// strongRead asks member target for the message at (q, off) with
// linearizable: true (served by the ready leader after ReadIndex; checked
// by porcupine). A refusal is recorded as a failed read (it read nothing);
// like a writer, the reader then follows the leader hint or tries the
// next member.
func (l *groupLoad) strongRead(ctx context.Context, client, target int, q int32, off int64) (next int, delay time.Duration) {
	id := l.rec.Invoke(history.Op{Client: client, Kind: history.Read, Queue: q, Offset: off})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.clients[target].PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off,
		MaxMessages: 1, Linearizable: true})
	next = target
	l.rec.Finish(id, func(o *history.Op) {
		switch c := status.Code(err); {
		case err == nil && len(res.Messages) > 0 && res.Messages[0].QueueOffset == off:
			o.Outcome, o.Found, o.Value = history.OK, true, history.ValueOf(res.Messages[0].Body)
		case err == nil, c == codes.OutOfRange, c == codes.NotFound:
			o.Outcome = history.OK
		default:
			o.Outcome, o.Err = history.Fail, c.String()
			if _, addr, d := refusal(err); addr != "" {
				if i, ok := l.byAddr[addr]; ok && i != target {
					next = i
					return
				}
				delay = d
			}
			next, delay = (target+1)%len(l.clients), max(delay, 20*time.Millisecond)
		}
	})
	return next, delay
}

// refusal reports whether err says that nothing was stored and the put
// may be sent again (to the leader it names, if any): the group's
// UNAVAILABLE refusals (NOT_LEADER, NO_LEADER, LEADER_NOT_READY,
// TRANSFERRING, SUPERSEDED, IN_SYNC_REPLICAS_NOT_ENOUGH, a dropped
// proposal) and a draining server. Every other error, including a
// transport UNAVAILABLE without ErrorInfo and DEADLINE_EXCEEDED with
// outcome=unknown, leaves the outcome unknown.
func refusal(err error) (nothingStored bool, leaderAddr string, delay time.Duration) {
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		return false, "", 0
	}
	var info *errdetails.ErrorInfo
	delay = 100 * time.Millisecond
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	if info == nil || info.GetMetadata()["stored"] != "" || info.GetMetadata()["outcome"] != "" {
		return false, "", 0
	}
	switch info.GetReason() {
	case "SERVICE_NOT_AVAILABLE", "IN_SYNC_REPLICAS_NOT_ENOUGH", "OS_PAGE_CACHE_BUSY":
		return true, info.GetMetadata()["leader_addr"], min(max(delay, 10*time.Millisecond), 500*time.Millisecond)
	}
	return false, "", 0
}

// put sends one message to member target and records it; it returns the
// outcome, the member to send the next put to, and how long to wait
// before resending a refused one.
func (l *groupLoad) put(ctx context.Context, client, target int, q int32, value string, attempt int) (history.Outcome, int, time.Duration) {
	id := l.rec.Invoke(history.Op{Client: client, Kind: history.Put, Queue: q, Value: value, Attempt: attempt})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.clients[target].PutMessage(cctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: topic, QueueId: q, Body: history.Body(value, bodySize)}})
	out, next := history.Unknown, target
	var delay time.Duration
	l.rec.Finish(id, func(o *history.Op) {
		switch {
		case err != nil:
			o.Err = status.Code(err).String()
			nothing, addr, d := refusal(err)
			if nothing {
				out, delay = history.Fail, d
				if i, ok := l.byAddr[addr]; ok && i != target {
					next, delay = i, 0 // the hint: go there now
					break
				}
			}
			// No usable hint (none, ourselves, or a dead or unreachable
			// member): try the next one, after a pause when this one did
			// not answer (a killed member refuses connections at once).
			next = (target + 1) % len(l.clients)
			if !nothing {
				delay = 50 * time.Millisecond
			}
		case res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
			o.Err = res.Status.String() // never expected in a group: not an ack
		default:
			out = history.OK
			o.Offset, o.CommitLogOffset = res.Result.QueueOffset, res.Result.WroteOffset
		}
		o.Outcome = out
	})
	if out == history.OK {
		for {
			cur := l.acked[q].Load()
			if cur > res.Result.QueueOffset || l.acked[q].CompareAndSwap(cur, res.Result.QueueOffset+1) {
				break
			}
		}
	}
	return out, next, delay
}

// read asks member node for the message at (q, off), a follower read
// (Weak). It reports whether the member answered.
func (l *groupLoad) read(ctx context.Context, client, node int, q int32, off int64) bool {
	id := l.rec.Invoke(history.Op{Client: client, Kind: history.Read, Queue: q, Offset: off, Weak: true})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.clients[node].PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off, MaxMessages: 1},
		grpc.WaitForReady(false))
	answered := true
	l.rec.Finish(id, func(o *history.Op) {
		switch c := status.Code(err); {
		case err == nil && len(res.Messages) > 0 && res.Messages[0].QueueOffset == off:
			o.Outcome, o.Found, o.Value = history.OK, true, history.ValueOf(res.Messages[0].Body)
		case err == nil, c == codes.OutOfRange, c == codes.NotFound:
			o.Outcome = history.OK // absent (on this member, so far)
		default:
			o.Outcome, o.Err, answered = history.Unknown, c.String(), false
		}
	})
	return answered
}
