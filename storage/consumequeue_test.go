package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// indexAll runs a dispatch round up to the visible end and fails the test
// unless it indexed everything: a deterministic stand-in for waiting on
// the dispatcher goroutine.
func indexAll(t testing.TB, s *Store) {
	t.Helper()
	end := s.visibleEnd()
	s.index.Run(end)
	if got := s.index.Dispatched(); got < end {
		t.Fatalf("dispatched %d of %d: %v", got, end, s.WriteErr())
	}
}

// putTopics puts one message to queue 0 of each of n topics T0…T(n-1).
func putTopics(t testing.TB, s *Store, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.PutMessage(context.Background(), msg("T"+strconv.Itoa(i), "m")); err != nil {
			t.Fatal(err)
		}
	}
}

// diskBytes is the space the files and directories under dir take (st_blocks).
func diskBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(path string, _ iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		total += fi.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestNewQueuesCostKiB: 1,000 queues holding one message each take at most
// 64 KiB of disk each, files and directories included (on 4b36369, each
// preallocated a 6,000,000-byte file: 5.6 GiB).
func TestNewQueuesCostKiB(t *testing.T) {
	s, o := openTest(t, nil)
	const n = 1000
	putTopics(t, s, n)
	indexAll(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := diskBytes(t, filepath.Join(o.Dir, "consumequeue"))
	if got > n*64<<10 {
		t.Fatalf("%d queues take %d bytes of disk (%d per queue), want at most 64 KiB each", n, got, got/n)
	}
	t.Logf("%d queues: %d bytes of disk (%d per queue)", n, got, got/n)
}

// syncRecorder is a MemFS injector that records the syncs and segment
// creations under consumequeue/.
type syncRecorder struct {
	mu  sync.Mutex
	ops []string
}

func (r *syncRecorder) inject(op vfs.Op, path string) error {
	switch op {
	case vfs.OpSync, vfs.OpSyncDir, vfs.OpFileSync, vfs.OpCreateSegment:
		if strings.Contains(path, "consumequeue") {
			r.mu.Lock()
			r.ops = append(r.ops, op.String()+" "+path)
			r.mu.Unlock()
		}
	}
	return nil
}

func (r *syncRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops
	r.ops = nil
	return ops
}

// TestQueueCreationDoesNotSync: indexing messages to 200 new queues, and one
// to an existing queue after them, syncs nothing under consumequeue/ (on
// 4b36369 each new queue preallocated, synced and dir-synced its file on
// the dispatcher's path, stalling every other queue behind it); the
// checkpoint then syncs the new files and their directories before it
// records them, and after a power cut right after it every queue is there.
func TestQueueCreationDoesNotSync(t *testing.T) {
	fs := vfs.NewMem()
	rec := &syncRecorder{}
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, CheckpointInterval: 1 << 40}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.PutMessage(context.Background(), msg("Old", "first")); err != nil {
		t.Fatal(err)
	}
	indexAll(t, s)
	err = s.index.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	fs.SetInjector(rec.inject)
	const n = 200
	putTopics(t, s, n)
	if _, err := s.PutMessage(context.Background(), msg("Old", "second")); err != nil {
		t.Fatal(err)
	}
	indexAll(t, s)
	if ops := rec.take(); len(ops) > 0 {
		t.Fatalf("indexing new queues synced %d times on the dispatch path, first %q", len(ops), ops[0])
	}
	if _, hi, err := s.QueueInfo("Old", 0); err != nil || hi != 2 {
		t.Fatalf("existing queue: max %d, %v", hi, err)
	}
	err = s.index.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	var fileSyncs, dirSyncs int
	for _, op := range rec.take() {
		switch {
		case strings.HasPrefix(op, vfs.OpFileSync.String()):
			fileSyncs++
		case strings.HasPrefix(op, vfs.OpSyncDir.String()):
			dirSyncs++
		}
	}
	// One sync per new file and for Old/0's, and each new queue's directory
	// plus its topic's, plus consumequeue/ itself.
	if fileSyncs != n+1 || dirSyncs < 2*n+1 {
		t.Fatalf("checkpoint synced %d files and %d directories, want %d and at least %d", fileSyncs, dirSyncs, n+1, 2*n+1)
	}
	resume := s.pause()
	img := fs.Crash(rand.New(rand.NewPCG(11, 11)))
	resume()
	s2, err := Open(Options{Dir: "/d", FS: img, FileSize: 64 << 10, MaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i := range n {
		res, err := s2.PullMessages(context.Background(), PullRequest{Topic: "T" + strconv.Itoa(i)})
		if err != nil || len(res.Messages) != 1 {
			t.Fatalf("queue T%d after the crash: %d messages, %v", i, len(res.Messages), err)
		}
	}
}

// TestRestartWritesNothingPerQueue: reopening a store of 300 queues maps
// no queue file, keeps at most MaxOpenQueueFiles open and writes only the
// abort marker (on 4b36369 every queue file was mapped and zeroed to its
// end: 300 mappings; 1,000 queues wrote 5.74 GiB on disk). 300, not more:
// MemFS's directory operations are linear in its files.
func TestRestartWritesNothingPerQueue(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, MaxOpenQueueFiles: 16}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	putTopics(t, s, n)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs, before := fs.OpenSegments(), fs.Written()
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commitlogFiles := len(s.log.Files().Snapshot())
	if mapped := fs.OpenSegments() - segs; mapped > commitlogFiles+1 { // +1: the allocator's next file
		t.Fatalf("open mapped %d segments for %d commitlog files: queue files are mapped", mapped, commitlogFiles)
	}
	if open := fs.OpenFiles(); open > o.MaxOpenQueueFiles {
		t.Fatalf("%d queue files open after the restart, limit %d", open, o.MaxOpenQueueFiles)
	}
	if wrote := fs.Written() - before; wrote > 1024 {
		t.Fatalf("the restart wrote %d bytes for %d queues", wrote, n)
	}
	if len(s.Queues()) != n {
		t.Fatalf("%d queues after the restart, want %d", len(s.Queues()), n)
	}
}

// openFDsUnder counts this process's descriptors open on regular files
// under dir. Directories are not counted: a checkpoint opens the queue
// directories it syncs (at most syncParallelism at once, for the sync) and
// may be doing so while the test counts; they are not queue files.
func openFDsUnder(t testing.TB, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("no /proc/self/fd (storaged runs on Linux only): %v", err)
	}
	n := 0
	for _, e := range ents {
		fd := filepath.Join("/proc/self/fd", e.Name())
		p, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(p, dir) {
			continue
		}
		if fi, err := os.Stat(fd); err == nil && fi.Mode().IsRegular() { // closed meanwhile: not open
			n++
		}
	}
	return n
}

// TestOpenQueueFilesBounded: with MaxOpenQueueFiles 8, writing and reading
// 100 queues keeps at most 8 queue files open (counted in /proc/self/fd) and
// maps none (on 4b36369: 100 descriptors and 100 mappings).
//
// No checkpoint runs while it counts (CheckpointInterval 1 h): a
// checkpoint's syncs hold up to 16 files and their directories open at
// once, beyond the limit, until each sync ends.
func TestOpenQueueFilesBounded(t *testing.T) {
	s, o := openTest(t, func(o *Options) { o.MaxOpenQueueFiles, o.CheckpointInterval = 8, time.Hour })
	const n = 100
	putTopics(t, s, n)
	indexAll(t, s)
	for i := range n {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T" + strconv.Itoa(i)})
		if err != nil || len(res.Messages) != 1 {
			t.Fatalf("T%d: %d messages, %v", i, len(res.Messages), err)
		}
	}
	cq := filepath.Join(o.Dir, "consumequeue")
	if got := openFDsUnder(t, cq); got > 8 || s.index.OpenFiles() > 8 {
		t.Fatalf("%d queue files open (%d counted), limit 8", got, s.index.OpenFiles())
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err == nil && strings.Contains(string(maps), cq) {
		t.Fatal("a consume-queue file is mapped")
	}
}

// TestConsumeQueueNoSpace: a full disk while creating or writing a queue
// file. A round's entries are published from the queues' in-memory tails
// before they reach their files, so the acked messages are readable at
// once; the writes fail when a checkpoint files them (a consume-queue
// fault wrapping vfs.ErrNoSpace and ErrDiskFull, no checkpoint written)
// and when a queue's tail is full: the round then stops at the entry that
// does not fit, without advancing past it. Once space is back the next
// round indexes it, the checkpoint files everything, and a reopened store
// finds every entry exactly once.
func TestConsumeQueueNoSpace(t *testing.T) {
	const block = 8 // ConsumeQueueEntries below: a file, so also a tail block, holds 8 entries
	for _, op := range []vfs.Op{vfs.OpOpenFile, vfs.OpFileWrite} {
		t.Run(op.String(), func(t *testing.T) {
			fs := vfs.NewMem()
			o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, CheckpointInterval: 1 << 40,
				ConsumeQueueEntries: block}
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			var full atomic.Bool
			full.Store(true)
			enospc := fmt.Errorf("%w: %w", vfs.ErrNoSpace, syscall.ENOSPC)
			fs.SetInjector(func(o vfs.Op, path string) error {
				if o == op && full.Load() && strings.Contains(path, filepath.Join("consumequeue", "Full")) {
					return enospc
				}
				return nil
			})
			// block+1 messages to Full: the last one needs the first
			// block written to its file, which fails. The put is still
			// answered (the message is stored; indexing resumes later).
			for _, topic := range append([]string{"A", "B"}, slices.Repeat([]string{"Full"}, block+1)...) {
				if _, err := s.PutMessage(context.Background(), msg(topic, topic)); err != nil {
					t.Fatal(err)
				}
			}
			// The rounds below are this test's; the goroutine's own rounds
			// meet the same disk and leave the same state.
			end := s.visibleEnd()
			err = s.index.RunErr(end)
			if !errors.Is(err, vfs.ErrNoSpace) || !errors.Is(err, ErrDiskFull) {
				t.Fatalf("dispatch on a full disk: %v, want vfs.ErrNoSpace and ErrDiskFull", err)
			}
			if next := s.index.Next(); next >= end {
				t.Fatalf("dispatch advanced to %d past the entry it could not write", next)
			}
			if _, hi, _ := s.QueueInfo("Full", 0); hi != block {
				t.Fatalf("queue Full shows %d entries, want the %d its tail holds", hi, block)
			}
			res, _, err := s.pullOnce(PullRequest{Topic: "Full", MaxMessages: 100, MaxBytes: 1 << 20}, MaxPullScan)
			if err != nil || len(res.Messages) != block {
				t.Fatalf("pull from the tail on a full disk: %d messages, %v; want %d", len(res.Messages), err, block)
			}
			for _, topic := range []string{"A", "B"} {
				if _, hi, err := s.QueueInfo(topic, 0); err != nil || hi != 1 {
					t.Fatalf("queue %s: max %d, %v", topic, hi, err)
				}
			}
			before := s.index.LastCheckpoint()
			if err := s.index.Checkpoint(); !errors.Is(err, vfs.ErrNoSpace) || !errors.Is(err, ErrDiskFull) {
				t.Fatalf("checkpoint on a full disk: %v, want vfs.ErrNoSpace and ErrDiskFull", err)
			}
			if got := s.index.LastCheckpoint(); got.Dispatched != before.Dispatched || got.Flushed != before.Flushed {
				t.Fatalf("a checkpoint was written over entries not in their files: %+v, before %+v", got, before)
			}
			if err := s.checkBeforePut(); !errors.Is(err, ErrDiskFull) {
				t.Fatalf("store health during the fault: %v, want ErrDiskFull", err)
			}

			full.Store(false)
			if err := s.index.RunErr(end); err != nil {
				t.Fatalf("dispatch once space is back: %v", err)
			}
			if err := s.index.Checkpoint(); err != nil {
				t.Fatalf("checkpoint once space is back: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err = Open(o); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			want := map[string]int64{"A": 1, "B": 1, "Full": block + 1}
			for topic, n := range want {
				if _, hi, _ := s.QueueInfo(topic, 0); hi != n {
					t.Fatalf("queue %s after reopening: max %d, want %d (indexed once)", topic, hi, n)
				}
			}
			res, _, err = s.pullOnce(PullRequest{Topic: "Full", MaxMessages: 100, MaxBytes: 1 << 20}, MaxPullScan)
			if err != nil || len(res.Messages) != block+1 || string(res.Messages[block].Body) != "Full" {
				t.Fatalf("pull after reopening: %d messages, %v", len(res.Messages), err)
			}
		})
	}
}

// TestQueueReadsAreBatched: pulling 1,000 consecutive entries from queue
// files costs one pread per 128-entry block, not one per entry.
func TestQueueReadsAreBatched(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 1 << 20, MaxMessageSize: 1024, ConsumeQueueEntries: 700}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		if _, err := s.PutMessage(context.Background(), msg("R", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(o); err != nil { // an empty tail: every entry is read from a file
		t.Fatal(err)
	}
	defer s.Close()
	var reads atomic.Int64
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpFileRead {
			reads.Add(1)
		}
		return nil
	})
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: "R", MaxMessages: n, MaxBytes: 1 << 30})
	if err != nil || len(res.Messages) != n {
		t.Fatalf("pulled %d: %v", len(res.Messages), err)
	}
	for i, m := range res.Messages {
		if string(m.Body) != strconv.Itoa(i) {
			t.Fatalf("message %d is %q", i, m.Body)
		}
	}
	// Blocks: [0,128) … [640,700) in file 0, [700,768) … in file 1.
	if got, want := reads.Load(), int64(n/cqBlockEntries+3); got > want {
		t.Fatalf("%d preads for %d entries, want at most %d", got, n, want)
	}
}

