package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/flush"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/vfs"
)

// flusher is what the store needs from a flush policy; *flush.Async and
// *flush.GroupCommit satisfy it.
type flusher interface {
	// Wait blocks until offset is durable (sync) or returns at once (async).
	Wait(ctx context.Context, offset int64) error
	// Wake asks for a flush soon, without blocking.
	Wake()
	// Close stops the policy after a final flush.
	Close() error
}

var (
	_ flusher      = (*flush.Async)(nil)
	_ flusher      = (*flush.GroupCommit)(nil)
	_ flush.Syncer = (*mappedFileQueue)(nil)
)

type queueKey struct {
	topic string
	queue int32
}

// Store is the message store: the commitlog write path over a queue of
// memory-mapped files, with an async or group-commit flush policy.
// All methods are safe for concurrent use.
type Store struct {
	opts        Options
	delayLevels []time.Duration
	clock       Clock
	dir         string // Dir/commitlog
	lockFile    io.Closer
	queue       *mappedFileQueue
	flusher     flusher
	dispatch    *dispatcher
	sched       *scheduler  // delay-level delivery
	ret         *retention  // file deletion and disk watermarks
	topics      *topicTable // topic configuration (topics.go)
	pulls       pullStats

	// put serialises appends: choosing or rolling the file, assigning queue
	// offsets, stamping the store time and copying the bytes (RocketMQ
	// putMessageLock; the topic-queue table lives under it as in 4.9.4).
	put struct {
		sync.Mutex
		lastStoreTS int64                   // guarded by put; store times never go backwards
		topicQueue  map[queueKey]*queueNext // next queue offset; guarded by put
		// file is the file appends go to, cached so a put does not take
		// the file list's read lock (whose shared counter every reader on
		// every core bumps). Only rolls change the last file, and they run
		// under put; retention never deletes the last file. nil: not looked
		// up yet.
		file *mappedFile
	}
	// beginTimeInLock is the clock time (Unix ns) the current holder took the
	// put lock, 0 when free: the OS_PAGE_CACHE_BUSY watchdog.
	beginTimeInLock atomic.Int64

	realClock bool // opts.Clock is the system clock

	closed   atomic.Bool
	writeErr atomic.Pointer[error] // sticky: set once, never cleared
	faults   *faults               // transient write faults (faults.go)
	logLimit *logthrottle.Throttle // every repeating error line goes through it
	stats    stats
}

