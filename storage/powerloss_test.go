package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// The power-loss suite (reliability guide T2). A store runs on a MemFS with
// concurrent producers; at random moments it is paused and the image a
// power cut would leave is taken (vfs.MemFS.Crash: every page changed since
// its last sync kept, dropped or torn at 512-byte sectors; directory changes
// since the last directory sync undone). A new store recovers each image
// and the acknowledged messages are checked:
//
//   - sync mode: every acknowledged message is there, at its queue offset
//     and commitlog offset, with its bytes;
//   - async mode: every acknowledged message that lay below the durable
//     offset at the crash is there; the ones lost were all acknowledged after
//     that offset was reached, i.e. within the flush window;
//   - both: recovery succeeds (a power cut never looks like corruption),
//     queue offsets are dense from 0, nothing unexpected appears.
//
// STORAGED_CRASH_RUNS and STORAGED_CRASH_POINTS scale it (default: 100
// runs x 50 points x 2 modes = 10,000 crash images; a tenth under -race,
// and .ci/run runs the full size without -race); STORAGED_CRASH_SEED
// replays one run. The producers' interleaving is not deterministic, the
// crash image for a given state and seed is.
func TestPowerLoss(t *testing.T) {
	defRuns := 100
	if raceEnabled {
		defRuns = 10 // 1,000 images under -race; .ci/run runs the full 10,000 without it
	}
	runs, points := envInt("STORAGED_CRASH_RUNS", defRuns), envInt("STORAGED_CRASH_POINTS", 50)
	seeds := make([]uint64, runs)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	if s := os.Getenv("STORAGED_CRASH_SEED"); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		seeds = []uint64{n}
	}
	if testing.Short() {
		seeds = seeds[:min(len(seeds), 5)]
	}
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			var total powerLossTally
			for _, seed := range seeds {
				tally := powerLossRun(t, mode, seed, points)
				total.add(tally)
				if t.Failed() {
					t.Fatalf("replay with STORAGED_CRASH_SEED=%d (mode %s)", seed, mode)
				}
			}
			t.Logf("%s: %d crash images, %d acked messages checked, %d lost (all within the flush window), largest loss window %v",
				mode, total.images, total.acked, total.lost, total.window)
		})
	}
}

type powerLossTally struct {
	images, acked, lost int
	window              time.Duration
}

func (a *powerLossTally) add(b powerLossTally) {
	a.images += b.images
	a.acked += b.acked
	a.lost += b.lost
	a.window = max(a.window, b.window)
}

type ack struct {
	body        string
	queue       int32
	queueOffset int64
	offset      int64
	end         int64
	at          time.Time
}

func powerLossOptions(fs vfs.FS, mode FlushMode) Options {
	return Options{Dir: "/data", FS: fs, FileSize: 8192, MaxMessageSize: 1024, ConsumeQueueEntries: 16,
		FlushMode: mode, FlushInterval: 2 * time.Millisecond, FlushLeastPages: 1,
		FlushThoroughInterval: 20 * time.Millisecond, CheckpointInterval: 5 * time.Millisecond}
}

func powerLossRun(t *testing.T, mode FlushMode, seed uint64, points int) powerLossTally {
	fs := vfs.NewMem()
	opts := powerLossOptions(fs, mode)
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked []ack
		sent  = map[string]bool{}
		grow  = sync.NewCond(&mu)
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	const producers, perProducer = 4, 60
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perProducer; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf("p%d-%d-%s", p, i, string(make([]byte, (p*37+i*11)%300)))
				mu.Lock()
				sent[body] = true
				mu.Unlock()
				res, err := s.PutMessage(context.Background(), &Message{Topic: "PL", QueueID: int32(p % 2), Body: []byte(body)})
				if err != nil {
					if errors.Is(err, ErrClosed) {
						return
					}
					t.Errorf("put: %v", err)
					mu.Lock()
					grow.Broadcast()
					mu.Unlock()
					return
				}
				mu.Lock()
				acked = append(acked, ack{body, int32(p % 2), res.Append.QueueOffset, res.Append.WroteOffset, res.Append.NextOffset(), time.Now()})
				grow.Broadcast()
				mu.Unlock()
			}
		}()
	}
	var tally powerLossTally
	step := producers * perProducer / points
	for c := 0; c < points && !t.Failed(); c++ {
		// Crash after a random number of further acknowledgements, spread
		// over the run's messages.
		mu.Lock()
		target := min(len(acked)+1+rng.IntN(2*step+1), producers*perProducer)
		for len(acked) < target && !t.Failed() {
			grow.Wait()
		}
		mu.Unlock()
		resume := s.pause()
		mu.Lock()
		snapshot := append([]ack(nil), acked...)
		sentNow := make(map[string]bool, len(sent))
		for k := range sent {
			sentNow[k] = true
		}
		mu.Unlock()
		durable := s.log.Flushed()
		crashedAt := time.Now()
		img := fs.Crash(rand.New(rand.NewPCG(seed, uint64(c))))
		resume()
		lost, window := checkCrashImage(t, img, mode, snapshot, sentNow, durable, crashedAt)
		tally.images++
		tally.acked += len(snapshot)
		tally.lost += lost
		tally.window = max(tally.window, window)
		if t.Failed() {
			t.Logf("crash point %d of seed %d", c, seed)
		}
	}
	close(stop)
	s.Close()
	wg.Wait()
	return tally
}

func checkCrashImage(t *testing.T, img *vfs.MemFS, mode FlushMode, acked []ack, sent map[string]bool,
	durable int64, crashedAt time.Time) (lost int, window time.Duration) {
	t.Helper()
	s, err := Open(powerLossOptions(img, mode))
	if err != nil {
		t.Errorf("recovery of a power-cut image failed: %v", err)
		return 0, 0
	}
	defer s.Close()
	found := map[string]*Record{}
	for q := int32(0); q < 2; q++ {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: "PL", QueueID: q, MaxMessages: 1 << 20, MaxBytes: 1 << 30})
		if errors.Is(err, ErrQueueNotFound) {
			continue
		}
		if err != nil {
			t.Errorf("pull after recovery: %v", err)
			return
		}
		for i, m := range res.Messages {
			if m.QueueOffset != int64(i) {
				t.Errorf("queue %d: message %d has queue offset %d (not dense)", q, i, m.QueueOffset)
			}
			b := string(m.Body)
			if !sent[b] {
				t.Errorf("unexpected message %q after recovery", b)
			}
			if found[b] != nil {
				t.Errorf("message %q twice", b)
			}
			found[b] = m
		}
	}
	for _, a := range acked {
		m := found[a.body]
		if m == nil {
			if mode == FlushSync || a.end <= durable {
				t.Errorf("acknowledged message lost: %q at offset %d (durable %d at the crash)", a.body, a.offset, durable)
				continue
			}
			lost++
			window = max(window, crashedAt.Sub(a.at))
			continue
		}
		if m.PhysicalOffset != a.offset || m.QueueOffset != a.queueOffset || m.QueueID != a.queue {
			t.Errorf("message %q recovered at %d/%d, acknowledged at %d/%d", a.body, m.PhysicalOffset, m.QueueOffset, a.offset, a.queueOffset)
		}
	}
	return lost, window
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
