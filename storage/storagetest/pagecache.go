package storagetest

import (
	"errors"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/internal/testenv"
)

// DirtyPages is the number of dirty page-cache pages of the file at path
// (cachestat(2), Linux 6.5+). The kernel counts every page of a dirty
// folio, so it tells how many bytes a sync of the file will write: a test
// that writes one byte and finds more than one page dirty has found a
// large folio around it (vfs.Segment.Populate's doc). Without cachestat
// the test fails under CI=true and is skipped elsewhere (testenv.Need).
func DirtyPages(t testing.TB, path string) uint64 {
	t.Helper()
	_, dirty := PageCache(t, path)
	return dirty
}

// PageCache is the number of page-cache pages of the file at path, and
// how many of them are dirty (cachestat(2), as DirtyPages).
func PageCache(t testing.TB, path string) (cached, dirty uint64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		rng struct{ off, len uint64 } // len 0: to the end of the file
		cs  struct{ cache, dirty, writeback, evicted, recentlyEvicted uint64 }
	)
	_, _, errno := unix.Syscall6(unix.SYS_CACHESTAT, f.Fd(), uintptr(unsafe.Pointer(&rng)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if errors.Is(errno, unix.ENOSYS) {
		testenv.Need(t, false, "cachestat(2) (Linux 6.5+) to count page-cache pages")
	}
	if errno != 0 {
		t.Fatalf("cachestat %s: %v", path, errno)
	}
	return cs.cache, cs.dirty
}

// DirtiedBy runs write, which must store into pages of the file at path
// that are clean, and returns how many pages are dirty after it. The
// kernel's writeback may clean a page between the store and the count
// (under memory pressure it writes pages back however young); a count of
// zero says nothing, so write runs again, up to five times, and the test
// fails if every count was zero.
func DirtiedBy(t testing.TB, path string, write func()) uint64 {
	t.Helper()
	for range 5 {
		if d := DirtyPages(t, path); d != 0 {
			t.Fatalf("%s has %d dirty pages before the write", path, d)
		}
		write()
		if d := DirtyPages(t, path); d != 0 {
			return d
		}
	}
	t.Fatalf("%s: no page dirty after five writes (writeback cleaned each before the count)", path)
	return 0
}
