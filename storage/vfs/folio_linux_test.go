package vfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/storaged/storaged/internal/testenv"
	"github.com/storaged/storaged/storage/storagetest"
)

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
	for _, how := range []PopulateMode{PopulateWrite, PopulateRead, PopulateZero} {
		t.Run(how.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seg")
			seg, err := Default.CreateSegment(path, size)
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			// As the allocator does: chunk by chunk, then a whole range.
			for lo := int64(0); lo < populated/2; lo += 4 << 20 {
				seg.Populate(lo, lo+4<<20, how)
			}
			seg.Populate(populated/2, populated, how)
			if err := seg.Sync(0, size); err != nil { // every page clean
				t.Fatal(err)
			}
			if n := storagetest.DirtyPages(t, path); n != 0 {
				t.Fatalf("%d pages dirty after a sync of the whole segment", n)
			}
			for _, off := range []int64{populated - 2<<20 + 100, populated/2 - 4096} {
				n := storagetest.DirtiedBy(t, path, func() { seg.Bytes()[off]++ })
				if n != 1 {
					t.Fatalf("a byte written at %d dirtied %d pages: the population left large folios, and each sync would write them whole", off, n)
				}
				if err := seg.Sync(0, size); err != nil {
					t.Fatal(err)
				}
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

// TestEvictThenPopulateSinglePages: a range read through the mapping
// (recovery's check that a file's tail is zero) sits in the large folios
// of the read's readahead, which Populate cannot split; after Evict,
// Populate faults it in page by page, and a put there dirties its own
// page. Without the Evict the put dirties hundreds (on this project's
// machines).
func TestEvictThenPopulateSinglePages(t *testing.T) {
	const size = 64 << 20
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := Default.CreateSegment(path, size)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	var sum byte
	for _, c := range seg.Bytes() { // the read of the whole file
		sum |= c
	}
	if sum != 0 {
		t.Fatal("a new segment is not zero")
	}
	seg.Evict(4096, size)
	seg.Populate(4096, size, PopulateRead)
	if n := storagetest.DirtiedBy(t, path, func() { seg.Bytes()[size-2<<20+100]++ }); n != 1 {
		t.Fatalf("one byte written after Evict and Populate dirtied %d pages: the read's large folios stayed", n)
	}
}

// TestPopulateZeroWritesExtents: PopulateZero leaves the range's extents
// written, the rest of the file's still unwritten, its pages writable
// (dirty again: an append there takes no fault), and the range's
// contents as they were, a byte stored before the population included.
func TestPopulateZeroWritesExtents(t *testing.T) {
	const size, populated = 8 << 20, 4 << 20
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := Default.CreateSegment(path, size)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	if n := storagetest.UnwrittenBytes(t, path, 0, size); n != size {
		t.Fatalf("a new segment has %d bytes in unwritten extents, want all %d (fallocate)", n, size)
	}
	seg.Bytes()[100] = 7 // an append the population runs beside
	seg.Populate(0, populated, PopulateZero)
	if n := storagetest.UnwrittenBytes(t, path, 0, populated); n != 0 {
		t.Errorf("%d bytes of the populated range still in unwritten extents: its zeros were not written", n)
	}
	if n := storagetest.UnwrittenBytes(t, path, populated, size); n != size-populated {
		t.Errorf("%d bytes past the populated range in unwritten extents, want %d: written beyond the range", n, size-populated)
	}
	if n := storagetest.DirtyPages(t, path); n != populated/pageSize {
		t.Errorf("%d pages dirty after the population, want the range's %d: not made writable again after its write-back", n, populated/pageSize)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got[100] != 7 {
		t.Fatalf("the byte stored at 100 is %d after the population, want 7", got[100])
	}
	got[100] = 0
	if i := slices.IndexFunc(got, func(c byte) bool { return c != 0 }); i >= 0 {
		t.Fatalf("byte %d is %d after the population, want 0", i, got[i])
	}
}

// TestSegmentData: Data names every range of a segment that holds a
// written byte, synced or only dirty in the page cache (what a kill -9
// leaves), and leaves out what was never written nor read: recovery then
// reads a crashed run's tail past the end in those ranges only
// (commitlog.zeroFrom). The page cache's pages count as data too, and a
// fault reads around itself (the device's readahead, 4 MiB each way on
// this VM), so a byte written makes up to a few MiB of data; a range
// 40 MiB from every write must be left out. A file system that cannot
// tell holes from data returns everything, which is safe but not what
// the project's machines (ext4) do: the test needs it to tell.
func TestSegmentData(t *testing.T) {
	const size, perWrite = 128 << 20, 16 << 20
	far := Range{80 << 20, 88 << 20}
	for _, tc := range []struct {
		name   string
		writes []int64 // offsets of one byte written through the mapping
		sync   bool
	}{
		{"nothing written", nil, false},
		{"one byte, synced", []int64{40 << 20}, true},
		{"one byte, dirty only", []int64{40 << 20}, false},
		{"three apart, dirty only", []int64{100, 40<<20 + 1, size - 1}, false},
		{"three apart, synced", []int64{100, 40<<20 + 1, size - 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seg")
			seg, err := Default.CreateSegment(path, size)
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			for _, off := range tc.writes {
				seg.Bytes()[off] = 1
			}
			if tc.sync {
				if err := seg.Sync(0, size); err != nil {
					t.Fatal(err)
				}
			}
			rs := seg.Data(0, size)
			var covered int64
			for i, r := range rs {
				if r.Lo >= r.Hi || r.Lo < 0 || r.Hi > size || (i > 0 && r.Lo <= rs[i-1].Hi) {
					t.Fatalf("ranges %v: not in order and apart inside [0, %d)", rs, size)
				}
				covered += r.Hi - r.Lo
			}
			for _, off := range tc.writes {
				if !slices.ContainsFunc(rs, func(r Range) bool { return r.Lo <= off && off < r.Hi }) {
					t.Fatalf("byte %d written, but not in the ranges %v", off, rs)
				}
			}
			testenv.Need(t, covered <= int64(len(tc.writes))*perWrite,
				"a file system that tells holes and unwritten extents from data (lseek SEEK_DATA)")
			if got := seg.Data(far.Lo, far.Hi); len(got) != 0 {
				t.Fatalf("%v was never written nor read, but Data names %v in it (all: %v)", far, got, rs)
			}
		})
	}
}
