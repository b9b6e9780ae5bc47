package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/storaged/storaged/storage/vfs"
)

// cqEntrySize is a consume-queue entry: int64 commitlog offset, int32
// size, int64 tags code (RocketMQ CQ_STORE_UNIT_SIZE).
const cqEntrySize = 20

// DefaultConsumeQueueEntries is the number of entries per consume-queue
// file (RocketMQ mappedFileSizeConsumeQueue / 20).
const DefaultConsumeQueueEntries = 300000

// consumeQueue is the index of one topic-queue: entry i, at byte i*20,
// locates the message with queue offset i in the commitlog. Files are named
// by the 20-digit byte offset of their first entry. Entries are written only
// by the dispatcher; readers find them through the atomic count.
type consumeQueue struct {
	fs       vfs.FS
	topic    string
	queueID  int32
	dir      string
	fileSize int64 // entries per file * 20

	mu    sync.RWMutex // guards files
	files []*mappedFile

	// count is the number of entries: queue offsets [min, count) exist.
	count atomic.Int64
	// min is the first queue offset still indexed (0 until retention).
	min atomic.Int64
	// flushed is the number of entries known durable.
	flushed int64 // guarded by the dispatcher (single writer)
}

func cqDir(root, topic string, queueID int32) string {
	return filepath.Join(root, "consumequeue", topic, strconv.Itoa(int(queueID)))
}

// loadConsumeQueue maps the queue's files and finds its valid end: the
// first entry that is empty or points at or past commitlogEnd ends it.
// Entries after it are zeroed (they belong to records the commitlog lost).
func loadConsumeQueue(fs vfs.FS, root, topic string, queueID int32, entriesPerFile int, commitlogEnd int64) (*consumeQueue, error) {
	q := &consumeQueue{fs: fs, topic: topic, queueID: queueID, dir: cqDir(root, topic, queueID),
		fileSize: int64(entriesPerFile) * cqEntrySize}
	entries, err := fs.ReadDir(q.dir)
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return nil, fmt.Errorf("storage: read consume queue %s/%d: %w", topic, queueID, err)
	}
	var froms []int64
	for _, e := range entries {
		if from, ok := parseFileName(e.Name); ok && !e.IsDir {
			froms = append(froms, from)
		}
	}
	sort.Slice(froms, func(i, j int) bool { return froms[i] < froms[j] })
	for i, from := range froms {
		if from%q.fileSize != 0 || (i > 0 && from != froms[i-1]+q.fileSize) {
			// A gap or misaligned file: drop it and what follows; the
			// dispatcher rebuilds the entries from the commitlog.
			for _, f := range froms[i:] {
				fs.Remove(filepath.Join(q.dir, fileName(f)))
			}
			break
		}
		m, err := openMappedFile(fs, filepath.Join(q.dir, fileName(from)), from, q.fileSize)
		if err != nil {
			q.close()
			return nil, err
		}
		q.files = append(q.files, m)
	}
	if len(q.files) > 0 {
		q.min.Store(q.files[0].from / cqEntrySize)
	}
	// Find the end: scan back from the last file for the last valid entry.
	end := int64(0)
	if len(q.files) > 0 {
		end = q.files[0].from / cqEntrySize
	}
	for _, m := range q.files {
		n := m.size / cqEntrySize
		i := int64(0)
		for ; i < n; i++ {
			off, size, _ := decodeCQ(m.data[i*cqEntrySize:])
			if size <= 0 || off < 0 || off+int64(size) > commitlogEnd {
				break
			}
		}
		end = m.from/cqEntrySize + i
		if i < n {
			break
		}
	}
	q.truncate(end)
	q.flushed = end
	return q, nil
}

func decodeCQ(b []byte) (off int64, size int32, tags int64) {
	return int64(binary.BigEndian.Uint64(b)), int32(binary.BigEndian.Uint32(b[8:])), int64(binary.BigEndian.Uint64(b[12:]))
}

// truncate drops entries from queue offset end on: zeroes them and removes
// files that start after end.
func (q *consumeQueue) truncate(end int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	keep := q.files[:0]
	for _, m := range q.files {
		start := m.from / cqEntrySize
		switch {
		case start > end || (start == end && start > 0 && len(keep) > 0):
			m.remove()
			continue
		case start+m.size/cqEntrySize > end:
			clear(m.data[(end-start)*cqEntrySize:])
		}
		m.wrote.Store(m.size)
		m.flushed.Store(0)
		keep = append(keep, m)
	}
	q.files = keep
	q.count.Store(end)
	if end < q.min.Load() {
		q.min.Store(end)
	}
}

