package segment

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// PageSize is the unit the flush policies count dirty data in.
const PageSize = 4096

// File is one commitlog file: fixed size, preallocated, mapped shared and
// read-write through a vfs.Segment. Appends happen under the commitlog's
// append lock; the positions are atomics so flushers and readers need no
// lock.
type File struct {
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

	// wakeAt, when above 0, is the append position at which the
	// allocator, waiting with this file's population window full, wants to
	// be woken on wake (Publish does it, once).
	wakeAt atomic.Int64
	wake   atomic.Pointer[chan struct{}]
	// popTo is how far the allocator has populated the file.
	popTo atomic.Int64
}

// FileName is the 20-digit zero-padded start offset (UtilAll.offset2FileName).
func FileName(from int64) string {
	return fmt.Sprintf("%020d", from)
}

func ParseFileName(name string) (int64, bool) {
	if len(name) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(name, 10, 64)
	return n, err == nil && n >= 0
}

// Create creates, preallocates, syncs and maps the file starting
// at from, then syncs the directory so the file survives a power cut once
// its data is synced. Preallocation means a full disk is an error here,
// never a SIGBUS on a later page fault. The allocator then faults the
// mapping in for writing (populate), off the put path.
func Create(fs vfs.FS, dir string, from, size int64) (*File, error) {
	path := filepath.Join(dir, FileName(from))
	seg, err := fs.CreateSegment(path, size)
	if err != nil {
		if errors.Is(err, vfs.ErrNoSpace) {
			return nil, fmt.Errorf("%w: %w: create %s: %w", base.ErrCreateFile, base.ErrDiskFull, FileName(from), err)
		}
		return nil, fmt.Errorf("%w: create %s: %w", base.ErrCreateFile, FileName(from), err)
	}
	if err := fs.SyncDir(dir); err != nil {
		seg.Close()
		fs.Remove(path)
		return nil, fmt.Errorf("%w: sync dir: %w", base.ErrCreateFile, err)
	}
	return &File{fs: fs, path: path, from: from, size: size, seg: seg, data: seg.Bytes()}, nil
}

// Open maps an existing file. Its positions start at size (full);
// recovery sets them.
func Open(fs vfs.FS, path string, from, size int64) (*File, error) {
	seg, err := fs.OpenSegment(path, size)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w (is the configured file size %d right?)", filepath.Base(path), err, size)
	}
	m := &File{fs: fs, path: path, from: from, size: size, seg: seg, data: seg.Bytes()}
	m.wrote.Store(size)
	m.flushed.Store(size)
	return m, nil
}

// full reports whether no more records fit (an END_OF_FILE blank was
// written or the file ends exactly).
func (m *File) Full() bool { return m.wrote.Load() >= m.size }

// flush syncs the pages between the flushed and the write position when at
// least leastPages pages are dirty (or the file is full, or leastPages is
// 0 and anything is dirty). It returns the flushed position.
// REQUIRES: one caller at a time (the queue's sync lock).
func (m *File) Flush(leastPages int) (int64, error) {
	wrote := m.wrote.Load()
	flushed := m.flushed.Load()
	if wrote <= flushed {
		return flushed, nil
	}
	if leastPages > 0 && wrote < m.size && wrote/PageSize-flushed/PageSize < int64(leastPages) {
		return flushed, nil
	}
	if err := m.seg.Sync(flushed, wrote); err != nil {
		return flushed, fmt.Errorf("msync %s [%d, %d): %w", filepath.Base(m.path), flushed, wrote, err)
	}
	m.flushed.Store(wrote)
	return wrote, nil
}

// sync makes bytes [lo, hi) durable.
func (m *File) Sync(lo, hi int64) error {
	if err := m.seg.Sync(lo, hi); err != nil {
		return fmt.Errorf("msync %s [%d, %d): %w", filepath.Base(m.path), lo, hi, err)
	}
	return nil
}

