package consumequeue

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// cqEntrySize is a consume-queue entry: int64 commitlog offset, int32
// size, int64 tags code (RocketMQ CQ_STORE_UNIT_SIZE).
const cqEntrySize = 20

// DefaultEntries is the number of entries per consume-queue
// file (RocketMQ mappedFileSizeConsumeQueue / 20).
const DefaultEntries = 300000

// cqBlockEntries is how many entries a consume queue keeps in memory at
// its tail and reads from a file at once: a pull or tag scan over N
// entries costs N/128 preads, and an idle queue holds at most 2.5 KiB of
// tail. A block never crosses a file boundary.
const cqBlockEntries = 128

// Queue is the index of one topic-queue: entry i locates the message
// with queue offset i in the commitlog. Entries are RocketMQ's 20 bytes,
// and file k holds entries [k*E, (k+1)*E) for E = Options.ConsumeQueueEntries,
// named by the 20-digit byte offset of its first entry, as RocketMQ names
// them; but a file is not preallocated or mapped: it grows by pwrite as
// entries arrive, so a queue holding one message costs 20 bytes of disk and
// no descriptor or mapping while idle (the store-wide cqFiles cache opens
// and closes files under Options.MaxOpenQueueFiles).
//
// Only the dispatcher writes. It appends entries to the in-memory tail
// (entries [tailFirst, written)) and publishes count = written at the end
// of each round: readers find the entries at or above tailFirst in the
// tail, so an entry is readable before it is in its file. The entries not
// in the file yet, [filed, written), are written there (writePending) when
// the tail moves on to the next block and before every checkpoint, not in
// every round: a put that reads its write (WAIT) then pays no pwrite, and
// a busy queue pays one per block of cqBlockEntries entries instead of
// one per round. A failed write keeps the entries in the tail (still
// readable, never taken back) and is retried; the tail never moves past
// entries not in the file, so it holds at most one block, as before.
// Durability comes from the checkpoint: it writes the pending entries,
// then syncs the files written since the last one, and the directories
// holding files created since, before it records the count.
type Queue struct {
	topic   string
	queueID int32
	dir     string
	entries int64 // entries per file
	cache   *cqFiles

	mu        sync.RWMutex // guards files, tail, tailFirst
	files     []*cqFile    // contiguous: files[i].first == files[0].first + i*entries
	tail      []byte       // entries [tailFirst, written), 20 bytes each
	tailFirst int64

	readMu     sync.Mutex // guards the read block
	readBlock  []byte     // entries [readFirst, readFirst+len/20) read from a file
	readFirst  int64
	readLoaded bool

	// count is the number of entries readers may use: offsets [min, count).
	count atomic.Int64
	// min is the first queue offset still indexed (0 until retention).
	min atomic.Int64

	// written is the number of entries accepted (count once the round
	// that put them publishes it); filed is how many of them are in the
	// file: [filed, written) are pending, in the tail only. Both the
	// dispatcher's own (runMu). unfiled: the queue is in the index's list
	// of queues with pending entries (runMu).
	written, filed int64
	unfiled        bool

	// trimmedAt and trimmedPhys are retention's own: the min offset it
	// last looked at and the commitlog offset of that entry, so that a
	// round over 10,000 queues with nothing to trim reads no entry.
	trimmedAt, trimmedPhys int64
}

// cqFile is one consume-queue file. Its descriptor, when open, is owned by
// the cqFiles cache.
type cqFile struct {
	q     *Queue
	first int64 // queue offset of its first entry
	path  string

	// Guarded by the cache's mutex.
	f    vfs.File
	elem *list.Element
	refs int
	gone bool // removed: never opened again, closed when released

	// dirty: written since its last sync, and in cqFiles.dirty. The
	// dispatcher's own (runMu).
	dirty bool
}

func cqDir(root, topic string, queueID int32) string {
	return filepath.Join(root, "consumequeue", topic, strconv.Itoa(int(queueID)))
}

func newQueue(cache *cqFiles, root, topic string, queueID int32, entriesPerFile int) *Queue {
	return &Queue{topic: topic, queueID: queueID, dir: cqDir(root, topic, queueID),
		entries: int64(entriesPerFile), cache: cache}
}

