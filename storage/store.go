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
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/dedup"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/pop"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/retention"
	"github.com/storaged/storaged/storage/schedule"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/timers"
	"github.com/storaged/storaged/storage/txn"
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
	_ flush.Syncer = (*commitlog.Log)(nil)
)

// Store is the message store: it composes the commitlog (storage/commitlog:
// placement of record bytes in memory-mapped files), the flush policy
// (flush/), the consume queues and their dispatcher (storage/consumequeue),
// the delay scheduler (storage/schedule), retention (storage/retention) and
// the topic table, and runs the put path in RocketMQ's order: check,
// validate, admit the topic, sequence and place under the append lock,
// flush, index. All methods are safe for concurrent use.
type Store struct {
	opts     Options
	resolved resolved // options parsed once (levels, delete hours)
	lockFile io.Closer
	log      *commitlog.Log
	flusher  flusher
	index    *consumequeue.Index
	sched    *schedule.Scheduler
	timers   *timers.Service // timer messages (timer_messages.go, storage/timers)
	ret      *retention.Retention
	topics   *topicTable // topic configuration (topics.go)
	seq      sequencer   // queue offsets and store times (sequence.go)
	pulls    pullStats
	// dedup is the idempotent-put window (idempotent.go); nil when off. A
	// group member's reader replaces it with one read from the committed
	// log (groupdedup.go), so it is read atomically.
	dedup atomic.Pointer[dedup.Window[dedupValue]]
	// scanYield, if set (tests), runs each time a long scan of the log for
	// the window lets the read guard go (scanDedup).
	scanYield func()
	group     *groupState    // group mode (group.go); nil when standalone
	offsets   *offsets.Table // consumer offsets (consumer_offsets.go)
	offSnap   tableSnapshot  // the offset table's snapshot (offsets_snapshot.go)
	popSnap   tableSnapshot  // the POP table's snapshot (pop_snapshot.go)
	txnSnap   tableSnapshot  // the transaction table's snapshot (txn_snapshot.go)
	snaps     stateSnapshots // the loop writing the three (state_snapshot.go)
	pop       *pop.Table     // POP consumption state (pop.go)
	popTurn   atomic.Uint32  // the queue a receive starts at (pop.go)
	txn       *txn.Table     // pending transactional half messages (transactions.go)
	txnSvc    txnService     // ends and the check loop (transactions.go)
	// popLocks serialize a consumer group's POP changes in group mode,
	// each from its decision to its record applied (pop.go popLock).
	popLocks [64]sync.Mutex
	// popRewrite: every POP change holds it shared (popLock), the group
	// rewrite before retention exclusively (rewritePopGroup).
	popRewrite sync.RWMutex
	// deleteFence: offset commits and the offset rewrite before retention
	// hold it shared from their checks to their record applied, a topic
	// delete exclusively until its tombstone is in the log (topicclear.go),
	// so no offset decided on the deleted topic lands after it.
	deleteFence sync.RWMutex

	// installing is the manifest of a snapshot install Open finishes
	// (group_install.go), nil otherwise; Open's own.
	installing *snapshot.Manifest

	// role is the broker role (Role), a runtime check: SetRole changes it.
	role atomic.Uint32

	closed   atomic.Bool
	writeErr atomic.Pointer[error] // sticky: set once, never cleared
	faults   *fault.Set            // transient write faults (internal/fault)
	logLimit *logthrottle.Throttle // every repeating error line goes through it
	stats    stats
}