// Open opens (creating if needed) the store in opts.Dir, recovers the
// commitlog and starts the flush policy. Close releases everything.
func Open(opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	levels, _ := ParseDelayLevels(opts.DelayLevels)
	s := &Store{opts: opts, delayLevels: levels, clock: opts.Clock, dir: filepath.Join(opts.Dir, "commitlog")}
	s.put.topicQueue = make(map[queueKey]*queueNext)
	s.logLimit = logthrottle.New(logthrottle.DefaultInterval, nil)
	s.faults = newFaults(opts.Logger, s.logLimit)
	_, s.realClock = opts.Clock.(systemClock)
	if err := opts.FS.MkdirAll(s.dir); err != nil {
		return nil, fmt.Errorf("storage: create data dir: %w", err)
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return nil, err
	}
	s.lockFile = lf
	s.queue = newMappedFileQueue(opts.FS, s.dir, opts.FileSize, &s.stats.syncLatency)
	if err := s.queue.load(); err != nil {
		s.cleanup()
		return nil, err
	}
	s.topics = newTopicTable(opts)
	s.topics.minOffset = s.queue.minOffset
	s.topics.onWriteError = func(err error) { s.faults.noted(faultTopicConfig, err) }
	hadTopics, err := s.topics.load()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	cp, _, err := readCheckpoint(opts.FS, opts.Dir)
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if abortExists(opts.FS, opts.Dir) {
		opts.Logger.Warn().Msg("storage: the last run did not close cleanly; recovering from the checkpoint")
	}
	if err := s.recover(cp); err != nil {
		s.cleanup()
		return nil, err
	}
	s.dispatch = newDispatcher(s)
	if err := s.rebuildQueues(cp); err != nil {
		s.cleanup()
		return nil, err
	}
	s.adoptTopics()
	if !hadTopics {
		s.opts.Logger.Info().Msg("storage: no topic config yet (new data dir, or one written before topic config existed)")
	}
	if s.ret, err = newRetention(s); err != nil {
		s.cleanup()
		return nil, err
	}
	if s.sched, err = newScheduler(s); err != nil {
		s.cleanup()
		return nil, err
	}
	if err := createAbort(opts.FS, opts.Dir); err != nil {
		s.cleanup()
		return nil, err
	}
	// Start preparing the file the next roll needs (the first one on an
	// empty store), so no put waits for a file to be created and faulted in.
	if l := s.queue.last(); l == nil {
		s.queue.alloc.prepare(0)
	} else {
		if !l.full() {
			s.queue.alloc.adopt(l) // fault in the rest of the file appends go to
		}
		s.queue.alloc.prepare(l.from + l.size)
	}
	onSync := func(int64) { s.dispatch.wake() }
	switch opts.FlushMode {
	case FlushSync:
		s.flusher = flush.NewGroupCommit(s.queue, flush.GroupCommitOptions{Timeout: opts.SyncFlushTimeout,
			OnError: s.fail, OnSync: onSync})
	default:
		s.flusher = flush.NewAsync(s.queue, flush.AsyncOptions{Interval: opts.FlushInterval,
			LeastPages: opts.FlushLeastPages, ThoroughInterval: opts.FlushThoroughInterval, OnError: s.fail, OnSync: onSync})
	}
	s.dispatch.start()
	// Know the disk before the first put: a store opened on a disk above
	// the warning watermark refuses writes from the start.
	s.ret.mu.Lock()
	s.ret.checkDisk()
	s.ret.mu.Unlock()
	s.ret.start()
	s.sched.start()
	return s, nil
}

// cleanup releases what a partial Open acquired.
func (s *Store) cleanup() {
	if s.dispatch != nil {
		s.dispatch.close()
	}
	if s.queue != nil {
		s.queue.close()
	}
	if s.lockFile != nil {
		s.lockFile.Close()
	}
}

// fail records a write or sync failure. The store is read-only from then
// on: every put gets SERVICE_NOT_AVAILABLE wrapping ErrWriteFailed.
func (s *Store) fail(cause error) {
	err := fmt.Errorf("%w: %w", ErrWriteFailed, cause)
	if s.writeErr.CompareAndSwap(nil, &err) {
		s.opts.Logger.Error().Err(cause).Msg("storage: write or sync failed; store is read-only until restarted")
		s.faults.notify()
	}
}

