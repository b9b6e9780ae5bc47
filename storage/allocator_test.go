package storage

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// TestRollDoesNotWaitForPopulate: the allocator hands a new file over as soon
// as it is created and mapped, and faults it in afterwards, chunk by chunk.
// A put must not wait for that population (it took seconds per GiB here and
// stalled the put lock at every roll); when the writer asks for the next
// file, the allocator creates it before it populates more of the current
// one, then goes on populating the current one ahead of the writer. (It
// asks once its writes are half way through the file: prepareNext.)
func TestRollDoesNotWaitForPopulate(t *testing.T) {

	fs := vfs.NewMem()
	first := filepath.Join("/d", "commitlog", fileName(0))
	second := filepath.Join("/d", "commitlog", fileName(64<<10))
	var (
		mu           sync.Mutex
		calls        = map[string]int{}
		beforeSecond = -1 // chunks of the first file populated when the second was created
		blocked      = make(chan struct{})
		release      = make(chan struct{})
		resumed      = make(chan struct{})
	)
	fs.SetInjector(func(op vfs.Op, path string) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case op == vfs.OpCreateSegment && path == second:
			beforeSecond = calls[first]
		case op == vfs.OpPopulate:
			calls[path]++
			switch {
			case path == first && calls[path] == 1:
				close(blocked)
				mu.Unlock()
				<-release // hold the first chunk of the first file
				mu.Lock()
			case path == first && calls[path] == 2:
				close(resumed)
			}
		}
		return nil
	})
	s, err := Open(Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, PopulateChunk: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	<-blocked // the allocator created file 0 and is populating it

	guard := func() <-chan time.Time { return time.After(10 * time.Second) } // failure guards only
	// putNoWait puts body and fails the test if the put waits for the
	// allocator (held in its first chunk).
	putNoWait := func(body string) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := s.PutMessage(context.Background(), msg("T", body))
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("put: %v", err)
			}
		case <-guard():
			t.Fatal("a put waited for the allocator to populate its file")
		}
	}
	putNoWait("while the file is being populated")
	// Puts up to half the file: they do not wait either, and the last asks
	// for file 1.
	for s.log.Files().Last().Wrote() < 32<<10 {
		putNoWait(strings.Repeat("x", 900))
	}
	close(release)
	s.log.Files().WaitReady(64 << 10)
	select {
	case <-resumed:
	case <-guard():
		t.Fatal("the allocator did not go on populating file 0 after creating file 1")
	}
	mu.Lock()
	defer mu.Unlock()
	if beforeSecond != 1 {
		t.Errorf("file 1 created after %d chunks of file 0, want right after the held one", beforeSecond)
	}
}

// TestOpenPopulatesTheLastFile: after a restart the file appends go to is
// faulted in beyond what it holds, so the puts after a restart do not take
// a page fault per page (the allocator otherwise only populates new files).
func TestOpenPopulatesTheLastFile(t *testing.T) {

	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, PopulateChunk: testChunk}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ { // ~3 pages of the first file
		if _, err := s.PutMessage(context.Background(), msg("T", strings.Repeat("x", 500))); err != nil {
			t.Fatal(err)
		}
	}
	wrote := s.log.Files().Last().Wrote()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	chunks := countOps(fs, vfs.OpPopulate, filepath.Join("/d", "commitlog", fileName(0))) // of the first file
	s, err = Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.log.WaitPopulated()
	// Every chunk from the one holding the write position to the end, and
	// none below it.
	want := int((o.FileSize - wrote&^(pageSize-1) + testChunk - 1) / testChunk)
	if chunks := chunks(); chunks != want {
		t.Fatalf("first file populated in %d chunks after the restart, want %d (write position %d)", chunks, want, wrote)
	}
}

