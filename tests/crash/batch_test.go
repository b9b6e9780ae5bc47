package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// TestKill9Batches is the kill -9 suite for batches, in async mode (where
// a put is answered once its records are copied into the page cache, so a
// kill lands in the middle of a batch's copy often): producers send
// PutMessages of 200-900 entries (~0.3-1.1 MiB) to their own queue, the
// server is killed after a random number of answers, restarted, and every
// queue is pulled and grouped by batch: every batch must be there whole or
// not at all, and every acknowledged batch whole. STORAGED_KILL_BATCH_CYCLES
// sets the cycles (default 20).
func TestKill9Batches(t *testing.T) {
	if testing.Short() {
		t.Skip("kill -9 suite skipped in -short mode")
	}
	cycles := 20
	if v, err := strconv.Atoi(os.Getenv("STORAGED_KILL_BATCH_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	args := []string{"--file-size", "8MiB", "--max-message-size", "2MiB"}
	dataDir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 10))
	const producers = 8
	acked := map[string]int{} // batch id → entries
	var batches, entries, cut int64
	srv, _ := start(t, dataDir, "async", args...)
	for c := 0; c < cycles; c++ {
		var mu sync.Mutex
		target, answered := 2+rng.IntN(10), 0
		reached := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		client := storagedv1.NewMessageStoreServiceClient(srv.conn)
		for p := 0; p < producers; p++ {
			prng := rand.New(rand.NewPCG(uint64(c), uint64(p)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := 0; ctx.Err() == nil; seq++ {
					id := fmt.Sprintf("c%d-p%d-s%d", c, p, seq)
					n := 200 + prng.IntN(701)
					pad := strings.Repeat("b", 1000+prng.IntN(200))
					req := &storagedv1.PutMessagesRequest{Topic: "Kill9Batch", QueueId: int32(p)}
					for j := 0; j < n; j++ {
						req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: fmt.Appendf(nil, "%s:%d/%d|%s", id, j, n, pad)})
					}
					res, err := client.PutMessages(ctx, req)
					if err != nil || res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
						continue // unknown outcome: whole or not at all
					}
					mu.Lock()
					acked[id] = n
					if answered++; answered == target {
						close(reached)
					}
					mu.Unlock()
				}
			}()
		}
		<-reached
		srv.kill(t) // mid-stream: other batches are being copied in
		cancel()
		wg.Wait()
		srv, _ = start(t, dataDir, "async", args...)
		cut += srv.TornTails()
		seen := verifyBatches(t, srv, producers)
		for id, n := range acked {
			if seen[id] != n {
				t.Fatalf("cycle %d: acknowledged batch %s (%d entries) served with %d", c, id, n, seen[id])
			}
		}
		batches, entries = int64(len(seen)), 0
		for _, n := range seen {
			entries += int64(n)
		}
	}
	srv.kill(t)
	t.Logf("%d kill -9 cycles (async), %d batches (%d entries, %d acknowledged) served whole, %d torn tails cut at restart",
		cycles, batches, entries, len(acked), cut)
}

// verifyBatches pulls every queue and checks each batch is whole: all its
// entries in order at consecutive queue offsets. It returns the entry
// count of each batch seen.
func verifyBatches(t *testing.T, srv *server, queues int) map[string]int {
	t.Helper()
	client := storagedv1.NewMessageStoreServiceClient(srv.conn)
	seen := map[string]int{}
	for q := int32(0); q < int32(queues); q++ {
		var cur string
		var curN, curJ int
		pullQueue(t, client, "Kill9Batch", q, func(m *storagedv1.StoredMessage) {
			head, _, _ := strings.Cut(string(m.Body), "|")
			var id string
			var j, n int
			if i := strings.IndexByte(head, ':'); i < 0 {
				t.Fatalf("queue %d offset %d: unexpected body %.40q", q, m.QueueOffset, m.Body)
			} else if _, err := fmt.Sscanf(head[i+1:], "%d/%d", &j, &n); err != nil {
				t.Fatalf("queue %d offset %d: unexpected body %.40q", q, m.QueueOffset, m.Body)
			} else {
				id = head[:i]
			}
			if curJ < curN && (id != cur || j != curJ) {
				t.Fatalf("queue %d offset %d: batch %s served with %d of its %d entries (then %s:%d)", q, m.QueueOffset, cur, curJ, curN, id, j)
			}
			if curJ == curN {
				if j != 0 {
					t.Fatalf("queue %d offset %d: batch %s served from its entry %d of %d", q, m.QueueOffset, id, j, n)
				}
				if seen[id] != 0 {
					t.Fatalf("batch %s twice", id)
				}
				cur, curN, curJ = id, n, 0
			}
			curJ++
			if curJ == curN {
				seen[cur] = curN
			}
		})
		if curJ < curN {
			t.Fatalf("queue %d: the last batch %s served with %d of its %d entries", q, cur, curJ, curN)
		}
	}
	return seen
}
