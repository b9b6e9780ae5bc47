package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

const pageSize = 4096

// mappedFile is one commitlog file: fixed size, preallocated, mapped shared
// and read-write. Appends happen under the store's put lock; the positions
// are atomics so flushers and readers need no lock.
type mappedFile struct {
	path string
	from int64 // commitlog offset of byte 0
	size int64
	f    *os.File
	data []byte // the mapping, len == size

	// wrote is the append position: bytes [0, wrote) hold complete records.
	// It is published with an atomic store only after the bytes are copied.
	wrote atomic.Int64
	// flushed is the position up to which an msync has returned.
	flushed atomic.Int64
}

// fileName is the 20-digit zero-padded start offset (UtilAll.offset2FileName).
func fileName(from int64) string {
	return fmt.Sprintf("%020d", from)
}

func parseFileName(name string) (int64, bool) {
	if len(name) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(name, 10, 64)
	return n, err == nil && n >= 0
}

// createMappedFile creates, preallocates, syncs and maps the file starting
// at from. Preallocation means a full disk is an error here, never a SIGBUS
// on a later page fault. The directory is synced so the file survives a
// power cut once its data is synced.
func createMappedFile(dir string, from, size int64, populate bool) (*mappedFile, error) {
	path := filepath.Join(dir, fileName(from))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: create %s: %w", ErrCreateFile, fileName(from), err)
	}
	fail := func(err error) (*mappedFile, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fail(fmt.Errorf("%w: %w: preallocate %s (%d bytes): %w", ErrCreateFile, ErrDiskFull, fileName(from), size, err))
		}
		return fail(fmt.Errorf("%w: preallocate %s: %w", ErrCreateFile, fileName(from), err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("%w: sync %s: %w", ErrCreateFile, fileName(from), err))
	}
	if err := syncDir(dir); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrCreateFile, err))
	}
	m, err := mapFile(f, path, from, size, populate)
	if err != nil {
		return fail(err)
	}
	return m, nil
}

// openMappedFile maps an existing file. Its positions start at size (full);
// recovery sets them.
func openMappedFile(path string, from, size int64) (*mappedFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", filepath.Base(path), err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("storage: stat %s: %w", filepath.Base(path), err)
	}
	if st.Size() != size {
		f.Close()
		return nil, fmt.Errorf("storage: commitlog file %s is %d bytes, the configured file size is %d", filepath.Base(path), st.Size(), size)
	}
	m, err := mapFile(f, path, from, size, false)
	if err != nil {
		f.Close()
		return nil, err
	}
	m.wrote.Store(size)
	m.flushed.Store(size)
	return m, nil
}

func mapFile(f *os.File, path string, from, size int64, populate bool) (*mappedFile, error) {
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap %s: %w", ErrCreateFile, filepath.Base(path), err)
	}
	if populate {
		// Take the write faults now, in the allocator, not one per page on
		// the put path (RocketMQ warmMappedFile, without writing zeros).
		// The pages become dirty zeros; a flush only ever syncs the range
		// written, so they cost writeback only if the file is left unused.
		// Best effort: kernels before 5.14 lack MADV_POPULATE_WRITE.
		_ = unix.Madvise(data, unix.MADV_POPULATE_WRITE)
	}
	return &mappedFile{path: path, from: from, size: size, f: f, data: data}, nil
}

// full reports whether no more records fit (an END_OF_FILE blank was
// written or the file ends exactly).
func (m *mappedFile) full() bool { return m.wrote.Load() >= m.size }

// flush msyncs the pages between the flushed and the write position when at
// least leastPages pages are dirty (or the file is full, or leastPages is
// 0 and anything is dirty). It returns the flushed position.
// REQUIRES: one caller at a time (the queue's sync lock).
func (m *mappedFile) flush(leastPages int) (int64, error) {
	wrote := m.wrote.Load()
	flushed := m.flushed.Load()
	if wrote <= flushed {
		return flushed, nil
	}
	if leastPages > 0 && wrote < m.size && wrote/pageSize-flushed/pageSize < int64(leastPages) {
		return flushed, nil
	}
	start := flushed &^ (pageSize - 1)
	if err := unix.Msync(m.data[start:wrote], unix.MS_SYNC); err != nil {
		return flushed, fmt.Errorf("msync %s [%d, %d): %w", filepath.Base(m.path), start, wrote, err)
	}
	m.flushed.Store(wrote)
	return wrote, nil
}

// close unmaps and closes the file. It does not flush.
func (m *mappedFile) close() error {
	var errs []error
	if m.data != nil {
		if err := unix.Munmap(m.data); err != nil {
			errs = append(errs, fmt.Errorf("munmap %s: %w", filepath.Base(m.path), err))
		}
		m.data = nil
	}
	if err := m.f.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove closes and deletes the file.
func (m *mappedFile) remove() error {
	err := m.close()
	if rerr := os.Remove(m.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir for sync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", filepath.Base(dir), err)
	}
	return nil
}

// lockDir takes an exclusive, non-blocking flock on dir/lock so that a
// second process on the same data dir fails at Open.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("storage: open lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("storage: lock data dir: %w", err)
	}
	return f, nil
}

// msyncRange msyncs data[lo:hi], widened to page boundaries.
func msyncRange(data []byte, lo, hi int64) error {
	return unix.Msync(data[lo&^(pageSize-1):hi], unix.MS_SYNC)
}