// put writes entry queueOffset. It is idempotent: an entry already there
// with the same commitlog offset is left alone. REQUIRES: the dispatcher.
func (q *consumeQueue) put(queueOffset, phys int64, size int32, tags int64) error {
	if queueOffset < q.count.Load() {
		return nil // already indexed (re-dispatch after recovery)
	}
	if queueOffset != q.count.Load() {
		return fmt.Errorf("storage: consume queue %s/%d: entry %d after %d entries: queue offsets out of order",
			q.topic, q.queueID, queueOffset, q.count.Load())
	}
	pos := queueOffset * cqEntrySize
	from := pos - pos%q.fileSize
	m := q.file(from)
	if m == nil {
		if err := q.fs.MkdirAll(q.dir); err != nil {
			return fmt.Errorf("storage: create consume queue dir: %w", err)
		}
		var err error
		if m, err = createMappedFile(q.fs, q.dir, from, q.fileSize); err != nil {
			return err
		}
		m.wrote.Store(m.size)
		q.mu.Lock()
		if len(q.files) == 0 {
			q.min.Store(from / cqEntrySize)
		}
		q.files = append(q.files, m)
		q.mu.Unlock()
	}
	b := m.data[pos-from:]
	binary.BigEndian.PutUint64(b, uint64(phys))
	binary.BigEndian.PutUint32(b[8:], uint32(size))
	binary.BigEndian.PutUint64(b[12:], uint64(tags))
	q.count.Store(queueOffset + 1)
	return nil
}

func (q *consumeQueue) file(from int64) *mappedFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.fileLocked(from)
}

// fileLocked is file. REQUIRES: q.mu held.
func (q *consumeQueue) fileLocked(from int64) *mappedFile {
	for i := len(q.files) - 1; i >= 0; i-- {
		if q.files[i].from == from {
			return q.files[i]
		}
	}
	return nil
}

// get returns entry queueOffset, or ok=false when it is not indexed. It
// reads under q.mu, so retention can unmap the files it drops.
func (q *consumeQueue) get(queueOffset int64) (phys int64, size int32, tags int64, ok bool) {
	if queueOffset < q.min.Load() || queueOffset >= q.count.Load() {
		return 0, 0, 0, false
	}
	pos := queueOffset * cqEntrySize
	q.mu.RLock()
	defer q.mu.RUnlock()
	m := q.fileLocked(pos - pos%q.fileSize)
	if m == nil {
		return 0, 0, 0, false
	}
	phys, size, tags = decodeCQ(m.data[pos-m.from:])
	return phys, size, tags, true
}

// dropFilesBelow takes off the queue the files whose entries all lie below
// queue offset entry, never the last file, and returns them; the caller
// deletes them (retention, after moving min to entry).
func (q *consumeQueue) dropFilesBelow(entry int64) []*mappedFile {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.files)-1 && (q.files[n].from+q.fileSize)/cqEntrySize <= entry {
		n++
	}
	if n == 0 {
		return nil
	}
	gone := append([]*mappedFile(nil), q.files[:n]...)
	q.files = append([]*mappedFile(nil), q.files[n:]...)
	return gone
}

// flush msyncs the entries written since the last flush. REQUIRES: the
// dispatcher (single writer).
func (q *consumeQueue) flush() error {
	end := q.count.Load()
	if end <= q.flushed {
		return nil
	}
	q.mu.RLock()
	files := q.files
	q.mu.RUnlock()
	for _, m := range files {
		start, stop := m.from, m.from+m.size
		lo, hi := max(q.flushed*cqEntrySize, start), min(end*cqEntrySize, stop)
		if lo >= hi {
			continue
		}
		if err := m.sync(lo-start, hi-start); err != nil {
			return fmt.Errorf("storage: flush consume queue %s/%d: %w", q.topic, q.queueID, err)
		}
	}
	q.flushed = end
	return nil
}

func (q *consumeQueue) close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for _, m := range q.files {
		errs = append(errs, m.close())
	}
	q.files = nil
	return errors.Join(errs...)
}

// TagsCode is the consume-queue tags code of a TAGS value: Java's
// String.hashCode over UTF-16 code units, sign-extended. 0 for no tag.
func TagsCode(tags string) int64 {
	var h int32
	for _, r := range tags {
		h = hashRune(h, r)
	}
	return int64(h)
}

// tagsCodeBytes is TagsCode over UTF-8 bytes, without allocating: the
// dispatcher runs it for every message.
func tagsCodeBytes(tags []byte) int64 {
	var h int32
	for len(tags) > 0 {
		r, n := utf8.DecodeRune(tags)
		h = hashRune(h, r)
		tags = tags[n:]
	}
	return int64(h)
}

// hashRune folds r into a Java String.hashCode as its UTF-16 code units.
func hashRune(h int32, r rune) int32 {
	if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError || r2 != utf8.RuneError {
		return 31*(31*h+int32(r1)) + int32(r2)
	}
	return 31*h + int32(r)
}
