package storage

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/storaged/storaged/storage/vfs"
)

// TestModelCrash is a rapid state machine on a MemFS in sync mode: puts,
// batches, reads against the model, and power cuts (a crash image, then
// recovery from it), some with an unsynced batch in flight. Every
// acknowledged message must survive every crash, at its offsets, an
// in-flight batch must survive whole or not at all, and reads must always
// match the model.
func TestModelCrash(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		fs := vfs.NewMem()
		opts := Options{Dir: "/m", FS: fs, FileSize: 4096, MaxMessageSize: 1024, ConsumeQueueEntries: 8, FlushMode: FlushSync}
		s, err := Open(opts)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { s.Close() }()
		model := map[int32][][]byte{}
		seed := uint64(0)
		rt.Repeat(map[string]func(*rapid.T){
			"put": func(rt *rapid.T) {
				q := rapid.Int32Range(0, 1).Draw(rt, "queue")
				body := rapid.SliceOfN(rapid.Byte(), 0, 900).Draw(rt, "body")
				res, err := s.PutMessage(context.Background(), &Message{Topic: "MC", QueueID: q, Body: body})
				if err != nil || res.Status != PutOK {
					rt.Fatalf("put: %v %v", res.Status, err)
				}
				if res.Append.QueueOffset != int64(len(model[q])) {
					rt.Fatalf("queue offset %d, model has %d", res.Append.QueueOffset, len(model[q]))
				}
				model[q] = append(model[q], body)
			},
			"batch": func(rt *rapid.T) {
				q := rapid.Int32Range(0, 1).Draw(rt, "queue")
				n := rapid.IntRange(1, 4).Draw(rt, "n")
				b := &Batch{Topic: "MC", QueueID: q}
				for i := 0; i < n; i++ {
					b.Messages = append(b.Messages, BatchMessage{Body: rapid.SliceOfN(rapid.Byte(), 0, 200).Draw(rt, "body")})
				}
				if _, err := s.PutMessages(context.Background(), b); err != nil {
					rt.Fatal(err)
				}
				for _, m := range b.Messages {
					model[q] = append(model[q], m.Body)
				}
			},
			"crash": func(rt *rapid.T) {
				// Sometimes a batch put without waiting for the sync
				// (WAIT=false) is in flight at the cut: it may survive
				// whole or not at all, never in part.
				var inflight *Batch
				if rapid.Bool().Draw(rt, "inflight batch") {
					inflight = &Batch{Topic: "MC", QueueID: rapid.Int32Range(0, 1).Draw(rt, "queue"),
						Properties: []Property{{Key: PropertyWaitStoreOK, Value: "false"}}}
					for range rapid.IntRange(2, 6).Draw(rt, "n") {
						inflight.Messages = append(inflight.Messages, BatchMessage{Body: rapid.SliceOfN(rapid.Byte(), 1, 400).Draw(rt, "body")})
					}
					if _, err := s.PutMessages(context.Background(), inflight); err != nil {
						rt.Fatal(err)
					}
				}
				resume := s.pause()
				img := fs.Crash(rand.New(rand.NewPCG(seed, 3)))
				seed++
				resume()
				s.Close()
				fs = img
				o := opts
				o.FS = fs
				if s, err = Open(o); err != nil {
					rt.Fatalf("recovery after a power cut: %v", err)
				}
				if inflight == nil {
					return
				}
				q := inflight.QueueID
				have := int64(len(model[q]))
				var maxOff int64
				if _, maxOff, err = s.QueueInfo("MC", q); err != nil && !errors.Is(err, ErrQueueNotFound) {
					rt.Fatal(err)
				}
				switch maxOff {
				case have: // lost whole
				case have + int64(len(inflight.Messages)): // survived whole
					for _, m := range inflight.Messages {
						model[q] = append(model[q], m.Body)
					}
				default:
					rt.Fatalf("queue %d: an in-flight batch of %d survived the power cut with %d messages",
						q, len(inflight.Messages), maxOff-have)
				}
			},
			"": func(rt *rapid.T) {
				for q, want := range model {
					res, err := s.PullMessages(context.Background(), PullRequest{Topic: "MC", QueueID: q, MaxMessages: 1 << 20,
						Offset: 0, Wait: 0})
					if err != nil && !errors.Is(err, ErrQueueNotFound) {
						rt.Fatalf("pull: %v", err)
					}
					// Sync mode: acked means durable, but dispatch may lag
					// the ack by a moment; every message it shows must match
					// and, after a wait, all must be there.
					for i, m := range res.Messages {
						if !bytes.Equal(m.Body, want[i]) {
							rt.Fatalf("queue %d offset %d differs from the model", q, i)
						}
					}
					if int64(len(want)) > res.MaxOffset {
						waitQueue(rt, s, q, int64(len(want)))
					}
				}
			},
		})
	})
}

func waitQueue(rt *rapid.T, s *Store, q int32, n int64) {
	for i := 0; i < 1000; i++ {
		_, hi, err := s.QueueInfo("MC", q)
		if err == nil && hi >= n {
			return
		}
		s.PullMessages(context.Background(), PullRequest{Topic: "MC", QueueID: q, Offset: hi, Wait: 1 << 30})
	}
	rt.Fatalf("queue %d never reached %d messages", q, n)
}

// TestConcurrentPutsHeap runs concurrent puts, batches and reads on MemFS,
// whose segments are heap memory: unlike an mmap, the race detector sees
// every access (reliability guide E3).
func TestConcurrentPutsHeap(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, err := Open(Options{Dir: "/h", FS: vfs.NewMem(), FileSize: 8192, MaxMessageSize: 1024, FlushMode: mode,
				ConsumeQueueEntries: 32})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var wg sync.WaitGroup
			for w := 0; w < 6; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 80; i++ {
						var err error
						if w%3 == 0 {
							_, err = s.PutMessages(context.Background(), &Batch{Topic: "H", QueueID: int32(w % 2),
								Messages: []BatchMessage{{Body: []byte("a")}, {Body: []byte("b")}}})
						} else {
							_, err = s.PutMessage(context.Background(), &Message{Topic: "H", QueueID: int32(w % 2), Body: make([]byte, 100+i)})
						}
						if err != nil {
							t.Error(err)
							return
						}
						if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "H", QueueID: int32(w % 2), MaxMessages: 4}); err != nil &&
							!errors.Is(err, ErrQueueNotFound) {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
