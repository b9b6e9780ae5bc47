package vfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkWillNeed reads a cold 64 MiB file through its mapping, one
// byte per page, as raft's Entries copies do for a follower far behind:
// with no advice (the kernel's own readahead on faults), after one
// MADV_WILLNEED for the whole range, and after Populate(PopulateWillNeed),
// which asks in willNeedChunk pieces. The file's pages are dropped from
// the page cache (POSIX_FADV_DONTNEED, unmapped) before each read.
//
//	go test -run '^$' -bench WillNeed -benchtime 5x ./storage/vfs
func BenchmarkWillNeed(b *testing.B) {
	const size = 64 << 20
	path := filepath.Join(b.TempDir(), "cold")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // only clean pages can be dropped
		b.Fatal(err)
	}
	for _, v := range []struct {
		name   string
		advise func(Segment)
	}{
		{"none", func(Segment) {}},
		{"one-call", func(s Segment) { _ = unix.Madvise(s.Bytes(), unix.MADV_WILLNEED) }},
		{"chunked", func(s Segment) { s.Populate(0, size, PopulateWillNeed) }},
	} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(size)
			var sum byte
			for b.Loop() {
				b.StopTimer()
				if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
					b.Fatal(err)
				}
				s, err := Default.OpenSegment(path, size)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				v.advise(s)
				m := s.Bytes()
				for off := 0; off < size; off += pageSize {
					sum += m[off]
				}
				b.StopTimer()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if sum == 1 { // keep the reads
				b.Log(sum)
			}
		})
	}
}
