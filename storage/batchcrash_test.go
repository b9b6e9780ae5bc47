package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/storaged/storaged/storage/vfs"
)

// batchBody is the body of message j of batch id (n messages): the batch
// can be told from its messages after recovery.
func batchBody(id string, j, n, pad int) []byte {
	return fmt.Appendf(nil, "%s:%d/%d|%s", id, j, n, strings.Repeat("x", pad))
}

// parseBatchBody inverts batchBody.
func parseBatchBody(b []byte) (id string, j, n int, ok bool) {
	head, _, _ := strings.Cut(string(b), "|")
	id, rest, ok1 := strings.Cut(head, ":")
	js, ns, ok2 := strings.Cut(rest, "/")
	j, err1 := strconv.Atoi(js)
	n, err2 := strconv.Atoi(ns)
	return id, j, n, ok1 && ok2 && err1 == nil && err2 == nil
}

// pullQueue reads every message of a queue, following NextOffset.
func pullQueue(t testing.TB, s *Store, topic string, q int32) []*Record {
	t.Helper()
	var out []*Record
	for next := int64(0); ; {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: q, Offset: next,
			MaxMessages: 1 << 16, MaxBytes: 1 << 30})
		if errors.Is(err, ErrQueueNotFound) && next == 0 {
			return nil
		}
		if err != nil {
			t.Fatalf("pull %s/%d at %d: %v", topic, q, next, err)
		}
		out = append(out, res.Messages...)
		if res.NextOffset <= next || res.NextOffset >= res.MaxOffset {
			return out
		}
		next = res.NextOffset
	}
}

// checkWholeBatches pulls every queue of topic and checks that each batch
// seen is whole: all its messages, in order, at consecutive queue offsets,
// the queue dense from 0. It returns the batch ids seen.
func checkWholeBatches(t *testing.T, s *Store, topic string, queues int32) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for q := int32(0); q < queues; q++ {
		msgs := pullQueue(t, s, topic, q)
		for i := 0; i < len(msgs); {
			m := msgs[i]
			if m.QueueOffset != int64(i) {
				t.Errorf("queue %d: message %d has queue offset %d (not dense)", q, i, m.QueueOffset)
				return seen
			}
			id, j, n, ok := parseBatchBody(m.Body)
			if !ok || j != 0 {
				t.Errorf("queue %d offset %d: %.40q does not start a batch: a batch was served in part", q, i, m.Body)
				return seen
			}
			if seen[id] {
				t.Errorf("batch %s twice", id)
			}
			for k := 0; k < n; k++ {
				if i+k >= len(msgs) {
					t.Errorf("queue %d: batch %s served with %d of its %d messages", q, id, k, n)
					return seen
				}
				id2, j2, n2, ok := parseBatchBody(msgs[i+k].Body)
				if !ok || id2 != id || j2 != k || n2 != n || msgs[i+k].QueueOffset != int64(i+k) {
					t.Errorf("queue %d: batch %s served with %d of its %d messages (then %.40q)", q, id, k, n, msgs[i+k].Body)
					return seen
				}
			}
			seen[id] = true
			i += n
		}
	}
	return seen
}

type batchAck struct {
	id       string
	queue    int32
	queueOff int64
	offset   int64
	end      int64
	count    int
}

func batchCrashOptions(fs vfs.FS, mode FlushMode) Options {
	o := powerLossOptions(fs, mode)
	o.FileSize, o.MaxMessageSize = 32<<10, 8<<10
	return o
}

// TestPowerLossBatches is the power-loss suite with batches: producers put
// batches of 2-40 messages (up to ~8 KiB, spanning several 512-byte sectors
// and 4 KiB pages), and at random moments the image a power cut would
// leave is taken (vfs.MemFS.Crash: unsynced pages kept, dropped or torn
// sector by sector). Every image must recover to whole batches only (a
// batch is served with all its messages or none), and every acknowledged
// batch must be there whole in sync mode, or when it lay below the durable
// offset in async mode. STORAGED_CRASH_RUNS / STORAGED_CRASH_POINTS scale
// it like TestPowerLoss (default 40 runs x 25 points x 2 modes = 2,000
// images; a fifth under -race).
func TestPowerLossBatches(t *testing.T) {
	runs := 40
	if raceEnabled {
		runs = 8
	}
	runs, points := envInt("STORAGED_CRASH_RUNS", runs), envInt("STORAGED_CRASH_POINTS", 25)
	if testing.Short() {
		runs = min(runs, 3)
	}
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			var images, batches, torn int
			for seed := uint64(1); seed <= uint64(runs); seed++ {
				i, b, tt := batchCrashRun(t, mode, seed, points)
				images, batches, torn = images+i, batches+b, torn+tt
				if t.Failed() {
					t.Fatalf("replay: seed %d mode %s", seed, mode)
				}
			}
			t.Logf("%s: %d crash images, %d acknowledged-batch checks, %d torn tails cut", mode, images, batches, torn)
		})
	}
}

