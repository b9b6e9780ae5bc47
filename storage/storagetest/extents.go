package storagetest

import (
	"errors"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/internal/testenv"
)

// UnwrittenBytes is how many bytes of [lo, hi) of the file at path lie in
// unwritten extents (preallocated, never written: FIEMAP's
// FIEMAP_EXTENT_UNWRITTEN), as the file system has them now: without
// FIEMAP_FLAG_SYNC, which would write the dirty pages back first and so
// convert the extents it was asked about. A sync of pages there also
// converts their extents. Without FIEMAP (tmpfs, other
// file systems) the test fails under CI=true and is skipped elsewhere
// (testenv.Need).
func UnwrittenBytes(t testing.TB, path string, lo, hi int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const (
		fsIocFiemap  = 0xC020660B // _IOWR('f', 11, struct fiemap)
		extentLast   = 0x1        // FIEMAP_EXTENT_LAST
		extentUnwrit = 0x800      // FIEMAP_EXTENT_UNWRITTEN
		batch        = 64
	)
	type extent struct {
		Logical, Physical, Length uint64
		_                         [2]uint64
		Flags                     uint32
		_                         [3]uint32
	}
	type fiemap struct {
		Start, Length           uint64
		Flags, Mapped, Count, _ uint32
		Extents                 [batch]extent
	}
	var n int64
	for start := uint64(lo); start < uint64(hi); {
		fm := fiemap{Start: start, Length: uint64(hi) - start, Count: batch}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&fm)))
		if errors.Is(errno, unix.EOPNOTSUPP) || errors.Is(errno, unix.ENOTTY) {
			testenv.Need(t, false, "FIEMAP on the test directory's file system, to see unwritten extents")
		}
		if errno != 0 {
			t.Fatalf("FIEMAP %s: %v", path, errno)
		}
		if fm.Mapped == 0 {
			break
		}
		for _, e := range fm.Extents[:fm.Mapped] {
			if e.Flags&extentUnwrit != 0 {
				elo, ehi := max(int64(e.Logical), lo), min(int64(e.Logical+e.Length), hi)
				n += max(0, ehi-elo)
			}
			start = e.Logical + e.Length
			if e.Flags&extentLast != 0 {
				start = uint64(hi)
			}
		}
	}
	return n
}