func (q *Queue) newFile(first int64) *cqFile {
	return &cqFile{q: q, first: first, path: filepath.Join(q.dir, segment.FileName(first*cqEntrySize))}
}

// loadConsumeQueue finds the queue's files and its valid end without
// opening them: the count is what the files' sizes hold, capped at want,
// the count the checkpoint recorded (entries past it were not known
// durable; the dispatcher writes them again from the commitlog). Only a
// queue shorter than the checkpoint says, which is damage, is scanned
// (scanValid) for zeroed or stale entries. Bytes past the end are cut
// (truncate), so a restart writes only to queues a crash left long.
func loadQueue(cache *cqFiles, root, topic string, queueID int32, entriesPerFile int, want, commitlogEnd int64) (*Queue, error) {
	q := newQueue(cache, root, topic, queueID, entriesPerFile)
	fs := cache.fs
	entries, err := fs.ReadDir(q.dir)
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return nil, fmt.Errorf("storage: read consume queue %s/%d: %w", topic, queueID, err)
	}
	var froms []int64
	for _, e := range entries {
		if from, ok := segment.ParseFileName(e.Name); ok && !e.IsDir {
			froms = append(froms, from)
		}
	}
	sort.Slice(froms, func(i, j int) bool { return froms[i] < froms[j] })
	fileBytes := q.entries * cqEntrySize
	end := int64(-1)
	for i, from := range froms {
		path := filepath.Join(q.dir, segment.FileName(from))
		if from%fileBytes != 0 || (i > 0 && from != froms[i-1]+fileBytes) || end >= 0 && end%q.entries != 0 {
			// A gap, a misaligned file or one after a short file: drop
			// it and what follows; the dispatcher rebuilds the entries
			// from the commitlog.
			for _, f := range froms[i:] {
				fs.Remove(filepath.Join(q.dir, segment.FileName(f)))
			}
			break
		}
		size, err := fs.Size(path)
		if err != nil {
			return nil, fmt.Errorf("storage: consume queue %s/%d: %w", topic, queueID, err)
		}
		first := from / cqEntrySize
		q.files = append(q.files, q.newFile(first))
		end = first + min(size/cqEntrySize, q.entries)
	}
	if len(q.files) == 0 {
		return q, nil
	}
	q.min.Store(q.files[0].first)
	if err := q.skipBlanks(end); err != nil {
		return nil, err
	}
	if end < want {
		if end, err = q.scanValid(end, commitlogEnd); err != nil {
			return nil, err
		}
	}
	end = min(end, want)
	if end, err = q.validEnd(end, commitlogEnd); err != nil {
		return nil, err
	}
	if err := q.cut(end); err != nil {
		return nil, err
	}
	return q, nil
}

// scanValid reads the queue forward and returns the first entry that is
// empty or points at or past commitlogEnd (a zeroed or torn page). Only a
// damaged queue is scanned; it is rebuilt from there.
func (q *Queue) scanValid(end, commitlogEnd int64) (int64, error) {
	buf := make([]byte, cqBlockEntries*cqEntrySize)
	for i := q.min.Load(); i < end; {
		n := min(blockEnd(i, q.entries), end) - i
		if err := q.readEntries(buf[:n*cqEntrySize], i); err != nil {
			return 0, err
		}
		for j := int64(0); j < n; j++ {
			off, size, _ := decodeCQ(buf[j*cqEntrySize:])
			if size <= 0 || off < 0 || off+int64(size) > commitlogEnd {
				return i + j, nil
			}
		}
		i += n
	}
	return end, nil
}

// validEnd reads the queue backward from end, a block at a time, and
// returns the end of its last entry that points inside the commitlog: a
// restart reads one block per queue, not the whole file.
func (q *Queue) validEnd(end, commitlogEnd int64) (int64, error) {
	buf := q.cache.loadBuf[:]
	for first := q.min.Load(); end > first; {
		lo := max(blockStart(end-1, q.entries), first)
		b := buf[:(end-lo)*cqEntrySize]
		if err := q.readEntries(b, lo); err != nil {
			return 0, err
		}
		for ; end > lo; end-- {
			off, size, _ := decodeCQ(b[(end-1-lo)*cqEntrySize:])
			if size > 0 && off >= 0 && off+int64(size) <= commitlogEnd {
				return end, nil
			}
		}
	}
	return end, nil
}