func batchCrashRun(t *testing.T, mode FlushMode, seed uint64, points int) (images, batches, torn int) {
	fs := vfs.NewMem()
	s, err := Open(batchCrashOptions(fs, mode))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked []batchAck
		grow  = sync.NewCond(&mu)
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	rng := rand.New(rand.NewPCG(seed, 0xba7c4))
	const producers, perProducer = 3, 40
	for p := 0; p < producers; p++ {
		prng := rand.New(rand.NewPCG(seed, uint64(p)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { mu.Lock(); grow.Broadcast(); mu.Unlock() }()
			for i := 0; i < perProducer; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := 2 + prng.IntN(39)
				pad := prng.IntN(7000 / n)
				id := fmt.Sprintf("p%d-%d", p, i)
				b := &Batch{Topic: "PLB", QueueID: int32(p % 2)}
				for j := 0; j < n; j++ {
					b.Messages = append(b.Messages, BatchMessage{Body: batchBody(id, j, n, pad)})
				}
				res, err := s.PutMessages(context.Background(), b)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("put batch: %v", err)
					return
				}
				mu.Lock()
				acked = append(acked, batchAck{id: id, queue: b.QueueID, queueOff: res.Append.QueueOffset,
					offset: res.Append.WroteOffset, end: res.Append.NextOffset(), count: n})
				grow.Broadcast()
				mu.Unlock()
			}
		}()
	}
	step := producers * perProducer / points
	for c := 0; c < points && !t.Failed(); c++ {
		mu.Lock()
		target := min(len(acked)+1+rng.IntN(2*step+1), producers*perProducer)
		for len(acked) < target && !t.Failed() {
			grow.Wait()
		}
		mu.Unlock()
		resume := s.pause()
		mu.Lock()
		snapshot := append([]batchAck(nil), acked...)
		mu.Unlock()
		durable := s.log.Flushed()
		img := fs.Crash(rand.New(rand.NewPCG(seed, uint64(c))))
		resume()
		torn += checkBatchImage(t, img, mode, snapshot, durable)
		images++
		batches += len(snapshot)
		if t.Failed() {
			t.Logf("crash point %d of seed %d", c, seed)
		}
	}
	close(stop)
	s.Close()
	wg.Wait()
	return images, batches, torn
}

func checkBatchImage(t *testing.T, img *vfs.MemFS, mode FlushMode, acked []batchAck, durable int64) (torn int) {
	t.Helper()
	s, err := Open(batchCrashOptions(img, mode))
	if err != nil {
		t.Errorf("recovery of a power-cut image failed: %v", err)
		return 0
	}
	defer s.Close()
	seen := checkWholeBatches(t, s, "PLB", 2)
	for _, a := range acked {
		if !seen[a.id] && (mode == FlushSync || a.end <= durable) {
			t.Errorf("acknowledged batch %s lost: %d messages at offset %d (durable %d at the crash)", a.id, a.count, a.offset, durable)
		}
	}
	// The queues go on after the cut: a new batch gets the next queue
	// offsets and is served whole.
	b := &Batch{Topic: "PLB", QueueID: 0, Messages: []BatchMessage{{Body: batchBody("after", 0, 2, 1)}, {Body: batchBody("after", 1, 2, 1)}}}
	res, err := s.PutMessages(context.Background(), b)
	if err != nil {
		t.Errorf("put after recovery: %v", err)
		return 0
	}
	waitQueueLen(t, s, "PLB", 0, res.Append.QueueOffset+2)
	if seen := checkWholeBatches(t, s, "PLB", 1); !seen["after"] {
		t.Errorf("the batch put after recovery is not served")
	}
	return int(s.Stats().TornTails)
}

// TestTornBatchIsCut tears a batch the way a kill -9 in the middle of its
// copy leaves it (the records before the tear whole in the page cache, the
// rest zero) or the way a power cut does (a sector of it lost), on real
// files, and checks recovery cuts the whole batch at its first record: the
// batch before it stays, the torn bytes are kept in a .broken file and
// counted, the consume queue serves none of it, and the next batch reuses
// its queue offsets.
func TestTornBatchIsCut(t *testing.T) {
	tests := []struct {
		name string
		tear func(rec []int64, end int64, data []byte) // rec: the torn batch's record offsets
	}{
		{"kill mid-copy: only the first record", func(rec []int64, end int64, data []byte) { clear(data[rec[1]:end]) }},
		{"kill mid-copy: all but the last record", func(rec []int64, end int64, data []byte) { clear(data[rec[len(rec)-1]:end]) }},
		{"kill mid-copy: inside a record", func(rec []int64, end int64, data []byte) { clear(data[rec[2]+30 : end]) }},
		{"power cut: a sector in the middle lost", func(rec []int64, end int64, data []byte) {
			mid := (rec[0] + end) / 2
			clear(data[mid-mid%512 : mid-mid%512+512])
		}},
		{"power cut: the first record lost", func(rec []int64, end int64, data []byte) { clear(data[rec[0]:rec[1]]) }},
	}
	for _, tt := range tests {
		for _, noCRC := range []bool{false, true} {
			name := tt.name
			if noCRC {
				name += ", DisablePropCRC"
			}
			t.Run(name, func(t *testing.T) { tornBatchCase(t, tt.tear, noCRC) })
		}
	}
}

