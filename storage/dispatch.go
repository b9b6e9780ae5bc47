package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// dispatcher follows the commitlog and writes consume-queue entries
// (RocketMQ ReputMessageService). It dispatches only up to the visible end:
// the durable offset in sync mode, so that a consumer never reads a message
// that a power cut could take back (RocketMQ #8239), and the written offset
// in async mode. It also writes the checkpoint.
type dispatcher struct {
	s    *Store
	root string

	mu     sync.RWMutex // guards queues
	queues map[queueKey]*consumeQueue
	files  *cqFiles // the consume queues' open files

	// touched holds the queues with entries put this round, written at
	// its end (writeQueues); verify makes a round check every record's
	// CRC first (rebuild, over records recovery did not scan), naming
	// verifyFlushed in the CorruptionError. Guarded by runMu.
	touched       []*consumeQueue
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
	advanced    []queueKey
	advancedAll bool
	// lastTopic is the topic of the last record dispatched, kept across
	// rounds so that a round per put does not allocate its topic string
	// each time. Guarded by runMu.
	lastTopic string

	// cpMu serialises checkpoints (the dispatcher's, retention's, Close's)
	// and guards lastCP. Lock order: cpMu, then runMu.
	cpMu   sync.Mutex
	lastCP checkpoint // last checkpoint written; guarded by cpMu
	// afterSnapshot, if set (tests), runs once a checkpoint has taken its
	// snapshot and released runMu.
	afterSnapshot func()

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

func newDispatcher(s *Store) *dispatcher {
	return &dispatcher{s: s, root: s.opts.Dir, queues: map[queueKey]*consumeQueue{}, notify: newQueueNotifier(),
		files: newCQFiles(s.opts.FS, s.opts.MaxOpenQueueFiles),
		kick:  make(chan struct{}, 1), done: make(chan struct{})}
}

// loadQueues finds every consume queue on disk, without opening its files,
// and cuts each to the count the checkpoint recorded for it (want; see
// loadConsumeQueue).
func (d *dispatcher) loadQueues(commitlogEnd int64, want func(topic string, qid int32) int64) error {
	fs := d.s.opts.FS
	topics, err := fs.ReadDir(filepath.Join(d.root, "consumequeue"))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: read consume queues: %w", err)
	}
	for _, t := range topics {
		if !t.IsDir || !validTopic(t.Name) {
			continue
		}
		ids, err := fs.ReadDir(filepath.Join(d.root, "consumequeue", t.Name))
		if err != nil {
			return fmt.Errorf("storage: read consume queues of %s: %w", t.Name, err)
		}
		for _, id := range ids {
			topic, qid, ok := splitQueueName(t.Name + "/" + id.Name)
			if !ok || !id.IsDir {
				continue
			}
			q, err := loadConsumeQueue(d.files, d.root, topic, qid, d.s.opts.ConsumeQueueEntries,
				want(topic, qid), commitlogEnd)
			if err != nil {
				return err
			}
			d.queues[queueKey{topic, qid}] = q
		}
	}
	return nil
}

