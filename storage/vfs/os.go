package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Default is the operating system's file system.
var Default FS = osFS{}

type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

func (osFS) ReadDir(dir string) ([]DirEntry, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]DirEntry, 0, len(es))
	for _, e := range es {
		if e.Type().IsRegular() || e.IsDir() {
			out = append(out, DirEntry{Name: e.Name(), IsDir: e.IsDir()})
		}
	}
	return out, nil
}

func (osFS) Size(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (osFS) Remove(path string) error             { return os.Remove(path) }
func (osFS) RemoveAll(path string) error          { return os.RemoveAll(path) }
func (osFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }
func (osFS) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

func (osFS) WriteFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (osFS) CreateSegment(path string, size int64) (Segment, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (Segment, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fail(fmt.Errorf("%w: preallocate %d bytes: %w", ErrNoSpace, size, err))
		}
		return fail(fmt.Errorf("preallocate: %w", err))
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	s, err := mapFile(f, size)
	if err != nil {
		return fail(err)
	}
	return s, nil
}

func (osFS) OpenSegment(path string, size int64) (Segment, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() != size {
		f.Close()
		return nil, fmt.Errorf("%s is %d bytes, want %d", filepath.Base(path), st.Size(), size)
	}
	s, err := mapFile(f, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func mapFile(f *os.File, size int64) (*osSegment, error) {
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &osSegment{f: f, data: data}, nil
}

type osSegment struct {
	f    *os.File
	data []byte
}

func (s *osSegment) Bytes() []byte { return s.data }

const pageSize = 4096

func (s *osSegment) Sync(lo, hi int64) error {
	if hi <= lo {
		return nil
	}
	return unix.Msync(s.data[lo&^(pageSize-1):hi], unix.MS_SYNC)
}

// Populate takes the write faults now (MADV_POPULATE_WRITE, Linux 5.14+),
// not one per page on the put path (MADV_POPULATE_READ, which leaves a
// minor write fault per page, measured 150-250 ns more per 1 KiB put). The
// pages become dirty zeros: the kernel's periodic writeback writes out
// those that no put has overwritten within dirty_expire_centisecs, as
// RocketMQ's warmMappedFile does on purpose. Syncs only ever cover the
// range written.
//
// Both fault the range in with the mapping advised MADV_RANDOM, and put
// the advice back to normal after. A fault in a file mapping otherwise
// goes through the kernel's readahead, which on file systems with large
// folios (ext4 since Linux 6.16, XFS since 5.18) fills the page cache
// with folios of up to 2 MiB, larger the longer the sequential faults go
// on. The kernel tracks dirtiness per folio: a put of 1 KiB then dirties
// the whole folio, and every msync writes all of it to the disk. On this
// project's machine (Linux 6.18, ext4) a sync single node wrote 40 times
// the bytes it stored, and a group's members, flushing one disk, waited
// on each other's megabytes (BENCHMARKS.md "Large folios: every msync
// wrote megabytes"). Under MADV_RANDOM a fault reads no ahead and adds one
// page, so a sync writes the pages a put wrote. The advice is put back
// because it also governs faults that read: a reader that later faults
// in written pages the kernel evicted gets the usual readahead.
// PopulateWillNeed's MADV_WILLNEED adds single pages as it is (checked
// with cachestat: one page dirty per byte written); PopulateOff leaves
// the writer to take the faults itself, through readahead: large folios
// again (512 pages dirty for one byte; an A/B mode only).
//
// PopulateZero populates as PopulateWrite, writes the range back
// (writeBack) and populates it writable again: a page is faulted twice,
// off the put path, and written twice, the zeros and then the records.
//
// PopulateRead and PopulateWillNeed leave the pages clean (nothing for
// writeback until a put writes them); as allocator modes they are there
// for the A/B of BENCHMARKS.md ("Allocator population and sync-mode
// msync"). PopulateWillNeed is also the read ahead of a reader
// (segment.File.WillNeed).
func (s *osSegment) Populate(lo, hi int64, how PopulateMode) {
	advice := unix.MADV_POPULATE_WRITE
	switch how {
	case PopulateRead:
		advice = unix.MADV_POPULATE_READ
	case PopulateWillNeed:
		// The kernel reads about its readahead size per WILLNEED call,
		// no more: one call for 64 MiB read 8 MiB of it on a disk with
		// read_ahead_kb 8192, calls of 128 KiB to 8 MiB read all of it
		// (BENCHMARKS.md, "Reading ahead of a follower"). So the range
		// goes in small calls.
		lo &^= pageSize - 1
		for lo < hi {
			end := min(hi, lo+willNeedChunk)
			_ = unix.Madvise(s.data[lo:end], unix.MADV_WILLNEED)
			lo = end
		}
		return
	case PopulateOff:
		return
	}
	lo &^= pageSize - 1
	r := s.data[lo:hi]
	_ = unix.Madvise(r, unix.MADV_RANDOM)
	_ = unix.Madvise(r, advice)
	if how == PopulateZero && s.writeBack(lo, hi) == nil {
		// Written back, the pages are clean and write-protected again:
		// fault them writable once more, so that appends take no fault.
		_ = unix.Madvise(r, advice)
	}
	_ = unix.Madvise(r, unix.MADV_NORMAL)
}

// writeBack writes bytes [lo, hi) of the file to the disk and waits for
// it, through a descriptor of its own: the dirty zeros of a populated
// range (or what an append already stored there; the contents do not
// change, so it may run while the range is being written). The kernel
// converts the range's unwritten extents when the writes complete, and
// the commitlog's next sync writes that metadata down with its own.
// Why its own descriptor: the kernel reports a failed write-back once per
// open file (errseq), to whichever of its syncs asks first. Through the
// mapping's descriptor an error met here, perhaps one of a put's pages
// the kernel's flusher wrote, would be taken from the commitlog's next
// msync, and a lost write acked. Through another, the msync still sees
// it; an error here only leaves the range to be converted by that msync.
func (s *osSegment) writeBack(lo, hi int64) error {
	f, err := os.OpenFile(s.f.Name(), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.SyncFileRange(int(f.Fd()), lo, hi-lo,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}

// Evict: MADV_DONTNEED takes the pages out of this mapping (for a shared
// file mapping it only unmaps: the page cache keeps the contents and any
// dirtiness), after which POSIX_FADV_DONTNEED can drop them from the page
// cache, which it does only for pages no mapping holds and that are
// clean. A large folio that reaches outside [lo, hi) stays.
func (s *osSegment) Evict(lo, hi int64) {
	lo = (lo + pageSize - 1) &^ (pageSize - 1)
	hi &^= pageSize - 1
	if hi <= lo {
		return
	}
	_ = unix.Madvise(s.data[lo:hi], unix.MADV_DONTNEED)
	_ = unix.Fadvise(int(s.f.Fd()), lo, hi-lo, unix.FADV_DONTNEED)
}

// Data asks the file system with lseek: SEEK_DATA finds the next byte
// that may not be zero, SEEK_HOLE the end of its run. ENXIO from
// SEEK_DATA says nothing but zeros follows; any other error, or a file
// system without the two (Linux then calls all of the file data, to its
// end), returns what is left whole. The seeks move the file's offset,
// which nothing else uses: the segment is read and written through its
// mapping.
func (s *osSegment) Data(lo, hi int64) []Range {
	var out []Range
	fd := int(s.f.Fd())
	for off := lo; off < hi; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return out
		}
		if err != nil {
			return append(out, Range{off, hi})
		}
		if d >= hi {
			return out
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil || h <= d {
			return append(out, Range{d, hi})
		}
		out = append(out, Range{d, min(h, hi)})
		off = h
	}
	return out
}

// willNeedChunk is the most one MADV_WILLNEED asks for: the kernel's
// default readahead (128 KiB), which a device's own is rarely below.
const willNeedChunk = 128 << 10

func (s *osSegment) Close() error {
	var errs []error
	if s.data != nil {
		errs = append(errs, unix.Munmap(s.data))
		s.data = nil
	}
	errs = append(errs, s.f.Close())
	return errors.Join(errs...)
}

func (osFS) OpenFile(path string, create bool) (File, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, noSpace(err)
	}
	return osFile{f}, nil
}

// noSpace marks ENOSPC (and EDQUOT, a full quota) with ErrNoSpace.
func noSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

type osFile struct{ f *os.File }

func (o osFile) ReadAt(p []byte, off int64) (int, error) { return o.f.ReadAt(p, off) }

func (o osFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := o.f.WriteAt(p, off)
	return n, noSpace(err)
}

func (o osFile) Truncate(size int64) error { return noSpace(o.f.Truncate(size)) }

func (o osFile) Sync() error {
	if err := unix.Fdatasync(int(o.f.Fd())); err != nil {
		return &os.PathError{Op: "fdatasync", Path: o.f.Name(), Err: noSpace(err)}
	}
	return nil
}

func (o osFile) Close() error { return o.f.Close() }

func (osFS) Lock(path string) (io.Closer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return f, nil
}
