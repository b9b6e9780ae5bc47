package segment

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// List is the commitlog's files: an ordered run of same-size mapped files
// whose names are their start offsets, with no gaps. The last file takes
// the appends; a new one comes from the allocator when it is full. It also
// holds the guard that keeps a file mapped while it is read (ReadLock):
// retention unmaps the files it removes only under the guard's write side
// (Unmap).
type List struct {
	fs       vfs.FS
	dir      string
	fileSize int64
	alloc    *allocator

	mu    sync.RWMutex // guards files; appends read the last file under the append lock
	files []*File

	// guard is held for reading by every reader of a file's bytes found
	// through the list, and for writing while Unmap unmaps files taken off
	// it.
	guard sync.RWMutex

	syncMu sync.Mutex // one Sync at a time
	// flushedWhere is the commitlog offset below which every byte is durable.
	flushedWhere atomic.Int64
	observeSync  func(time.Duration)
}

// Options configure a List.
type Options struct {
	// PopulateChunk is how much of a file the allocator faults in at a
	// time; 0 means DefaultPopulateChunk.
	PopulateChunk int64
	// PopulateAhead is how far ahead of the writer the allocator keeps a
	// file populated (and how much of a prepared file it populates before
	// the roll); 0 means DefaultPopulateAhead. A value of at least the
	// file size populates whole files as soon as they exist.
	PopulateAhead int64
	// PopulateNear is, with vfs.PopulateWrite or PopulateZero, how far
	// ahead of the writer the pages are made writable (dirty zeros; with
	// PopulateZero, written to the disk first); past it, up to
	// PopulateAhead, they are populated read (clean). 0 means
	// DefaultPopulateNear; at least PopulateAhead makes the whole window
	// writable, as before this option.
	PopulateNear int64
	// Populate is how the allocator faults files in (vfs.PopulateMode);
	// the zero value is vfs.PopulateWrite. With vfs.PopulateOff it
	// populates nothing.
	Populate vfs.PopulateMode
	// ObserveSync, if set, is told the duration of every Sync that synced
	// something.
	ObserveSync func(time.Duration)
	// Room, if set, is asked before the allocator preallocates a file of
	// size bytes ahead of need; false skips it (the roll then creates the
	// file itself and reports a full disk to its put). Preallocating the
	// next file on a nearly full disk holds all of the free space for as
	// long as fallocate runs, and it then fails anyway: every small write
	// meanwhile (the checkpoint retention needs before it may delete, a
	// consume-queue file) fails with ENOSPC, and a store refusing puts for
	// a full disk could not free it.
	Room func(size int64) bool
}

// NewList returns the list of the files in dir (none loaded yet: Load)
// and starts its allocator goroutine; Close stops it.
func NewList(fs vfs.FS, dir string, fileSize int64, o Options) *List {
	if o.PopulateChunk <= 0 {
		o.PopulateChunk = DefaultPopulateChunk
	}
	if o.PopulateAhead <= 0 {
		o.PopulateAhead = DefaultPopulateAhead
	}
	if o.PopulateNear <= 0 {
		o.PopulateNear = DefaultPopulateNear
	}
	ahead := max(o.PopulateAhead, o.PopulateChunk)
	return &List{
		fs:          fs,
		dir:         dir,
		fileSize:    fileSize,
		alloc:       newAllocator(fs, dir, fileSize, o.PopulateChunk, ahead, min(o.PopulateNear, ahead), o.Populate, o.Room),
		observeSync: o.ObserveSync,
	}
}

// load maps every commitlog file in dir, sorted by offset. It refuses a
// file of the wrong size or a gap between files, and deletes a zero-length
// last file (a crash during creation).
func (q *List) Load() error {
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
		if from, ok := ParseFileName(e.Name); ok && !e.IsDir {
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
		m, err := Open(q.fs, path, n.from, q.fileSize)
		if err != nil {
			return err
		}
		q.files = append(q.files, m)
	}
	return nil
}

// last returns the last file or nil.
func (q *List) Last() *File {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if len(q.files) == 0 {
		return nil
	}
	return q.files[len(q.files)-1]
}

// first returns the first file or nil.
func (q *List) First() *File {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if len(q.files) == 0 {
		return nil
	}
	return q.files[0]
}

// snapshot returns the current files. The slice must not be modified.
func (q *List) Snapshot() []*File {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.files[:len(q.files):len(q.files)]
}