func (d *dispatcher) start() {
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
func (d *dispatcher) loop() {
	defer d.wg.Done()
	t := time.NewTicker(d.s.opts.CheckpointInterval)
	defer t.Stop()
	pause := time.NewTimer(dispatchPause)
	pause.Stop()
	retry := time.NewTimer(faultRetryMax)
	retry.Stop()
	defer retry.Stop()
	retrying := false // retry is armed
	for {
		if !retrying {
			if delay, ok := d.s.faults.retryIn(faultConsumeQueue, faultCheckpoint); ok {
				retry.Reset(delay)
				retrying = true
			}
		}
		select {
		case <-d.kick:
			if !d.run(d.s.visibleEnd()) {
				continue
			}
			pause.Reset(dispatchPause)
			select {
			case <-pause.C:
			case <-d.done:
				return
			}
		case <-t.C:
			d.run(d.s.visibleEnd())
			d.checkpointRound()
		case <-retry.C:
			retrying = false
			d.run(d.s.visibleEnd())
			if d.s.faults.failing(faultCheckpoint) {
				d.checkpointRound()
			}
		case <-d.done:
			return
		}
	}
}

// checkpointRound writes the checkpoint and records the outcome: a failed
// commitlog sync is sticky (checkpoint already called Store.fail), any
// other failure a transient fault of the checkpoint, retried by loop.
func (d *dispatcher) checkpointRound() {
	err := d.checkpoint()
	switch {
	case err == nil:
		d.s.faults.cleared(faultCheckpoint)
	case errors.Is(err, ErrWriteFailed):
	default:
		d.s.faults.failed(faultCheckpoint, err)
	}
}

// wake asks for a dispatch round without blocking.
func (d *dispatcher) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run dispatches every record in [next, end) and publishes the progress.
// It reports whether there was anything to dispatch.
func (d *dispatcher) run(end int64) bool {
	d.runMu.Lock()
	did, _ := d.runLocked(end)
	d.unlockRun()
	return did
}

// maxAdvanced bounds the queues a round notes for the long polls; a round
// that advances more wakes every poll.
const maxAdvanced = 1024

// runLocked is run. It publishes the progress (dispatched, then the long
// polls of the queues advanced) whether or not the round failed part way.
// REQUIRES: runMu held.
func (d *dispatcher) runLocked(end int64) (bool, error) {
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
		if errors.Is(err, ErrCorrupt) {
			d.s.fail(err) // the commitlog itself is bad: no retry can help
		} else {
			// A consume-queue write failed (ENOSPC, EMFILE, EIO): next
			// stays at the entry that failed and loop retries it. Kick
			// it, in case this round was a put's (visible.go): it arms
			// its retry timer when it wakes.
			d.s.faults.failed(faultConsumeQueue, err)
			d.wake()
		}
		return true, err
	}
	d.stalled.Store(false)
	d.s.faults.cleared(faultConsumeQueue)
	return true, nil
}

// noteAdvanced records that the round wrote an entry of k. REQUIRES:
// runMu held, d.collect.
func (d *dispatcher) noteAdvanced(topic string, qid int32) {
	if n := len(d.advanced); n > 0 && d.advanced[n-1] == (queueKey{topic, qid}) || d.advancedAll {
		return
	}
	if len(d.advanced) == maxAdvanced {
		d.advancedAll = true
		return
	}
	d.advanced = append(d.advanced, queueKey{topic, qid})
}

// dispatchTo indexes the records in [next, end). The entries of a round
// are written at its end, one write per queue (writeQueues); a queue whose
// write fails (a full disk, EMFILE) drops them and next moves back to the
// first of them, so the next round writes them again: puts of the entries
// after it, to other queues, are idempotent.
func (d *dispatcher) dispatchTo(end int64) error {
	err := d.dispatchRecords(end)
	return errors.Join(err, d.writeQueues())
}

func (d *dispatcher) dispatchRecords(end int64) error {
	// Deleted topics: their records below the delete are never indexed
	// again (topics.go). Tombstones change only under runMu, which the
	// caller holds.
	tombs := d.s.topics.tombstones()
	skipBelow := tombs[d.lastTopic]
	for d.next < end {
		f := d.s.queue.findByOffset(d.next)
		if f == nil {
			return fmt.Errorf("storage: dispatch: no commitlog file holds offset %d", d.next)
		}
		rel := d.next - f.from
		b := f.data[rel:]
		if len(b) < BlankLen || IsBlank(b) {
			d.next = f.from + f.size
			continue
		}
		if d.verify {
			if err := verifyRecord(b, f.from+rel, !d.s.opts.DisablePropCRC); err != nil {
				return &CorruptionError{File: "commitlog/" + fileName(f.from), Offset: d.next, Flushed: d.verifyFlushed,
					Reason: err.Error() + " (found rebuilding the consume queues)"}
			}
		}
		m, err := parseMeta(b)
		if err != nil {
			return &CorruptionError{File: "commitlog/" + fileName(f.from), Offset: d.next, Flushed: d.verifyFlushed,
				Reason: "dispatch: " + err.Error()}
		}
		if m.tx == TransactionNotType || m.tx == TransactionCommitType {
			topic := d.lastTopic
			if string(m.topic) != d.lastTopic {
				topic = string(m.topic)
				if !validTopic(topic) { // it names a directory
					return &CorruptionError{File: "commitlog/" + fileName(f.from), Offset: d.next, Flushed: d.verifyFlushed,
						Reason: fmt.Sprintf("dispatch: invalid topic %q", topic)}
				}
				d.lastTopic = topic
				skipBelow = tombs[topic]
			}
			if d.next < skipBelow {
				d.next += int64(m.total)
				continue
			}
			q, err := d.queueFor(topic, m.queueID)
			if err != nil {
				return err
			}
			tags := tagsCodeBytes(m.tags)
			if topic == ScheduleTopic {
				tags = d.deliverAt(m.storeTS, int(m.queueID)+1)
			}
			had := q.pending()
			err = q.put(m.queueOffset, d.next, m.total, tags)
			if !had && q.pending() {
				d.touched = append(d.touched, q)
			}
			if err != nil {
				return err
			}
			if d.collect {
				d.noteAdvanced(topic, m.queueID)
			}
		}
		d.next += int64(m.total)
	}
	return nil
}

