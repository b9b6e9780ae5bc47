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
	// Populate faults bytes [lo, hi) of the mapping in for writing, best
	// effort, so appends there do not page-fault. It does not change their
	// contents, so it may run while the same range is being written.
	Populate(lo, hi int64)
	// Close unmaps and closes; it does not sync.
	Close() error
}

var (
	// ErrNoSpace wraps ENOSPC from preallocation.
	ErrNoSpace = errors.New("vfs: no space left on device")
	// ErrLocked is returned by Lock when the lock is held.
	ErrLocked = errors.New("vfs: locked")
	// ErrInjected is the error MemFS injectors return by default.
	ErrInjected = errors.New("vfs: injected error")
)