// cut drops the entries from queue offset end on: files that start after
// it are removed, the one holding it is truncated there. Only a crash or
// damage leaves anything to cut. REQUIRES: no readers yet (load).
func (q *Queue) cut(end int64) error {
	keep := q.files[:0]
	for _, cf := range q.files {
		switch {
		case cf.first > end || (cf.first == end && len(keep) > 0):
			q.cache.forget(cf)
			if err := q.cache.fs.Remove(cf.path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				return fmt.Errorf("storage: consume queue %s/%d: remove %s: %w", q.topic, q.queueID, filepath.Base(cf.path), err)
			}
			continue
		}
		size, err := q.cache.fs.Size(cf.path)
		if err != nil {
			return fmt.Errorf("storage: consume queue %s/%d: %w", q.topic, q.queueID, err)
		}
		if want := min(end-cf.first, q.entries) * cqEntrySize; size > want {
			err := q.cache.with(cf, false, func(f vfs.File) error { return f.Truncate(want) })
			if err != nil {
				return fmt.Errorf("storage: consume queue %s/%d: cut %s at %d: %w", q.topic, q.queueID, filepath.Base(cf.path), want, err)
			}
			q.cache.markDirty(cf)
		}
		keep = append(keep, cf)
	}
	q.files = keep
	if len(keep) == 0 {
		end = 0
	}
	q.tail, q.tailFirst = nil, end
	q.readLoaded = false
	q.count.Store(end)
	q.written, q.filed = end, end
	if end < q.min.Load() {
		q.min.Store(end)
	}
	return nil
}

// A blank entry (RocketMQ ConsumeQueue.fillPreBlank): commitlog offset 0,
// size MaxInt32, tags code 0. It only ever precedes a queue's first entry
// in its first file, when the queue starts at k > 0 (StartAt).
const blankSize = 1<<31 - 1

func encodeBlank(b []byte) {
	binary.BigEndian.PutUint64(b, 0)
	binary.BigEndian.PutUint32(b[8:], blankSize)
	binary.BigEndian.PutUint64(b[12:], 0)
}

func isBlank(off int64, size int32, tags int64) bool {
	return off == 0 && size == blankSize && tags == 0
}

// skipBlanks moves min past the blank entries at the start of the first
// file (a queue started at k > 0): they are a prefix of that file, so a
// binary search over it finds k. end is the queue's end as the files'
// sizes give it. REQUIRES: load.
func (q *Queue) skipBlanks(end int64) error {
	first := q.files[0].first
	hi := min(end, first+q.entries)
	if hi <= first {
		return nil
	}
	var e [cqEntrySize]byte
	var err error
	blank := func(i int64) bool {
		if rerr := q.readEntries(e[:], i); rerr != nil {
			err = rerr
			return false
		}
		return isBlank(decodeCQ(e[:]))
	}
	if !blank(first) {
		return err
	}
	n := sort.Search(int(hi-first), func(j int) bool { return !blank(first + int64(j)) })
	if err != nil {
		return err
	}
	q.min.Store(first + int64(n))
	return nil
}

func decodeCQ(b []byte) (off int64, size int32, tags int64) {
	return int64(binary.BigEndian.Uint64(b)), int32(binary.BigEndian.Uint32(b[8:])), int64(binary.BigEndian.Uint64(b[12:]))
}

// blockStart and blockEnd bound the block holding entry i: cqBlockEntries
// aligned, clipped to its file.
func blockStart(i, perFile int64) int64 {
	return max(i-i%cqBlockEntries, i-i%perFile)
}

func blockEnd(i, perFile int64) int64 {
	return min(i-i%cqBlockEntries+cqBlockEntries, i-i%perFile+perFile)
}