// verifyRecord checks the record at the start of b completely, as
// recovery does, and that it lies where it says.
func verifyRecord(b []byte, at int64, requireCRC bool) error {
	if _, err := checkRecord(b, requireCRC); err != nil {
		return err
	}
	if got := int64(binary.BigEndian.Uint64(b[posPhysOffset:])); got != at {
		return corrupt("PHYSICALOFFSET %d, record lies at %d (stale bytes)", got, at)
	}
	return nil
}

// writeQueues writes the round's pending entries, one write per queue. A
// queue that fails drops its pending entries and moves next back to the
// first one (see dispatchTo). REQUIRES: runMu.
func (d *dispatcher) writeQueues() error {
	var errs []error
	for _, q := range d.touched {
		if err := q.writePending(); err != nil {
			errs = append(errs, err)
			if phys, ok := q.dropPending(); ok && phys < d.next {
				d.next = phys
			}
		}
	}
	clear(d.touched)
	d.touched = d.touched[:0]
	return errors.Join(errs...)
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
func (d *dispatcher) deliverAt(storeTS int64, level int) int64 {
	from := storeTS
	if now := d.s.clock.Now().UnixMilli(); now < from {
		from = now
	}
	return from + d.s.delayOf(level).Milliseconds()
}

func (d *dispatcher) queueFor(topic string, qid int32) (*consumeQueue, error) {
	k := queueKey{topic, qid}
	d.mu.RLock()
	q := d.queues[k]
	d.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	// Nothing on disk yet: the first writePending creates the directory
	// and the file, without a sync; the next checkpoint syncs them.
	q = newConsumeQueue(d.files, d.root, topic, qid, d.s.opts.ConsumeQueueEntries)
	d.mu.Lock()
	d.queues[k] = q
	d.mu.Unlock()
	return q, nil
}

// queue returns the consume queue of topic/qid, or nil.
func (d *dispatcher) queue(topic string, qid int32) *consumeQueue {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.queues[queueKey{topic, qid}]
}

// checkpoint makes the consume queues and the commitlog durable up to the
// dispatched offset and records both. It holds runMu only to take its
// snapshot (the dispatched offset, the queue counts, the files and
// directories to sync): the syncs and the checkpoint write, several ms and
// up to seconds after many new queues, run without it, so neither dispatch
// rounds nor the puts waiting to read their writes (visible.go) wait for
// them. Checkpoints run one at a time (cpMu). REQUIRES: runMu not held.
func (d *dispatcher) checkpoint() error {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	d.runMu.Lock()
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
	flushed, err := d.s.queue.Sync(0)
	if err != nil {
		// The commitlog's own sync: the one sticky failure.
		d.s.fail(err)
		return fmt.Errorf("%w: sync before checkpoint: %w", ErrWriteFailed, err)
	}
	if dispatched > flushed { // cannot happen: dispatched ≤ written ≤ flushed after Sync(0)
		dispatched = flushed
	}
	cp := checkpoint{Flushed: flushed, Dispatched: dispatched, Queues: counts, StoreTime: d.s.lastStoreTime()}
	if cp.Flushed == d.lastCP.Flushed && cp.Dispatched == d.lastCP.Dispatched && len(cp.Queues) == len(d.lastCP.Queues) {
		return nil
	}
	if err := writeCheckpoint(d.s.opts.FS, d.root, cp); err != nil {
		return err
	}
	d.lastCP = cp
	return nil
}

// lastCheckpoint returns the last checkpoint written.
func (d *dispatcher) lastCheckpoint() checkpoint {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	return d.lastCP
}

// snapshotLocked returns the dispatched offset and every queue's count:
// what a checkpoint records. REQUIRES: runMu held.
func (d *dispatcher) snapshotLocked() (int64, map[string]int64) {
	dispatched := d.next
	counts := map[string]int64{}
	d.mu.RLock()
	queues := make([]*consumeQueue, 0, len(d.queues))
	for _, q := range d.queues {
		queues = append(queues, q)
	}
	d.mu.RUnlock()
	sort.Slice(queues, func(i, j int) bool {
		return queueName(queues[i].topic, queues[i].queueID) < queueName(queues[j].topic, queues[j].queueID)
	})
	for _, q := range queues {
		counts[queueName(q.topic, q.queueID)] = q.count.Load()
	}
	return dispatched, counts
}

// stop ends the goroutine.
func (d *dispatcher) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	close(d.done)
	d.wg.Wait()
}

