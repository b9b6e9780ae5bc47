package vfs

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Op names an operation an Injector can fail.
type Op int

// The operations MemFS can fail.
const (
	OpCreateSegment Op = iota // ENOSPC-like: preallocation
	OpSync                    // EIO-like: msync of a segment
	OpWriteFile
	OpSyncDir
	OpRename
	OpRemove
	OpPopulate // cannot fail; an injector can block it or count calls
	OpOpenFile // OpenFile: EMFILE-like, or ENOSPC-like when creating
	OpFileWrite
	OpFileSync
	OpFileRead // File.ReadAt: EIO-like, or counted
)

func (o Op) String() string {
	return [...]string{"create-segment", "sync", "write-file", "sync-dir", "rename", "remove", "populate",
		"open-file", "file-write", "file-sync", "file-read"}[o]
}

// Injector decides whether an operation fails: a non-nil error is returned
// by the operation, which then has no effect.
type Injector func(op Op, path string) error

// OnCall returns an Injector that fails the n-th call (1-based) of op with
// err, and every later one when sticky.
func OnCall(op Op, n int, err error, sticky bool) Injector {
	var mu sync.Mutex
	count := 0
	return func(o Op, _ string) error {
		if o != op {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		count++
		if count == n || (sticky && count > n) {
			return err
		}
		return nil
	}
}

// MemFS is an in-memory FS that remembers what is durable. Segment bytes
// live on the heap (so the race detector sees them, unlike an mmap), with a
// durable shadow that Sync updates; the directory entries that survive a
// crash are those present at the directory's last SyncDir. Crash returns
// the image a power cut would leave.
type MemFS struct {
	mu      sync.Mutex
	files   map[string]*memFile            // current namespace
	durable map[string]map[string]*memFile // dir -> entries at its last SyncDir
	dirs    map[string]bool
	locks   map[string]bool
	inject  Injector
	// populated, if set, sees every Segment.Populate with its range
	// (OnPopulate).
	populated func(path string, lo, hi int64, how PopulateMode)
	// SegmentsClosed counts Close calls on segments (leak checks).
	open int
	// openFiles counts Files opened and not closed; written counts the
	// bytes written through WriteFile and File.WriteAt.
	openFiles int
	written   int64
}

type memFile struct {
	mu      sync.Mutex
	data    []byte // current contents (the mapping, for a segment)
	durable []byte // what survives a crash
}

// NewMem returns an empty MemFS.
func NewMem() *MemFS {
	return &MemFS{files: map[string]*memFile{}, durable: map[string]map[string]*memFile{},
		dirs: map[string]bool{"/": true, ".": true}, locks: map[string]bool{}}
}

// SetInjector installs (or, with nil, removes) an error injector.
func (m *MemFS) SetInjector(in Injector) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inject = in
}

// OnPopulate installs (or, with nil, removes) fn, which sees every
// Segment.Populate call with its path, range and mode: the ranges a test
// expects a reader to have asked for ahead (segment.File.WillNeed).
func (m *MemFS) OnPopulate(fn func(path string, lo, hi int64, how PopulateMode)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.populated = fn
}

func (m *MemFS) fail(op Op, path string) error {
	if m.inject == nil {
		return nil
	}
	if err := m.inject(op, path); err != nil {
		return fmt.Errorf("%s %s: %w", op, filepath.Base(path), err)
	}
	return nil
}

func clean(p string) string { return filepath.Clean(p) }

func notExist(op, path string) error {
	return &fs.PathError{Op: op, Path: path, Err: fs.ErrNotExist}
}

// MkdirAll implements FS. Directories are durable at once (the store
// creates them before anything that depends on them).
func (m *MemFS) MkdirAll(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for d := clean(dir); ; d = filepath.Dir(d) {
		m.dirs[d] = true
		if d == filepath.Dir(d) {
			break
		}
	}
	return nil
}

