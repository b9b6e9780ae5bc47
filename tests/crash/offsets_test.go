package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// TestKill9ConsumerOffsets: concurrent committers, each moving its own
// (group, queue) offset forward one by one, storaged SIGKILLed after a
// random number of acknowledged commits and restarted. After each restart
// every key's offset is at least its last acknowledged commit (an acked
// commit is never lost) and at most its last attempted one (nothing
// invented); committers go on from what was recovered. Both flush modes:
// kill -9 loses nothing acknowledged in either (the page cache survives).
func TestKill9ConsumerOffsets(t *testing.T) {
	if testing.Short() {
		t.Skip("kill -9 suite skipped in -short mode")
	}
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) { kill9Offsets(t, mode, 6) })
	}
}

func kill9Offsets(t *testing.T, mode string, cycles int) {
	const keys, perQueue = 4, 1000
	dataDir := t.TempDir()
	srv, _ := start(t, dataDir, mode)
	client := storagedv1.NewMessageStoreServiceClient(srv.conn)
	ctx := t.Context()
	for q := int32(0); q < keys; q++ {
		for n := 0; n < perQueue; n += 250 { // a batch fits a 64 KiB file
			batch := make([]*storagedv1.BatchEntry, 250)
			for i := range batch {
				batch[i] = &storagedv1.BatchEntry{Body: []byte("m")}
			}
			if _, err := client.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: "Offsets", QueueId: q, Messages: batch}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	var next [keys]int64 // the next offset each committer sends
	for i := range next {
		next[i] = 1
	}
	group := func(k int) string { return fmt.Sprintf("g%d", k) }
	total := 0
	for c := 0; c < cycles; c++ {
		var (
			mu        sync.Mutex
			lastAcked [keys]int64
			attempted [keys]int64
			acks      int
		)
		for k := range lastAcked {
			lastAcked[k], attempted[k] = next[k]-1, next[k]-1
		}
		target := 10 + rng.IntN(150)
		reached := make(chan struct{})
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for k := 0; k < keys; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for off := next[k]; cctx.Err() == nil && off <= perQueue; off++ {
					mu.Lock()
					attempted[k] = off
					mu.Unlock()
					_, err := client.CommitOffset(cctx, &storagedv1.CommitOffsetRequest{ConsumerGroup: group(k), Topic: "Offsets", QueueId: int32(k), Offset: off})
					if err != nil {
						return // unknown outcome from here on: the kill
					}
					mu.Lock()
					lastAcked[k] = off
					acks++
					if acks == target {
						close(reached)
					}
					mu.Unlock()
				}
			}()
		}
		<-reached
		srv.kill(t)
		cancel()
		wg.Wait()
		total += acks
		srv, _ = start(t, dataDir, mode)
		client = storagedv1.NewMessageStoreServiceClient(srv.conn)
		for k := 0; k < keys; k++ {
			resp, err := client.GetOffset(ctx, &storagedv1.GetOffsetRequest{ConsumerGroup: group(k), Topic: "Offsets", QueueId: int32(k)})
			got := resp.GetOffset()
			switch {
			case status.Code(err) == codes.NotFound && lastAcked[k] == 0:
				got = 0
			case err != nil:
				t.Fatalf("cycle %d key %d: %v (last acked %d)", c, k, err, lastAcked[k])
			case got < lastAcked[k] || got > attempted[k]:
				t.Fatalf("cycle %d key %d: offset %d, last acked %d, last attempted %d (data dir %s)",
					c, k, got, lastAcked[k], attempted[k], dataDir)
			}
			next[k] = got + 1
		}
	}
	// The offset topic stays the store's through the restarts.
	_, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "RMQ_SYS_CONSUMER_OFFSET"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("pull of the offset topic: %v", err)
	}
	srv.kill(t)
	t.Logf("%s: %d kill -9 cycles, %d acknowledged commits, none lost (%s)", mode, cycles, total, strings.TrimSpace(fmt.Sprint(next)))
}