// TestNextFilePreparedAtHalf: the file after the one appends go to is
// created only once appends are half way through it, not at the roll and
// not at a restart (a prepared file is deleted at Close, and populated
// it is a whole file of dirty zeros to write back: prepareNext).
func TestNextFilePreparedAtHalf(t *testing.T) {
	const fileSize = 64 << 10
	fs := vfs.NewMem()
	createdNow := countOps(fs, vfs.OpCreateSegment, filepath.Join("/d", "commitlog", fileName(fileSize))) // of the second file
	o := Options{Dir: "/d", FS: fs, FileSize: fileSize, MaxMessageSize: 1024, PopulateChunk: testChunk}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("x", 900)
	put := func(s *Store) {
		t.Helper()
		if _, err := s.PutMessage(context.Background(), msg("T", body)); err != nil {
			t.Fatal(err)
		}
	}
	// Up to just below half: nothing asked for (the allocator is idle
	// once WaitPopulated returns, so a request would have been served).
	for s.log.Files().Last() == nil || s.log.Files().Last().Wrote()+1024 < fileSize/2 {
		put(s)
	}
	s.log.WaitPopulated()
	if n := createdNow(); n != 0 {
		t.Fatalf("the next file was created %d times before appends reached half of the first", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart below half prepares nothing either.
	if s, err = Open(o); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.log.WaitPopulated()
	if n := createdNow(); n != 0 {
		t.Fatalf("a restart created the next file %d times", n)
	}
	for s.log.Files().Last().Wrote() < fileSize/2 {
		put(s)
	}
	s.log.Files().WaitReady(fileSize)
	if n := createdNow(); n != 1 {
		t.Fatalf("the next file was created %d times once appends passed half, want 1", n)
	}
}

// countOps counts fs's operations op on path from now on (it takes fs's
// injector) and returns how many there were so far.
func countOps(fs *vfs.MemFS, op vfs.Op, path string) func() int {
	var n atomic.Int64
	fs.SetInjector(func(o vfs.Op, p string) error {
		if o == op && p == path {
			n.Add(1)
		}
		return nil
	})
	return func() int { return int(n.Load()) }
}

// testChunk is the allocator's population chunk in these tests: small, so
// a 64 KiB file takes many chunks.
const testChunk = 4096

// TestAllocatorLeavesRoomOnANearlyFullDisk: the allocator preallocates the
// next file ahead of need only while the disk keeps room for it plus the
// store's small files (prepareRoom). On a nearly full disk the doomed
// fallocate held every free byte while it ran, so a concurrent checkpoint
// write failed with ENOSPC and retention, which needs that checkpoint
// before it deletes, could not free the disk (TestDiskWatermarkOnTmpfs
// failed so about once in 40 runs under load). The roll then creates the
// file itself, and a full disk is the put's error.
func TestAllocatorLeavesRoomOnANearlyFullDisk(t *testing.T) {
	const fileSize = 64 << 10
	fs := vfs.NewMem()
	var mu sync.Mutex
	avail := uint64(1 << 30)
	setAvail := func(n uint64) { mu.Lock(); avail = n; mu.Unlock() }
	var creates []string
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpCreateSegment {
			mu.Lock()
			creates = append(creates, filepath.Base(path))
			mu.Unlock()
		}
		return nil
	})
	o := Options{Dir: "/d", FS: fs, FileSize: fileSize, MaxMessageSize: 1024, ConsumeQueueEntries: 16,
		StatDisk: func(string) (DiskUsage, error) {
			mu.Lock()
			defer mu.Unlock()
			return DiskUsage{Size: 2 * avail, Used: avail, Avail: avail}, nil // 50 %: puts go on
		}}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	body := strings.Repeat("x", 900)
	// fill puts into the file at from until it is at least half written:
	// the allocator is then asked for the next file (prepareNext).
	fill := func(from int64) {
		t.Helper()
		for l := s.log.Files().Last(); l == nil || l.From() < from || l.Wrote() < fileSize/2; l = s.log.Files().Last() {
			mustPut(t, s, "T", 0, body)
		}
	}
	fill(0) // room: file 1 is prepared
	s.log.Files().WaitReady(fileSize)

	// Just short of the file plus the reserve: file 2 is not prepared.
	setAvail(fileSize + prepareReserve + 16*20 - 1)
	fill(fileSize)
	s.log.Files().WaitPopulated()
	mu.Lock()
	got := strings.Join(creates, " ")
	mu.Unlock()
	if want := fileName(0) + " " + fileName(fileSize); got != want {
		t.Fatalf("files created on a nearly full disk: %s, want %s (nothing ahead of need)", got, want)
	}
	// The roll into file 2 creates it itself, and the puts go on.
	for s.log.Files().Last().From() < 2*fileSize {
		mustPut(t, s, "T", 0, body)
	}
	setAvail(1 << 30) // room again: the next file is prepared ahead
	fill(3 * fileSize)
	s.log.Files().WaitReady(4 * fileSize)
}

