// Package crash holds the kill -9 suite (reliability guide T1): the real
// storaged binary, concurrent producers, SIGKILL at random moments,
// restart, and a check that every acknowledged message came back.
package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

var binary string

func TestMain(m *testing.M) { proctest.Main(m, &binary) }

// server is one run of storaged on dataDir (proctest.Process, a run per
// start so that each restart gets its own connection).
type server struct {
	*proctest.Process
	conn *grpc.ClientConn
}

// start runs storaged on a loopback port and waits until the message
// store service is SERVING (recovery done). It returns the time that took.
// extra flags come last, so they override the defaults here.
func start(t *testing.T, dataDir, mode string, extra ...string) (*server, time.Duration) {
	t.Helper()
	began := time.Now()
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: dataDir,
		Flags: append([]string{"--flush-mode", mode, "--file-size", "64KiB"}, extra...)})
	return &server{Process: p, conn: p.Conn()}, time.Since(began)
}

func (s *server) kill(t *testing.T) { t.Helper(); s.Kill(t) }

type acked struct {
	queue  int32
	qoff   int64
	offset int64
	body   string
}

// TestKill9 runs STORAGED_KILL_CYCLES cycles (default 50; 1,000 by hand) of
// sync-mode puts from concurrent producers, a SIGKILL after a random number
// of acknowledgements, and a restart. After each restart every acknowledged
// message must be readable at its offsets with identical bytes, queue
// offsets must be dense and unique, and nothing unknown may appear.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("kill -9 suite skipped in -short mode")
	}
	cycles := 50
	if v, err := strconv.Atoi(os.Getenv("STORAGED_KILL_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	dataDir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	const producers = 4
	var all []acked
	sent := map[string]bool{}
	var recoveries []time.Duration
	srv, _ := start(t, dataDir, "sync")
	for c := 0; c < cycles; c++ {
		var mu sync.Mutex
		var cycleAcked []acked
		target := 20 + rng.IntN(200)
		reached := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		client := storagedv1.NewMessageStoreServiceClient(srv.conn)
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := 0; ctx.Err() == nil; seq++ {
					body := fmt.Sprintf("c%d-p%d-s%d-%s", c, p, seq, strings.Repeat("k", (seq*13)%500))
					mu.Lock()
					sent[body] = true
					mu.Unlock()
					res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
						Topic: "Kill9", QueueId: int32(p % 2), Body: []byte(body)}})
					if err != nil || res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
						continue // unknown outcome: may or may not be stored
					}
					mu.Lock()
					cycleAcked = append(cycleAcked, acked{res.Result.QueueId, res.Result.QueueOffset, res.Result.WroteOffset, body})
					if len(cycleAcked) == target {
						close(reached)
					}
					mu.Unlock()
				}
			}()
		}
		<-reached
		srv.kill(t) // mid-flight: producers see errors from here on
		cancel()
		wg.Wait()
		all = append(all, cycleAcked...)
		var took time.Duration
		srv, took = start(t, dataDir, "sync")
		recoveries = append(recoveries, took)
		verify(t, srv, all, sent)
		if t.Failed() {
			t.Fatalf("cycle %d failed (data dir %s)", c, dataDir)
		}
	}
	srv.kill(t)
	sort.Slice(recoveries, func(i, j int) bool { return recoveries[i] < recoveries[j] })
	t.Logf("%d kill -9 cycles, %d acknowledged messages, 0 lost; restart to SERVING p50 %v p99 %v max %v",
		cycles, len(all), recoveries[len(recoveries)/2], recoveries[len(recoveries)*99/100], recoveries[len(recoveries)-1])
}

// pullQueue is proctest.PullQueue failing the test on an error.
func pullQueue(t *testing.T, client storagedv1.MessageStoreServiceClient, topic string, q int32, fn func(*storagedv1.StoredMessage)) {
	t.Helper()
	if err := proctest.PullQueue(context.Background(), client, topic, q, fn); err != nil {
		t.Fatal(err)
	}
}

func verify(t *testing.T, srv *server, all []acked, sent map[string]bool) {
	t.Helper()
	client := storagedv1.NewMessageStoreServiceClient(srv.conn)
	got := map[string]*storagedv1.StoredMessage{}
	for q := int32(0); q < 2; q++ {
		pullQueue(t, client, "Kill9", q, func(m *storagedv1.StoredMessage) {
			b := string(m.Body)
			if !sent[b] {
				t.Fatalf("unexpected message %q", b)
			}
			if got[b] != nil {
				t.Fatalf("message %q twice", b)
			}
			got[b] = m
		})
	}
	for _, a := range all {
		m := got[a.body]
		if m == nil {
			t.Fatalf("acknowledged message lost: %q (queue %d offset %d)", a.body, a.queue, a.qoff)
		}
		if m.QueueId != a.queue || m.QueueOffset != a.qoff || m.CommitLogOffset != a.offset {
			t.Fatalf("message %q at %d/%d/%d, acknowledged at %d/%d/%d", a.body, m.QueueId, m.QueueOffset, m.CommitLogOffset,
				a.queue, a.qoff, a.offset)
		}
	}
}