// Open opens (creating if needed) the store in opts.Dir, recovers the
// commitlog and starts the flush policy. Close releases everything.
func Open(opts Options) (*Store, error) {
	opts = opts.withDefaults()
	res, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	s := &Store{opts: opts, resolved: res}
	s.txn = txn.New(opts.MaxPendingTransactions)
	s.txnSvc.busy, s.txnSvc.committed, s.txnSvc.wake = map[int64]chan struct{}{}, map[int64]bool{}, make(chan struct{}, 1)
	s.role.Store(uint32(opts.Role))
	s.seq.init()
	s.logLimit = logthrottle.New(logthrottle.DefaultInterval, nil)
	s.faults = fault.New(opts.Logger, s.logLimit)
	dir := filepath.Join(opts.Dir, "commitlog")
	if err := opts.FS.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("storage: create data dir: %w", err)
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return nil, err
	}
	s.lockFile = lf
	// A snapshot install a crash interrupted is finished before anything
	// reads the commitlog or the raft log (group_install.go).
	if s.installing, err = s.rollForwardInstall(); err != nil {
		s.cleanup()
		return nil, err
	}
	// The abort marker's absence vouches for the log's tail (past its
	// end, zeros) only as a clean close left it: not for files an install
	// just moved in.
	crashed := abortExists(opts.FS, opts.Dir)
	if crashed {
		opts.Logger.Warn().Msg("storage: the last run did not close cleanly; recovering from the checkpoint")
	}
	// The marker is back before anything can write to the log (recovery
	// cuts, a replica's raft loop): a crash from here on, in this Open
	// too, leaves it for the next one.
	if err := createAbort(opts.FS, opts.Dir); err != nil {
		s.cleanup()
		return nil, err
	}
	s.log, err = commitlog.Open(commitlog.Options{FS: opts.FS, Dir: dir, FileSize: opts.FileSize,
		ClosedCleanly: !crashed && s.installing == nil, RequireCRC: !opts.DisablePropCRC, PopulateChunk: opts.PopulateChunk, PopulateAhead: opts.PopulateAhead, PopulateNear: opts.PopulateNear, Populate: opts.Populate, Clock: opts.Clock,
		Room: prepareRoom(opts), Logger: opts.Logger, Throttle: s.logLimit})
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.topics = newTopicTable(opts)
	s.topics.minOffset = s.log.MinOffset
	s.topics.onWriteError = func(err error) { s.faults.Noted(fault.TopicConfig, err) }
	hadTopics, err := s.topics.load()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if s.installing != nil { // the snapshot's topic table (group_install.go)
		m := s.installing
		if _, err := s.topics.applySnapshot(snapshotTopics(*m), snapshotTombstones(*m), max(m.Index, m.TopicsIndex)); err != nil {
			s.cleanup()
			return nil, err
		}
	}
	cp, _, err := consumequeue.ReadCheckpoint(opts.FS, opts.Dir)
	if err != nil {
		s.cleanup()
		return nil, err
	}
	flushed := cp.Flushed
	var synced commitlog.Synced
	if opts.Group != nil {
		if flushed, synced, err = s.groupCommitEnd(cp.Flushed); err != nil {
			s.cleanup()
			return nil, err
		}
	}
	var scan commitlog.ScanResult
	if synced != nil {
		scan, err = s.log.RecoverGroup(flushed, cp.Dispatched, synced)
	} else {
		scan, err = s.log.Recover(flushed, cp.Dispatched)
	}
	if err != nil {
		s.cleanup()
		return nil, err
	}
	var cqLog consumequeue.Log = s.log
	if opts.Group != nil {
		if err := s.openGroupLog(cp, scan.From); err != nil {
			s.cleanup()
			return nil, err
		}
		cqLog = groupCQLog{s.log, s}
	}
	s.seq.lastStoreTS.Store(max(scan.LastTS, cp.StoreTime))
	s.index = consumequeue.New(cqLog, consumequeue.Options{
		FS: opts.FS, Dir: opts.Dir, EntriesPerFile: opts.ConsumeQueueEntries, MaxOpenFiles: opts.MaxOpenQueueFiles,
		CheckpointInterval: opts.CheckpointInterval, RequireCRC: !opts.DisablePropCRC, AwaitTimeout: opts.SyncFlushTimeout,
		Watermark: s.visibleEnd, Tombstones: s.topics.tombstones, Delay: s.delayOf, LastStoreTime: s.lastStoreTime,
		Fail: s.fail, Faults: s.faults, Clock: opts.Clock, Logger: opts.Logger, Apply: s.systemApplier,
		Raft: s.raftPoint,
	})
	if err := s.rebuildQueues(cp); err != nil {
		s.cleanup()
		return nil, err
	}
	if s.installing != nil {
		if err := s.completeInstall(); err != nil {
			s.cleanup()
			return nil, err
		}
	}
	s.adoptTopics()
	s.openDedup()
	if err := s.openSystemState(); err != nil {
		s.cleanup()
		return nil, err
	}
	if !hadTopics {
		s.opts.Logger.Info().Msg("storage: no topic config yet (new data dir, or one written before topic config existed)")
	}
	if s.ret, err = retention.New((*retentionHost)(s), retention.Options{
		FS: opts.FS, Dir: opts.Dir, Files: s.log.Files(), FileReservedTime: opts.FileReservedTime, Hours: res.deleteHours,
		DiskCleanPercent: opts.DiskCleanPercent, DiskWarningPercent: opts.DiskWarningPercent,
		DiskCheckInterval: opts.DiskCheckInterval, StatDisk: opts.StatDisk, Clock: opts.Clock, Logger: opts.Logger,
		Throttle: s.logLimit,
	}); err != nil {
		s.cleanup()
		return nil, err
	}
	if s.sched, err = schedule.New((*scheduleHost)(s), schedule.Options{
		FS: opts.FS, Dir: filepath.Join(opts.Dir, "config"), Levels: res.delayLevels, PersistEvery: opts.CheckpointInterval,
		Clock: opts.Clock, Logger: opts.Logger, Throttle: s.logLimit, Faults: s.faults,
	}); err != nil {
		s.cleanup()
		return nil, err
	}
	if s.timers, err = timers.New((*timerHost)(s), timers.Options{
		FS: opts.FS, Dir: filepath.Join(opts.Dir, "config"), MaxPending: opts.MaxTimerMessages, PersistEvery: opts.CheckpointInterval,
		Clock: opts.Clock, Logger: opts.Logger, Throttle: s.logLimit, Faults: s.faults, Group: opts.Group != nil,
	}); err != nil {
		s.cleanup()
		return nil, err
	}
	onSync := func(int64) { s.index.Wake() }
	switch {
	case s.group != nil:
		s.flusher = groupFlusher{s} // the raft loop syncs (openGroupLog started the log)
	case opts.FlushMode == FlushSync:
		s.log.Start()
		s.flusher = flush.NewGroupCommit(s.log, flush.GroupCommitOptions{Timeout: opts.SyncFlushTimeout,
			OnError: s.fail, OnSync: onSync})
	default:
		s.log.Start()
		s.flusher = flush.NewAsync(s.log, flush.AsyncOptions{Interval: opts.FlushInterval,
			LeastPages: opts.FlushLeastPages, ThoroughInterval: opts.FlushThoroughInterval, OnError: s.fail, OnSync: onSync})
	}
	s.index.Start()
	// Know the disk before the first put: a store opened on a disk above
	// the warning watermark refuses writes from the start.
	s.ret.CheckDisk()
	if s.group != nil {
		// Before retention runs: in a group it asks the raft node what
		// followers still need (groupKeepFrom).
		if err := s.startGroup(); err != nil {
			s.index.Stop()
			s.cleanup()
			return nil, err
		}
	}
	s.ret.Start()
	s.sched.Start()
	s.timers.Start()
	s.startTxn()
	s.startStateSnapshots()
	return s, nil
}