// ReadDir implements FS.
func (m *MemFS) ReadDir(dir string) ([]DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir = clean(dir)
	if !m.dirs[dir] {
		return nil, notExist("readdir", dir)
	}
	seen := map[string]bool{}
	var out []DirEntry
	for p := range m.files {
		if filepath.Dir(p) == dir {
			out = append(out, DirEntry{Name: filepath.Base(p)})
		}
	}
	for d := range m.dirs {
		if filepath.Dir(d) == dir && d != dir && !seen[d] {
			seen[d] = true
			out = append(out, DirEntry{Name: filepath.Base(d), IsDir: true})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Size implements FS.
func (m *MemFS) Size(path string) (int64, error) {
	m.mu.Lock()
	f := m.files[clean(path)]
	m.mu.Unlock()
	if f == nil {
		return 0, notExist("stat", path)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(len(f.data)), nil
}

// Remove implements FS.
func (m *MemFS) Remove(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail(OpRemove, path); err != nil {
		return err
	}
	path = clean(path)
	if _, ok := m.files[path]; !ok {
		if m.dirs[path] {
			delete(m.dirs, path)
			return nil
		}
		return notExist("remove", path)
	}
	delete(m.files, path)
	return nil
}

// RemoveAll implements FS.
func (m *MemFS) RemoveAll(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	path = clean(path)
	prefix := path + string(filepath.Separator)
	for p := range m.files {
		if p == path || strings.HasPrefix(p, prefix) {
			delete(m.files, p)
		}
	}
	for d := range m.dirs {
		if d == path || strings.HasPrefix(d, prefix) {
			delete(m.dirs, d)
		}
	}
	return nil
}

// Rename implements FS.
func (m *MemFS) Rename(oldpath, newpath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail(OpRename, newpath); err != nil {
		return err
	}
	f := m.files[clean(oldpath)]
	if f == nil {
		return notExist("rename", oldpath)
	}
	delete(m.files, clean(oldpath))
	m.files[clean(newpath)] = f
	return nil
}

// ReadFile implements FS.
func (m *MemFS) ReadFile(path string) ([]byte, error) {
	m.mu.Lock()
	f := m.files[clean(path)]
	m.mu.Unlock()
	if f == nil {
		return nil, notExist("open", path)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return bytes.Clone(f.data), nil
}

// WriteFile implements FS: the contents are synced, the entry is not.
func (m *MemFS) WriteFile(path string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail(OpWriteFile, path); err != nil {
		return err
	}
	path = clean(path)
	if !m.dirs[filepath.Dir(path)] {
		return notExist("open", path)
	}
	f := m.files[path]
	if f == nil {
		f = &memFile{}
		m.files[path] = f
	}
	f.mu.Lock()
	f.data = bytes.Clone(data)
	f.durable = bytes.Clone(data)
	f.mu.Unlock()
	m.written += int64(len(data))
	return nil
}

// SyncDir implements FS.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail(OpSyncDir, dir); err != nil {
		return err
	}
	dir = clean(dir)
	entries := map[string]*memFile{}
	for p, f := range m.files {
		if filepath.Dir(p) == dir {
			entries[filepath.Base(p)] = f
		}
	}
	m.durable[dir] = entries
	return nil
}

// CreateSegment implements FS.
func (m *MemFS) CreateSegment(path string, size int64) (Segment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail(OpCreateSegment, path); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	path = clean(path)
	if !m.dirs[filepath.Dir(path)] {
		return nil, notExist("open", path)
	}
	if _, ok := m.files[path]; ok {
		return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrExist}
	}
	f := &memFile{data: make([]byte, size), durable: make([]byte, size)}
	m.files[path] = f
	m.open++
	return &memSegment{m: m, f: f, path: path}, nil
}

// OpenSegment implements FS.
func (m *MemFS) OpenSegment(path string, size int64) (Segment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.files[clean(path)]
	if f == nil {
		return nil, notExist("open", path)
	}
	if int64(len(f.data)) != size {
		return nil, fmt.Errorf("%s is %d bytes, want %d", filepath.Base(path), len(f.data), size)
	}
	m.open++
	return &memSegment{m: m, f: f, path: clean(path)}, nil
}

// OpenSegments is the number of segments opened and not closed.
func (m *MemFS) OpenSegments() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.open
}

type memSegment struct {
	m      *MemFS
	f      *memFile
	path   string
	closed bool
}

func (s *memSegment) Bytes() []byte { return s.f.data }

func (s *memSegment) Sync(lo, hi int64) error {
	s.m.mu.Lock()
	err := s.m.fail(OpSync, s.path)
	s.m.mu.Unlock()
	if err != nil {
		return err
	}
	if hi <= lo {
		return nil
	}
	lo &^= pageSize - 1
	s.f.mu.Lock()
	copy(s.f.durable[lo:hi], s.f.data[lo:hi])
	s.f.mu.Unlock()
	return nil
}

// Populate changes nothing in memory. It reports OpPopulate to the
// injector and the call to OnPopulate's function, outside the file
// system's lock, so a test can hold it up.
func (s *memSegment) Populate(lo, hi int64, how PopulateMode) {
	s.m.mu.Lock()
	in, seen := s.m.inject, s.m.populated
	s.m.mu.Unlock()
	if seen != nil {
		seen(s.path, lo, hi, how)
	}
	if in != nil {
		_ = in(OpPopulate, s.path)
	}
}

// Evict changes nothing: MemFS has no page cache.
func (s *memSegment) Evict(lo, hi int64) {}

// Data: MemFS keeps no holes; all of [lo, hi) may hold data.
func (s *memSegment) Data(lo, hi int64) []Range {
	if hi <= lo {
		return nil
	}
	return []Range{{lo, hi}}
}

func (s *memSegment) Close() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.m.open--
	}
	return nil
}

