package storage

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/storaged/storaged/storage/vfs"
)

const pageSize = 4096

// mappedFile is one commitlog (or consume-queue) file: fixed size,
// preallocated, mapped shared and read-write through a vfs.Segment. Appends
// happen under the store's put lock; the positions are atomics so flushers
// and readers need no lock.
type mappedFile struct {
	fs   vfs.FS
	path string
	from int64 // offset of byte 0
	size int64
	seg  vfs.Segment
	data []byte // the mapping, len == size

	// popMu serialises the allocator's background population with close,
	// so a range is never populated after it is unmapped.
	popMu sync.Mutex

	// wrote is the append position: bytes [0, wrote) hold complete records.
	// It is published with an atomic store only after the bytes are copied.
	wrote atomic.Int64
	// flushed is the position up to which a sync has returned.
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
// at from, then syncs the directory so the file survives a power cut once
// its data is synced. Preallocation means a full disk is an error here,
// never a SIGBUS on a later page fault. The allocator then faults the
// mapping in for writing (populate), off the put path.
func createMappedFile(fs vfs.FS, dir string, from, size int64) (*mappedFile, error) {
	path := filepath.Join(dir, fileName(from))
	seg, err := fs.CreateSegment(path, size)
	if err != nil {
		if errors.Is(err, vfs.ErrNoSpace) {
			return nil, fmt.Errorf("%w: %w: create %s: %w", ErrCreateFile, ErrDiskFull, fileName(from), err)
		}
		return nil, fmt.Errorf("%w: create %s: %w", ErrCreateFile, fileName(from), err)
	}
	if err := fs.SyncDir(dir); err != nil {
		seg.Close()
		fs.Remove(path)
		return nil, fmt.Errorf("%w: sync dir: %w", ErrCreateFile, err)
	}
	return &mappedFile{fs: fs, path: path, from: from, size: size, seg: seg, data: seg.Bytes()}, nil
}

// openMappedFile maps an existing file. Its positions start at size (full);
// recovery sets them.
func openMappedFile(fs vfs.FS, path string, from, size int64) (*mappedFile, error) {
	seg, err := fs.OpenSegment(path, size)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w (is the configured file size %d right?)", filepath.Base(path), err, size)
	}
	m := &mappedFile{fs: fs, path: path, from: from, size: size, seg: seg, data: seg.Bytes()}
	m.wrote.Store(size)
	m.flushed.Store(size)
	return m, nil
}

// full reports whether no more records fit (an END_OF_FILE blank was
// written or the file ends exactly).
func (m *mappedFile) full() bool { return m.wrote.Load() >= m.size }

// flush syncs the pages between the flushed and the write position when at
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
	if err := m.seg.Sync(flushed, wrote); err != nil {
		return flushed, fmt.Errorf("msync %s [%d, %d): %w", filepath.Base(m.path), flushed, wrote, err)
	}
	m.flushed.Store(wrote)
	return wrote, nil
}

// sync makes bytes [lo, hi) durable.
func (m *mappedFile) sync(lo, hi int64) error {
	if err := m.seg.Sync(lo, hi); err != nil {
		return fmt.Errorf("msync %s [%d, %d): %w", filepath.Base(m.path), lo, hi, err)
	}
	return nil
}

// populate faults bytes [lo, hi) in for writing unless the file is closed.
func (m *mappedFile) populate(lo, hi int64) {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	if m.seg != nil {
		m.seg.Populate(lo, hi)
	}
}

// close unmaps and closes the file. It does not flush.
func (m *mappedFile) close() error {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	if m.seg == nil {
		return nil
	}
	err := m.seg.Close()
	m.seg, m.data = nil, nil
	if err != nil {
		return fmt.Errorf("close %s: %w", filepath.Base(m.path), err)
	}
	return nil
}

// remove closes and deletes the file (the caller syncs the directory).
func (m *mappedFile) remove() error {
	err := m.close()
	if rerr := m.fs.Remove(m.path); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

func syncDir(fs vfs.FS, dir string) error {
	if err := fs.SyncDir(dir); err != nil {
		return fmt.Errorf("sync dir %s: %w", filepath.Base(dir), err)
	}
	return nil
}