// cleanup releases what a partial Open acquired.
func (s *Store) cleanup() {
	if s.index != nil {
		s.index.Close()
	}
	if s.group != nil {
		s.group.rlog.Close()
	}
	if s.log != nil {
		s.log.Close()
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
		s.faults.Notify()
	}
}

// WriteErr returns the sticky write error, or nil.
func (s *Store) WriteErr() error {
	if p := s.writeErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Role returns the store's current broker role.
func (s *Store) Role() Role { return Role(s.role.Load()) }

// SetRole changes the broker role at run time: a slave refuses puts and
// admin changes (ErrSlave) and does not deliver delayed messages; a master
// takes them. Reads are served in both roles.
func (s *Store) SetRole(r Role) { s.role.Store(uint32(r)) }

// Writable reports whether puts are currently accepted (open, master, no
// sticky write error, no background write failing (internal/fault), disk
// not above the warning watermark).
func (s *Store) Writable() bool {
	return s.checkBeforePut() == nil
}

// FlushMode returns the configured flush mode.
func (s *Store) FlushMode() FlushMode { return s.opts.FlushMode }

// checkBeforePut is RocketMQ's checkBeforePutMessage minus the message
// checks: closed, slave, not writable.
func (s *Store) checkBeforePut() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if s.Role() == RoleSlave {
		return ErrSlave
	}
	if err := s.WriteErr(); err != nil {
		return err
	}
	if err := s.faults.Err(); err != nil {
		return err // a background write is failing: refused until a retry succeeds
	}
	return s.ret.WriteErr() // disk above the warning watermark
}

// reject records and returns a refusal: nothing was appended.
func (s *Store) reject(st PutStatus, err error) (PutResult, error) {
	s.stats.record(st, 0, 0)
	return PutResult{Status: st}, err
}