// OpenFile implements FS. The injector sees OpOpenFile with the path;
// an error it returns is wrapped with ErrNoSpace when the file would have
// been created (a full disk has no room for the inode or entry).
func (m *MemFS) OpenFile(path string, create bool) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	path = clean(path)
	f := m.files[path]
	if f == nil && !create {
		return nil, notExist("open", path)
	}
	if err := m.fail(OpOpenFile, path); err != nil {
		if f == nil {
			return nil, fmt.Errorf("%w: %w", ErrNoSpace, err)
		}
		return nil, err
	}
	if f == nil {
		if !m.dirs[filepath.Dir(path)] {
			return nil, notExist("open", path)
		}
		f = &memFile{}
		m.files[path] = f
	}
	m.openFiles++
	return &memHandle{m: m, f: f, path: path}, nil
}

// OpenFiles is the number of Files opened and not closed.
func (m *MemFS) OpenFiles() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.openFiles
}

// Written is the number of bytes written through WriteFile and
// File.WriteAt (not through segment mappings).
func (m *MemFS) Written() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.written
}

// memHandle is an open File. Its data is the memFile's, shared with every
// other handle on the same file, as an inode's page cache is.
type memHandle struct {
	m      *MemFS
	f      *memFile
	path   string
	closed bool
}

func (h *memHandle) ReadAt(p []byte, off int64) (int, error) {
	h.m.mu.Lock()
	err := h.m.fail(OpFileRead, h.path)
	h.m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if off < 0 {
		return 0, fmt.Errorf("readat %s: negative offset", filepath.Base(h.path))
	}
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *memHandle) WriteAt(p []byte, off int64) (int, error) {
	h.m.mu.Lock()
	err := h.m.fail(OpFileWrite, h.path)
	if err == nil {
		h.m.written += int64(len(p))
	}
	h.m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(h.f.data)) {
		h.f.data = append(h.f.data, make([]byte, end-int64(len(h.f.data)))...)
	}
	copy(h.f.data[off:], p)
	return len(p), nil
}

func (h *memHandle) Truncate(size int64) error {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if size <= int64(len(h.f.data)) {
		h.f.data = h.f.data[:size:size]
	} else {
		h.f.data = append(h.f.data, make([]byte, size-int64(len(h.f.data)))...)
	}
	return nil
}

func (h *memHandle) Sync() error {
	h.m.mu.Lock()
	err := h.m.fail(OpFileSync, h.path)
	h.m.mu.Unlock()
	if err != nil {
		return err
	}
	h.f.mu.Lock()
	h.f.durable = bytes.Clone(h.f.data)
	h.f.mu.Unlock()
	return nil
}

func (h *memHandle) Close() error {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if !h.closed {
		h.closed = true
		h.m.openFiles--
	}
	return nil
}

type memLock struct {
	m    *MemFS
	path string
}

func (l memLock) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	delete(l.m.locks, l.path)
	return nil
}

// Lock implements FS.
func (m *MemFS) Lock(path string) (io.Closer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	path = clean(path)
	if m.locks[path] {
		return nil, ErrLocked
	}
	m.locks[path] = true
	return memLock{m, path}, nil
}

// Crash returns the file system a power cut at this instant would leave,
// decided by rng: directories hold the entries of their last SyncDir (a
// file created since is gone, one removed since is back, a rename is
// undone), and each page a file changed since its last Sync is, at random,
// the new page, the old one, or torn: each 512-byte sector new or old.
// Nothing may write to m's files while Crash runs (pause the store).
func (m *MemFS) Crash(rng *rand.Rand) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := NewMem()
	for d := range m.dirs {
		out.dirs[d] = true
	}
	images := map[*memFile]*memFile{}
	image := func(f *memFile) *memFile {
		if img, ok := images[f]; ok {
			return img
		}
		f.mu.Lock()
		data := bytes.Clone(f.durable)
		cur := f.data
		if len(cur) != len(data) {
			// A File grown or truncated since its last Sync: the size
			// that survives is the old or the new one; bytes past the
			// durable size were zeros before.
			if rng.IntN(2) == 0 {
				data = append(data, make([]byte, max(len(cur)-len(data), 0))...)[:len(cur)]
			}
			cur = append(bytes.Clone(cur), make([]byte, max(len(data)-len(cur), 0))...)[:len(data)]
		}
		for p := 0; p < len(data); p += pageSize {
			end := min(p+pageSize, len(data))
			if bytes.Equal(cur[p:end], data[p:end]) {
				continue
			}
			switch rng.IntN(3) {
			case 0: // the new page reached the disk
				copy(data[p:end], cur[p:end])
			case 1: // it did not
			default: // torn at sector granularity
				for sec := p; sec < end; sec += sectorSize {
					if rng.IntN(2) == 0 {
						copy(data[sec:min(sec+sectorSize, end)], cur[sec:min(sec+sectorSize, end)])
					}
				}
			}
		}
		f.mu.Unlock()
		img := &memFile{data: data, durable: bytes.Clone(data)}
		images[f] = img
		return img
	}
	for dir, entries := range m.durable {
		for name, f := range entries {
			out.files[filepath.Join(dir, name)] = image(f)
		}
		out.durable[dir] = map[string]*memFile{}
		for name := range entries {
			out.durable[dir][name] = out.files[filepath.Join(dir, name)]
		}
	}
	return out
}

const sectorSize = 512