// put appends entry queueOffset to the tail. It is idempotent: an entry
// below the written count is left alone (re-dispatch after recovery). An
// entry that starts a new block first writes the pending ones; if that
// fails, the entry is not taken and the error returned. REQUIRES: the
// dispatcher.
func (q *Queue) put(queueOffset, phys int64, size int32, tags int64) error {
	if queueOffset < q.written {
		// A re-dispatch (recovery from the checkpoint's dispatched
		// offset): the entry must be the one already there. A different
		// physical offset is a duplicate queue offset in the log, never
		// something to swallow (design replication.md §3.3).
		if p, _, _, ok, err := q.lookup(queueOffset); err == nil && ok && p != phys {
			return fmt.Errorf("%w: consume queue %s/%d: entry %d re-dispatched at commitlog offset %d, indexed at %d",
				base.ErrCorrupt, q.topic, q.queueID, queueOffset, phys, p)
		}
		return nil
	}
	if queueOffset != q.written {
		return fmt.Errorf("%w: consume queue %s/%d: entry %d after %d entries: queue offsets out of order",
			base.ErrCorrupt, q.topic, q.queueID, queueOffset, q.written)
	}
	if queueOffset >= blockEnd(q.tailFirst, q.entries) {
		if err := q.writePending(); err != nil {
			return err
		}
		q.mu.Lock()
		q.tail, q.tailFirst = q.tail[:0], queueOffset
		q.mu.Unlock()
	}
	var e [cqEntrySize]byte
	binary.BigEndian.PutUint64(e[:], uint64(phys))
	binary.BigEndian.PutUint32(e[8:], uint32(size))
	binary.BigEndian.PutUint64(e[12:], uint64(tags))
	q.mu.Lock()
	q.tail = append(q.tail, e[:]...)
	q.mu.Unlock()
	q.written++
	return nil
}

// unpublished reports whether put accepted entries readers cannot see yet.
func (q *Queue) unpublished() bool { return q.written > q.count.Load() }

// publish lets readers see every entry put accepted. REQUIRES: the
// dispatcher.
func (q *Queue) publish() { q.count.Store(q.written) }

// pending reports whether put accepted entries not yet in the file.
func (q *Queue) pending() bool { return q.written > q.filed }

// writePending writes the pending entries to their file, creating it (and
// the queue's directory) if needed. No sync: the checkpoint does that
// before it counts them. REQUIRES: the dispatcher.
func (q *Queue) writePending() error {
	from := q.filed
	if q.written <= from {
		return nil
	}
	cf, err := q.fileFor(from)
	if err != nil {
		return err
	}
	b := q.tail[(from-q.tailFirst)*cqEntrySize : (q.written-q.tailFirst)*cqEntrySize]
	err = q.cache.with(cf, true, func(f vfs.File) error {
		_, err := f.WriteAt(b, (from-cf.first)*cqEntrySize)
		return err
	})
	if err != nil {
		return q.ioErr("write", cf, err)
	}
	q.cache.markDirty(cf)
	q.filed = q.written
	return nil
}

// fileFor returns the file holding entry i, adding it (not yet on disk:
// with opens it with create) when i starts a new one. REQUIRES: the
// dispatcher.
func (q *Queue) fileFor(i int64) (*cqFile, error) {
	first := i - i%q.entries
	q.mu.RLock()
	n := len(q.files)
	var last *cqFile
	if n > 0 {
		last = q.files[n-1]
	}
	q.mu.RUnlock()
	if last != nil && last.first == first {
		return last, nil
	}
	if n == 0 {
		if err := q.cache.fs.MkdirAll(q.dir); err != nil {
			return nil, fmt.Errorf("storage: create consume queue dir %s/%d: %w", q.topic, q.queueID, base.WrapNoSpace(err))
		}
		// The queue's directory, and its topic's if new, must reach
		// their parents' entries.
		topicDir := filepath.Dir(q.dir)
		cqRoot := filepath.Dir(topicDir)
		q.cache.dirs[topicDir] = true
		q.cache.dirs[cqRoot] = true
		q.cache.dirs[filepath.Dir(cqRoot)] = true
	}
	cf := q.newFile(first)
	q.cache.dirs[q.dir] = true // the new file's entry
	q.mu.Lock()
	if len(q.files) == 0 {
		q.min.Store(max(q.min.Load(), first)) // a queue started at k > first (StartAt) starts at k
	}
	q.files = append(q.files, cf)
	q.mu.Unlock()
	return cf, nil
}

func (q *Queue) ioErr(op string, cf *cqFile, err error) error {
	return fmt.Errorf("storage: %s consume queue %s/%d file %s: %w", op, q.topic, q.queueID, filepath.Base(cf.path), base.WrapNoSpace(err))
}