func (s *Store) rejectErr(err error) (PutResult, error) {
	if st, ok := groupRejectStatus(err); ok {
		return s.reject(st, err)
	}
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
	case errors.Is(err, ErrTimerFull):
		return s.reject(WheelTimerFlowControl, err)
	case errors.Is(err, ErrTransactionsFull):
		return s.reject(ServiceNotAvailable, err)
	case errors.Is(err, ErrTopicConfig):
		return s.reject(ServiceNotAvailable, err)
	case errors.Is(err, ErrClosed), errors.Is(err, ErrSlave), errors.Is(err, ErrWriteFailed), errors.Is(err, ErrNotWritable):
		return s.reject(ServiceNotAvailable, err)
	}
	return s.reject(UnknownError, err)
}

// putMessage stores one message (PutMessage, after the dedup window).
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
// a crash. fate (nil but for a keyed put in a group: putOnce) is told the
// group entry's outcome (groupPut).
func (s *Store) putMessage(ctx context.Context, m *Message, fate *entryFate) (PutResult, error) {
	if err := s.checkBeforePut(); err != nil {
		return s.rejectErr(err)
	}
	if err := s.groupRefusal(); err != nil {
		return s.rejectErr(err)
	}
	if err := ctx.Err(); err != nil {
		return s.reject(UnknownError, err)
	}
	r, verr := s.prepare(m)
	if verr != nil {
		return s.rejectErr(verr)
	}
	if err := s.topics.admit(m.Topic, m.QueueID); err != nil { // the topic named, before a delay diversion
		return s.rejectErr(err)
	}
	if r.Topic == TimerTopic {
		if err := s.timerAdmit(); err != nil {
			return s.rejectErr(err)
		}
	}
	if r.Topic == TransHalfTopic {
		if err := s.txnAdmit(); err != nil {
			return s.rejectErr(err)
		}
	}
	if int64(r.Total)+BlankLen > s.opts.FileSize {
		return s.rejectErr(illegal("body", fmt.Sprintf("record of %d bytes cannot fit a commitlog file of %d bytes", r.Total, s.opts.FileSize)))
	}
	if s.log.Busy(s.opts.PageCacheBusyTimeout) {
		return s.rejectErr(ErrBusy)
	}
	if s.group != nil { // its own slice: the proposal keeps it past this call
		return s.groupPut(ctx, r.Topic, r.QueueID, r.SysFlag, []record.Spec{r}, false, fate)
	}
	one := [1]record.Spec{r} // on the stack: the standalone put allocates nothing
	res, err := s.appendRecords(r.Topic, r.QueueID, r.SysFlag, one[:], false)
	if err != nil {
		return s.rejectErr(err)
	}
	return s.afterAppend(ctx, res, m.WaitStoreOK())
}

// prepare validates m and builds its record spec (outside the append lock).
func (s *Store) prepare(m *Message) (record.Spec, *ValidationError) {
	switch {
	case !record.ValidTopic(m.Topic):
		return record.Spec{}, illegal("topic", fmt.Sprintf("topic must be 1-%d characters of [%%|a-zA-Z0-9_-]", MaxTopicLength))
	case m.Body == nil:
		return record.Spec{}, illegal("body", "body is nil")
	case len(m.Body) > s.opts.MaxMessageSize:
		return record.Spec{}, illegal("body", fmt.Sprintf("body of %d bytes exceeds the limit of %d", len(m.Body), s.opts.MaxMessageSize))
	case m.QueueID < 0:
		return record.Spec{}, illegal("queue_id", "queue id must not be negative")
	}
	if _, ok := record.Lookup(m.Properties, PropertyInnerNum); ok && m.SysFlag&FlagInnerBatch == 0 {
		return record.Spec{}, illegal("properties", "INNER_NUM without the inner-batch flag")
	}
	if m.SysFlag&FlagInnerBatch != 0 {
		return record.Spec{}, illegal("sys_flag", "inner batches need a batch consume queue, which this store does not have")
	}
	r := record.Spec{
		Topic: m.Topic, QueueID: m.QueueID, Flag: m.Flag, Body: m.Body, Props: m.Properties,
		SysFlag: m.SysFlag, BornTS: m.BornTimestamp, BornHost: m.BornHost, StoreHost: s.opts.StoreHost,
		Reconsume: m.ReconsumeTimes, PreparedTx: m.PreparedTxOffset, PropCRC: !s.opts.DisablePropCRC,
	}
	if m.SysFlag&record.TransactionMask == TransactionPreparedType {
		divertHalf(&r) // a half message (transactions.go)
	} else if tx := m.SysFlag & record.TransactionMask; tx == TransactionNotType || tx == TransactionCommitType {
		if level := record.DelayLevel(m.Properties); level > 0 {
			schedule.Divert(&r, level, len(s.resolved.delayLevels))
		} else if verr := s.divertTimer(&r); verr != nil {
			return record.Spec{}, verr
		}
	}
	if ferr := r.Size(); ferr != nil {
		return record.Spec{}, fieldError(ferr)
	}
	r.BodyCRC = record.BodyCRC(m.Body)
	return r, nil
}

