package cluster

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/history"
)

// groupOpTimeout bounds one put or read in a group scenario, the
// tracker's retries included: longer than the members'
// --replication-timeout (groupReplicationTimeout), so that a put proposed
// and not committed is answered by the server (outcome unknown) rather
// than cut by the client, and short enough that a writer stuck on a
// paused or isolated leader moves on.
const (
	groupOpTimeout          = 4 * time.Second
	groupReplicationTimeout = "2s"
)

// The clients of a group scenario. Each writer waits for its put's
// commit (about 20-30 ms on the loaded 2-core machine), so the put rate
// is the writers over that latency: 16 made 300-800 acked puts/s, 32 make
// 900-1,700 (raft batches the extra proposals into the same Readys).
const (
	groupProducers     = 32
	groupReaders       = 2 // follower reads, from a random member
	groupStrongReaders = 2 // linearizable reads, through the tracker
)

// groupLoad is the clients of a group scenario. Writers put (producer,
// seq) messages round-robin over the queues through one
// client.LeaderTracker (as an application would): it sends each put to
// the ready leader, follows leader hints, looks the leader up after a
// failure and retries only refusals that stored nothing (client.Classify).
// A put the tracker gives up on with nothing stored is a definite failure
// and the writer sends the same message again; a put of unknown outcome
// is never resent (the next message goes out instead). Strong readers
// read single offsets near each queue's acked end with linearizable: true
// through the same tracker (a refused read read nothing, and is retried
// the same way); porcupine checks them. Every second strong reader reads
// with linearizable: true from a random member instead (the group runs
// with --raft-follower-reads, so a follower serves it after the leader's
// read index): porcupine checks those too. Readers read the same way from a
// random member without linearizable: follower reads, recorded Weak
// (replication design §5.4 d).
type groupLoad struct {
	rec     *history.Recorder
	tr      *client.LeaderTracker
	clients []storagedv1.MessageStoreServiceClient // by member index, for follower reads
	acked   ackedEnds
	wg      sync.WaitGroup
	// calls and refusals count the tracker's put calls and those refused
	// with nothing stored (retried inside one recorded put).
	calls, refusals atomic.Int64
	// memberReads and memberRefused count the linearizable reads sent to
	// a random member (memberStrongRead) that it answered, and refused.
	memberReads, memberRefused atomic.Int64
}