// get returns entry queueOffset, or ok=false when it is not indexed or
// cannot be read (lookup says why).
func (q *Queue) get(queueOffset int64) (phys int64, size int32, tags int64, ok bool) {
	phys, size, tags, ok, _ = q.lookup(queueOffset)
	return phys, size, tags, ok
}

// lookup is get with the read error. Entries at the tail come from memory;
// older ones from the read block, refilled with one pread per block, so a
// scan over N entries costs N/cqBlockEntries reads. The pread runs without
// q.mu, so a cold read never holds up the dispatcher's appends.
func (q *Queue) lookup(queueOffset int64) (phys int64, size int32, tags int64, ok bool, err error) {
	if queueOffset < q.min.Load() || queueOffset >= q.count.Load() {
		return 0, 0, 0, false, nil
	}
	q.mu.RLock()
	if queueOffset >= q.tailFirst {
		defer q.mu.RUnlock()
		if p := (queueOffset - q.tailFirst) * cqEntrySize; p+cqEntrySize <= int64(len(q.tail)) {
			phys, size, tags = decodeCQ(q.tail[p:])
			return phys, size, tags, true, nil
		}
		return 0, 0, 0, false, nil
	}
	// Entries below tailFirst are in their file: the tail moves on only
	// after writing them.
	tailFirst := q.tailFirst
	cf, err := q.fileOfLocked(queueOffset)
	q.mu.RUnlock()
	if err != nil {
		// Retention moves min before it drops files: an entry below min
		// now had its file taken since the check above.
		if queueOffset < q.min.Load() {
			return 0, 0, 0, false, nil
		}
		return 0, 0, 0, false, err
	}
	q.readMu.Lock()
	defer q.readMu.Unlock()
	if !q.readLoaded || queueOffset < q.readFirst || queueOffset >= q.readFirst+int64(len(q.readBlock))/cqEntrySize {
		lo := blockStart(queueOffset, q.entries)
		hi := min(blockEnd(queueOffset, q.entries), tailFirst)
		if n := (hi - lo) * cqEntrySize; int64(cap(q.readBlock)) < n {
			q.readBlock = make([]byte, n) // a queue of one entry keeps 20 bytes
		}
		q.readBlock = q.readBlock[:(hi-lo)*cqEntrySize]
		q.readLoaded = false
		if err := q.readFrom(cf, q.readBlock, lo); err != nil {
			if queueOffset < q.min.Load() { // retention took the file meanwhile
				return 0, 0, 0, false, nil
			}
			return 0, 0, 0, false, err
		}
		q.readFirst, q.readLoaded = lo, true
	}
	phys, size, tags = decodeCQ(q.readBlock[(queueOffset-q.readFirst)*cqEntrySize:])
	return phys, size, tags, true, nil
}

// fileOfLocked returns the file holding entry i. REQUIRES: q.mu held, or
// no concurrent writer.
func (q *Queue) fileOfLocked(i int64) (*cqFile, error) {
	if len(q.files) == 0 || i < q.files[0].first {
		return nil, fmt.Errorf("storage: consume queue %s/%d: entry %d is below the first file", q.topic, q.queueID, i)
	}
	k := (i - q.files[0].first) / q.entries
	if k >= int64(len(q.files)) {
		return nil, fmt.Errorf("storage: consume queue %s/%d: entry %d is past the last file", q.topic, q.queueID, i)
	}
	return q.files[k], nil
}

// readEntries fills b with the entries from queue offset i on, all in
// one file. REQUIRES: no concurrent writer (load).
func (q *Queue) readEntries(b []byte, i int64) error {
	cf, err := q.fileOfLocked(i)
	if err != nil {
		return err
	}
	return q.readFrom(cf, b, i)
}

// readFrom fills b with the entries of cf from queue offset i on.
func (q *Queue) readFrom(cf *cqFile, b []byte, i int64) error {
	err := q.cache.with(cf, false, func(f vfs.File) error {
		_, err := f.ReadAt(b, (i-cf.first)*cqEntrySize)
		return err
	})
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: file is shorter than its entries: %w", base.ErrCorrupt, err)
		}
		return q.ioErr("read", cf, err)
	}
	return nil
}