// WriteErr returns the sticky write error, or nil.
func (s *Store) WriteErr() error {
	if p := s.writeErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Writable reports whether puts are currently accepted (open, master, no
// sticky write error, no background write failing (faults.go), disk not
// above the warning watermark).
func (s *Store) Writable() bool {
	return !s.closed.Load() && s.opts.Role == RoleMaster && s.writeErr.Load() == nil && s.faults.err() == nil &&
		s.ret.writeErr() == nil
}

// FlushMode returns the configured flush mode.
func (s *Store) FlushMode() FlushMode { return s.opts.FlushMode }

// checkBeforePut is RocketMQ's checkBeforePutMessage minus the message
// checks: closed, slave, not writable.
func (s *Store) checkBeforePut() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if s.opts.Role == RoleSlave {
		return ErrSlave
	}
	if err := s.WriteErr(); err != nil {
		return err
	}
	if err := s.faults.err(); err != nil {
		return err // a background write is failing: refused until a retry succeeds
	}
	return s.ret.writeErr() // disk above the warning watermark
}

// busy reports whether some put has held the put lock longer than the
// threshold (RocketMQ isOSPageCacheBusy).
// It reads the clock only when the lock is held at all.
func (s *Store) busy() bool {
	begin := s.beginTimeInLock.Load()
	return begin != 0 && s.clock.Now().UnixNano()-begin > int64(s.opts.PageCacheBusyTimeout)
}

// reject records and returns a refusal: nothing was appended.
func (s *Store) reject(st PutStatus, err error) (PutResult, error) {
	s.stats.record(st, 0, 0)
	return PutResult{Status: st}, err
}

func (s *Store) rejectErr(err error) (PutResult, error) {
	var verr *ValidationError
	switch {
	case errors.As(err, &verr):
		return s.reject(verr.Status, err)
	case errors.Is(err, ErrWriteRetrying): // before the cause's own markers (ErrCreateFile)
		return s.reject(ServiceNotAvailable, err)
	case errors.Is(err, ErrBusy):
		return s.reject(OSPageCacheBusy, err)
	case errors.Is(err, ErrCreateFile):
		return s.reject(CreateMappedFileFailed, err)
	case errors.Is(err, ErrTopicNotFound):
		return s.reject(MessageIllegal, err)
	case errors.Is(err, ErrTooManyTopics):
		return s.reject(LMQConsumeQueueNumExceeded, err)
	case errors.Is(err, ErrTopicConfig):
		return s.reject(ServiceNotAvailable, err)
	case errors.Is(err, ErrClosed), errors.Is(err, ErrSlave), errors.Is(err, ErrWriteFailed), errors.Is(err, ErrNotWritable):
		return s.reject(ServiceNotAvailable, err)
	}
	return s.reject(UnknownError, err)
}

// PutMessage stores one message.
//
// On success err is nil and the result's Status is PutOK, or
// FlushDiskTimeout when sync mode did not see the record durable within
// SyncFlushTimeout (the message is stored; RocketMQ counts it as sent).
// When nothing was appended, err is non-nil and Status names the RocketMQ
// status: ServiceNotAvailable (ErrClosed, ErrSlave, ErrWriteFailed),
// MessageIllegal / PropertiesSizeExceeded (*ValidationError),
// OSPageCacheBusy (ErrBusy), CreateMappedFileFailed (ErrCreateFile); for
// the topic table (topics.go): MessageIllegal for a reserved topic or a
// queue id outside the topic's queues (*ValidationError) and for an
// unknown topic with auto-creation off (ErrTopicNotFound),
// LMQConsumeQueueNumExceeded (ErrTooManyTopics), ServiceNotAvailable when
// the auto-created topic could not be persisted (ErrTopicConfig; retry).
// When the message was appended but its durability is unknown (ctx ended
// while waiting for the sync, or the sync failed), err is non-nil, Status is
// UnknownError and Appended() is true: the message may or may not survive
// a crash.
func (s *Store) PutMessage(ctx context.Context, m *Message) (PutResult, error) {
	if err := s.checkBeforePut(); err != nil {
		return s.rejectErr(err)
	}
	if err := ctx.Err(); err != nil {
		return s.reject(UnknownError, err)
	}
	r, verr := s.prepare(m)
	if verr != nil {
		return s.rejectErr(verr)
	}
	if err := s.admitTopic(m.Topic, m.QueueID); err != nil { // the topic named, before a delay diversion
		return s.rejectErr(err)
	}
	if int64(r.total)+BlankLen > s.opts.FileSize {
		return s.rejectErr(illegal("body", fmt.Sprintf("record of %d bytes cannot fit a commitlog file of %d bytes", r.total, s.opts.FileSize)))
	}
	if s.busy() {
		return s.rejectErr(ErrBusy)
	}
	one := [1]recordSpec{r}
	res, err := s.appendRecords(r.topic, r.queueID, r.sysFlag, one[:], false)
	if err != nil {
		return s.rejectErr(err)
	}
	return s.afterAppend(ctx, res, m.WaitStoreOK())
}

// prepare validates m and builds its record spec (outside the put lock).
func (s *Store) prepare(m *Message) (recordSpec, *ValidationError) {
	switch {
	case !validTopic(m.Topic):
		return recordSpec{}, illegal("topic", fmt.Sprintf("topic must be 1-%d characters of [%%|a-zA-Z0-9_-]", MaxTopicLength))
	case m.Body == nil:
		return recordSpec{}, illegal("body", "body is nil")
	case len(m.Body) > s.opts.MaxMessageSize:
		return recordSpec{}, illegal("body", fmt.Sprintf("body of %d bytes exceeds the limit of %d", len(m.Body), s.opts.MaxMessageSize))
	case m.QueueID < 0:
		return recordSpec{}, illegal("queue_id", "queue id must not be negative")
	}
	if _, ok := lookup(m.Properties, PropertyInnerNum); ok && m.SysFlag&FlagInnerBatch == 0 {
		return recordSpec{}, illegal("properties", "INNER_NUM without the inner-batch flag")
	}
	if m.SysFlag&FlagInnerBatch != 0 {
		return recordSpec{}, illegal("sys_flag", "inner batches need a batch consume queue, which this store does not have")
	}
	r := recordSpec{
		topic: m.Topic, queueID: m.QueueID, flag: m.Flag, body: m.Body, props: m.Properties,
		sysFlag: m.SysFlag, bornTS: m.BornTimestamp, bornHost: m.BornHost, storeHost: s.opts.StoreHost,
		reconsume: m.ReconsumeTimes, preparedTx: m.PreparedTxOffset, propCRC: !s.opts.DisablePropCRC,
	}
	if tx := m.SysFlag & transactionMask; tx == TransactionNotType || tx == TransactionCommitType {
		if level := delayLevel(m.Properties); level > 0 {
			divert(&r, level, len(s.delayLevels))
		}
	}
	if verr := r.size(); verr != nil {
		return recordSpec{}, verr
	}
	r.bodyCRC = BodyCRC(m.Body)
	return r, nil
}

// PutMessages stores a batch: one topic and queue, consecutive queue
// offsets, all in one commitlog file or not at all. Results and errors are
// as for PutMessage; Append.Offsets has each message's commitlog offset.
//
// A batch is all or nothing across a crash too: its first record carries
// the batch's record count and byte length (PropertyBatch, under the
// whole-record CRC), and recovery cuts a batch that is not whole at its
// first record. Readers never see part of one: the write position is
// published once, after the whole batch is copied.
func (s *Store) PutMessages(ctx context.Context, b *Batch) (PutResult, error) {
	if err := s.checkBeforePut(); err != nil {
		return s.rejectErr(err)
	}
	if err := ctx.Err(); err != nil {
		return s.reject(UnknownError, err)
	}
	specs, verr := s.prepareBatch(b)
	if verr != nil {
		return s.rejectErr(verr)
	}
	if err := s.admitTopic(b.Topic, b.QueueID); err != nil {
		return s.rejectErr(err)
	}
	if s.busy() {
		return s.rejectErr(ErrBusy)
	}
	res, err := s.appendRecords(b.Topic, b.QueueID, b.SysFlag, specs, true)
	if err != nil {
		return s.rejectErr(err)
	}
	return s.afterAppend(ctx, res, b.WaitStoreOK())
}

func (s *Store) prepareBatch(b *Batch) ([]recordSpec, *ValidationError) {
	switch {
	case !validTopic(b.Topic):
		return nil, illegal("topic", fmt.Sprintf("topic must be 1-%d characters of [%%|a-zA-Z0-9_-]", MaxTopicLength))
	case b.QueueID < 0:
		return nil, illegal("queue_id", "queue id must not be negative")
	case len(b.Messages) == 0:
		return nil, illegal("messages", "batch is empty")
	case b.SysFlag&transactionMask != TransactionNotType:
		return nil, illegal("batch", "a batch must not be transactional")
	case b.SysFlag&FlagInnerBatch != 0:
		return nil, illegal("sys_flag", "inner batches are not supported")
	case delayLevel(b.Properties) > 0:
		return nil, illegal("batch", "a batch must not have a delay level")
	}
	specs := make([]recordSpec, len(b.Messages))
	bodies, total := 0, 0
	for i := range b.Messages {
		bm := &b.Messages[i]
		if bm.Body == nil {
			return nil, illegal("messages", fmt.Sprintf("message %d: body is nil", i))
		}
		if delayLevel(bm.Properties) > 0 {
			return nil, illegal("batch", fmt.Sprintf("message %d: a batch must not have a delay level", i))
		}
		bodies += len(bm.Body)
		specs[i] = recordSpec{
			topic: b.Topic, queueID: b.QueueID, flag: bm.Flag, body: bm.Body, props: bm.Properties,
			sysFlag: b.SysFlag, bornTS: bm.BornTimestamp, bornHost: b.BornHost, storeHost: s.opts.StoreHost,
			propCRC: !s.opts.DisablePropCRC,
			// The first record of a batch of two or more carries its
			// extent (record.go batchOf): counted here, so the size
			// checks below see the bytes that are written.
			batchFirst: i == 0 && len(b.Messages) > 1,
		}
		if verr := specs[i].size(); verr != nil {
			verr.Reason = fmt.Sprintf("message %d: %s", i, verr.Reason)
			return nil, verr
		}
		total += specs[i].total
	}
	if bodies > s.opts.MaxMessageSize {
		return nil, illegal("messages", fmt.Sprintf("batch bodies total %d bytes, limit %d", bodies, s.opts.MaxMessageSize))
	}
	if int64(total)+BlankLen > s.opts.FileSize {
		return nil, illegal("messages", fmt.Sprintf("batch of %d bytes cannot fit a commitlog file of %d bytes", total, s.opts.FileSize))
	}
	for i := range specs {
		specs[i].bodyCRC = BodyCRC(specs[i].body)
	}
	if specs[0].batchFirst {
		specs[0].batchCount, specs[0].batchBytes = len(specs), total
	}
	return specs, nil
}

// appendRecords appends records for one topic-queue under the put lock,
// rolling to a new file (after an END_OF_FILE blank) when they do not fit.
// All records land in one file. It returns the append result, or an error
// when nothing was appended.
func (s *Store) appendRecords(topic string, queueID, sysFlag int32, specs []recordSpec, batch bool) (ar AppendResult, err error) {
	total := 0
	for i := range specs {
		total += specs[i].total
	}
	if !batch {
		topic, queueID = specs[0].topic, specs[0].queueID // after a delay diversion
	}
	key := queueKey{topic, queueID}
	tx := sysFlag & transactionMask
	assignsOffset := tx == TransactionNotType || tx == TransactionCommitType

	s.put.Lock()
	// One clock read inside the lock serves the store time, the busy
	// watchdog and the lock-hold statistics, and one monotonic read at the
	// end (clock reads are not free on every machine: a time.Now is two
	// vDSO reads, ~55 ns on this project's VM, a third of a put's CPU
	// before this was cut down). An injected clock stamps the store time;
	// the statistics always use real time.
	lockStart := time.Now()
	inLock := lockStart
	if !s.realClock {
		inLock = s.clock.Now()
	}
	s.beginTimeInLock.Store(inLock.UnixNano())
	defer func() {
		s.beginTimeInLock.Store(0)
		held := time.Since(lockStart)
		s.put.Unlock()
		s.stats.appendLatency.observe(held)
		if err == nil {
			ar.LockedAt, ar.LockHeld = lockStart, held
		}
		for {
			old := s.stats.maxLockHold.Load()
			if int64(held) <= old || s.stats.maxLockHold.CompareAndSwap(old, int64(held)) {
				break
			}
		}
	}()
	if s.closed.Load() {
		return AppendResult{}, ErrClosed
	}
	if topic != ScheduleTopic && !s.topics.has(topic, queueID) { // deleted since admitTopic
		return AppendResult{}, fmt.Errorf("%w: %s was deleted", ErrTopicNotFound, topic)
	}
	// Re-stamp inside the lock so store times never go backwards along the
	// log; recovery relies on it.
	storeTS := inLock.UnixMilli()
	if storeTS < s.put.lastStoreTS {
		storeTS = s.put.lastStoreTS
	}

	f := s.put.file
	if f == nil {
		f = s.queue.last()
		s.put.file = f
	}
	if f == nil || f.full() {
		var err error
		if f, err = s.rollLocked(); err != nil {
			return AppendResult{}, err
		}
	}
	pos := f.wrote.Load()
	if int64(total)+BlankLen > f.size-pos {
		// Not enough room: fill the rest with the blank record, mark the
		// file full, and append into a new one (the same queue offset is
		// reused there; nothing was assigned here).
		putBlank(f.data[pos:], int(f.size-pos))
		f.wrote.Store(f.size)
		var err error
		if f, err = s.rollLocked(); err != nil {
			return AppendResult{}, err
		}
		pos = f.wrote.Load()
		if int64(total)+BlankLen > f.size-pos { // cannot happen: checked against FileSize
			return AppendResult{}, fmt.Errorf("storage: %d bytes do not fit an empty file", total)
		}
	}

	queueOffset := int64(0)
	var next *queueNext
	if assignsOffset {
		if next = s.put.topicQueue[key]; next == nil {
			next = new(queueNext)
			s.put.topicQueue[key] = next
		}
		queueOffset = next.offset
	}
	res := AppendResult{
		Status: AppendOK, WroteOffset: f.from + pos, WroteBytes: int32(total), StoreTimestamp: storeTS,
		Topic: topic, QueueID: queueID, QueueOffset: queueOffset, MsgNum: int32(len(specs)), StoreHost: s.opts.StoreHost,
	}
	if batch {
		res.Offsets = make([]int64, len(specs))
	}
	p := pos
	for i := range specs {
		qo := queueOffset
		if assignsOffset {
			qo += int64(i)
		}
		specs[i].encode(f.data[p:], qo, f.from+p, storeTS)
		if batch {
			res.Offsets[i] = f.from + p
		}
		p += int64(specs[i].total)
	}
	f.wrote.Store(p) // publish only after every byte is copied
	s.put.lastStoreTS = storeTS
	if assignsOffset {
		next.offset = queueOffset + int64(len(specs))
	}
	return res, nil
}

// rollLocked takes the next file. REQUIRES: s.put held.
func (s *Store) rollLocked() (*mappedFile, error) {
	f, err := s.queue.roll()
	if err != nil {
		s.logLimit.Event("storage: roll", s.opts.Logger.Error()).Err(err).Msg("storage: cannot create the next commitlog file")
		return nil, err
	}
	s.stats.rolls.Add(1)
	s.put.file = f
	return f, nil
}

// afterAppend applies the flush policy, waits until the message is
// readable (read your writes, visible.go) and records the outcome.
// The put latency histogram counts sync waits only: an async put's latency
// is its time in the lock, already in the append histogram, and each clock
// read costs ~60 ns on some VMs.
//
// WAIT=false answers as soon as the record is appended, in both modes:
// the message is stored but neither known durable (sync) nor indexed yet;
// the dispatcher makes it readable within about dispatchPause (async) or
// after the sync that covers it (sync).
func (s *Store) afterAppend(ctx context.Context, res AppendResult, wait bool) (PutResult, error) {
	out := PutResult{Status: PutOK, Append: res}
	var err error
	if s.opts.FlushMode == FlushSync {
		if wait {
			start := time.Now()
			err = s.flusher.Wait(ctx, res.NextOffset())
			out.FlushWaitStart, out.FlushWait = start, time.Since(start)
			s.stats.putLatency.observe(out.FlushWait)
		} else {
			s.flusher.Wake()
		}
	} else {
		if s.opts.WakeFlushOnPut {
			s.flusher.Wake()
		}
		if !wait {
			s.dispatch.wake() // async: written is visible; index it soon
		}
	}
	if wait && err == nil {
		// Durable (sync) or written (async): make it readable before the
		// answer. If indexing fails or is slow the message is still
		// stored: the answer stays PUT_OK (a retry would store it twice)
		// and it becomes readable once indexing resumes.
		// Only ctx ending changes the answer: the caller stopped waiting.
		if werr := s.dispatch.awaitDispatched(ctx, res.NextOffset()); errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded) {
			err = werr
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, flush.ErrTimeout):
		out.Status, err = FlushDiskTimeout, nil
	case errors.Is(err, flush.ErrSyncFailed):
		out.Status, err = UnknownError, fmt.Errorf("%w: %w", ErrWriteFailed, err)
	case errors.Is(err, flush.ErrClosed):
		out.Status, err = UnknownError, fmt.Errorf("%w: store closed before the sync covered the message", ErrClosed)
	default: // ctx
		out.Status = UnknownError
	}
	s.stats.record(out.Status, int(res.MsgNum), int(res.WroteBytes))
	return out, err
}

