package consumequeue

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"path/filepath"
	"sort"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
)

// Topic is the queue's topic.
func (q *Queue) Topic() string { return q.topic }

// ID is the queue's id.
func (q *Queue) ID() int32 { return q.queueID }

// Min is the first queue offset still indexed (0 until retention trims).
func (q *Queue) Min() int64 { return q.min.Load() }

// Count is the number of entries readers may use: offsets [Min, Count).
func (q *Queue) Count() int64 { return q.count.Load() }

// Get returns entry queueOffset (commitlog offset, size, tags code), or
// ok=false when it is not indexed or cannot be read (Lookup says why).
func (q *Queue) Get(queueOffset int64) (phys int64, size int32, tags int64, ok bool) {
	return q.get(queueOffset)
}

// Lookup is Get with the read error.
func (q *Queue) Lookup(queueOffset int64) (phys int64, size int32, tags int64, ok bool, err error) {
	return q.lookup(queueOffset)
}

// Dispatched is the commitlog offset up to which every record is indexed
// (published after the entries are written).
func (d *Index) Dispatched() int64 { return d.dispatched.Load() }

// Stalled reports whether the last dispatch round failed.
func (d *Index) Stalled() bool { return d.stalled.Load() }

// Done is closed when the dispatcher stops (Stop or Close): long polls end.
func (d *Index) Done() <-chan struct{} { return d.done }

// WaitAdvance registers a long poll on k: the channel is closed at the
// next dispatch round that advances k. Call release once after, whether or
// not it closed (see queueNotifier).
func (d *Index) WaitAdvance(k Key) (advanced <-chan struct{}, release func()) {
	return d.notify.wait(k)
}

// WokenPolls counts the long polls a dispatch round woke (tests).
func (d *Index) WokenPolls() uint64 { return d.notify.woken.Load() }

// Keys lists the queues, in no order.
func (d *Index) Keys() []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]Key, 0, len(d.queues))
	for k := range d.queues {
		out = append(out, k)
	}
	return out
}

// Len is the number of queues.
func (d *Index) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.queues)
}

// queueList returns the queues, in no order.
func (d *Index) queueList() []*Queue {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]*Queue, 0, len(d.queues))
	for _, q := range d.queues {
		out = append(out, q)
	}
	return out
}

// Rebuild indexes the records in [from, end), before Start, checking every
// one completely (recovery checked only the records from its own scan
// start on; damage below it is a *CorruptionError naming cp.Flushed), then
// publishes the position and takes cp as the last checkpoint written.
func (d *Index) Rebuild(from, end int64, cp Checkpoint) error {
	d.runMu.Lock()
	defer d.unlockRun()
	d.next = from
	d.verify, d.verifyFlushed = true, cp.Flushed
	err := d.dispatchTo(end)
	d.verify = false
	if err != nil {
		return fmt.Errorf("storage: rebuild consume queues: %w", err)
	}
	d.dispatched.Store(d.next)
	d.cpMu.Lock()
	d.lastCP = cp
	d.cpMu.Unlock()
	return nil
}

// Paused runs fn with the dispatcher paused between rounds (no round runs
// meanwhile), then wakes the puts waiting to index (visible.go). fn may
// call DropTopicPaused.
func (d *Index) Paused(fn func()) {
	d.runMu.Lock()
	defer d.unlockRun()
	fn()
}

// StartApplyingPaused starts the system records' hook (Options.Apply):
// every record of a topic with an applier that is indexed from the
// current dispatch position on is passed to it once, in log order; none
// before. The store rebuilds its state from what is indexed already (its
// consume queues) and then calls this, so that state equals a replay of
// the indexed log at every point. A caller that rebuilds the state again
// later (a snapshot installed) calls it again after. REQUIRES: inside
// Paused, or before Start.
func (d *Index) StartApplyingPaused() { d.applyNext = d.next }