// findByOffset returns the file holding commitlog offset off, or nil.
func (q *List) Find(off int64) *File {
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

// Roll appends a new last file: the first at offset 0 when there is none,
// otherwise right after the last one. REQUIRES: the caller serialises
// appends (the commitlog's append lock).
func (q *List) Roll() (*File, error) {
	from := int64(0)
	if l := q.Last(); l != nil {
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
func (q *List) RemoveFirst(n int) []*File {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.files)-1)
	if n <= 0 {
		return nil
	}
	gone := append([]*File(nil), q.files[:n]...)
	q.files = append([]*File(nil), q.files[n:]...)
	return gone
}

// maxOffset is the commitlog offset the next append goes to.
func (q *List) MaxOffset() int64 {
	l := q.Last()
	if l == nil {
		return 0
	}
	return l.from + l.wrote.Load()
}

// minOffset is the first commitlog offset still on disk.
func (q *List) MinOffset() int64 {
	f := q.First()
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
func (q *List) Sync(minPages int) (int64, error) {
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	start := time.Now()
	durable := q.flushedWhere.Load()
	synced := false
	for _, m := range q.Snapshot() {
		if m.from+m.size <= durable {
			continue
		}
		before := m.flushed.Load()
		pos, err := m.Flush(minPages)
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
	if synced && q.observeSync != nil {
		q.observeSync(time.Since(start))
	}
	return durable, nil
}

// close unmaps every file and stops the allocator. It does not sync. It
// waits for the readers inside the guard (ReadLock), as retention's Unmap
// does: a reader that started before Close (a pull, a snapshot being
// sent) never touches an unmapped file, and one after finds no file.
func (q *List) Close() error {
	errs := []error{q.alloc.close()}
	q.guard.Lock()
	defer q.guard.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range q.files {
		errs = append(errs, m.Close())
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
	ready    *File // prepared, not yet handed out
	inflight int64 // offset being prepared, or -1
	closed   bool
	// pending counts the files asked for or adopted that the loop has not
	// taken up yet; cond is broadcast when it drops to 0.
	pending int

	chunk     int64                 // population chunk
	ahead     int64                 // population window past the writer
	near      int64                 // writable window past the writer (PopulateWrite), at most ahead
	nearChunk int64                 // population chunk of the writable window
	how       vfs.PopulateMode      // Options.Populate
	room      func(size int64) bool // Options.Room, nil: always

	reqc   chan int64
	adoptc chan *File
	wake   chan struct{}      // a writer passed a file's wakeAt
	quietc chan chan struct{} // WaitPopulated: closed once the loop has nothing to do
	done   chan struct{}
	wg     sync.WaitGroup
}

func newAllocator(fs vfs.FS, dir string, size, chunk, ahead, near int64, how vfs.PopulateMode, room func(int64) bool) *allocator {
	// The writable window goes in quarters (whole pages, at most a chunk):
	// the writer wakes the loop each time it leaves one of room.
	nearChunk := min(chunk, max(PageSize, (near/4)&^(PageSize-1)))
	a := &allocator{fs: fs, dir: dir, size: size, chunk: chunk, ahead: ahead, near: near, nearChunk: nearChunk, how: how, room: room, inflight: -1,
		reqc: make(chan int64, 1), adoptc: make(chan *File, 1), wake: make(chan struct{}, 1),
		quietc: make(chan chan struct{}), done: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	a.wg.Add(1)
	go a.loop()
	return a
}

// loop creates the files asked for and faults them in, each up to
// PopulateAhead past the writer's position in it (a prepared file, not
// written yet: its first PopulateAhead bytes), chunk by chunk, oldest file
// first, serving requests and Close between chunks. Creating comes first:
// a request is served within one population chunk. When every window is
// full it waits for a request, Close, or a writer whose appends leave a
// chunk of room in a window (File.Publish wakes it).
//
// Why a window and not the whole file at once: a whole 1 GiB file
// populated at once was faulted in, and with PopulateWrite dirtied, in one
// burst; three group members on one disk stalled every sync for about 4 s
// at each (BENCHMARKS.md, "Population in a window"). Populated just ahead
// of the writer, the work is spread over the file's life.
//
// Why PopulateWrite makes only PopulateNear of the window writable and
// populates the rest read: the kernel's write-back expiry (30 s) is kept
// per inode, not per page. A commitlog file with dirty zeros ahead of the
// writer is never clean, so every 30 s the flusher wrote all of its dirty
// pages at once, the whole 128 MiB window: on this project's VM a sync
// single node's puts stalled for ~0.2 s and a group's for ~0.5 s each
// time (BENCHMARKS.md, "Dirty zeros: a stall every 30 s"). Read
// population does the costly part (the page-cache pages, zeroed and
// mapped) and dirties nothing; the writable window (16 MiB by default)
// just ahead of the writer takes the write faults (ext4's page_mkwrite)
// off the put path, and is all the flusher finds dirty then.
func (a *allocator) loop() {
	defer a.wg.Done()
	var todo []*popJob // files not yet fully populated, oldest first
	var quiets []chan struct{}
	for {
		todo = slices.DeleteFunc(todo, func(j *popJob) bool {
			// What the writer has passed needs no populating.
			w := j.m.wrote.Load() &^ (PageSize - 1)
			j.at, j.wat = max(j.at, w), max(j.wat, w)
			if j.how == vfs.PopulateOff {
				j.at = j.m.size
			}
			// A file closed meanwhile (a prepared one the roll did not
			// take, one cut off by a truncation) is never written again.
			return j.done() || j.m.unmapped()
		})
		work, lo, hi, how := a.next(todo)
		if work != nil {
			select {
			case from := <-a.reqc:
				todo = a.create(from, todo)
			case m := <-a.adoptc:
				todo = a.adopted(m, todo)
			case q := <-a.quietc:
				quiets = append(quiets, q)
			case <-a.done:
				return
			default:
				work.m.populate(lo, hi, how)
				if how.Writable() {
					work.wat = hi
				}
				work.at = max(work.at, hi)
				work.m.popTo.Store(work.at)
			}
			continue
		}
		// Every window is full: wake when a writer has left a chunk of
		// room in one (or has passed that point already).
		passed := false
		for _, j := range todo {
			w := a.wakeAt(j)
			j.m.wakeWhen(w, &a.wake)
			passed = passed || j.m.wrote.Load() >= w
		}
		if passed {
			continue
		}
		for _, q := range quiets {
			close(q)
		}
		quiets = nil
		select {
		case from := <-a.reqc:
			todo = a.create(from, todo)
		case m := <-a.adoptc:
			todo = a.adopted(m, todo)
		case q := <-a.quietc:
			quiets = append(quiets, q)
		case <-a.wake:
		case <-a.done:
			return
		}
	}
}

// next is the population to do now: the file, the range and how, or a nil
// file when every window is full. The writable windows come first, oldest
// file first (the writer is about to store into them), then the rest of
// the windows.
func (a *allocator) next(todo []*popJob) (j *popJob, lo, hi int64, how vfs.PopulateMode) {
	for _, j := range todo {
		if j.how.Writable() && j.wat < min(j.m.size, j.m.wrote.Load()+a.near) {
			return j, j.wat, min(j.wat+a.nearChunk, j.m.size), j.how
		}
	}
	for _, j := range todo {
		if j.at < min(j.m.size, j.m.wrote.Load()+a.ahead) {
			how := j.how
			if how.Writable() {
				how = vfs.PopulateRead // the writable window's pass makes them writable
			}
			return j, j.at, min(j.at+a.chunk, j.m.size), how
		}
	}
	return nil, 0, 0, 0
}

// wakeAt is the append position in j's file at which the writer has left
// a chunk of room in one of its windows that is not done yet.
func (a *allocator) wakeAt(j *popJob) int64 {
	w := int64(math.MaxInt64)
	if j.at < j.m.size {
		w = j.at - a.ahead + a.chunk
	}
	if j.how.Writable() && j.wat < j.m.size {
		w = min(w, j.wat-a.near+a.nearChunk)
	}
	return w
}

// popJob is a file the allocator populates, how, and how far it has.
type popJob struct {
	m   *File
	how vfs.PopulateMode
	at  int64 // populated below at (or the writer passed it)
	wat int64 // with PopulateWrite or PopulateZero: writable below wat (or the writer passed it)
}

// done: nothing of the file is left to populate.
func (j *popJob) done() bool {
	return j.at >= j.m.size && (!j.how.Writable() || j.wat >= j.m.size)
}

// adoptMode is how a file that existed before this process (adopt) is
// populated: as Options.Populate says, except that PopulateWrite and
// PopulateZero become PopulateRead. The file's pages are on disk already
// (zeros written back after an earlier population, or records) or still
// dirty in the page cache; a write population would dirty every clean one again, so each
// restart wrote the rest of a 1 GiB file back as zeros once more, and on
// a shared disk that writeback stalled the syncs of the group the member
// rejoined (BENCHMARKS.md, "Population at a restart"). Read population
// maps them clean: a put's first store into each page takes a
// write-protect fault instead (2.6 µs against 0.42 µs for a 1 KiB append,
// "Targets (issue 16)"; ~15 µs where a crash left the extent unwritten).
func adoptMode(how vfs.PopulateMode) vfs.PopulateMode {
	if how.Writable() {
		return vfs.PopulateRead
	}
	return how
}

// create makes the file starting at from, publishes it as ready and adds
// it to todo. Errors are dropped here on purpose: take() then creates the
// file itself and reports the real error to the put.
func (a *allocator) create(from int64, todo []*popJob) []*popJob {
	var m *File
	err := errNoRoom
	if a.room == nil || a.room(a.size) {
		m, err = Create(a.fs, a.dir, from, a.size)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight = -1
	a.pending--
	a.cond.Broadcast()
	if err != nil {
		return todo
	}
	if a.closed || a.ready != nil {
		m.Remove()
		return todo
	}
	a.ready = m
	return append(todo, &popJob{m: m, how: a.how})
}

// errNoRoom: Options.Room said no to a file prepared ahead of need.
var errNoRoom = errors.New("segment: no room to prepare a file ahead")

// adopt has the loop populate m, an existing file the writer will append
// to (the last file at Open: a restart would otherwise leave the rest of
// it to page faults), before anything else, in adoptMode.
func (a *allocator) adopt(m *File) {
	a.mu.Lock()
	a.pending++
	a.mu.Unlock()
	select {
	case a.adoptc <- m:
	case <-a.done:
	}
}

// adopted takes up an adopted file: the loop has population to do.
func (a *allocator) adopted(m *File, todo []*popJob) []*popJob {
	a.mu.Lock()
	if a.pending--; a.pending == 0 {
		a.cond.Broadcast()
	}
	a.mu.Unlock()
	return append([]*popJob{{m: m, how: adoptMode(a.how)}}, todo...) // the writer's file: first
}

// DefaultPopulateChunk is how much of a file the allocator faults in at a
// time (MADV_POPULATE_WRITE); between chunks it serves requests and notices
// Close, so neither a roll nor Close waits for more than one chunk.
//
// Why population at all: a first write to a page of a preallocated file
// takes a fault that cost ~15 µs per 4 KiB page here (ext4 converting the
// unwritten extent), which made a 1 KiB put 4× slower. Why in chunks after
// the file is handed over: populating 1 GiB took 0.1–2.2 s here, longer
// than a writer of batches needs to fill a file, and waiting for it held
// the put lock at every roll for up to 1.9 s (BENCHMARKS.md).
const DefaultPopulateChunk int64 = 32 << 20

// DefaultPopulateAhead is how far ahead of the writer the allocator keeps
// a file populated (Options.PopulateAhead). 128 MiB is 0.5 s of the
// fastest batches measured here (~250 MB/s) and several chunks of slack
// for the allocator; a writer faster than population takes the page
// faults itself (a put never waits for population).
const DefaultPopulateAhead int64 = 128 << 20

// DefaultPopulateNear is how much of the window PopulateWrite makes
// writable (Options.PopulateNear): the most dirty zeros the flusher finds
// in a file when it writes it back, every 30 s (loop's doc). 16 MiB, in
// passes of 4 MiB, is ~90 ms of the fastest batches measured here, and
// with it a group's slowest put in a minute (three members on one disk)
// took ~0.1 s instead of ~0.6 s; 4 MiB cost a sync single node ~11 % of
// its batch throughput, 16 MiB ~5 % (BENCHMARKS.md, "Dirty zeros: a stall
// every 30 s"). A writer that overtakes it takes the write faults itself,
// as with PopulateRead.
const DefaultPopulateNear int64 = 16 << 20

// take returns the file starting at from: the prepared one if it matches,
// otherwise one created now. The owner asks for the following file
// (Prepare) when it wants it.
func (a *allocator) take(from int64) (*File, error) {
	a.mu.Lock()
	for a.inflight == from {
		a.cond.Wait()
	}
	if a.closed {
		a.mu.Unlock()
		return nil, base.ErrClosed
	}
	m := a.ready
	a.ready = nil
	a.mu.Unlock()
	if m != nil && m.from != from {
		m.Remove()
		m = nil
	}
	if m == nil {
		var err error
		if m, err = Create(a.fs, a.dir, from, a.size); err != nil {
			return nil, err
		}
	}
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
		a.pending++
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
		err := a.ready.Remove()
		a.ready = nil
		return err
	}
	return nil
}

// ReadLock holds the guard for reading: no file found through the list is
// unmapped until ReadUnlock. Every reader of a file's bytes holds it.
func (q *List) ReadLock() { q.guard.RLock() }

// ReadUnlock releases ReadLock.
func (q *List) ReadUnlock() { q.guard.RUnlock() }

// Unmap closes files taken off the list (RemoveFirst) once no reader is
// inside them. It does not delete them.
func (q *List) Unmap(files []*File) error {
	q.guard.Lock()
	defer q.guard.Unlock()
	var errs []error
	for _, m := range files {
		if err := m.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Flushed is the commitlog offset below which every byte is durable.
func (q *List) Flushed() int64 { return q.flushedWhere.Load() }

// Replace sets the files after recovery or truncation cut the list, and
// the durable offset. REQUIRES: no appends, syncs or readers yet.
func (q *List) Replace(files []*File, flushed int64) {
	q.mu.Lock()
	q.files = files
	q.mu.Unlock()
	q.flushedWhere.Store(flushed)
}

// Reload replaces every file of the list with what the directory holds
// once swap has run: a snapshot's install (design replication.md §3.5)
// renames the snapshot's files in and deletes the others. With no sync
// running, no reader inside any mapping (the guard's write side) and the
// list locked, it unmaps every file, runs swap, maps the directory anew
// and sets the ends: every file whole except the one holding end, which
// is written and durable up to end (the snapshot's files were synced
// before the swap). The caller holds off appends and has discarded the
// allocator's prepared file (DiscardPrepared). On an error the list may
// be empty: the caller must stop (a restart finishes the install).
func (q *List) Reload(swap func() error, end int64) error {
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	q.guard.Lock()
	defer q.guard.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for _, m := range q.files {
		errs = append(errs, m.Close())
	}
	q.files = nil
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := swap(); err != nil {
		return err
	}
	if err := q.Load(); err != nil {
		return err
	}
	n := len(q.files)
	if n == 0 || q.files[n-1].from >= end || q.files[n-1].End() < end {
		return fmt.Errorf("storage: after the swap the commitlog files do not end at %d", end)
	}
	for _, m := range q.files {
		pos := min(m.size, end-m.from)
		m.SetPositions(pos, pos)
	}
	q.flushedWhere.Store(end)
	return nil
}

// Dir is the directory of the files.
func (q *List) Dir() string { return q.dir }

// FileSize is the size of every file.
func (q *List) FileSize() int64 { return q.fileSize }

// Prepare asks the allocator for the file starting at from, ahead of need.
func (q *List) Prepare(from int64) { q.alloc.prepare(from) }

// Adopt has the allocator fault in the rest of f, an existing file appends
// go to (the last file at open).
func (q *List) Adopt(f *File) { q.alloc.adopt(f) }

// WaitPopulated waits until the allocator has taken up every file it was
// asked for or adopted and has faulted each in as far as its window goes
// (PopulateAhead past the writer's position; with a window of at least the
// file size, whole files): benchmarks time puts into populated files, and
// tests wait for the allocator to be idle.
func (q *List) WaitPopulated() { q.alloc.waitPopulated() }

func (a *allocator) waitPopulated() {
	a.mu.Lock()
	for a.pending > 0 && !a.closed {
		a.cond.Wait()
	}
	a.mu.Unlock()
	q := make(chan struct{})
	select {
	case a.quietc <- q:
	case <-a.done:
		return
	}
	select {
	case <-q:
	case <-a.done:
	}
}

// HoldSync stops syncs until release (a test seam: the store's tests pause
// every writer at a consistent point).
func (q *List) HoldSync() (release func()) {
	q.syncMu.Lock()
	return q.syncMu.Unlock
}

// WaitReady waits until the allocator has prepared the file starting at
// from (a test seam).
func (q *List) WaitReady(from int64) {
	a := q.alloc
	a.mu.Lock()
	defer a.mu.Unlock()
	for (a.ready == nil || a.ready.from != from) && !a.closed {
		a.cond.Wait()
	}
}

// DiscardPrepared deletes the file the allocator prepared, if any, unless
// it starts at from (the offset the next roll takes), and reports whether
// it deleted one; the caller syncs the directory. A truncation that moves
// the end back (commitlog.TruncateAfter) needs it: a file prepared beyond
// the new end would otherwise stay on disk past a gap, which Load refuses.
func (q *List) DiscardPrepared(from int64) (bool, error) { return q.alloc.discard(from) }

func (a *allocator) discard(from int64) (bool, error) {
	a.mu.Lock()
	for a.inflight >= 0 && !a.closed {
		a.cond.Wait()
	}
	m := a.ready
	if m == nil || m.from == from {
		a.mu.Unlock()
		return false, nil
	}
	a.ready = nil
	a.mu.Unlock()
	return true, m.Remove()
}