// putMessages stores a batch (PutMessages, after the dedup window): one topic and queue, consecutive queue
// offsets, all in one commitlog file or not at all. Results and errors are
// as for PutMessage; Append.Offsets has each message's commitlog offset.
//
// A batch is all or nothing across a crash too: its first record carries
// the batch's record count and byte length (PropertyBatch, under the
// whole-record CRC), and recovery cuts a batch that is not whole at its
// first record. Readers never see part of one: the write position is
// published once, after the whole batch is copied.
func (s *Store) putMessages(ctx context.Context, b *Batch, fate *entryFate) (PutResult, error) {
	if err := s.checkBeforePut(); err != nil {
		return s.rejectErr(err)
	}
	if err := s.groupRefusal(); err != nil {
		return s.rejectErr(err)
	}
	if err := ctx.Err(); err != nil {
		return s.reject(UnknownError, err)
	}
	specs, verr := s.prepareBatch(b)
	if verr != nil {
		return s.rejectErr(verr)
	}
	if err := s.topics.admit(b.Topic, b.QueueID); err != nil {
		return s.rejectErr(err)
	}
	if s.log.Busy(s.opts.PageCacheBusyTimeout) {
		return s.rejectErr(ErrBusy)
	}
	if s.group != nil {
		return s.groupPut(ctx, b.Topic, b.QueueID, b.SysFlag, specs, true, fate)
	}
	res, err := s.appendRecords(b.Topic, b.QueueID, b.SysFlag, specs, true)
	if err != nil {
		return s.rejectErr(err)
	}
	return s.afterAppend(ctx, res, b.WaitStoreOK())
}

func (s *Store) prepareBatch(b *Batch) ([]record.Spec, *ValidationError) {
	switch {
	case !record.ValidTopic(b.Topic):
		return nil, illegal("topic", fmt.Sprintf("topic must be 1-%d characters of [%%|a-zA-Z0-9_-]", MaxTopicLength))
	case b.QueueID < 0:
		return nil, illegal("queue_id", "queue id must not be negative")
	case len(b.Messages) == 0:
		return nil, illegal("messages", "batch is empty")
	case b.SysFlag&record.TransactionMask != TransactionNotType:
		return nil, illegal("batch", "a batch must not be transactional")
	case b.SysFlag&FlagInnerBatch != 0:
		return nil, illegal("sys_flag", "inner batches are not supported")
	case record.DelayLevel(b.Properties) > 0:
		return nil, illegal("batch", "a batch must not have a delay level")
	case hasTimerProperty(b.Properties):
		return nil, illegal("batch", "a batch must not have a delivery time (timer property)")
	}
	specs := make([]record.Spec, len(b.Messages))
	bodies, total := 0, 0
	for i := range b.Messages {
		bm := &b.Messages[i]
		if bm.Body == nil {
			return nil, illegal("messages", fmt.Sprintf("message %d: body is nil", i))
		}
		if record.DelayLevel(bm.Properties) > 0 {
			return nil, illegal("batch", fmt.Sprintf("message %d: a batch must not have a delay level", i))
		}
		if hasTimerProperty(bm.Properties) {
			return nil, illegal("batch", fmt.Sprintf("message %d: a batch must not have a delivery time (timer property)", i))
		}
		bodies += len(bm.Body)
		specs[i] = record.Spec{
			Topic: b.Topic, QueueID: b.QueueID, Flag: bm.Flag, Body: bm.Body, Props: bm.Properties,
			SysFlag: b.SysFlag, BornTS: bm.BornTimestamp, BornHost: b.BornHost, StoreHost: s.opts.StoreHost,
			PropCRC: !s.opts.DisablePropCRC,
			// The first record of a batch of two or more carries its
			// extent (record.Spec.BatchFirst): counted here, so the size
			// checks below see the bytes that are written.
			BatchFirst: i == 0 && len(b.Messages) > 1,
		}
		if ferr := specs[i].Size(); ferr != nil {
			verr := fieldError(ferr)
			verr.Reason = fmt.Sprintf("message %d: %s", i, verr.Reason)
			return nil, verr
		}
		total += specs[i].Total
	}
	if bodies > s.opts.MaxMessageSize {
		return nil, illegal("messages", fmt.Sprintf("batch bodies total %d bytes, limit %d", bodies, s.opts.MaxMessageSize))
	}
	if int64(total)+BlankLen > s.opts.FileSize {
		return nil, illegal("messages", fmt.Sprintf("batch of %d bytes cannot fit a commitlog file of %d bytes", total, s.opts.FileSize))
	}
	for i := range specs {
		specs[i].BodyCRC = record.BodyCRC(specs[i].Body)
	}
	if specs[0].BatchFirst {
		specs[0].BatchCount, specs[0].BatchBytes = len(specs), total
	}
	return specs, nil
}