// dropFilesBelow takes off the queue the files whose entries all lie below
// queue offset entry, never the last file, and returns them; the caller
// deletes them (retention, after moving min to entry).
func (q *Queue) dropFilesBelow(entry int64) []*cqFile {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.files)-1 && q.files[n].first+q.entries <= entry {
		n++
	}
	if n == 0 {
		return nil
	}
	gone := append([]*cqFile(nil), q.files[:n]...)
	q.files = append([]*cqFile(nil), q.files[n:]...)
	return gone
}

// remove closes and deletes a file dropped from the queue.
func (cf *cqFile) remove() error {
	cf.q.cache.forget(cf)
	return cf.q.cache.fs.Remove(cf.path)
}

// close forgets the queue's open files.
func (q *Queue) close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for _, cf := range q.files {
		errs = append(errs, q.cache.forget(cf))
	}
	return errors.Join(errs...)
}

// cqFiles is the store-wide cache of open consume-queue files: at most
// limit descriptors, the least recently used closed first, so the number
// of queues is bounded by disk, not by RLIMIT_NOFILE (a file in use is
// never closed; the limit may be passed while every open file is in use).
type cqFiles struct {
	fs    vfs.FS
	limit int

	// The files written and the directories given entries since the last
	// checkpoint (sync). The dispatcher's own (runMu).
	dirty map[*cqFile]struct{}
	dirs  map[string]bool

	loadBuf [cqBlockEntries * cqEntrySize]byte // loadConsumeQueue's (Open's) read buffer

	mu   sync.Mutex
	lru  list.List // of *cqFile, most recently used first
	open int
}

func newCQFiles(fs vfs.FS, limit int) *cqFiles {
	return &cqFiles{fs: fs, limit: limit, dirty: map[*cqFile]struct{}{}, dirs: map[string]bool{}}
}

func (c *cqFiles) markDirty(cf *cqFile) {
	if !cf.dirty {
		cf.dirty = true
		c.dirty[cf] = struct{}{}
	}
}

// syncParallelism bounds the concurrent syncs of a checkpoint: a file
// system commits concurrent fsyncs together, so 1,000 new queues cost a
// few journal commits, not 1,000 (each on the dispatcher's time).
const syncParallelism = 16

// take removes and returns the files written and the directories given
// entries since the last take, for a checkpoint to sync (syncTaken) without
// holding up the dispatcher: a file written again meanwhile is marked dirty
// again and synced by the next checkpoint. REQUIRES: the dispatcher (runMu).
func (c *cqFiles) take() (files []*cqFile, dirs []string) {
	files = make([]*cqFile, 0, len(c.dirty))
	for cf := range c.dirty {
		cf.dirty = false
		files = append(files, cf)
	}
	clear(c.dirty)
	dirs = make([]string, 0, len(c.dirs))
	for dir := range c.dirs {
		dirs = append(dirs, dir)
	}
	clear(c.dirs)
	return files, dirs
}

// giveBack returns what a checkpoint failed to sync, so the next one
// retries it. REQUIRES: the dispatcher (runMu).
func (c *cqFiles) giveBack(files []*cqFile, dirs []string) {
	for _, cf := range files {
		c.markDirty(cf)
	}
	for _, dir := range dirs {
		c.dirs[dir] = true
	}
}

// syncTaken makes files, then dirs, durable, and returns what failed to
// sync (every dir when a file failed: a directory is synced only after the
// files it names). A file or directory that no longer exists was removed
// by retention or a deleted topic: nothing to sync. It needs no lock: the
// cache's descriptors are reference-counted, and the dispatcher may write
// the same files meanwhile.
func (c *cqFiles) syncTaken(files []*cqFile, dirs []string) (failedFiles []*cqFile, failedDirs []string, err error) {
	errs := parallel(len(files), func(i int) error {
		cf := files[i]
		err := c.with(cf, false, func(f vfs.File) error { return f.Sync() })
		if err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return cf.q.ioErr("sync", cf, err)
		}
		return nil
	})
	for i, cf := range files {
		if errs[i] != nil {
			failedFiles = append(failedFiles, cf)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return failedFiles, dirs, err
	}
	errs = parallel(len(dirs), func(i int) error {
		if err := c.fs.SyncDir(dirs[i]); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("storage: sync consume queue directory %s: %w", dirs[i], base.WrapNoSpace(err))
		}
		return nil
	})
	for i, dir := range dirs {
		if errs[i] != nil {
			failedDirs = append(failedDirs, dir)
		}
	}
	return nil, failedDirs, errors.Join(errs...)
}

