package storage

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// mappedFileQueue is the commitlog: an ordered run of same-size mapped files
// whose names are their start offsets, with no gaps. The last file takes the
// appends; a new one comes from the allocator when it is full.
type mappedFileQueue struct {
	fs       vfs.FS
	dir      string
	fileSize int64
	alloc    *allocator

	mu    sync.RWMutex // guards files; appends read the last file under the put lock
	files []*mappedFile

	syncMu sync.Mutex // one Sync at a time
	// flushedWhere is the commitlog offset below which every byte is durable.
	flushedWhere atomic.Int64
	syncLatency  *histogram
}

func newMappedFileQueue(fs vfs.FS, dir string, fileSize int64, syncLatency *histogram) *mappedFileQueue {
	return &mappedFileQueue{
		fs:          fs,
		dir:         dir,
		fileSize:    fileSize,
		alloc:       newAllocator(fs, dir, fileSize),
		syncLatency: syncLatency,
	}
}

// load maps every commitlog file in dir, sorted by offset. It refuses a
// file of the wrong size or a gap between files, and deletes a zero-length
// last file (a crash during creation).
func (q *mappedFileQueue) load() error {
	entries, err := q.fs.ReadDir(q.dir)
	if err != nil {
		return fmt.Errorf("storage: read commitlog dir: %w", err)
	}
	type named struct {
		from int64
		name string
	}
	var names []named
	for _, e := range entries {
		if from, ok := parseFileName(e.Name); ok && !e.IsDir {
			names = append(names, named{from, e.Name})
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i].from < names[j].from })
	for i, n := range names {
		path := q.dir + "/" + n.name
		if i == len(names)-1 {
			if size, err := q.fs.Size(path); err == nil && size == 0 {
				if err := q.fs.Remove(path); err != nil {
					return fmt.Errorf("storage: remove empty file %s: %w", n.name, err)
				}
				break
			}
		}
		if n.from%q.fileSize != 0 {
			return fmt.Errorf("storage: commitlog file %s does not start at a multiple of the file size %d", n.name, q.fileSize)
		}
		if i > 0 && n.from != names[i-1].from+q.fileSize {
			return fmt.Errorf("storage: gap in commitlog between %s and %s", names[i-1].name, n.name)
		}
		m, err := openMappedFile(q.fs, path, n.from, q.fileSize)
		if err != nil {
			return err
		}
		q.files = append(q.files, m)
	}
	return nil
}

// last returns the last file or nil.
func (q *mappedFileQueue) last() *mappedFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if len(q.files) == 0 {
		return nil
	}
	return q.files[len(q.files)-1]
}

// first returns the first file or nil.
func (q *mappedFileQueue) first() *mappedFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if len(q.files) == 0 {
		return nil
	}
	return q.files[0]
}

// snapshot returns the current files. The slice must not be modified.
func (q *mappedFileQueue) snapshot() []*mappedFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.files[:len(q.files):len(q.files)]
}

// findByOffset returns the file holding commitlog offset off, or nil.
func (q *mappedFileQueue) findByOffset(off int64) *mappedFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if len(q.files) == 0 || off < q.files[0].from {
		return nil
	}
	i := int((off - q.files[0].from) / q.fileSize)
	if i >= len(q.files) {
		return nil
	}
	return q.files[i]
}

// roll appends a new last file: the first at offset 0 when there is none,
// otherwise right after the last one. REQUIRES: the put lock.
func (q *mappedFileQueue) roll() (*mappedFile, error) {
	from := int64(0)
	if l := q.last(); l != nil {
		from = l.from + q.fileSize
	}
	m, err := q.alloc.take(from)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	q.files = append(q.files, m)
	q.mu.Unlock()
	return m, nil
}

// removeFirst takes up to n files off the front of the queue, never the
// last one, and returns them; the caller unmaps and deletes them
// (retention). The min offset moves to the first file left.
func (q *mappedFileQueue) removeFirst(n int) []*mappedFile {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.files)-1)
	if n <= 0 {
		return nil
	}
	gone := append([]*mappedFile(nil), q.files[:n]...)
	q.files = append([]*mappedFile(nil), q.files[n:]...)
	return gone
}

// maxOffset is the commitlog offset the next append goes to.
func (q *mappedFileQueue) maxOffset() int64 {
	l := q.last()
	if l == nil {
		return 0
	}
	return l.from + l.wrote.Load()
}

// minOffset is the first commitlog offset still on disk.
func (q *mappedFileQueue) minOffset() int64 {
	f := q.first()
	if f == nil {
		return 0
	}
	return f.from
}

// Sync implements flush.Syncer. It msyncs every file from the one holding
// flushedWhere to the last, in one call, so a waiter whose record crossed a
// file boundary is answered by a single Sync. With minPages > 0 a file is
// synced only when that many pages are dirty (or it is full). It returns
// the durable offset: every byte below it has been synced.
func (q *mappedFileQueue) Sync(minPages int) (int64, error) {
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	start := time.Now()
	durable := q.flushedWhere.Load()
	synced := false
	for _, m := range q.snapshot() {
		if m.from+m.size <= durable {
			continue
		}
		before := m.flushed.Load()
		pos, err := m.flush(minPages)
		if err != nil {
			return durable, err
		}
		synced = synced || pos != before
		durable = m.from + pos
		if pos < m.size {
			break
		}
	}
	q.flushedWhere.Store(durable)
	if synced && q.syncLatency != nil {
		q.syncLatency.observe(time.Since(start))
	}
	return durable, nil
}