// appendRecords sequences records for one topic-queue (queue offsets, store
// time: sequence.go) and has the commitlog place them, all in one file,
// under its append lock. It returns the append result, or an error when
// nothing was appended.
func (s *Store) appendRecords(topic string, queueID, sysFlag int32, specs []record.Spec, batch bool) (AppendResult, error) {
	b := s.stampBatch(topic, queueID, sysFlag, specs, batch)
	admit := func(now time.Time) error { return b.admit(now) }
	encode := func(dst []byte, at int64) {
		b.encode(specs, dst, at)
		b.commit()
	}
	placed, err := s.log.Append(b.total, admit, encode)
	if err != nil {
		return AppendResult{}, err
	}
	b.res.LockedAt, b.res.LockHeld = placed.LockedAt, placed.LockHeld
	return b.result(placed.At), nil
}

// stamped is one put's records on their way into the log: the queue they
// go to and how each is stamped (queue offsets and store time from the
// sequencer, physical offsets from where they land). The standalone append
// (inside the commitlog's callbacks) and the group-mode proposal (inside
// the raft node's stamp) both run admit, encode and commit, in that order.
//
// The specs themselves are not in it: encode takes them. stamped reaches
// the heap through admit (its topic may become a map key) and the result,
// and Go's escape analysis does not tell fields apart, so specs held here
// would move a put's one spec (on its caller's stack) to the heap.
type stamped struct {
	s           *Store
	topic       string
	queueID, tx int32
	n           int // records
	batch       bool
	total       int
	st          sequenced
	res         AppendResult
}

func (s *Store) stampBatch(topic string, queueID, sysFlag int32, specs []record.Spec, batch bool) stamped {
	b := stamped{s: s, topic: topic, queueID: queueID, tx: sysFlag & record.TransactionMask, n: len(specs), batch: batch}
	for i := range specs {
		b.total += specs[i].Total
	}
	if !batch {
		b.topic, b.queueID = specs[0].Topic, specs[0].QueueID // after a delay diversion
	} else {
		b.res.Offsets = make([]int64, len(specs))
	}
	return b
}

// storeTopic reports whether the store itself writes topic (queue 0),
// which is not in the topic table: its hidden state topics and the
// delay-level and timer topics.
func storeTopic(topic string) bool {
	return HiddenTopic(topic) || topic == ScheduleTopic || topic == TimerTopic
}

// admit checks the queue still exists (it may have been deleted since the
// put was admitted) and takes the queue offsets and store time.
func (b *stamped) admit(now time.Time) error {
	if !storeTopic(b.topic) && !b.s.topics.has(b.topic, b.queueID) {
		return fmt.Errorf("%w: %s was deleted", ErrTopicNotFound, b.topic)
	}
	b.st = b.s.seq.begin(consumequeue.Key{Topic: b.topic, Queue: b.queueID}, b.tx, now)
	return nil
}

// encode writes specs (those stampBatch was given) at commitlog offset at
// into dst.
func (b *stamped) encode(specs []record.Spec, dst []byte, at int64) {
	p := 0
	for i := range specs {
		specs[i].Encode(dst[p:], b.st.queueOffset(i), at+int64(p), b.st.storeTS)
		if b.batch {
			b.res.Offsets[i] = at + int64(p)
		}
		p += specs[i].Total
	}
}

// commit advances the queue's offsets past the records (sequence.go).
func (b *stamped) commit() { b.s.seq.commit(b.st, b.n) }

// undo takes back commit (a group's put raft refused).
func (b *stamped) undo() { b.s.seq.undo(b.st) }

// result is the append result of records placed at commitlog offset at.
func (b *stamped) result(at int64) AppendResult {
	res := b.res
	res.Status, res.WroteOffset, res.WroteBytes, res.StoreTimestamp = AppendOK, at, int32(b.total), b.st.storeTS
	res.Topic, res.QueueID, res.QueueOffset, res.MsgNum, res.StoreHost = b.topic, b.queueID, b.st.first, int32(b.n), b.s.opts.StoreHost
	return res
}