// parallel runs fn(0) … fn(n-1) on up to syncParallelism goroutines, all
// ended when it returns, and returns their errors by index.
func parallel(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, syncParallelism) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	return errs
}

// with runs fn on cf's descriptor, opening it (creating the file when
// create is set) and closing idle ones beyond the limit first.
func (c *cqFiles) with(cf *cqFile, create bool, fn func(vfs.File) error) error {
	f, err := c.acquire(cf, create)
	if err != nil {
		return err
	}
	defer c.release(cf)
	return fn(f)
}

func (c *cqFiles) acquire(cf *cqFile, create bool) (vfs.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cf.gone {
		return nil, &iofs.PathError{Op: "open", Path: cf.path, Err: iofs.ErrNotExist}
	}
	if cf.f != nil {
		c.lru.MoveToFront(cf.elem)
		cf.refs++
		return cf.f, nil
	}
	for e := c.lru.Back(); e != nil && c.open >= c.limit; {
		prev := e.Prev()
		if old := e.Value.(*cqFile); old.refs == 0 {
			c.closeLocked(old)
		}
		e = prev
	}
	f, err := c.fs.OpenFile(cf.path, create)
	if err != nil {
		return nil, err
	}
	cf.f, cf.elem, cf.refs = f, c.lru.PushFront(cf), 1
	c.open++
	return f, nil
}

// release ends a use of cf. The last user closes it when it is gone, or
// when the cache is over its limit: acquire opens past the limit when
// every open file is in use (a checkpoint syncs up to syncParallelism
// files at once, readers and the dispatcher hold theirs), and without this
// the excess stayed open until the next open of another file.
func (c *cqFiles) release(cf *cqFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cf.refs--
	if cf.refs == 0 && cf.f != nil && (cf.gone || c.open > c.limit) {
		c.closeLocked(cf)
	}
}

// closeLocked closes an idle file. A close error is dropped: the file was
// only read or written, and flush reopens it to sync. REQUIRES: c.mu.
func (c *cqFiles) closeLocked(cf *cqFile) error {
	err := cf.f.Close()
	c.lru.Remove(cf.elem)
	cf.f, cf.elem = nil, nil
	c.open--
	return err
}

// forget closes cf, or has its last user close it, and keeps it from
// being opened again (removal, or the store closing).
func (c *cqFiles) forget(cf *cqFile) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cf.gone = true
	if cf.f == nil || cf.refs > 0 {
		return nil
	}
	return c.closeLocked(cf)
}

// openCount is the number of open consume-queue files.
func (c *cqFiles) openCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// EntrySize is the size of a consume-queue entry on disk; BlockEntries is
// how many entries a queue reads (and keeps at its tail) at once.
const (
	EntrySize    = cqEntrySize
	BlockEntries = cqBlockEntries
)

// Dir is the directory of the queue of topic/queueID under the data dir.
func Dir(root, topic string, queueID int32) string { return cqDir(root, topic, queueID) }

// DecodeEntry decodes a 20-byte consume-queue entry.
func DecodeEntry(b []byte) (phys int64, size int32, tags int64) { return decodeCQ(b) }

// startAt writes the queue's first file: blank entries from the file's
// first entry up to first (none when first starts a file; the file is
// created empty then), so that a reload finds the queue starting at first
// even before any entry is written. REQUIRES: a new queue, before Start.
func (q *Queue) startAt(first int64) error {
	cf, err := q.fileFor(first)
	if err != nil {
		return err
	}
	blanks := make([]byte, (first-cf.first)*cqEntrySize)
	for i := 0; i < len(blanks); i += cqEntrySize {
		encodeBlank(blanks[i:])
	}
	err = q.cache.with(cf, true, func(f vfs.File) error {
		_, err := f.WriteAt(blanks, 0)
		return err
	})
	if err != nil {
		return q.ioErr("write", cf, err)
	}
	q.cache.markDirty(cf)
	return nil
}