func (d *dispatcher) close() error {
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

// openQueueFiles is the number of consume-queue files open now.
func (d *dispatcher) openQueueFiles() int { return d.files.openCount() }

// recordMeta is what dispatch needs from a record header.
type recordMeta struct {
	total       int32
	queueID     int32
	queueOffset int64
	tx          int32
	storeTS     int64
	topic       []byte
	tags        []byte
}

// parseMeta reads the dispatch fields of a record. It does not check CRCs
// (recovery or a rebuild's verify did, or this process wrote the record),
// but it checks every length against the bytes it has, so damaged bytes
// are an error wrapping ErrCorrupt, never a panic.
func parseMeta(b []byte) (recordMeta, error) {
	be := binary.BigEndian
	if len(b) < minRecordLen {
		return recordMeta{}, corrupt("%d bytes is too short for a record", len(b))
	}
	total := int32(be.Uint32(b))
	if total < minRecordLen || int64(total) > int64(len(b)) {
		return recordMeta{}, corrupt("total size %d out of range [%d, %d]", total, minRecordLen, len(b))
	}
	b = b[:total]
	m := recordMeta{total: total, queueID: int32(be.Uint32(b[posQueueID:])),
		queueOffset: int64(be.Uint64(b[posQueueOffset:]))}
	if m.queueID < 0 || m.queueOffset < 0 {
		return recordMeta{}, corrupt("queue id %d, queue offset %d", m.queueID, m.queueOffset)
	}
	sys := int32(be.Uint32(b[posSysFlag:]))
	m.tx = sys & transactionMask
	p := posBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	if p+8 > len(b) {
		return recordMeta{}, corrupt("header overruns total size %d", total)
	}
	m.storeTS = int64(be.Uint64(b[p:]))
	p += 8 + 8 + 4 + 8
	if sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	if p+4 > len(b) {
		return recordMeta{}, corrupt("header overruns total size %d", total)
	}
	bodyLen := int64(int32(be.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || bodyLen > int64(len(b)-p) {
		return recordMeta{}, corrupt("body length %d overruns total size %d", bodyLen, total)
	}
	p += int(bodyLen)
	var tl int
	if be.Uint32(b[posMagic:]) == MagicV2 {
		if p+2 > len(b) {
			return recordMeta{}, corrupt("topic length overruns record")
		}
		tl = int(be.Uint16(b[p:]))
		p += 2
	} else {
		if p+1 > len(b) {
			return recordMeta{}, corrupt("topic length overruns record")
		}
		tl = int(b[p])
		p++
	}
	if tl > len(b)-p-2 {
		return recordMeta{}, corrupt("topic length %d overruns record", tl)
	}
	m.topic = b[p : p+tl]
	p += tl
	pl := int(be.Uint16(b[p:]))
	p += 2
	if pl > len(b)-p {
		return recordMeta{}, corrupt("properties length %d overruns record", pl)
	}
	m.tags = propertyIn(b[p:p+pl], PropertyTags)
	return m, nil
}

// propertyIn finds key in an encoded properties string as parseProperties
// reads it; the value aliases props (no allocation).
func propertyIn(props []byte, key string) []byte {
	for len(props) > 0 {
		end := bytes.IndexByte(props, propertySeparator)
		if end < 0 {
			end = len(props)
		}
		item := props[:end]
		if len(item) > len(key) && item[len(key)] == nameValueSeparator && string(item[:len(key)]) == key {
			// As parseProperties: an item whose value holds another
			// separator is not a property (FuzzParseMeta found it).
			if v := item[len(key)+1:]; bytes.IndexByte(v, nameValueSeparator) < 0 {
				return v
			}
		}
		if end == len(props) {
			break
		}
		props = props[end+1:]
	}
	return nil
}