// afterAppend applies the flush policy, waits until the message is
// readable (read your writes, consumequeue/visible.go) and records the
// outcome. The put latency histogram counts sync waits only: an async
// put's latency is its time in the lock, already in the append histogram,
// and each clock read costs ~60 ns on some VMs.
//
// WAIT=false answers as soon as the record is appended, in both modes:
// the message is stored but neither known durable (sync) nor indexed yet;
// the dispatcher makes it readable within about its pause (async) or after
// the sync that covers it (sync).
func (s *Store) afterAppend(ctx context.Context, res AppendResult, wait bool) (PutResult, error) {
	out := PutResult{Status: PutOK, Append: res}
	var err error
	if s.opts.FlushMode == FlushSync {
		if wait {
			start := time.Now()
			err = s.flusher.Wait(ctx, res.NextOffset())
			out.FlushWaitStart, out.FlushWait = start, time.Since(start)
			s.stats.putLatency.Observe(out.FlushWait)
		} else {
			s.flusher.Wake()
		}
	} else {
		if s.opts.WakeFlushOnPut {
			s.flusher.Wake()
		}
		if !wait {
			s.index.Wake() // async: written is visible; index it soon
		}
	}
	if wait && err == nil {
		// Durable (sync) or written (async): make it readable before the
		// answer. If indexing fails or is slow the message is still
		// stored: the answer stays PUT_OK (a retry would store it twice)
		// and it becomes readable once indexing resumes.
		// Only ctx ending changes the answer: the caller stopped waiting.
		if werr := s.index.AwaitDispatched(ctx, res.NextOffset()); errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded) {
			err = werr
		}
	}
	if err != nil {
		out.Status, err = waitOutcome(err)
	}
	s.stats.record(out.Status, int(res.MsgNum), int(res.WroteBytes))
	return out, err
}

// waitOutcome is the answer to a put whose record is appended but whose
// wait for the flush or the index ended with err (non-nil): a flush
// timeout is FLUSH_DISK_TIMEOUT (stored, no error); a failed sync, a
// closed store or the caller's ctx ending is UNKNOWN_ERROR with an error
// saying why (stored, durability unknown).
func waitOutcome(err error) (PutStatus, error) {
	switch {
	case errors.Is(err, flush.ErrTimeout):
		return FlushDiskTimeout, nil
	case errors.Is(err, flush.ErrSyncFailed):
		return UnknownError, fmt.Errorf("%w: %w", ErrWriteFailed, err)
	case errors.Is(err, flush.ErrClosed):
		return UnknownError, fmt.Errorf("%w: store closed before the sync covered the message", ErrClosed)
	}
	return UnknownError, err // ctx
}