// TestOpenDamagedRecordBelowCheckpoint is issue 11's point 11: with the
// consume queues deleted, the rebuild indexes records recovery never
// checked; one with a body length of 0xFFFFFF00 made Open panic (index out
// of range) on 4b36369. Now Open answers a CorruptionError naming the file
// and the record.
func TestOpenDamagedRecordBelowCheckpoint(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, FileSize: 4096, MaxMessageSize: 1024}
	offs := putN(t, o, 40)
	victim := offs[3]
	if victim.WroteOffset >= o.FileSize {
		t.Fatalf("victim at %d is not in file 0", victim.WroteOffset)
	}
	path := filepath.Join(dir, "commitlog", fileName(0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rec := b[victim.WroteOffset:]
	p := posBornHost + 8 + 8 + 8 + 4 + 8 // the body length: after the hosts (IPv4), store time, reconsume, prepared tx
	binary.BigEndian.PutUint32(rec[p:], 0xFFFFFF00)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "consumequeue")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(o)
	if err == nil {
		s.Close()
		t.Fatal("open served a store with a damaged record below the checkpoint")
	}
	var cerr *CorruptionError
	if !errors.As(err, &cerr) || !errors.Is(err, ErrCorrupt) || cerr.File != "commitlog/"+fileName(0) || cerr.Offset != victim.WroteOffset {
		t.Fatalf("open: %v, want a CorruptionError at commitlog/%s offset %d", err, fileName(0), victim.WroteOffset)
	}
}

