// Package load runs many concurrent clients with random deadlines and
// cancellations against an in-process storaged (real store, real gRPC over
// loopback) in both flush modes, then checks that every acknowledged
// message is stored and that goroutines and heap return to their baseline
// (reliability guide T11).
package load

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadWithDeadlinesAndCancellation(t *testing.T) {
	for _, mode := range []storage.FlushMode{storage.FlushAsync, storage.FlushSync} {
		t.Run(mode.String(), func(t *testing.T) { loadRun(t, mode) })
	}
}

func loadRun(t *testing.T, mode storage.FlushMode) {
	dir := t.TempDir()
	st, err := storage.Open(storage.Options{Dir: dir, FileSize: 1 << 20, MaxMessageSize: 64 << 10, FlushMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(st, zerolog.Nop())
	gs, err := server.NewGRPCServer(svc, server.GRPCConfig{Logger: zerolog.Nop(), MaxMessageSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	gs.SetServing(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	baseGoroutines := runtime.NumGoroutine()

	const conns, clients, perClient = 4, 64, 40
	var cc []*grpc.ClientConn
	for i := 0; i < conns; i++ {
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cc = append(cc, c)
	}
	type result struct {
		body        string
		queue       int32
		queueOffset int64
		offset      int64
	}
	var (
		mu                                           sync.Mutex
		acked                                        []result
		okN, cancelled, deadline, unavailable, other atomic.Int64
	)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 77))
			client := storagedv1.NewMessageStoreServiceClient(cc[c%conns])
			for i := 0; i < perClient; i++ {
				body := fmt.Sprintf("c%d-%d-%s", c, i, strings.Repeat("z", rng.IntN(2048)))
				d := time.Duration(5+rng.IntN(2000)) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), d)
				if rng.IntN(10) == 0 { // 10 % cancelled in flight
					go cancel()
				}
				res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
					Topic: "Load", QueueId: int32(c % 4), Body: []byte(body)}})
				cancel()
				switch status.Code(err) {
				case codes.OK:
					okN.Add(1)
					if res.Status == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
						mu.Lock()
						acked = append(acked, result{body, res.Result.QueueId, res.Result.QueueOffset, res.Result.WroteOffset})
						mu.Unlock()
					}
				case codes.Canceled:
					cancelled.Add(1)
				case codes.DeadlineExceeded:
					deadline.Add(1)
				case codes.Unavailable:
					unavailable.Add(1)
				default:
					other.Add(1)
					t.Errorf("unexpected error: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for _, c := range cc {
		c.Close()
	}
	t.Logf("%s: %d ok, %d cancelled, %d deadline exceeded, %d unavailable", mode, okN.Load(), cancelled.Load(), deadline.Load(), unavailable.Load())
	if okN.Load() == 0 {
		t.Fatal("nothing succeeded: the run says nothing")
	}

	// The acked-message checker: every acknowledged message is readable at
	// its offsets with its bytes.
	for _, a := range acked {
		var rec *storage.Record
		var err error
		for try := 0; try < 100; try++ { // dispatch may trail the ack briefly
			if rec, err = st.GetMessage(a.offset); err == nil {
				break
			}
			st.PullMessages(context.Background(), storage.PullRequest{Topic: "Load", QueueID: a.queue, Offset: a.queueOffset, Wait: time.Second})
		}
		if err != nil || string(rec.Body) != a.body || rec.QueueOffset != a.queueOffset || rec.QueueID != a.queue {
			t.Fatalf("acknowledged message at %d not stored as acked: %v", a.offset, err)
		}
	}

	// Goroutines and heap back to the baseline once clients are gone.
	deadlineAt := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseGoroutines+2 {
		if time.Now().After(deadlineAt) {
			t.Fatalf("goroutines: %d now, %d before the load", runtime.NumGoroutine(), baseGoroutines)
		}
		runtime.Gosched()
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("heap in use: %d KiB before, %d KiB after; goroutines %d before, %d after",
		before.HeapInuse>>10, after.HeapInuse>>10, baseGoroutines, runtime.NumGoroutine())
	if after.HeapInuse > before.HeapInuse+64<<20 {
		t.Fatalf("heap grew from %d to %d bytes and stayed", before.HeapInuse, after.HeapInuse)
	}
	gs.Shutdown(5 * time.Second)
	<-served
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}
