package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/internal/testenv"
)

// dirtyPages is the number of dirty page-cache pages of f
// (cachestat(2), Linux 6.5+): the kernel counts a dirty folio's every
// page, so it tells how much a sync of f will write.
func dirtyPages(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var (
		rng struct{ off, len uint64 } // len 0: to the end of the file
		cs  struct{ cache, dirty, writeback, evicted, recentlyEvicted uint64 }
	)
	_, _, errno := unix.Syscall6(unix.SYS_CACHESTAT, f.Fd(), uintptr(unsafe.Pointer(&rng)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if errors.Is(errno, unix.ENOSYS) {
		testenv.Need(t, false, "cachestat(2) (Linux 6.5+) to count dirty pages")
	}
	if errno != 0 {
		t.Fatalf("cachestat: %v", errno)
	}
	return cs.dirty
}

// TestPopulateSinglePages: a put into a populated segment dirties the
// page it writes, not a large folio around it, so that a sync writes what
// was put (Populate's doc; BENCHMARKS.md "Large folios: every msync wrote
// megabytes"). Readahead grows folios the farther sequential faults go,
// so the write lands near the end of a 64 MiB range. Where the file
// system has no large folios (tmpfs, older kernels) it passes either way;
// on this project's machines (ext4, Linux 6.18) it fails without the
// MADV_RANDOM around the population. The advice is put back: the mapping
// is one mapping again, not advised random (smaps' "rr"), although its
// last 4 MiB were never populated.
func TestPopulateSinglePages(t *testing.T) {
	const size, populated = 68 << 20, 64 << 20
	for _, how := range []PopulateMode{PopulateWrite, PopulateRead} {
		t.Run(how.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seg")
			seg, err := Default.CreateSegment(path, size)
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			s := seg.(*osSegment)
			// As the allocator does: chunk by chunk, then a whole range.
			for lo := int64(0); lo < populated/2; lo += 4 << 20 {
				seg.Populate(lo, lo+4<<20, how)
			}
			seg.Populate(populated/2, populated, how)
			if err := seg.Sync(0, size); err != nil { // every page clean
				t.Fatal(err)
			}
			if n := dirtyPages(t, s.f); n != 0 {
				t.Fatalf("%d pages dirty after a sync of the whole segment", n)
			}
			for _, off := range []int64{populated - 2<<20 + 100, populated/2 - 4096} {
				seg.Bytes()[off] = 1
			}
			if n := dirtyPages(t, s.f); n != 2 {
				t.Fatalf("two bytes written into two pages dirtied %d pages: the population left large folios, and each sync would write them whole", n)
			}
			smaps, err := os.ReadFile("/proc/self/smaps")
			if err != nil {
				t.Fatal(err)
			}
			var flags []string // VmFlags of each mapping of path
			for _, m := range strings.Split(string(smaps), "\n") {
				if strings.HasSuffix(m, " "+path) {
					flags = append(flags, "")
				} else if f, ok := strings.CutPrefix(m, "VmFlags:"); ok && len(flags) > 0 && flags[len(flags)-1] == "" {
					flags[len(flags)-1] = f + " "
				}
			}
			if len(flags) != 1 || strings.Contains(flags[0], " rr ") {
				t.Fatalf("the segment's mappings after Populate have VmFlags %q, want one mapping without rr (the advice was not put back)", flags)
			}
		})
	}
}