// TestQueueReadsWhileIndexing: pulls from the tail, from older blocks and
// across file boundaries while the dispatcher appends (and rolls blocks and
// files) always return the right message for each offset; run under -race.
func TestQueueReadsWhileIndexing(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.ConsumeQueueEntries = 300; o.MaxOpenQueueFiles = 2 })
	const n = 2000
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 5))
			for {
				select {
				case <-done:
					return
				default:
				}
				_, hi, err := s.QueueInfo("W", 0)
				if err != nil || hi == 0 {
					continue
				}
				from := rng.Int64N(hi)
				res, err := s.PullMessages(context.Background(), PullRequest{Topic: "W", Offset: from, MaxMessages: 200})
				if err != nil {
					errs <- err
					return
				}
				for i, m := range res.Messages {
					if want := strconv.FormatInt(from+int64(i), 10); string(m.Body) != want {
						errs <- fmt.Errorf("offset %d: body %q", from+int64(i), m.Body)
						return
					}
				}
			}
		}()
	}
	for i := range n {
		if _, err := s.PutMessage(context.Background(), msg("W", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	indexAll(t, s)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, hi, _ := s.QueueInfo("W", 0); hi != n {
		t.Fatalf("max %d, want %d", hi, n)
	}
}

// TestCheckpointAfterDeleteTopic: a queue created and its topic deleted
// before the next checkpoint leaves directories to sync that no longer
// exist; the checkpoint skips them rather than failing on real files.
func TestCheckpointAfterDeleteTopic(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.CheckpointInterval = 1 << 40 })
	if _, err := s.PutMessage(context.Background(), msg("Gone", "x")); err != nil {
		t.Fatal(err)
	}
	indexAll(t, s)
	if _, err := s.DeleteTopic("Gone"); err != nil {
		t.Fatal(err)
	}
	err := s.index.Checkpoint()
	if err != nil {
		t.Fatalf("checkpoint after a topic delete: %v", err)
	}
}