// Stats returns a snapshot of the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Puts: map[string]uint64{}, Messages: map[string]uint64{}, Bytes: map[string]uint64{},
		AppendLatency: s.stats.appendLatency.snapshot(),
		PutLatency:    s.stats.putLatency.snapshot(),
		SyncLatency:   s.stats.syncLatency.snapshot(),
		MaxLockHold:   time.Duration(s.stats.maxLockHold.Load()),
		Rolls:         s.stats.rolls.Load(),
		Files:         len(s.queue.snapshot()),
		MinOffset:     s.queue.minOffset(),
		MaxOffset:     s.queue.maxOffset(),
		FlushedOffset: s.queue.flushedWhere.Load(),
		TornTails:     s.stats.tornTails.Load(),
		TornBytes:     s.stats.tornBytes.Load(),
	}
	st.DispatchedOffset = s.dispatch.dispatched.Load()
	st.DispatchLag = st.MaxOffset - st.DispatchedOffset
	s.dispatch.mu.RLock()
	st.Queues = len(s.dispatch.queues)
	s.dispatch.mu.RUnlock()
	for i := 1; i < numStatuses; i++ {
		name := PutStatus(i).String()
		if n := s.stats.puts[i].Load(); n > 0 {
			st.Puts[name] = n
			st.Messages[name] = s.stats.msgs[i].Load()
			st.Bytes[name] = s.stats.bytes[i].Load()
		}
	}
	if err := s.WriteErr(); err != nil {
		st.WriteError = err.Error()
	}
	st.Faults = s.faults.stats()
	st.Schedule = s.sched.stats()
	st.Retention, st.Disk = s.ret.stats()
	return st
}

