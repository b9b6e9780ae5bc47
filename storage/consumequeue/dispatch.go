package consumequeue

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
)

// Index is the consume queues and their dispatcher: it follows the
// commitlog and writes consume-queue entries (RocketMQ
// ReputMessageService). It dispatches only up to Options.Watermark: the
// durable offset in sync mode, so that a consumer never reads a message
// that a power cut could take back (RocketMQ #8239), the written offset in
// async mode, the commit index under replication. It also writes the
// checkpoint.
type Index struct {
	opts Options
	root string
	log  Log

	mu     sync.RWMutex // guards queues
	queues map[Key]*Queue
	files  *cqFiles // the consume queues' open files

	// touched holds the queues with entries put this round, published at
	// its end (publishQueues); unfiled the queues with entries not in
	// their files yet (fileQueues), and fileFailed says the last attempt
	// to write them failed. verify makes a round check every record's
	// CRC first (rebuild, over records recovery did not scan), naming
	// verifyFlushed in the CorruptionError. Guarded by runMu.
	touched       []*Queue
	unfiled       []*Queue
	fileFailed    bool
	verify        bool
	verifyFlushed int64

	// runMu is held by every dispatch round and checkpoint, so a test can
	// pause the store at a consistent point (see Store.pause).
	// A put waiting to read its write may take it too (visible.go).
	runMu      sync.Mutex
	next       int64        // next commitlog offset to dispatch; guarded by runMu
	dispatched atomic.Int64 // published after the entries are written
	closed     bool         // queues unmapped: no more rounds; guarded by runMu
	// stalled is set while the last round failed.
	stalled atomic.Bool

	// progress wakes puts waiting for runMu (visible.go); notify wakes
	// the long polls of the queues a round advanced (notify.go).
	progress progress
	notify   *queueNotifier
	// collect says the current round notes the queues it advances in
	// advanced (a poll waits); advancedAll that it advanced more than
	// maxAdvanced of them. Guarded by runMu.
	collect     bool
	advanced    []Key
	advancedAll bool
	// lastTopic is the topic of the last record dispatched, kept across
	// rounds so that a round per put does not allocate its topic string
	// each time, and lastApply its applier (Options.Apply). Guarded by
	// runMu.
	lastTopic string
	lastApply Applier
	// applyNext: records at or past it go to their applier, and it moves
	// past each one applied, so a record indexed again (a round that
	// failed part way starts over from an earlier offset) is applied
	// once. MaxInt64 until StartApplyingPaused. Guarded by runMu.
	applyNext int64

	// cpMu serialises checkpoints (the dispatcher's, retention's, Close's)
	// and guards lastCP. Lock order: cpMu, then runMu.
	cpMu   sync.Mutex
	lastCP Checkpoint // last checkpoint written; guarded by cpMu
	// afterSnapshot, if set (tests), runs once a checkpoint has taken its
	// snapshot and released runMu.
	afterSnapshot func()

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

// New returns an empty index over log (Load finds the queues on disk). It
// starts nothing: Start runs the dispatcher goroutine, Close ends it.
func New(log Log, opts Options) *Index {
	return &Index{opts: opts, root: opts.Dir, log: log, queues: map[Key]*Queue{}, notify: newQueueNotifier(),
		files: newCQFiles(opts.FS, opts.MaxOpenFiles), applyNext: math.MaxInt64,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// Load finds every consume queue on disk, without opening its files,
// and cuts each to the count the checkpoint recorded for it (want; see
// loadConsumeQueue).
func (d *Index) Load(commitlogEnd int64, want func(topic string, qid int32) int64) error {
	fs := d.opts.FS
	topics, err := fs.ReadDir(filepath.Join(d.root, "consumequeue"))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: read consume queues: %w", err)
	}
	for _, t := range topics {
		if !t.IsDir || !record.ValidTopic(t.Name) {
			continue
		}
		ids, err := fs.ReadDir(filepath.Join(d.root, "consumequeue", t.Name))
		if err != nil {
			return fmt.Errorf("storage: read consume queues of %s: %w", t.Name, err)
		}
		for _, id := range ids {
			topic, qid, ok := SplitQueueName(t.Name + "/" + id.Name)
			if !ok || !id.IsDir {
				continue
			}
			q, err := loadQueue(d.files, d.root, topic, qid, d.opts.EntriesPerFile,
				want(topic, qid), commitlogEnd)
			if err != nil {
				return err
			}
			d.queues[Key{topic, qid}] = q
		}
	}
	return nil
}

func (d *Index) Start() {
	d.wg.Add(1)
	go d.loop()
}

// dispatchPause is how long the dispatcher lets records accumulate after a
// round that found work, before it answers the next wake. A round per put
// costs the writers: waking the dispatcher is a futex call when it is
// parked, and a dispatcher right behind the writer reads the cache line
// the writer is still filling, so the line bounces between cores. On the
// project's 2-core VM a round per put added ~300 ns to a 1 KiB async put
// (BENCHMARKS.md). RocketMQ's ReputMessageService waits 1 ms between
// rounds; the same here bounds what the pause adds to a message's
// visibility under load, and a put after an idle spell is still dispatched
// at once.
const dispatchPause = time.Millisecond

// loop runs dispatch rounds when kicked and the checkpoint on a ticker.
// A round or checkpoint that failed transiently (faults.go) is retried on
// the retry timer with the source's backoff, whether or not a put kicks
// the dispatcher meanwhile: once puts are refused, none will.
func (d *Index) loop() {
	defer d.wg.Done()
	t := time.NewTicker(d.opts.CheckpointInterval)
	defer t.Stop()
	pause := time.NewTimer(dispatchPause)
	pause.Stop()
	retry := time.NewTimer(fault.RetryMax)
	retry.Stop()
	defer retry.Stop()
	retrying := false // retry is armed
	for {
		if !retrying {
			if delay, ok := d.opts.Faults.RetryIn(fault.ConsumeQueue, fault.Checkpoint); ok {
				retry.Reset(delay)
				retrying = true
			}
		}
		select {
		case <-d.kick:
			if !d.Run(d.opts.Watermark()) {
				continue
			}
			pause.Reset(dispatchPause)
			select {
			case <-pause.C:
			case <-d.done:
				return
			}
		case <-t.C:
			d.Run(d.opts.Watermark())
			d.checkpointRound()
		case <-retry.C:
			retrying = false
			d.Run(d.opts.Watermark())
			if d.opts.Faults.Failing(fault.Checkpoint) || d.opts.Faults.Failing(fault.ConsumeQueue) {
				d.checkpointRound() // writes the entries not in their files (fileQueues)
			}
		case <-d.done:
			return
		}
	}
}

// checkpointRound writes the checkpoint and records the outcome: a failed
// commitlog sync is sticky (checkpoint already reported it), a failed
// write of consume-queue entries a fault of the consume queues
// (fileQueues recorded it), any other failure a transient fault of the
// checkpoint; loop retries both.
func (d *Index) checkpointRound() {
	err := d.Checkpoint()
	switch {
	case err == nil:
		d.opts.Faults.Cleared(fault.Checkpoint)
	case errors.Is(err, base.ErrWriteFailed), errors.Is(err, errFiling):
	default:
		d.opts.Faults.Failed(fault.Checkpoint, err)
	}
}

// Wake asks for a dispatch round without blocking.
func (d *Index) Wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run dispatches every record in [next, end) and publishes the progress.
// It reports whether there was anything to dispatch.
func (d *Index) Run(end int64) bool {
	d.runMu.Lock()
	did, _ := d.runLocked(end)
	d.unlockRun()
	return did
}

// maxAdvanced bounds the queues a round notes for the long polls; a round
// that advances more wakes every poll.
const maxAdvanced = 1024

// runLocked is Run. It publishes the progress (dispatched, then the long
// polls of the queues advanced) whether or not the round failed part way.
// REQUIRES: runMu held.
func (d *Index) runLocked(end int64) (bool, error) {
	if d.closed || d.next >= end {
		return false, nil
	}
	d.collect = d.notify.active()
	err := d.dispatchTo(end)
	d.dispatched.Store(d.next)
	switch {
	case d.collect && !d.advancedAll:
		d.notify.signal(d.advanced)
	case d.collect || d.notify.active():
		// Too many queues to name, or a poll registered during the round,
		// after collect was decided: it may have looked before this
		// round's entries were published, so wake it (wake everyone).
		d.notify.signalAll()
	}
	d.collect, d.advanced, d.advancedAll = false, d.advanced[:0], false
	if err != nil {
		d.stalled.Store(true)
		if errors.Is(err, base.ErrCorrupt) {
			d.opts.Fail(err) // the commitlog itself is bad: no retry can help
		} else {
			// A consume-queue write failed (ENOSPC, EMFILE, EIO): next
			// stays at the entry that failed and loop retries it. Kick
			// it, in case this round was a put's (visible.go): it arms
			// its retry timer when it wakes.
			d.opts.Faults.Failed(fault.ConsumeQueue, err)
			d.Wake()
		}
		return true, err
	}
	d.stalled.Store(false)
	if !d.fileFailed {
		d.opts.Faults.Cleared(fault.ConsumeQueue)
	}
	return true, nil
}

// noteAdvanced records that the round wrote an entry of k. REQUIRES:
// runMu held, d.collect.
func (d *Index) noteAdvanced(topic string, qid int32) {
	if n := len(d.advanced); n > 0 && d.advanced[n-1] == (Key{topic, qid}) || d.advancedAll {
		return
	}
	if len(d.advanced) == maxAdvanced {
		d.advancedAll = true
		return
	}
	d.advanced = append(d.advanced, Key{topic, qid})
}

// dispatchTo indexes the records in [next, end). The entries of a round
// are published at its end (publishQueues), from the queues' in-memory
// tails; they reach their files when a tail moves on to its next block
// and before every checkpoint (fileQueues). A record whose entry cannot
// be taken (its queue's tail is full and the write of it failed: a full
// disk, EMFILE) ends the round there: next stays at it, and a later round
// takes it.
func (d *Index) dispatchTo(end int64) error {
	err := d.dispatchRecords(end)
	d.publishQueues()
	return err
}

func (d *Index) dispatchRecords(end int64) error {
	// Deleted topics: their records below the delete are never indexed
	// again. Tombstones change only under runMu, which the caller holds.
	tombs := d.opts.Tombstones()
	skipBelow := tombs[d.lastTopic]
	fileSize := d.log.FileSize()
	for d.next < end {
		b := d.log.At(d.next)
		if b == nil {
			return fmt.Errorf("storage: dispatch: no commitlog file holds offset %d", d.next)
		}
		fileStart := d.next - d.next%fileSize
		if len(b) < record.BlankLen || record.IsBlank(b) {
			d.next = fileStart + fileSize
			continue
		}
		bad := func(reason string) error {
			return &base.CorruptionError{File: "commitlog/" + segment.FileName(fileStart), Offset: d.next,
				Flushed: d.verifyFlushed, Reason: reason}
		}
		var h record.Header
		var err error
		if d.verify {
			// Recovery checked the records from its scan start on, not
			// those below it that a rebuild reads: check each completely.
			h, err = record.Check(b, d.opts.RequireCRC)
			if err == nil && h.PhysOffset != d.next {
				err = record.Corrupt("PHYSICALOFFSET %d, record lies at %d (stale bytes)", h.PhysOffset, d.next)
			}
			if err != nil {
				return bad(err.Error() + " (found rebuilding the consume queues)")
			}
		} else if h, err = record.Parse(b); err != nil {
			// No CRC check: recovery or a rebuild's verify did, or this
			// process wrote the record. Every length is still checked.
			return bad("dispatch: " + err.Error())
		}
		if h.QueueID < 0 || h.QueueOffset < 0 {
			return bad(fmt.Sprintf("dispatch: queue id %d, queue offset %d", h.QueueID, h.QueueOffset))
		}
		if tx := h.Tx(); tx == record.TransactionNotType || tx == record.TransactionCommitType {
			topic := d.lastTopic
			if string(h.Topic) != d.lastTopic {
				topic = string(h.Topic)
				if !record.ValidTopic(topic) { // it names a directory
					return bad(fmt.Sprintf("dispatch: invalid topic %q", topic))
				}
				d.lastTopic = topic
				d.lastApply = nil
				if d.opts.Apply != nil {
					d.lastApply = d.opts.Apply(topic)
				}
				skipBelow = tombs[topic]
			}
			if d.next < skipBelow {
				d.next += int64(h.Total)
				continue
			}
			q := d.queueFor(topic, h.QueueID)
			var tags int64
			switch topic {
			case record.ScheduleTopic:
				tags = d.deliverAt(h.StoreTS, int(h.QueueID)+1)
			case record.TimerTopic:
				// The delivery time (or the recall marker): the timer
				// service rebuilds its due index from the entries alone.
				tags = record.TimerTagsCode(&h)
			default:
				tags = record.TagsCodeBytes(h.Property(record.PropertyTags))
			}
			had := q.unpublished()
			err = q.put(h.QueueOffset, d.next, h.Total, tags)
			if !had && q.unpublished() {
				d.touched = append(d.touched, q)
			}
			if !q.unfiled && q.pending() {
				q.unfiled = true
				d.unfiled = append(d.unfiled, q)
			}
			if err != nil {
				return err
			}
			if d.collect {
				d.noteAdvanced(topic, h.QueueID)
			}
			if d.lastApply != nil && d.next >= d.applyNext {
				d.lastApply(d.next, b[:h.Total])
				d.applyNext = d.next + int64(h.Total)
			}
		}
		d.next += int64(h.Total)
	}
	return nil
}

// publishQueues lets readers see the round's entries. REQUIRES: runMu.
func (d *Index) publishQueues() {
	for _, q := range d.touched {
		q.publish()
	}
	clear(d.touched)
	d.touched = d.touched[:0]
}

// errFiling marks a checkpoint that failed writing consume-queue entries
// to their files (fileQueues), a fault of the consume queues, not of the
// checkpoint.
var errFiling = errors.New("storage: write consume-queue entries")

// fileQueues writes every queue's entries that are not in its file yet,
// one write per queue. A queue whose write fails keeps its entries in its
// tail (readable, as before) and stays on the list for the next try; the
// failure is a transient fault of the consume queues until a try
// succeeds. REQUIRES: runMu.
func (d *Index) fileQueues() error {
	var errs []error
	keep := d.unfiled[:0]
	for _, q := range d.unfiled {
		if err := q.writePending(); err != nil {
			errs = append(errs, err)
			keep = append(keep, q)
			continue
		}
		q.unfiled = false
	}
	clear(d.unfiled[len(keep):])
	d.unfiled = keep
	if err := errors.Join(errs...); err != nil {
		d.fileFailed = true
		d.opts.Faults.Failed(fault.ConsumeQueue, err)
		return fmt.Errorf("%w: %w", errFiling, err)
	}
	if d.fileFailed {
		d.fileFailed = false
		if !d.stalled.Load() {
			d.opts.Faults.Cleared(fault.ConsumeQueue)
		}
	}
	return nil
}

// forgetUnfiled takes q off the list of queues to write (Jump drops it).
// REQUIRES: runMu.
func (d *Index) forgetUnfiled(q *Queue) {
	if q.unfiled {
		d.unfiled = slices.DeleteFunc(d.unfiled, func(u *Queue) bool { return u == q })
		q.unfiled = false
	}
}

// deliverAt is the delivery time (Unix ms) of a delayed message stored at
// storeTS on level: the store time plus the level's delay, except that a
// store time ahead of the clock counts from the clock instead. Store times
// never go backwards (appendRecords), so after the clock is set back every
// put is stamped with the last time stamped before, up to the jump ahead of
// the clock; counting from that would hold a 1 s message for the whole
// jump. The dispatch follows the put within milliseconds, so the clock
// read here is (nearly) the put's own time and the message is still never
// delivered before its delay has passed on the clock. A re-dispatch at a
// restart reads a later clock, so it can only deliver later, never
// earlier.
func (d *Index) deliverAt(storeTS int64, level int) int64 {
	from := storeTS
	if now := d.opts.Clock.Now().UnixMilli(); now < from {
		from = now
	}
	return from + d.opts.Delay(level).Milliseconds()
}

func (d *Index) queueFor(topic string, qid int32) *Queue {
	k := Key{topic, qid}
	d.mu.RLock()
	q := d.queues[k]
	d.mu.RUnlock()
	if q != nil {
		return q
	}
	// Nothing on disk yet: the first writePending creates the directory
	// and the file, without a sync; the next checkpoint syncs them.
	q = newQueue(d.files, d.root, topic, qid, d.opts.EntriesPerFile)
	d.mu.Lock()
	d.queues[k] = q
	d.mu.Unlock()
	return q
}

// Queue returns the consume queue of topic/qid, or nil.
func (d *Index) Queue(topic string, qid int32) *Queue {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.queues[Key{topic, qid}]
}

// checkpoint makes the consume queues and the commitlog durable up to the
// dispatched offset and records both. It holds runMu only to take its
// snapshot (the dispatched offset, the queue counts, the files and
// directories to sync): the syncs and the checkpoint write, several ms and
// up to seconds after many new queues, run without it, so neither dispatch
// rounds nor the puts waiting to read their writes (visible.go) wait for
// them. Checkpoints run one at a time (cpMu). REQUIRES: runMu not held.
func (d *Index) Checkpoint() error {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	d.runMu.Lock()
	// Every entry the checkpoint counts must be in its file when the
	// files are synced below.
	if err := d.fileQueues(); err != nil {
		d.unlockRun()
		return err
	}
	dispatched, counts := d.snapshotLocked()
	files, dirs := d.files.take()
	d.unlockRun()
	if d.afterSnapshot != nil {
		d.afterSnapshot()
	}
	// A queue's new entries, its new files and their directories are
	// durable before the checkpoint records its count. Creating them
	// synced nothing (writePending), so that a new queue never holds up
	// the dispatch of others; this is where they become durable, together.
	if failedFiles, failedDirs, err := d.files.syncTaken(files, dirs); err != nil {
		d.runMu.Lock()
		d.files.giveBack(failedFiles, failedDirs)
		d.unlockRun()
		return err
	}
	// Everything dispatched must be durable before the checkpoint says so.
	// In async mode this sync also bounds the loss window to
	// CheckpointInterval, whatever the flush policy's page threshold (see
	// storage.Options.FlushLeastPages).
	flushed, err := d.log.Sync(0)
	if err != nil {
		// The commitlog's own sync: the one sticky failure.
		d.opts.Fail(err)
		return fmt.Errorf("%w: sync before checkpoint: %w", base.ErrWriteFailed, err)
	}
	if dispatched > flushed { // cannot happen: dispatched ≤ written ≤ flushed after Sync(0)
		dispatched = flushed
	}
	cp := Checkpoint{Flushed: flushed, Dispatched: dispatched, Queues: counts, StoreTime: d.opts.LastStoreTime()}
	if d.opts.Raft != nil {
		// Read after the dispatched offset: the commit end only grows, and
		// nothing is dispatched past it. A point that breaks the rule (a
		// snapshot install moving both meanwhile) is left out this time.
		if p, ok := d.opts.Raft(); ok && p.CommitEnd >= dispatched {
			cp.RaftPoint = p
		}
	}
	if cp.Flushed == d.lastCP.Flushed && cp.Dispatched == d.lastCP.Dispatched && len(cp.Queues) == len(d.lastCP.Queues) &&
		cp.RaftApplied == d.lastCP.RaftApplied {
		return nil
	}
	if err := WriteCheckpoint(d.opts.FS, d.root, cp); err != nil {
		return err
	}
	d.lastCP = cp
	return nil
}

// LastCheckpoint returns the last checkpoint written.
func (d *Index) LastCheckpoint() Checkpoint {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	return d.lastCP
}

// snapshotLocked returns the dispatched offset and every queue's count:
// what a checkpoint records. REQUIRES: runMu held.
func (d *Index) snapshotLocked() (int64, map[string]int64) {
	dispatched := d.next
	counts := map[string]int64{}
	d.mu.RLock()
	queues := make([]*Queue, 0, len(d.queues))
	for _, q := range d.queues {
		queues = append(queues, q)
	}
	d.mu.RUnlock()
	sort.Slice(queues, func(i, j int) bool {
		return QueueName(queues[i].topic, queues[i].queueID) < QueueName(queues[j].topic, queues[j].queueID)
	})
	for _, q := range queues {
		counts[QueueName(q.topic, q.queueID)] = q.count.Load()
	}
	return dispatched, counts
}

// Stop ends the goroutine; the queues stay open (Close).
func (d *Index) Stop() {
	select {
	case <-d.done:
		return
	default:
	}
	close(d.done)
	d.wg.Wait()
}

// Close stops the dispatcher if running and closes the queues.
func (d *Index) Close() error {
	d.Stop()
	d.runMu.Lock() // a put dispatching itself (visible.go) finishes first
	d.closed = true
	d.unlockRun()
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, q := range d.queues {
		errs = append(errs, q.close())
	}
	return errors.Join(errs...)
}

// OpenFiles is the number of consume-queue files open now.
func (d *Index) OpenFiles() int { return d.files.openCount() }