// close unmaps every file and stops the allocator. It does not sync.
func (q *mappedFileQueue) close() error {
	errs := []error{q.alloc.close()}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range q.files {
		errs = append(errs, m.close())
	}
	q.files = nil
	return errors.Join(errs...)
}

// allocator prepares the next commitlog file in the background so that a
// roll does not create, preallocate and map a file under the put lock
// (RocketMQ AllocateMappedFileService; etcd filePipeline).
type allocator struct {
	fs   vfs.FS
	dir  string
	size int64

	mu       sync.Mutex
	cond     *sync.Cond
	ready    *mappedFile // prepared, not yet handed out
	inflight int64       // offset being prepared, or -1
	closed   bool
	// unpopulated counts the files asked for or adopted whose population
	// has not finished; cond is broadcast when it drops to 0.
	unpopulated int

	reqc   chan int64
	adoptc chan *mappedFile
	done   chan struct{}
	wg     sync.WaitGroup
}

func newAllocator(fs vfs.FS, dir string, size int64) *allocator {
	a := &allocator{fs: fs, dir: dir, size: size, inflight: -1, reqc: make(chan int64, 1),
		adoptc: make(chan *mappedFile, 1), done: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	a.wg.Add(1)
	go a.loop()
	return a
}

// loop creates the files asked for and faults them in. Creating comes
// first: a request is served within one population chunk, and population
// of the files already handed out goes on afterwards, oldest first, ahead
// of the writer.
func (a *allocator) loop() {
	defer a.wg.Done()
	var todo []*mappedFile // published files not yet fully populated
	var at int64           // next offset to populate in todo[0]
	for {
		if len(todo) == 0 {
			select {
			case from := <-a.reqc:
				todo = a.create(from, todo)
			case m := <-a.adoptc:
				todo = []*mappedFile{m}
			case <-a.done:
				return
			}
			continue
		}
		select {
		case from := <-a.reqc:
			todo = a.create(from, todo)
		case m := <-a.adoptc: // the writer's file: first
			todo, at = append([]*mappedFile{m}, todo...), 0
		case <-a.done:
			return
		default:
			m := todo[0]
			// What the writer has passed needs no populating.
			at = max(at, m.wrote.Load()&^(pageSize-1))
			if at < m.size {
				m.populate(at, min(at+populateChunk, m.size))
				at += populateChunk
			}
			if at >= m.size {
				todo, at = todo[1:], 0
				a.populated()
			}
		}
	}
}

// create makes the file starting at from, publishes it as ready and adds
// it to todo. Errors are dropped here on purpose: take() then creates the
// file itself and reports the real error to the put.
func (a *allocator) create(from int64, todo []*mappedFile) []*mappedFile {
	m, err := createMappedFile(a.fs, a.dir, from, a.size)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight = -1
	a.cond.Broadcast()
	if err != nil {
		a.populatedLocked()
		return todo
	}
	if a.closed || a.ready != nil {
		m.remove()
		a.populatedLocked()
		return todo
	}
	a.ready = m
	return append(todo, m)
}

// adopt has the loop populate m, an existing file the writer will append
// to (the last file at Open: a restart would otherwise leave the rest of
// it to page faults), before anything else.
func (a *allocator) adopt(m *mappedFile) {
	a.mu.Lock()
	a.unpopulated++
	a.mu.Unlock()
	select {
	case a.adoptc <- m:
	case <-a.done:
	}
}

// populated records that one file asked for or adopted needs no more
// population.
func (a *allocator) populated() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.populatedLocked()
}

func (a *allocator) populatedLocked() {
	if a.unpopulated--; a.unpopulated == 0 {
		a.cond.Broadcast()
	}
}

// populateChunk is how much of a file the allocator faults in at a time
// (MADV_POPULATE_WRITE); between chunks it serves requests and notices
// Close, so neither a roll nor Close waits for more than one chunk. A
// variable for tests.
//
// Why population at all: a first write to a page of a preallocated file
// takes a fault that cost ~15 µs per 4 KiB page here (ext4 converting the
// unwritten extent), which made a 1 KiB put 4× slower. Why in chunks after
// the file is handed over: populating 1 GiB took 0.1–2.2 s here, longer
// than a writer of batches needs to fill a file, and waiting for it held
// the put lock at every roll for up to 1.9 s (BENCHMARKS.md).
var populateChunk int64 = 32 << 20

// take returns the file starting at from: the prepared one if it matches,
// otherwise one created now. It then asks for the following file.
func (a *allocator) take(from int64) (*mappedFile, error) {
	a.mu.Lock()
	for a.inflight == from {
		a.cond.Wait()
	}
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	m := a.ready
	a.ready = nil
	a.mu.Unlock()
	if m != nil && m.from != from {
		m.remove()
		m = nil
	}
	if m == nil {
		var err error
		if m, err = createMappedFile(a.fs, a.dir, from, a.size); err != nil {
			return nil, err
		}
	}
	a.prepare(from + a.size)
	return m, nil
}

func (a *allocator) prepare(from int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.inflight >= 0 {
		return
	}
	select {
	case a.reqc <- from:
		a.inflight = from
		a.unpopulated++
	default:
	}
}

// close stops the goroutine and deletes a prepared, unused file.
func (a *allocator) close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	close(a.done)
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight = -1
	a.cond.Broadcast()
	if a.ready != nil {
		err := a.ready.remove()
		a.ready = nil
		return err
	}
	return nil
}