// DropTopicPaused removes every consume queue of topic and its files.
// REQUIRES: inside Paused, or before Start.
func (d *Index) DropTopicPaused(topic string) error {
	d.mu.Lock()
	var qs []*Queue
	for k, q := range d.queues {
		if k.Topic == topic {
			qs = append(qs, q)
			delete(d.queues, k)
		}
	}
	d.mu.Unlock()
	for _, q := range qs {
		d.forgetUnfiled(q) // its entries are never written now
	}
	var errs []error
	for _, q := range qs {
		errs = append(errs, q.close())
	}
	// Remove the files and sync each queue dir before the dirs go, so no
	// crash image brings a removed file back under a re-created queue.
	fs := d.opts.FS
	root := filepath.Join(d.root, "consumequeue")
	for _, q := range qs {
		entries, err := fs.ReadDir(q.dir)
		if err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if !e.IsDir {
				errs = append(errs, fs.Remove(filepath.Join(q.dir, e.Name)))
			}
		}
		if len(entries) > 0 {
			errs = append(errs, base.SyncDir(fs, q.dir))
		}
	}
	if err := fs.RemoveAll(filepath.Join(root, topic)); err != nil {
		errs = append(errs, err)
	} else if len(qs) > 0 {
		// No consume-queue directory yet: the topic's entries were all
		// in memory (never filed), so nothing was removed.
		if err := base.SyncDir(fs, root); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// TrimBelow moves every queue's min offset to its first entry whose
// message is at or above commitlog offset minPhys (retention deleted the
// files below it), and deletes the queue files wholly below it, never a
// queue's last file. It returns how many files it deleted.
func (d *Index) TrimBelow(minPhys int64) (int, error) {
	var errs []error
	n := 0
	for _, q := range d.queueList() {
		k, err := q.trimBelow(minPhys)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

func (q *Queue) trimBelow(minPhys int64) (int, error) {
	lo, hi := q.min.Load(), q.count.Load()
	if lo == q.trimmedAt && q.trimmedPhys >= minPhys || lo >= hi {
		return 0, nil // its first entry is still in the commitlog, as last round
	}
	if phys, _, _, ok := q.get(lo); ok && phys >= minPhys {
		q.trimmedAt, q.trimmedPhys = lo, phys
		return 0, nil
	}
	// Entries are in commitlog order: find the first one at or past minPhys.
	i := sort.Search(int(hi-lo), func(i int) bool {
		phys, _, _, ok := q.get(lo + int64(i))
		return !ok || phys >= minPhys
	})
	newMin := lo + int64(i)
	if newMin <= lo {
		return 0, nil
	}
	q.min.Store(newMin)
	gone := q.dropFilesBelow(newMin)
	var errs []error
	n := 0
	for _, cf := range gone {
		if err := cf.remove(); err != nil {
			errs = append(errs, fmt.Errorf("storage: delete consume queue file %s/%d/%s: %w", q.topic, q.queueID,
				segment.FileName(cf.first*cqEntrySize), err))
			continue
		}
		n++
	}
	if len(gone) > 0 {
		if err := base.SyncDir(q.cache.fs, q.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// FirstAtOrAbove is the queue offset of the first entry whose message lies
// at or above commitlog offset minPhys, or Count when there is none: where
// a copy of this queue starts whose commitlog begins at minPhys (a
// snapshot's per-queue first offset, design replication.md §3.5). Entries
// are in commitlog order, so it is a binary search.
func (q *Queue) FirstAtOrAbove(minPhys int64) (int64, error) {
	lo, hi := q.min.Load(), q.count.Load()
	var err error
	i := sort.Search(int(hi-lo), func(i int) bool {
		phys, _, _, ok, lerr := q.lookup(lo + int64(i))
		if lerr != nil && err == nil {
			err = lerr
		}
		return !ok || phys >= minPhys
	})
	if err != nil {
		return 0, err
	}
	return lo + int64(i), nil
}

// StartAt creates the empty queue topic/qid starting at queue offset
// first: the dispatcher's first entry for it must be first, and offsets
// below it are never served. Its first file is written at once with blank
// entries before first (RocketMQ's fill-pre-blank), so that a reload finds
// where it starts even while it holds no entry; the next checkpoint syncs
// the file and records the queue's count. A snapshot's receiver starts
// each queue of the manifest so (design replication.md §3.5), since the
// messages below first were deleted before the snapshot was taken.
// REQUIRES: before Start; the queue must not exist yet.
func (d *Index) StartAt(topic string, qid int32, first int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := Key{topic, qid}
	if _, ok := d.queues[k]; ok {
		return fmt.Errorf("storage: consume queue %s/%d exists already", topic, qid)
	}
	if first < 0 {
		return fmt.Errorf("storage: consume queue %s/%d cannot start at %d", topic, qid, first)
	}
	q := newQueue(d.files, d.root, topic, qid, d.opts.EntriesPerFile)
	q.min.Store(first)
	q.count.Store(first)
	q.written, q.filed, q.tailFirst = first, first, first
	if err := q.startAt(first); err != nil {
		return err
	}
	d.queues[k] = q
	return nil
}

// Jump moves the index onto a snapshot's commitlog at run time (design
// replication.md §3.5: a replica installs a snapshot whose oldest file
// starts at minPhys). swap, which replaces the commitlog's files, runs
// first, with no dispatch round and no checkpoint running (they read the
// files); an error from it is returned as is. The records below minPhys
// are gone then, so dispatching
// goes on from minPhys when it was below. A queue of starts whose count
// is below its start there (the leader deleted its entries in between
// before it took the snapshot) is dropped, files and all, and started
// again at that offset (StartAt's blank prefix); a queue missing here
// with a start above 0 is started so. Every other queue keeps its
// entries: the committed prefix of a group's log is the same on every
// replica, and this replica indexed only committed records. A reader
// still holding a dropped queue finds its files gone (an error, never a
// wrong entry). The next checkpoint is written whatever it finds, since
// queues changed under the same counts. REQUIRES: the dispatcher does not
// run ahead of the commit end, which the caller has not moved yet.
func (d *Index) Jump(minPhys int64, starts map[Key]int64, swap func() error) error {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	d.runMu.Lock()
	defer d.unlockRun()
	if err := swap(); err != nil {
		return err
	}
	d.lastCP = Checkpoint{Flushed: -1}
	d.mu.Lock()
	defer d.mu.Unlock()
	fs := d.opts.FS
	for k, first := range starts {
		q := d.queues[k]
		if first < 0 || (q != nil && q.Count() >= first) || (q == nil && first == 0) {
			continue
		}
		if q != nil {
			var errs []error
			for _, cf := range q.dropFilesBelow(math.MaxInt64) {
				errs = append(errs, cf.remove())
			}
			errs = append(errs, q.close())
			ents, err := fs.ReadDir(q.dir)
			if err != nil && !errors.Is(err, iofs.ErrNotExist) {
				errs = append(errs, err)
			}
			for _, e := range ents {
				if !e.IsDir {
					if err := fs.Remove(filepath.Join(q.dir, e.Name)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
						errs = append(errs, err)
					}
				}
			}
			if len(ents) > 0 {
				errs = append(errs, base.SyncDir(fs, q.dir))
			}
			d.forgetUnfiled(q)
			delete(d.queues, k)
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("storage: drop consume queue %s/%d for a snapshot: %w", k.Topic, k.Queue, err)
			}
		}
		nq := newQueue(d.files, d.root, k.Topic, k.Queue, d.opts.EntriesPerFile)
		nq.min.Store(first)
		nq.count.Store(first)
		nq.written, nq.filed, nq.tailFirst = first, first, first
		if err := nq.startAt(first); err != nil {
			return err
		}
		d.queues[k] = nq
	}
	if d.next < minPhys {
		d.next = minPhys
		d.dispatched.Store(minPhys)
	}
	return nil
}
