// Package vfs is the file-system seam under the store: every file, mapping
// and sync the storage package does goes through an FS. Production uses
// Default (the OS, mmap and msync via golang.org/x/sys/unix); tests use
// MemFS, which keeps a durable shadow of every file and can produce the
// image a power cut would leave (Crash), and can inject errors.
//
// Writes to a segment go straight into the slice Bytes returns, as they go
// into an mmap; only Sync makes them durable.
package vfs

import (
	"errors"
	"fmt"
	"io"
)

// FS is what the store needs from a file system.
type FS interface {
	// MkdirAll creates dir and its parents.
	MkdirAll(dir string) error
	// ReadDir lists dir. A missing dir is an error wrapping fs.ErrNotExist.
	ReadDir(dir string) ([]DirEntry, error)
	// Size returns the size of the file at path.
	Size(path string) (int64, error)
	// Remove deletes a file; RemoveAll a tree. Neither syncs the directory.
	Remove(path string) error
	RemoveAll(path string) error
	// Rename renames without syncing the directory.
	Rename(oldpath, newpath string) error
	// ReadFile returns a file's contents.
	ReadFile(path string) ([]byte, error)
	// WriteFile creates or truncates path, writes data and syncs the file
	// (not its directory).
	WriteFile(path string, data []byte) error
	// SyncDir makes the directory's entries (creates, removes, renames)
	// durable.
	SyncDir(dir string) error
	// CreateSegment creates path (it must not exist), preallocates size
	// bytes (a full disk fails here, with an error wrapping ErrNoSpace),
	// syncs the file and maps it. The directory is not synced.
	CreateSegment(path string, size int64) (Segment, error)
	// OpenSegment maps an existing file of exactly size bytes.
	OpenSegment(path string, size int64) (Segment, error)
	// Lock takes an exclusive lock on path (created if needed); a second
	// Lock on it, from this or another process, fails with ErrLocked.
	Lock(path string) (io.Closer, error)
	// OpenFile opens path for positioned reads and writes (pread/pwrite,
	// no mapping), creating it empty when create is set and it does not
	// exist. Neither the new file nor its directory entry is synced.
	OpenFile(path string, create bool) (File, error)
}

// File is a file read and written at offsets, without a mapping: it grows
// as it is written, and a full disk is an error from WriteAt (wrapping
// ErrNoSpace), never a SIGBUS on a later page fault. The consume queues use
// it, so that an idle queue costs neither a mapping nor preallocated disk.
type File interface {
	// ReadAt reads len(p) bytes at off; fewer only with an error (io.EOF
	// past the end).
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at off, growing the file as needed. Not durable
	// until Sync.
	WriteAt(p []byte, off int64) (int, error)
	// Truncate sets the file's size. Not durable until Sync.
	Truncate(size int64) error
	// Sync makes the file's contents and size durable (fdatasync), not
	// its directory entry.
	Sync() error
	// Close closes the file; it does not sync.
	Close() error
}

// DirEntry is one entry of a directory.
type DirEntry struct {
	Name  string
	IsDir bool
}

// Segment is a mapped, fixed-size file.
type Segment interface {
	// Bytes is the mapping. Writes to it are not durable until Sync.
	Bytes() []byte
	// Sync makes bytes [lo, hi) durable (msync; widened to pages).
	Sync(lo, hi int64) error
	// Populate faults bytes [lo, hi) of the mapping in the way how says,
	// best effort, so appends there take no (or a cheaper) page fault. It
	// does not change their contents, so it may run while the same range
	// is being written. PopulateOff does nothing.
	Populate(lo, hi int64, how PopulateMode)
	// Evict drops the clean pages of [lo, hi) (narrowed to whole pages)
	// from the mapping and from the page cache, best effort; dirty pages
	// stay, and the contents do not change. Recovery reads the zero tail
	// of the last commitlog file to check it, and that read's readahead
	// leaves the tail in large folios, which every later sync of a put
	// there would write whole; evicted, the tail is faulted in afresh by
	// Populate, page by page (Populate's doc in os.go).
	Evict(lo, hi int64)
	// Data returns the ranges of [lo, hi) that may hold bytes other than
	// zero, in order and apart. The rest reads as zeros without being
	// read: holes, and unwritten extents with nothing in the page cache
	// (lseek's SEEK_DATA and SEEK_HOLE). Where the file system cannot
	// tell, [lo, hi) is returned whole. Recovery proves the last file's
	// tail zero after a crash, and most of a 1 GiB file's tail was never
	// written: reading it all through the mapping took 2 s of every
	// restart (commitlog's cutTail).
	Data(lo, hi int64) []Range
	// Close unmaps and closes; it does not sync.
	Close() error
}

// Range is the bytes [Lo, Hi) of a file.
type Range struct{ Lo, Hi int64 }

// PopulateMode says how the allocator faults in a commitlog file ahead of
// the writer (Segment.Populate).
type PopulateMode uint8

const (
	// PopulateWrite maps the pages writable now (MADV_POPULATE_WRITE,
	// Linux 5.14+): appends take no fault, and the pages are dirty zeros
	// until a put overwrites them. The default.
	PopulateWrite PopulateMode = iota
	// PopulateRead maps the pages read-only now (MADV_POPULATE_READ): the
	// pages stay clean, and the first append to each takes a
	// write-protect fault (ext4's page_mkwrite).
	PopulateRead
	// PopulateWillNeed only reads the range into the page cache
	// (MADV_WILLNEED): nothing is mapped and nothing dirtied; the first
	// append to each page takes a full minor fault.
	PopulateWillNeed
	// PopulateOff populates nothing: the first append to each page takes
	// the fault (~15 µs per page on ext4 here for an unwritten extent).
	PopulateOff
	// PopulateZero is PopulateWrite with the range's zeros written to the
	// disk first: the file's unwritten extents there become written ones,
	// so a later sync of a put there writes its pages and nothing else.
	// A sync of pages in an unwritten extent also converts the extent and
	// writes the inode, and waits for both: on this project's machine
	// that made a small msync 1.4-2x as slow (BENCHMARKS.md, "Corrected:
	// the files prepared page by page"). The price is every byte written
	// twice.
	PopulateZero
)

// Writable reports whether the mode leaves the pages writable (dirty
// zeros): PopulateWrite and PopulateZero.
func (m PopulateMode) Writable() bool { return m == PopulateWrite || m == PopulateZero }

// String is the mode's name.
func (m PopulateMode) String() string {
	switch m {
	case PopulateWrite:
		return "write"
	case PopulateRead:
		return "read"
	case PopulateWillNeed:
		return "willneed"
	case PopulateOff:
		return "off"
	case PopulateZero:
		return "zero"
	}
	return fmt.Sprintf("PopulateMode(%d)", uint8(m))
}

// ParsePopulateMode parses a mode's name (String's output).
func ParsePopulateMode(s string) (PopulateMode, error) {
	for m := PopulateWrite; m <= PopulateZero; m++ {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("vfs: unknown populate mode %q (want write, read, willneed, off or zero)", s)
}

var (
	// ErrNoSpace wraps ENOSPC from preallocation.
	ErrNoSpace = errors.New("vfs: no space left on device")
	// ErrLocked is returned by Lock when the lock is held.
	ErrLocked = errors.New("vfs: locked")
	// ErrInjected is the error MemFS injectors return by default.
	ErrInjected = errors.New("vfs: injected error")
)