// TestPopulateWindow: with a PopulateAhead window smaller than the file,
// the allocator faults in only that much past the writer: the first
// file's first window at Open, more as puts move the append position (the
// puts themselves wake it), and of the next file (prepared at half) only
// its first window before the roll, then again as far ahead of the writer
// as the window goes. Whole files populated at once were written to the
// disk twice (zeros, then records) and stalled the syncs of a group on
// one disk for seconds.
func TestPopulateWindow(t *testing.T) {
	const fileSize, ahead = 64 << 10, 4 * testChunk
	fs := vfs.NewMem()
	populated := make(chan struct{}, 1)
	second := filepath.Join("/d", "commitlog", fileName(fileSize))
	var secondChunks atomic.Int64 // of the next file: the writer passes none before the roll
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpPopulate {
			if path == second {
				secondChunks.Add(1)
			}
			select {
			case populated <- struct{}{}:
			default:
			}
		}
		return nil
	})
	s, err := Open(Options{Dir: "/d", FS: fs, FileSize: fileSize, MaxMessageSize: 1024, PopulateChunk: testChunk, PopulateAhead: ahead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// window checks that f is populated at least ahead past its writer,
	// short by at most slack, and not more than a chunk beyond that.
	window := func(what string, f *segment.File, slack int64) {
		t.Helper()
		want := min(fileSize, f.Wrote()+ahead)
		if got := f.PopulatedTo(); got < want-slack || got > want+testChunk {
			t.Fatalf("%s, written to %d: populated to %d, want %d (-%d, +%d)", what, f.Wrote(), got, want, slack, testChunk)
		}
	}
	body := strings.Repeat("x", 900)
	last := func() *segment.File { return s.log.Files().Last() }
	mustPut(t, s, "T", 0, body)
	s.log.WaitPopulated()
	window("the first file after a put", last(), 0)
	for last().Wrote() < 20<<10 {
		mustPut(t, s, "T", 0, body)
	}
	// Nothing but the puts wakes the allocator now; once they leave a
	// chunk of room in the window it fills it.
	f := last()
	for f.PopulatedTo() < f.Wrote()+ahead-testChunk {
		select {
		case <-populated:
		case <-time.After(10 * time.Second):
			t.Fatalf("the first file written to %d: populated to %d after 10 s: the writer did not wake the allocator", f.Wrote(), f.PopulatedTo())
		}
	}
	window("the first file", f, testChunk)
	s.log.WaitPopulated()
	window("the first file, allocator idle", f, 0)
	for last().Wrote() < fileSize/2 {
		mustPut(t, s, "T", 0, body)
	}
	s.log.Files().WaitReady(fileSize)
	s.log.WaitPopulated()
	window("the first file at half", f, 0)
	if got := secondChunks.Load(); got != ahead/testChunk {
		t.Fatalf("the next file, prepared: %d chunks populated before the roll, want %d (its first window)", got, ahead/testChunk)
	}
	for last().From() < fileSize || last().Wrote() < 6<<10 {
		mustPut(t, s, "T", 0, body)
	}
	s.log.WaitPopulated()
	window("the second file", last(), 0)
	if got := f.PopulatedTo(); got > fileSize {
		t.Fatalf("the first file populated to %d, past its end", got)
	}
}

// TestPopulateNearWindow: with PopulateWrite (and PopulateZero, whose
// writable passes go in that mode) the allocator makes only
// PopulateNear past the writer writable (MADV_POPULATE_WRITE: dirty
// zeros) and populates the rest of the window read (clean pages), the
// writable part first. A file with dirty zeros in it stays dirty, and the
// kernel's write-back, whose 30 s expiry is kept per file, wrote all of
// them at once: with the whole 128 MiB window writable, a burst that
// stalled a group's puts for half a second every 30 s.
func TestPopulateNearWindow(t *testing.T) {
	for _, mode := range []vfs.PopulateMode{vfs.PopulateWrite, vfs.PopulateZero} {
		t.Run(mode.String(), func(t *testing.T) { testPopulateNearWindow(t, mode) })
	}
}

// testPopulateNearWindow is TestPopulateNearWindow with Options.Populate
// mode, a writable one: the writable passes are made in that mode.
func testPopulateNearWindow(t *testing.T, mode vfs.PopulateMode) {
	const fileSize, ahead, near = 64 << 10, 8 * testChunk, 2 * testChunk
	fs := vfs.NewMem()
	first := filepath.Join("/d", "commitlog", fileName(0))
	var (
		mu     sync.Mutex
		calls  []popCall
		wrote  func() int64 // the first file's append position; set once Open returns
		opened = make(chan struct{})
		s      *Store
	)
	fs.OnPopulate(func(path string, lo, hi int64, how vfs.PopulateMode) {
		if path != first {
			return
		}
		<-opened
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, popCall{lo, hi, how, wrote()})
	})
	s, err := Open(Options{Dir: "/d", FS: fs, FileSize: fileSize, MaxMessageSize: 1024, PopulateChunk: testChunk,
		PopulateAhead: ahead, PopulateNear: near, Populate: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	wrote = func() int64 { // before the first put: no file yet, nothing written
		if f := s.log.Files().Last(); f != nil {
			return f.Wrote()
		}
		return 0
	}
	close(opened)
	body := strings.Repeat("x", 900)
	mustPut(t, s, "T", 0, body)
	f := s.log.Files().Last()
	// check: after WaitPopulated, the first near bytes past the writer are
	// writable, the rest of the window populated read, nothing written
	// writable beyond near (plus one pass) past where the writer was then.
	check := func(what string) {
		t.Helper()
		s.log.WaitPopulated()
		mu.Lock()
		defer mu.Unlock()
		w := f.Wrote()
		var writable, readTo int64
		for _, c := range calls {
			switch c.how {
			case mode:
				if c.lo > max(writable, c.wrote&^(testChunk-1)) { // the writer's pages need none
					t.Fatalf("%s: writable to %d, then [%d, %d) with the writer at %d: a gap", what, writable, c.lo, c.hi, c.wrote)
				}
				writable = max(writable, c.hi)
				if c.hi > c.wrote+near+testChunk {
					t.Fatalf("%s: [%d, %d) made writable with the writer at %d: past near (%d) and a pass", what, c.lo, c.hi, c.wrote, near)
				}
			case vfs.PopulateRead:
				readTo = max(readTo, c.hi)
			default:
				t.Fatalf("%s: populated [%d, %d) %v", what, c.lo, c.hi, c.how)
			}
		}
		if want := min(fileSize, w+near); writable < want || writable > want+testChunk {
			t.Fatalf("%s, written to %d: writable to %d, want %d (+%d)", what, w, writable, want, testChunk)
		}
		// Populated: read, or made writable (which populates too).
		if got, want := max(readTo, writable), min(fileSize, w+ahead); got < want || got > want+testChunk || f.PopulatedTo() != got {
			t.Fatalf("%s, written to %d: populated to %d (read to %d, PopulatedTo %d), want %d (+%d)", what, w, got, readTo, f.PopulatedTo(), want, testChunk)
		}
	}
	check("after one put")
	for f.Wrote() < 20<<10 {
		mustPut(t, s, "T", 0, body)
	}
	check("at 20 KiB")
	for f.Wrote() < fileSize-6<<10 {
		mustPut(t, s, "T", 0, body)
	}
	check("near the end")
}

// popCall is one Segment.Populate the allocator made, and the writer's
// position when it did.
type popCall struct {
	lo, hi int64
	how    vfs.PopulateMode
	wrote  int64
}