func tornBatchCase(t *testing.T, tear func(rec []int64, end int64, data []byte), noCRC bool) {
	dir := t.TempDir()
	opts := Options{Dir: dir, FileSize: 1 << 20, FlushMode: FlushAsync, DisablePropCRC: noCRC}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	put := func(s *Store, id string, n int) AppendResult {
		b := &Batch{Topic: "TB", QueueID: 1}
		for j := 0; j < n; j++ {
			b.Messages = append(b.Messages, BatchMessage{Body: batchBody(id, j, n, 300)})
		}
		res, err := s.PutMessages(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		return res.Append
	}
	put(s, "whole", 5)
	if err := s.Close(); err != nil { // the first batch is below the checkpoint
		t.Fatal(err)
	}
	if s, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	torn := put(s, "torn", 8)
	// Let the dispatcher index the torn batch, so its consume-queue
	// entries exist and must be cut too.
	waitQueueLen(t, s, "TB", 1, 13)
	s.crash()
	path := filepath.Join(dir, "commitlog", fileName(0))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tear(torn.Offsets, torn.NextOffset(), data)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}

	s, err = Open(opts)
	if err != nil {
		t.Fatalf("open after the tear: %v", err)
	}
	defer s.Close()
	seen := checkWholeBatches(t, s, "TB", 2)
	if !seen["whole"] || seen["torn"] {
		t.Fatalf("batches served after recovery: %v, want only the whole one", seen)
	}
	if st := s.Stats(); st.TornTails != 1 || st.MaxOffset != torn.WroteOffset {
		t.Fatalf("torn tails %d, log end %d; want 1 and the torn batch's start %d", st.TornTails, st.MaxOffset, torn.WroteOffset)
	}
	if _, err := os.Stat(filepath.Join(dir, "commitlog", fileName(torn.WroteOffset)+".broken")); err != nil {
		t.Fatalf("torn batch not kept: %v", err)
	}
	again := put(s, "again", 3)
	waitQueueLen(t, s, "TB", 1, 8)
	if again.QueueOffset != 5 || again.WroteOffset != torn.WroteOffset {
		t.Fatalf("next batch at queue offset %d, commitlog %d; want 5 and %d", again.QueueOffset, again.WroteOffset, torn.WroteOffset)
	}
	if seen := checkWholeBatches(t, s, "TB", 2); !seen["again"] {
		t.Fatal("the next batch is not served")
	}
}

// waitQueueLen waits until the queue's consume queue holds n entries.
func waitQueueLen(t *testing.T, s *Store, topic string, q int32, n int64) {
	t.Helper()
	for {
		arrived, release := s.index.NextRelease()
		if _, maxOff, err := s.QueueInfo(topic, q); err == nil && maxOff >= n {
			release()
			return
		}
		<-arrived
		release()
	}
}

// TestBatchProperty checks the batch property's bytes and cost: only the
// first record of a batch of two or more carries it, its size is in the
// record's size and in the batch's, single puts and one-message batches
// carry nothing new, and a client cannot set it.
func TestBatchProperty(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), FileSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	b := &Batch{Topic: "BP", Messages: []BatchMessage{{Body: []byte("a")}, {Body: []byte("bb")}, {Body: []byte("ccc")}}}
	res, err := s.PutMessages(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for i, off := range res.Append.Offsets {
		r, err := s.GetMessage(off)
		if err != nil {
			t.Fatal(err)
		}
		sum += int64(r.TotalSize)
		v, ok := r.Property(PropertyBatch)
		switch {
		case i == 0 && (!ok || v != fmt.Sprintf("%013d,%013d", 3, res.Append.WroteBytes)):
			t.Fatalf("first record: %s = %q (%v), want 3 records, %d bytes", PropertyBatch, v, ok, res.Append.WroteBytes)
		case i > 0 && ok:
			t.Fatalf("record %d carries %s", i, PropertyBatch)
		}
	}
	if sum != int64(res.Append.WroteBytes) {
		t.Fatalf("records sum to %d bytes, the batch wrote %d", sum, res.Append.WroteBytes)
	}
	one, err := s.PutMessages(ctx, &Batch{Topic: "BP", Messages: []BatchMessage{{Body: []byte("a")}}})
	if err != nil {
		t.Fatal(err)
	}
	single, err := s.PutMessage(ctx, &Message{Topic: "BP", Body: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.GetMessage(res.Append.Offsets[0])
	if one.Append.WroteBytes != single.Append.WroteBytes || first.TotalSize != single.Append.WroteBytes+int32(batchPropLen) {
		t.Fatalf("one-message batch %d bytes, single put %d, first of a batch %d: want equal, equal, +%d",
			one.Append.WroteBytes, single.Append.WroteBytes, first.TotalSize, batchPropLen)
	}
	for _, m := range []*Message{{Topic: "BP", Body: []byte("x"), Properties: []Property{{Key: PropertyBatch, Value: "0000000000002,0000000000200"}}}} {
		if _, err := s.PutMessage(ctx, m); !errors.Is(err, ErrIllegal) {
			t.Fatalf("client-set %s: %v, want a validation error", PropertyBatch, err)
		}
	}
}