// Close stops taking puts, waits for appends in progress, flushes
// everything (answering sync waiters), unmaps the files, stops every
// goroutine and releases the data dir lock. It returns the sticky write
// error if a sync ever failed. Calling Close twice is safe.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.sched.stop() // persists its progress; needs the flush policy running
	s.ret.stop()
	s.put.Lock() // no append in progress after this; new ones see closed
	s.put.Unlock()
	var errs []error
	if err := s.flusher.Close(); err != nil {
		errs = append(errs, err)
	}
	s.dispatch.stop()
	clean := len(errs) == 0 && s.WriteErr() == nil
	if clean {
		// Everything is flushed: index it all and checkpoint, so the next
		// Open has nothing to scan.
		s.dispatch.run(s.queue.maxOffset())
		if err := s.dispatch.checkpoint(); err != nil {
			errs = append(errs, err)
			clean = false
		}
	}
	if clean {
		// Only a clean close removes the abort marker; otherwise the next
		// Open knows to distrust what it finds.
		if err := removeAbort(s.opts.FS, s.opts.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.dispatch.close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.queue.close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.lockFile.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.WriteErr(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// visibleEnd is the commitlog offset readers may see up to: the durable
// offset in sync mode (visibility never runs ahead of durability), the
// written offset in async mode.
func (s *Store) visibleEnd() int64 {
	if s.opts.FlushMode == FlushSync {
		return s.queue.flushedWhere.Load()
	}
	return s.queue.maxOffset()
}

// delayOf returns the delay of level (1-based), 1 s for an unknown level
// (RocketMQ computeDeliverTimestamp).
func (s *Store) delayOf(level int) time.Duration {
	if level >= 1 && level <= len(s.delayLevels) {
		return s.delayLevels[level-1]
	}
	return time.Second
}

// lastStoreTime is the newest store time stamped.
func (s *Store) lastStoreTime() int64 {
	s.put.Lock()
	defer s.put.Unlock()
	return s.put.lastStoreTS
}

// rebuildQueues loads the consume queues, re-dispatches everything from
// the checkpoint's dispatched offset (or from the start of the log when a
// queue has fewer entries than the checkpoint recorded: deleted or
// truncated), and rebuilds the topic-queue table from them.
func (s *Store) rebuildQueues(cp checkpoint) error {
	end := s.queue.maxOffset()
	// Entries past the checkpoint were not known durable when it was
	// written: a power cut may have torn them. loadQueues drops them; the
	// re-dispatch below writes them again from the commitlog.
	want := func(topic string, qid int32) int64 { return s.checkpointCount(cp, topic, qid) }
	if err := s.dispatch.loadQueues(end, want); err != nil {
		return err
	}
	s.dropDeletedQueues()
	from := min(cp.Dispatched, end)
	for name, want := range cp.Queues {
		topic, qid, ok := splitQueueName(name)
		if !ok {
			continue
		}
		if want = s.checkpointCount(cp, topic, qid); want == 0 {
			continue // the topic was deleted after the checkpoint
		}
		if q := s.dispatch.queue(topic, qid); q == nil || q.count.Load() < want {
			s.opts.Logger.Warn().Str("queue", name).Msg("storage: consume queue missing or short; rebuilding from the commitlog")
			from = s.queue.minOffset()
			break
		}
	}
	from = max(from, s.queue.minOffset())
	s.dispatch.next = from
	// Recovery checked the records from its scan start on, not those below
	// it that a rebuild from the log's start reads: check every record the
	// rebuild indexes, so damage there is a CorruptionError.
	s.dispatch.verify, s.dispatch.verifyFlushed = true, cp.Flushed
	err := s.dispatch.dispatchTo(end)
	s.dispatch.verify = false
	if err != nil {
		return fmt.Errorf("storage: rebuild consume queues: %w", err)
	}
	s.dispatch.dispatched.Store(s.dispatch.next)
	s.dispatch.lastCP = cp
	for k, q := range s.dispatch.queues {
		s.put.topicQueue[k] = &queueNext{offset: q.count.Load()}
	}
	return nil
}

// lockDir takes the data dir lock (dir/lock) so that a second process on
// the same data dir fails at Open.
func lockDir(fs vfs.FS, dir string) (io.Closer, error) {
	l, err := fs.Lock(filepath.Join(dir, "lock"))
	if errors.Is(err, vfs.ErrLocked) {
		return nil, ErrLocked
	}
	if err != nil {
		return nil, fmt.Errorf("storage: lock data dir: %w", err)
	}
	return l, nil
}

// queueNext is a topic-queue's next queue offset, held by pointer in the
// put lock's table so that a put looks the key up once.
type queueNext struct{ offset int64 }