// Close stops taking puts, waits for appends in progress, flushes
// everything (answering sync waiters), unmaps the files, stops every
// goroutine and releases the data dir lock. It returns the sticky write
// error if a sync ever failed. Calling Close twice is safe.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.haltStateSnapshots()
	s.stopTxn()
	s.timers.Stop() // persists its progress; needs the flush policy running
	s.sched.Stop()  // the same
	s.ret.Stop()
	if s.group != nil {
		s.group.node.Close() // waiters answered ErrClosed (outcome unknown)
		s.group.signal()     // and the waits on the commit end or a topic change look again
		s.stopDedup()        // asked for by the raft loop only
	}
	s.log.Drain() // no append in progress after this; new ones see closed
	var errs []error
	if err := s.flusher.Close(); err != nil {
		errs = append(errs, err)
	}
	s.index.Stop()
	if s.group != nil && len(errs) == 0 && s.WriteErr() == nil {
		// The raft loop, stopped above, synced what it wrote in each
		// round; a clean close vouches for the whole log (the next Open
		// trusts the tail past its end: abort.go), so it is synced here
		// too, whatever the loop's last round did.
		if _, err := s.log.Sync(0); err != nil {
			errs = append(errs, fmt.Errorf("storage: sync the commitlog at close: %w", err))
		}
	}
	clean := len(errs) == 0 && s.WriteErr() == nil
	if clean && s.group != nil {
		// The next Open's walk of the raft index starts at its end.
		if err := s.group.rlog.SaveMark(1); err != nil {
			s.opts.Logger.Warn().Err(err).Msg("storage: raft/mark not written at close (the next start walks the whole raft index)")
		}
	}
	if clean {
		// Everything is flushed: index it all and checkpoint, so the next
		// Open has nothing to scan.
		s.index.Run(s.visibleEnd())
		if err := s.index.Checkpoint(); err != nil {
			errs = append(errs, err)
			clean = false
		}
	}
	if clean {
		// Everything applied is synced: the next Open replays no offset
		// or POP record (a failure costs it a longer replay, not this
		// Close).
		s.saveFinalStateSnapshots()
	}
	if clean {
		// Only a clean close removes the abort marker; otherwise the next
		// Open knows to distrust what it finds.
		if err := removeAbort(s.opts.FS, s.opts.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.index.Close(); err != nil {
		errs = append(errs, err)
	}
	if s.group != nil {
		if err := s.group.rlog.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.log.Close(); err != nil {
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

// visibleEnd is the commitlog offset readers may see up to, the
// dispatcher's watermark: the durable offset in sync mode (visibility
// never runs ahead of durability), the written offset in async mode.
func (s *Store) visibleEnd() int64 {
	if s.group != nil {
		return s.group.commitEnd.Load() // in a group: the commit end (design §3.3)
	}
	if s.opts.FlushMode == FlushSync {
		return s.log.Flushed()
	}
	return s.log.MaxOffset()
}

// delayOf returns the delay of level (1-based), 1 s for an unknown level
// (RocketMQ computeDeliverTimestamp).
func (s *Store) delayOf(level int) time.Duration {
	return schedule.DelayOf(s.resolved.delayLevels, level)
}

// lastStoreTime is the newest store time stamped.
func (s *Store) lastStoreTime() int64 { return s.seq.lastStoreTS.Load() }

// rebuildQueues loads the consume queues, re-dispatches everything from
// the checkpoint's dispatched offset (or from the start of the log when a
// queue has fewer entries than the checkpoint recorded: deleted or
// truncated), and rebuilds the sequencer's queue offsets from them.
func (s *Store) rebuildQueues(cp consumequeue.Checkpoint) error {
	end := s.log.MaxOffset()
	if s.group != nil {
		end = s.group.commitEnd.Load() // only committed entries are applied
	}
	// Entries past the checkpoint were not known durable when it was
	// written: a power cut may have torn them. Load drops them; the
	// re-dispatch below writes them again from the commitlog.
	want := func(topic string, qid int32) int64 { return s.checkpointCount(cp, topic, qid) }
	if err := s.index.Load(end, want); err != nil {
		return err
	}
	if s.installing != nil {
		if err := s.startInstalledQueues(s.installing); err != nil {
			return err
		}
	}
	s.dropDeletedQueues()
	from := min(cp.Dispatched, end)
	for name := range cp.Queues {
		topic, qid, ok := consumequeue.SplitQueueName(name)
		if !ok {
			continue
		}
		want := s.checkpointCount(cp, topic, qid)
		if want == 0 {
			continue // the topic was deleted after the checkpoint
		}
		if q := s.index.Queue(topic, qid); q == nil || q.Count() < want {
			s.opts.Logger.Warn().Str("queue", name).Msg("storage: consume queue missing or short; rebuilding from the commitlog")
			from = s.log.MinOffset()
			break
		}
	}
	from = max(from, s.log.MinOffset())
	// Recovery checked the records from its scan start on, not those below
	// it that a rebuild from the log's start reads: Rebuild checks every
	// record it indexes, so damage there is a CorruptionError.
	if err := s.index.Rebuild(from, end, cp); err != nil {
		return err
	}
	for _, k := range s.index.Keys() {
		if q := s.index.Queue(k.Topic, k.Queue); q != nil {
			s.seq.set(k, q.Count())
		}
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

// fieldError turns the codec's refusal into the store's.
func fieldError(e *record.FieldError) *ValidationError {
	st := MessageIllegal
	if e.TooLong {
		st = PropertiesSizeExceeded
	}
	return &ValidationError{Status: st, Field: e.Field, Reason: e.Reason}
}

// durableTo returns once every commitlog byte below off is durable: through
// the group commit in sync mode (one sync shared with producers), by an
// explicit sync in async mode. A failed sync is sticky (s.fail).
func (s *Store) durableTo(off int64) error {
	if s.log.Flushed() >= off {
		return nil
	}
	if s.opts.FlushMode == FlushSync {
		return s.flusher.Wait(context.Background(), off)
	}
	if _, err := s.log.Sync(0); err != nil {
		s.fail(err)
		return fmt.Errorf("%w: %w", ErrWriteFailed, err)
	}
	if got := s.log.Flushed(); got < off {
		return fmt.Errorf("storage: sync reached %d, short of %d", got, off)
	}
	return nil
}