// populate faults bytes [lo, hi) in the way how says unless the file is
// closed.
func (m *File) populate(lo, hi int64, how vfs.PopulateMode) {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	if m.seg != nil {
		m.seg.Populate(lo, hi, how)
	}
}

// Evict drops the clean pages of bytes [lo, hi) from the page cache
// (vfs.Segment.Evict) unless the file is closed: recovery, after reading
// the zero tail of the file it will append to, so that the allocator's
// population faults the tail in afresh, page by page.
func (m *File) Evict(lo, hi int64) {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	if m.seg != nil {
		m.seg.Evict(lo, hi)
	}
}

// DataRanges is vfs.Segment.Data of the file's bytes [lo, hi): the
// ranges that may hold bytes other than zero. Of a closed file nothing
// can be told, so all of [lo, hi) is returned, as vfs.Segment.Data does
// where the file system cannot tell: a caller proving bytes zero never
// takes a closed file for an empty one.
func (m *File) DataRanges(lo, hi int64) []vfs.Range {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	if m.seg == nil {
		if hi <= lo {
			return nil
		}
		return []vfs.Range{{Lo: lo, Hi: hi}}
	}
	return m.seg.Data(lo, hi)
}

// unmapped: the file was closed (or removed).
func (m *File) unmapped() bool {
	m.popMu.Lock()
	defer m.popMu.Unlock()
	return m.seg == nil
}

// WillNeed asks the kernel to read bytes [lo, hi) of the file into the
// page cache without waiting for them (MADV_WILLNEED): a reader about to
// walk data that may be cold (a raft leader catching a follower up from
// old files) then finds the pages there instead of faulting each one in
// from the disk while it holds its locks. It maps nothing and dirties
// nothing; a closed file is left alone.
func (m *File) WillNeed(lo, hi int64) {
	m.populate(lo, hi, vfs.PopulateWillNeed)
}

// close unmaps and closes the file. It does not flush.
func (m *File) Close() error {
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
func (m *File) Remove() error {
	err := m.Close()
	if rerr := m.fs.Remove(m.path); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// From is the commitlog offset of the file's first byte.
func (m *File) From() int64 { return m.from }

// Size is the file's size in bytes.
func (m *File) Size() int64 { return m.size }

// End is the commitlog offset just past the file.
func (m *File) End() int64 { return m.from + m.size }

// Path is the file's path.
func (m *File) Path() string { return m.path }

// Name is the file's name: FileName(From()).
func (m *File) Name() string { return FileName(m.from) }

// Data is the mapping (nil once closed). Bytes below Wrote hold complete
// records; a reader must hold the list's read guard (List.Read) while it
// uses them, so that retention does not unmap the file meanwhile.
func (m *File) Data() []byte { return m.data }

// Wrote is the append position: bytes [0, Wrote) hold complete records.
func (m *File) Wrote() int64 { return m.wrote.Load() }

// Publish moves the append position to pos, after the bytes below it are
// copied: readers see them from then on.
func (m *File) Publish(pos int64) {
	m.wrote.Store(pos)
	if w := m.wakeAt.Load(); w > 0 && pos >= w && m.wakeAt.CompareAndSwap(w, 0) {
		if c := m.wake.Load(); c != nil {
			select {
			case *c <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
	}
}

// PopulatedTo is how far the allocator has faulted the file in: bytes
// below it were populated, or the writer passed them first.
func (m *File) PopulatedTo() int64 { return m.popTo.Load() }

// wakeWhen has Publish signal c once the append position reaches pos.
func (m *File) wakeWhen(pos int64, c *chan struct{}) {
	m.wake.Store(c)
	m.wakeAt.Store(pos)
}

// Flushed is the position up to which a sync has returned.
func (m *File) Flushed() int64 { return m.flushed.Load() }

// SetPositions sets both positions (recovery, truncation).
func (m *File) SetPositions(wrote, flushed int64) {
	m.wrote.Store(wrote)
	m.flushed.Store(flushed)
}