func newGroupLoad(t testing.TB, g *group, rec *history.Recorder) *groupLoad {
	l := &groupLoad{rec: rec}
	var addrs []string
	for _, p := range g.nodes {
		// Own connections, not p.Conn(): those close on kill and are
		// replaced on restart, while the address stays.
		l.clients = append(l.clients, storagedv1.NewMessageStoreServiceClient(dial(t, p.Addr())))
		addrs = append(addrs, p.Addr())
	}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/PutMessage") {
			l.calls.Add(1)
			if err != nil && client.Classify(err).NothingStored {
				l.refusals.Add(1)
			}
		}
		return err
	}
	tr, err := client.New(client.Options{Addrs: addrs, DialOptions: []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(count),
		// As dial's: back within a second of a restart or heal.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: time.Second}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	l.tr = tr
	return l
}

// start runs the writers and readers until ctx ends.
func (l *groupLoad) start(ctx context.Context, seed uint64, producers, readers, strongReaders int) {
	for p := range producers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for seq := 0; ctx.Err() == nil; seq++ {
				q := int32((p + seq) % queues)
				for attempt := 0; ctx.Err() == nil; attempt++ {
					if l.put(ctx, p, q, history.Value(p, seq), attempt) != history.Fail {
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
				if !l.read(ctx, producers+r, rng.IntN(len(l.clients)), q, l.acked.near(q, rng)) {
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
			for hold(ctx, between(rng, 5*time.Millisecond, 15*time.Millisecond)) {
				q := int32(rng.IntN(queues))
				if r%2 == 0 {
					l.strongRead(ctx, producers+readers+r, q, l.acked.near(q, rng))
				} else if !l.memberStrongRead(ctx, producers+readers+r, rng.IntN(len(l.clients)), q, l.acked.near(q, rng)) {
					hold(ctx, 20*time.Millisecond) // that member is down or refused: no spinning on it
				}
			}
		}()
	}
}

func (l *groupLoad) wait() { l.wg.Wait() }

// strongRead asks the leader, through the tracker, for the message at
// (q, off) with linearizable: true (served by the ready leader after
// ReadIndex). A read the tracker gave up on is recorded as failed (it
// read nothing); any other error leaves it unknown.
func (l *groupLoad) strongRead(ctx context.Context, reader int, q int32, off int64) {
	id := l.rec.Invoke(history.Op{Client: reader, Kind: history.Read, Queue: q, Offset: off})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	var res *storagedv1.PullMessagesResponse
	err := l.tr.Do(cctx, func(ctx context.Context, c storagedv1.MessageStoreServiceClient) error {
		var err error
		res, err = c.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off,
			MaxMessages: 1, Linearizable: true})
		return err
	})
	failed := history.Unknown
	if client.NothingStored(err) {
		failed = history.Fail
	}
	l.rec.Finish(id, func(o *history.Op) { finishRead(o, off, res, err, failed) })
}

// put sends one message through the tracker and records it.
func (l *groupLoad) put(ctx context.Context, writer int, q int32, value string, attempt int) history.Outcome {
	id := l.rec.Invoke(history.Op{Client: writer, Kind: history.Put, Queue: q, Value: value, Attempt: attempt})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.tr.PutMessage(cctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: topic, QueueId: q, Body: history.Body(value, bodySize)}})
	notOK := history.Unknown
	if err != nil && client.NothingStored(err) {
		notOK = history.Fail
	}
	var out history.Outcome
	l.rec.Finish(id, func(o *history.Op) {
		finishPut(o, res, err, notOK)
		out = o.Outcome
	})
	if out == history.OK {
		l.acked.ack(q, res.Result.QueueOffset)
	}
	return out
}

// memberStrongRead asks member node, whichever its role, for the message
// at (q, off) with linearizable: true: with --raft-follower-reads a
// follower serves it after the leader's read index, and porcupine checks
// it as it checks the leader's. A refusal (nothing read: no leader known,
// NOT_LEADER without the flag, READ_INDEX_TIMEOUT) is a failed read; any
// other error leaves it unknown. It reports whether the member answered.
func (l *groupLoad) memberStrongRead(ctx context.Context, reader, node int, q int32, off int64) bool {
	id := l.rec.Invoke(history.Op{Client: reader, Kind: history.Read, Queue: q, Offset: off})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.clients[node].PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off,
		MaxMessages: 1, Linearizable: true}, grpc.WaitForReady(false))
	failed := history.Unknown
	if err != nil && client.Classify(err).NothingStored {
		failed = history.Fail
	}
	l.rec.Finish(id, func(o *history.Op) { finishRead(o, off, res, err, failed) })
	answered := err == nil || status.Code(err) == codes.OutOfRange || status.Code(err) == codes.NotFound
	if answered {
		l.memberReads.Add(1)
	} else if failed == history.Fail {
		l.memberRefused.Add(1)
	}
	return answered
}

// read asks member node for the message at (q, off), a follower read
// (Weak). It reports whether the member answered.
func (l *groupLoad) read(ctx context.Context, client, node int, q int32, off int64) bool {
	id := l.rec.Invoke(history.Op{Client: client, Kind: history.Read, Queue: q, Offset: off, Weak: true})
	cctx, cancel := context.WithTimeout(ctx, groupOpTimeout)
	defer cancel()
	res, err := l.clients[node].PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: q, QueueOffset: off, MaxMessages: 1},
		grpc.WaitForReady(false))
	l.rec.Finish(id, func(o *history.Op) { finishRead(o, off, res, err, history.Unknown) })
	return err == nil || status.Code(err) == codes.OutOfRange || status.Code(err) == codes.NotFound
}
