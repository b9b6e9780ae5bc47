package commitlog

import (
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
	open := func() *Log {
		nop := zerolog.Nop()
		l, err := Open(Options{FS: vfs.Default, Dir: dir, FileSize: size, RequireCRC: true, Clock: base.SystemClock,
			Logger: &nop, Throttle: logthrottle.New(time.Second, nil), PopulateChunk: 4 << 20, PopulateAhead: size})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := open()
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

	l = open()
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
