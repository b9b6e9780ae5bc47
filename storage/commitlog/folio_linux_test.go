package commitlog

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/vfs"
)

// openOnDisk opens a log on real files with o's directory, sizes and
// population, the rest as a store would (CRCs required, the system
// clock); the caller recovers, starts and closes it.
func openOnDisk(t *testing.T, o Options) *Log {
	t.Helper()
	nop := zerolog.Nop()
	o.FS, o.RequireCRC, o.Clock, o.Logger, o.Throttle = vfs.Default, true, base.SystemClock, &nop, logthrottle.New(time.Second, nil)
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRestartAppendsDirtyOwnPages: after a restart whose page cache lost
// the last file (a reboot, or eviction), recovery reads the file's zero
// tail to check it, through readahead that leaves it in large folios. A
// put after the restart must still dirty only the pages it writes, or
// every sync writes whole folios of up to 2 MiB (cutTail evicts the tail;
// vfs.Segment.Evict). Readahead's folios grow as its sequential faults
// go on, so the put checked lands 40 MiB past the restart's end. On file
// systems without large folios it passes either way; on this project's
// machines (ext4, Linux 6.18) it fails without the eviction.
func TestRestartAppendsDirtyOwnPages(t *testing.T) {
	const size = 64 << 20
	dir := t.TempDir()
	opts := Options{Dir: dir, FileSize: size, PopulateChunk: 4 << 20, PopulateAhead: size}
	l := openOnDisk(t, opts)
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	at, n := appendOne(t, l, 0, "before the restart")
	end := at + int64(n)
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	l.Close()

	// The restart finds nothing of the file in the page cache.
	path := filepath.Join(dir, segment.FileName(0))
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // the population's dirty zeros, so that all of it can go
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	f.Close()

	l = openOnDisk(t, opts)
	defer l.Close()
	r, err := l.Recover(end, 0)
	if err != nil || r.End != end {
		t.Fatalf("recover: end %d, %v; want %d", r.End, err, end)
	}
	l.Start()
	l.WaitPopulated()
	big := string(make([]byte, 1<<20))
	for qo := int64(1); qo <= 40; qo++ {
		appendOne(t, l, qo, big)
	}
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	qo := int64(41)
	d := storagetest.DirtiedBy(t, path, func() {
		at, n = appendOne(t, l, qo, "after the restart")
		qo++
	})
	if pages := uint64((at+int64(n)-1)/4096 - at/4096 + 1); d != pages {
		t.Fatalf("a put of %d bytes at %d dirtied %d pages, want the %d it wrote into: recovery's read left large folios", n, at, d, pages)
	}
}

// TestPopulateDirtiesOnlyNearWindow: with write population the allocator
// leaves dirty zeros only in the PopulateNear bytes past the writer, and
// populates the rest of its window clean (read). The kernel writes back a
// dirty file's pages all at once when the file has been dirty for 30 s,
// and a file with dirty zeros ahead of the writer always is: with the
// whole 128 MiB window dirty, every 30 s a burst of zeros stalled a sync
// single node's puts for ~0.2 s and a group's for ~0.5 s. The window must
// still be in the page cache (populated), or the writer takes the faults.
func TestPopulateDirtiesOnlyNearWindow(t *testing.T) {
	const size, ahead, near = 64 << 20, 32 << 20, 2 << 20
	dir := t.TempDir()
	l := openOnDisk(t, Options{Dir: dir, FileSize: size, PopulateChunk: 4 << 20, PopulateAhead: ahead, PopulateNear: near})
	defer l.Close()
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	appendOne(t, l, 0, "one put")
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	l.WaitPopulated()
	cached, dirty := storagetest.PageCache(t, filepath.Join(dir, segment.FileName(0)))
	// At most near and one pass of it (a quarter) past the writer's page.
	if most := uint64(1 + (near+near/4)/4096); dirty > most {
		t.Fatalf("%d pages dirty after population, want at most %d (%d MiB writable past the writer): the dirty zeros reach further", dirty, most, near>>20)
	}
	if least := uint64(ahead / 4096); cached < least {
		t.Fatalf("%d pages in the page cache after population, want the window's %d at least", cached, least)
	}
}

// TestPopulateZeroWritesAheadOfWriter: with vfs.PopulateZero the
// allocator leaves the writable window past the writer in written
// extents (a sync of a put there converts nothing) and the read window
// beyond it unwritten, while puts go on beside its write-backs; after a
// reopen every record is there, the ones written into ranges the
// allocator wrote back included.
func TestPopulateZeroWritesAheadOfWriter(t *testing.T) {
	const size, ahead, near = 64 << 20, 16 << 20, 2 << 20
	dir := t.TempDir()
	o := Options{Dir: dir, FileSize: size, PopulateChunk: 4 << 20, PopulateAhead: ahead, PopulateNear: near, Populate: vfs.PopulateZero}
	l := openOnDisk(t, o)
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	body := string(make([]byte, 1000))
	var records int64
	for l.MaxOffset() < 3*near { // through several writable passes
		appendOne(t, l, records, body)
		records++
		if records%64 == 0 {
			if _, err := l.Sync(0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	l.WaitPopulated()
	end := l.MaxOffset()
	path := filepath.Join(dir, segment.FileName(0))
	page := end &^ 4095
	if n := storagetest.UnwrittenBytes(t, path, page, end+near); n != 0 {
		t.Errorf("%d bytes of the writable window [%d, %d) in unwritten extents: its zeros were not written ahead", n, page, end+near)
	}
	// One writable pass (a quarter of near) may reach past near.
	if lo := end + near + near/4; storagetest.UnwrittenBytes(t, path, lo, size) != size-lo {
		t.Errorf("extents past the writable window [%d, %d) written: zeros written beyond it", lo, size)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openOnDisk(t, o)
	defer l.Close()
	res, err := l.Recover(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.End != end || res.Records != records {
		t.Fatalf("after a reopen: end %d, %d records (%s), want %d and %d", res.End, res.Records, res.BadReason, end, records)
	}
}

// TestTruncateAfterLeavesTheTailAlone: a truncation clears and syncs the
// bytes it drops, not the file's unused tail past them, which is zero
// already. Clearing the whole rest of the file faulted in and dirtied
// every page of it, and the sync wrote them all back with the log's lock
// held: a replica's truncation of a few records in a 1 GiB file wrote
// ~700 MB of zeros, and raft's Steps waited up to 3.6 s behind it
// (BENCHMARKS.md "A truncation that wrote a file of zeros"). With
// population off, most of the file is not in the page cache before the
// truncation; no page may be added by it, nor left dirty.
func TestTruncateAfterLeavesTheTailAlone(t *testing.T) {
	const size = 16 << 20
	dir := t.TempDir()
	l := openOnDisk(t, Options{Dir: dir, FileSize: size, Populate: vfs.PopulateOff})
	defer l.Close()
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	var offs []int64
	body := string(make([]byte, 64<<10))
	for qo := range int64(16) {
		at, _ := appendOne(t, l, qo, body)
		offs = append(offs, at)
	}
	end := l.MaxOffset()
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, segment.FileName(0))
	before, _ := storagetest.PageCache(t, path)
	if half := uint64(size / 4096 / 2); before > half {
		t.Fatalf("%d pages cached before the truncation, want at most half the file's %d: the test needs the tail out of the page cache", before, 2*half)
	}
	cut := offs[10]
	if err := l.TruncateAfter(cut); err != nil {
		t.Fatal(err)
	}
	if after, dirty := storagetest.PageCache(t, path); after > before || dirty != 0 {
		t.Fatalf("the truncation at %d (written end %d) left %d pages cached (%d before), %d dirty: it touched the zero tail",
			cut, end, after, before, dirty)
	}
	if !AllZero(l.Files().Last().Data()[cut:end]) {
		t.Fatalf("bytes [%d, %d) not zero after the truncation", cut, end)
	}
	if at, _ := appendOne(t, l, 10, "after"); at != cut {
		t.Fatalf("append after the truncation at %d, want %d", at, cut)
	}
}

// TestRecoverFindsBytesFarPastTheEnd: after a crash, recovery proves the
// last file's tail zero by reading only what the file system says may hold
// data (zeroFrom). Bytes a dead run left far past the end, synced or only
// dirty in the page cache (a kill -9), are still found: saved in a
// .broken file from the end to the last of them, and zeroed.
func TestRecoverFindsBytesFarPastTheEnd(t *testing.T) {
	const size = 64 << 20
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("synced %v", sync), func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Dir: dir, FileSize: size, Populate: vfs.PopulateOff}
			l := openOnDisk(t, opts)
			if _, err := l.Recover(0, 0); err != nil {
				t.Fatal(err)
			}
			l.Start()
			at, n := appendOne(t, l, 0, "kept")
			end := at + int64(n)
			if _, err := l.Sync(0); err != nil {
				t.Fatal(err)
			}
			far := int64(40<<20 + 3)
			f := l.Files().Last()
			copy(f.Data()[far:], "stale")
			if sync {
				if err := f.Sync(far, far+5); err != nil {
					t.Fatal(err)
				}
			}
			l.Close() // not a clean close for the next Open: ClosedCleanly stays false

			l = openOnDisk(t, opts)
			defer l.Close()
			r, err := l.Recover(end, 0)
			if err != nil || r.End != end {
				t.Fatalf("recover: end %d, %v; want %d", r.End, err, end)
			}
			if st := l.Stats(); st.TornTails != 1 || st.TornBytes != uint64(far+5-end) {
				t.Fatalf("torn tails %d of %d bytes; want 1 of %d (from the end to the stale bytes)", st.TornTails, st.TornBytes, far+5-end)
			}
			if b := l.Files().Last().Data(); !AllZero(b[end:]) {
				t.Fatal("the stale bytes are still there after recovery")
			}
			saved, err := os.ReadFile(filepath.Join(dir, segment.FileName(end)+".broken"))
			if err != nil || int64(len(saved)) != far+5-end || string(saved[len(saved)-5:]) != "stale" {
				t.Fatalf("saved %d bytes (%v), want %d ending in the stale bytes", len(saved), err, far+5-end)
			}
		})
	}
}
