package storage

// Transactional messages (RocketMQ's two-phase send; storage/txn keeps the
// table and the op codec).
//
// Half. A put whose transaction type is PREPARED is diverted in prepare, as
// RocketMQ's TransactionalMessageBridge.parseHalfMessageInner does: stored
// on txn.HalfTopic queue 0 with its topic and queue in REAL_TOPIC /
// REAL_QID, TRAN_MSG=true, and its transaction type reset to NOT, so it is
// indexed on the half topic (which no client reads) and never on its own.
// Its answer (PUT_OK once durable, committed in a group) is the client's
// transaction: its commitlog offset names it. The half topic's applier puts
// it in the pending table (storage/txn) on every replica; a put while
// Options.MaxPendingTransactions are pending is refused (ErrTransactionsFull).
//
// End. EndTransaction COMMIT puts the message to its real topic and queue
// (same body, flag, born time and host, properties without REAL_TOPIC,
// REAL_QID and TRAN_MSG, plus TRAN_PREPARED_QUEUE_OFFSET; transaction type
// COMMIT and PREPARED TX OFF = the half's commitlog offset, as RocketMQ's
// EndTransactionProcessor), then writes an op record (txn.OpTopic, TAGS
// "d", TRAN_OP_RESOLUTION=COMMIT, body: the half's queue offset) through
// putSystem; the op's applier takes the half out of the table. ROLLBACK
// writes the op only. The answer comes once the op is durable (committed)
// and applied. One end of a half runs at a time (txnService.busy); a
// repeated end with the same resolution is answered OK from the table's
// memory of recent ends without a second put; the other resolution, or a
// half the table does not know, is an error.
//
// At most once, never lost. The real message is put before the op record,
// so a crash between them leaves the half pending with its message already
// delivered. To never deliver it twice, the store that runs the ends (the
// standalone store after Open, a group's ready leader in each of its
// leaderships) first reconciles: for every pending half it looks through
// its real queue's entries stored after the half for a COMMIT-typed record
// whose PREPARED TX OFF is the half's offset (the log order makes those
// the only candidates; the cost is one record read per message stored in
// those queues since the oldest pending half, and pending halves live at
// most TransactionTimeout + TransactionCheckMax × TransactionCheckInterval
// unless ended). A half found so is only missing its op: the next end or
// check writes the COMMIT op without putting the message again, and a
// ROLLBACK of it is refused. The op is after the real message in the log,
// so a durable (committed) op implies a durable (committed) message: a
// commit whose put was appended with an unknown outcome still gets its op,
// and a commit is never recorded without its message.
//
// Check. A goroutine (started by Open, stopped by Close) runs where
// deliveries run (a master; in a group the ready leader: groupDelivering),
// on Options.Clock: every TransactionCheckInterval, or when the first half
// arrives, it finds the halves older than their immunity
// (CHECK_IMMUNITY_TIME_IN_SECONDS, else TransactionTimeout) and not checked
// within TransactionCheckInterval, writes one check op for them (TAGS "c":
// the count is in the log, so a restart does not reset it), then hands
// each to the TransactionChecker (the server sends a
// RecoverOrphanedTransactionCommand to a producer of its topic, which
// answers with EndTransaction). A half checked TransactionCheckMax times
// is discarded: a DISCARD op, a rollback. With no pending half the loop
// waits on a channel, not on the clock.
//
// Retention keeps the files from the oldest pending half on.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/txn"
)

// Transaction topics and properties (storage/txn).
const (
	TransHalfTopic              = txn.HalfTopic
	TransOpTopic                = txn.OpTopic
	PropertyTransactionPrepared = txn.PropertyTransactionPrepared
	PropertyCheckImmunity       = txn.PropertyCheckImmunity
	PropertyPreparedQueueOffset = txn.PropertyPreparedQueueOffset
)

var (
	// ErrTransactionsFull refuses a half message while
	// Options.MaxPendingTransactions halves are pending (nothing stored;
	// end some, or retry later).
	ErrTransactionsFull = errors.New("storage: the store holds its maximum of pending transactional half messages")
	// ErrTransactionNotFound: no pending half message has that transaction
	// id (never stored, of another topic, or ended so long ago that the
	// store no longer remembers how).
	ErrTransactionNotFound = errors.New("storage: no pending transaction with this id")
	// ErrTransactionEnded: the transaction ended the other way (a rollback
	// of a committed one, a commit of one rolled back or discarded after
	// its last check).
	ErrTransactionEnded = errors.New("storage: the transaction has ended the other way")
)

// TransactionCheck is a half message due for a check.
type TransactionCheck struct {
	// Half is the half message's record (on TransHalfTopic); Topic and
	// Queue its real topic and queue; Checks the checks before this one.
	Half   *Record
	Topic  string
	Queue  int32
	Checks int32
}

// TransactionChecker asks a producer to resolve a half message (the
// server's RecoverOrphanedTransactionCommand). It must not block: the
// answer comes later as an EndTransaction.
type TransactionChecker interface {
	CheckTransaction(c TransactionCheck)
}

// TransactionStats describe transactional half messages: Pending is the
// table's count (the same on every member of a group); the counters are
// this process's, where it ran ends and checks, since it opened.
type TransactionStats struct {
	Pending                                   int
	Committed, RolledBack, Checked, Discarded uint64
}

// transactionStats is Stats' Transactions.
func (s *Store) transactionStats() TransactionStats {
	c := &s.txnSvc.counts
	return TransactionStats{Pending: s.PendingTransactions(), Committed: c.committed.Load(), RolledBack: c.rolledBack.Load(),
		Checked: c.checked.Load(), Discarded: c.discarded.Load()}
}

// TransactionResult is the outcome of EndTransaction.
type TransactionResult struct {
	// Op is the put result of the op record (zero when Repeated).
	Op PutResult
	// Repeated: the transaction had ended this way already; nothing was
	// written.
	Repeated bool
	// MsgID is the committed message's msgId, when this call put it.
	MsgID string
}

// txnService is the leader-local side of transactions: which halves an
// end is under way for, which halves have their message delivered but no
// op yet, and the check loop. Lock order: mu, then the table's Mu.
type txnService struct {
	mu        sync.Mutex
	busy      map[int64]chan struct{} // by half commitlog offset
	committed map[int64]bool          // real message found or put, op missing
	epoch     uint64                  // the leadership reconciled (+1; 0: none)
	gen       uint64                  // the table rebuild reconciled
	rebuilt   atomic.Uint64           // table rebuilds (openTxn)

	checker atomic.Pointer[TransactionChecker]
	counts  struct{ committed, rolledBack, checked, discarded atomic.Uint64 }
	// afterRealPut, if set, runs between a commit's message put and its
	// op record; an error ends the commit there (tests: a crash between).
	afterRealPut func() error
	wake         chan struct{}
	stop         chan struct{}
	done         chan struct{}
}

// SetTransactionChecker sets who the check loop asks (nil: nobody; checks
// are still counted, as RocketMQ counts a check no producer received).
func (s *Store) SetTransactionChecker(c TransactionChecker) {
	if c == nil {
		s.txnSvc.checker.Store(nil)
		return
	}
	s.txnSvc.checker.Store(&c)
}

// PendingTransactions counts the pending half messages.
func (s *Store) PendingTransactions() int {
	s.txn.Mu.Lock()
	defer s.txn.Mu.Unlock()
	return s.txn.Pending()
}

// divertHalf rewrites a PREPARED message for the half topic (see above).
// It copies the properties.
func divertHalf(r *record.Spec) {
	props := make([]record.Property, 0, len(r.Props)+3)
	for _, p := range r.Props {
		switch p.Key {
		case record.PropertyRealTopic, record.PropertyRealQueueID, PropertyTransactionPrepared:
			continue // ours win
		}
		props = append(props, p)
	}
	props = append(props,
		record.Property{Key: PropertyTransactionPrepared, Value: "true"},
		record.Property{Key: record.PropertyRealTopic, Value: r.Topic},
		record.Property{Key: record.PropertyRealQueueID, Value: strconv.Itoa(int(r.QueueID))})
	r.Props = props
	r.Topic = TransHalfTopic
	r.QueueID = 0
	r.SysFlag &^= record.TransactionMask
}

// txnAdmit refuses a half while the table is full. Concurrent puts may
// pass it together: the table exceeds the bound by at most the puts in
// flight (an applier never refuses a record).
func (s *Store) txnAdmit() error {
	s.txn.Mu.Lock()
	n := s.txn.Pending()
	s.txn.Mu.Unlock()
	if n >= s.opts.MaxPendingTransactions {
		return fmt.Errorf("%w (%d of %d)", ErrTransactionsFull, n, s.opts.MaxPendingTransactions)
	}
	return nil
}

// halfOf reads a half record's table entry; ok is false for a record
// without a usable REAL_TOPIC / REAL_QID (never written by divertHalf).
func halfOf(phys, queueOffset, storeMS int64, realTopic, realQID, immunity string) (txn.Half, bool) {
	q, err := strconv.ParseInt(realQID, 10, 32)
	if err != nil || q < 0 || !record.ValidTopic(realTopic) {
		return txn.Half{}, false
	}
	h := txn.Half{Offset: queueOffset, Phys: phys, StoreMS: storeMS, Topic: realTopic, Queue: int32(q)}
	if sec, err := strconv.ParseInt(immunity, 10, 64); err == nil && sec > 0 {
		h.ImmunityMS = min(sec, 86400) * 1000
	}
	return h, true
}

// applyHalfRecord is the half topic's applier (sysrecords.go).
func (s *Store) applyHalfRecord(phys int64, b []byte) {
	h, err := record.Parse(b)
	if err != nil {
		return // the dispatcher parsed it already
	}
	half, ok := halfOf(phys, h.QueueOffset, h.StoreTS, string(h.Property(record.PropertyRealTopic)),
		string(h.Property(record.PropertyRealQueueID)), string(h.Property(PropertyCheckImmunity)))
	s.txn.Mu.Lock()
	if ok {
		s.txn.AddHalf(half)
	}
	s.txn.HalfRecord(phys)
	s.txn.Mu.Unlock()
	if ok {
		s.txnWake()
	}
}

// applyOpRecord is the op topic's applier (sysrecords.go). A record that
// does not decode is skipped (never refused: every replica must apply
// what its log holds; a whole replay at Open refuses it instead, one
// past the table's snapshot too) and still noted as applied.
func (s *Store) applyOpRecord(phys int64, b []byte) {
	h, err := record.Parse(b)
	if err != nil {
		return
	}
	op, err := txn.Decode(string(h.Property(record.PropertyTags)), string(h.Property(txn.PropertyResolution)), h.Body)
	if err != nil {
		s.opts.Logger.Warn().Err(err).Int64("offset", h.PhysOffset).Msg("storage: transaction op record skipped")
	}
	s.txn.Mu.Lock()
	if err == nil {
		s.txn.ApplyOp(op, h.StoreTS)
	}
	s.txn.OpRecord(phys)
	s.txn.Mu.Unlock()
}

// openTxn rebuilds the pending table at Open (sysrecords.go's
// openSystemState): from its snapshot if there is a usable one
// (txn_snapshot.go), then from the half and op topics' consume queues
// past it. Replaying every half before every op gives the table log
// order gives: an op always follows its halves in the log, and ops of
// unknown halves are ignored either way.
func (s *Store) openTxn() error {
	if s.txn == nil {
		s.txn = txn.New(s.opts.MaxPendingTransactions)
	}
	s.txn.Mu.Lock()
	s.txn.Reset()
	s.txn.Mu.Unlock()
	s.txnSvc.rebuilt.Add(1) // reconcile again: the log may have changed under it
	from := s.loadTxnSnapshot()
	err := s.replaySystem(TransHalfTopic, 0, from.halfFrom, func(phys int64, rec *Record) error {
		if phys <= from.after {
			return nil
		}
		v := func(k string) string { x, _ := rec.Property(k); return x }
		half, ok := halfOf(phys, rec.QueueOffset, rec.StoreTimestamp, v(PropertyRealTopic), v(PropertyRealQueueID), v(PropertyCheckImmunity))
		s.txn.Mu.Lock()
		if ok {
			s.txn.AddHalf(half)
		}
		s.txn.HalfRecord(phys)
		s.txn.Mu.Unlock()
		s.txnSnap.replayed++
		return nil
	})
	if err != nil {
		return err
	}
	return s.replaySystem(TransOpTopic, 0, from.opFrom, func(phys int64, rec *Record) error {
		if phys <= from.after {
			return nil
		}
		tags, _ := rec.Property(PropertyTags)
		res, _ := rec.Property(txn.PropertyResolution)
		op, err := txn.Decode(tags, res, rec.Body)
		if err != nil {
			return fmt.Errorf("%w: transaction op record at commitlog offset %d: %w", ErrCorrupt, phys, err)
		}
		s.txn.Mu.Lock()
		s.txn.ApplyOp(op, rec.StoreTimestamp)
		s.txn.OpRecord(phys)
		s.txn.Mu.Unlock()
		s.txnSnap.replayed++
		return nil
	})
}

// resetTxnForSnapshot empties the pending table when a snapshot install
// leaves a gap in what this replica applied (as resetPopForSnapshot): an op
// in the gap would leave its half pending here forever, and a check of it
// could deliver a rolled-back message. The dispatcher then applies the
// snapshot's records from its first offset, which the leader's retention
// kept at or below its oldest pending half. REQUIRES: the index paused.
func (s *Store) resetTxnForSnapshot(minOffset int64) {
	if s.index.Dispatched() >= minOffset {
		return
	}
	s.txn.Mu.Lock()
	s.txn.Reset()
	s.txn.Mu.Unlock()
	s.txnSvc.rebuilt.Add(1)
}

// txnProtectedFrom is the commitlog offset retention keeps from: the
// oldest pending half.
func (s *Store) txnProtectedFrom() int64 {
	if s.txn == nil {
		return 1<<63 - 1
	}
	s.txn.Mu.Lock()
	defer s.txn.Mu.Unlock()
	if p, ok := s.txn.OldestPhys(); ok {
		return p
	}
	return 1<<63 - 1
}

// EndTransaction commits or rolls back the pending half message of topic
// stored at commitlog offset phys (its transaction id), see the top of
// this file. Errors: ErrTransactionNotFound, ErrTransactionEnded, the put
// path's refusals (nothing written: ErrClosed, a *NotLeaderError, …), or
// an error with res.Op appended (the op's durability unknown: a retry is
// answered from the table).
func (s *Store) EndTransaction(ctx context.Context, topic string, phys int64, commit bool) (TransactionResult, error) {
	if s.closed.Load() {
		return TransactionResult{}, ErrClosed
	}
	if err := s.groupRefusal(); err != nil {
		return TransactionResult{}, err
	}
	if err := s.checkBeforePut(); err != nil {
		return TransactionResult{}, err
	}
	if err := s.txnReconcile(); err != nil {
		return TransactionResult{}, err
	}
	svc := &s.txnSvc
	for {
		svc.mu.Lock()
		s.txn.Mu.Lock()
		h, pending := s.txn.ByPhys(phys)
		ended, wasEnded := s.txn.Ended(phys)
		s.txn.Mu.Unlock()
		if !pending {
			svc.mu.Unlock()
			switch {
			case !wasEnded:
				return TransactionResult{}, fmt.Errorf("%w (commitlog offset %d)", ErrTransactionNotFound, phys)
			case commit == (ended == txn.Commit):
				return TransactionResult{Repeated: true}, nil
			}
			return TransactionResult{}, fmt.Errorf("%w: it ended with %s", ErrTransactionEnded, ended)
		}
		if h.Topic != topic {
			svc.mu.Unlock()
			return TransactionResult{}, fmt.Errorf("%w: the transaction is of topic %s, not %s", ErrTransactionNotFound, h.Topic, topic)
		}
		if ch := svc.busy[phys]; ch != nil {
			svc.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return TransactionResult{}, ctx.Err()
			}
		}
		ch := make(chan struct{})
		svc.busy[phys] = ch
		written := svc.committed[phys]
		svc.mu.Unlock()
		res, err := s.endHalf(ctx, h, commit, written)
		svc.mu.Lock()
		delete(svc.busy, phys)
		close(ch)
		svc.mu.Unlock()
		return res, err
	}
}

// endHalf writes an end of h. REQUIRES: h marked busy.
func (s *Store) endHalf(ctx context.Context, h txn.Half, commit, written bool) (TransactionResult, error) {
	var out TransactionResult
	kind := txn.Rollback
	if commit {
		kind = txn.Commit
	}
	if !commit && written {
		return out, fmt.Errorf("%w: its message was delivered already (the commit's op record is being written)", ErrTransactionEnded)
	}
	if commit && !written {
		rec, err := s.readRecord(h.Phys)
		if err != nil {
			return out, err
		}
		if rec.Topic != TransHalfTopic || rec.QueueOffset != h.Offset {
			return out, fmt.Errorf("%w: the half message at commitlog offset %d is a record of %s offset %d", ErrCorrupt, h.Phys, rec.Topic, rec.QueueOffset)
		}
		res, err := s.putMessage(ctx, committedMessage(rec, h), nil)
		if !res.Appended() {
			return out, err // nothing stored: the half stays pending
		}
		s.txnSvc.mu.Lock()
		s.txnSvc.committed[h.Phys] = true
		s.txnSvc.mu.Unlock()
		out.MsgID = res.Append.MsgID()
		if f := s.txnSvc.afterRealPut; f != nil {
			if err := f(); err != nil {
				return out, err
			}
		}
		// Appended with an unknown outcome: the op goes after it in the
		// log, so the op is durable (committed) only with it.
	}
	var err error
	out.Op, err = s.putTxnOp(ctx, txn.Op{Kind: kind, Offsets: []int64{h.Offset}})
	if err == nil {
		if commit {
			s.txnSvc.counts.committed.Add(1)
		} else {
			s.txnSvc.counts.rolledBack.Add(1)
		}
	}
	return out, err
}

// committedMessage is the message a commit puts for half rec (RocketMQ
// EndTransactionProcessor.endMessageTransaction).
func committedMessage(rec *Record, h txn.Half) *Message {
	props := make([]Property, 0, len(rec.Properties)+1)
	for _, p := range rec.Properties {
		switch p.Key {
		case PropertyRealTopic, PropertyRealQueueID, PropertyTransactionPrepared, PropertyPreparedQueueOffset,
			PropertyCRC32, PropertyBatch, PropertyInnerNum:
			continue
		}
		props = append(props, p)
	}
	props = append(props, Property{Key: PropertyPreparedQueueOffset, Value: strconv.FormatInt(h.Offset, 10)})
	return &Message{
		Topic: h.Topic, QueueID: h.Queue, Flag: rec.Flag, Body: rec.Body, Properties: props,
		SysFlag:       rec.SysFlag&^(record.TransactionMask|FlagInnerBatch) | TransactionCommitType,
		BornTimestamp: rec.BornTimestamp, BornHost: rec.BornHost, ReconsumeTimes: rec.ReconsumeTimes,
		PreparedTxOffset: h.Phys,
	}
}

// putTxnOp writes op and waits until it is durable (committed) and
// applied.
func (s *Store) putTxnOp(ctx context.Context, op txn.Op) (PutResult, error) {
	tags, res, body := txn.Encode(op)
	props := []record.Property{{Key: PropertyTags, Value: tags}}
	if res != "" {
		props = append(props, record.Property{Key: txn.PropertyResolution, Value: res})
	}
	out, err := s.putSystem(ctx, TransOpTopic, body, false, props...)
	if err == nil && out.Status != PutOK {
		err = fmt.Errorf("storage: transaction op record stored with status %s", out.Status)
	}
	return out, err
}

// txnDelivering reports whether this store runs ends and checks.
func (s *Store) txnDelivering() bool { return s.Role() == RoleMaster && s.groupDelivering() }

// txnReconcile finds, once per leadership (standalone: once per Open), the
// pending halves whose message was put before a crash or failover cut
// their commit short (see the top of this file).
func (s *Store) txnReconcile() error {
	svc := &s.txnSvc
	epoch, gen := s.groupEpoch()+1, svc.rebuilt.Load()
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.epoch == epoch && svc.gen == gen {
		return nil
	}
	s.txn.Mu.Lock()
	halves := s.txn.All()
	s.txn.Mu.Unlock()
	type qk struct {
		topic string
		queue int32
	}
	lowest := map[qk]int64{}
	want := map[int64]bool{}
	for _, h := range halves {
		k := qk{h.Topic, h.Queue}
		if lo, ok := lowest[k]; !ok || h.Phys < lo {
			lowest[k] = h.Phys
		}
		want[h.Phys] = true
	}
	committed := map[int64]bool{}
	for k, lo := range lowest {
		q := s.index.Queue(k.topic, k.queue)
		if q == nil {
			continue
		}
		for off := q.Count() - 1; off >= q.Min(); off-- {
			phys, _, _, ok, err := q.Lookup(off)
			if err != nil {
				return err
			}
			if !ok || phys <= lo {
				break
			}
			rec, err := s.readRecord(phys)
			if errors.Is(err, ErrOutOfRange) {
				break
			}
			if err != nil {
				return fmt.Errorf("storage: transactions: reconcile %s/%d offset %d: %w", k.topic, k.queue, off, err)
			}
			if rec.SysFlag&record.TransactionMask == TransactionCommitType && want[rec.PreparedTxOffset] {
				committed[rec.PreparedTxOffset] = true
			}
		}
	}
	svc.committed = committed
	svc.epoch, svc.gen = epoch, gen
	return nil
}

// txnWake wakes the check loop (a half arrived).
func (s *Store) txnWake() {
	select {
	case s.txnSvc.wake <- struct{}{}:
	default:
	}
}

// startTxn starts the check loop (Open, once the state is rebuilt).
func (s *Store) startTxn() {
	svc := &s.txnSvc
	if s.opts.txnManual {
		return
	}
	svc.stop = make(chan struct{})
	svc.done = make(chan struct{})
	go func() {
		defer close(svc.done)
		for {
			next, idle := s.txnRound()
			select {
			case <-svc.stop:
				return
			default:
			}
			s.txnWait(next, idle)
			select {
			case <-svc.stop:
				return
			default:
			}
		}
	}()
}

// stopTxn stops the check loop and waits for it (Close; safe twice).
func (s *Store) stopTxn() {
	svc := &s.txnSvc
	if svc.stop == nil {
		return
	}
	select {
	case <-svc.stop:
	default:
		close(svc.stop)
	}
	<-svc.done
}

// txnWait waits for the next round: a half's arrival, the clock reaching
// next (when not idle), or a second of real time while this store does
// not deliver (a leadership may come).
func (s *Store) txnWait(next time.Time, idle bool) {
	svc := &s.txnSvc
	var at <-chan struct{}
	if !idle {
		c, release := base.ClockWait(s.opts.Clock, next)
		defer release()
		at = c
	}
	var poll <-chan time.Time
	if !s.txnDelivering() {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		poll = t.C
	}
	select {
	case <-svc.wake:
	case <-at:
	case <-poll:
	case <-svc.stop:
	}
}

// txnRound runs one round of checks and returns when the next is due
// (idle: no pending half, wait for one).
func (s *Store) txnRound() (next time.Time, idle bool) {
	s.txn.Mu.Lock()
	n := s.txn.Pending()
	s.txn.Mu.Unlock()
	if n == 0 || !s.txnDelivering() || s.closed.Load() || s.WriteErr() != nil {
		return time.Time{}, true
	}
	now := s.opts.Clock.Now()
	retry := now.Add(s.opts.TransactionCheckInterval)
	if err := s.txnReconcile(); err != nil {
		s.logLimit.Event("txn reconcile", s.opts.Logger.Warn()).Err(err).Msg("storage: transactions: reconcile failed; no checks this round")
		return retry, false
	}
	nowMS := now.UnixMilli()
	interval := s.opts.TransactionCheckInterval.Milliseconds()
	svc := &s.txnSvc
	var (
		commits, discards, checks []txn.Half
		nextMS                    = retry.UnixMilli()
	)
	svc.mu.Lock()
	s.txn.Mu.Lock()
	halves := s.txn.All()
	s.txn.Mu.Unlock()
	for _, h := range halves {
		if svc.busy[h.Phys] != nil {
			continue
		}
		imm := h.ImmunityMS
		if imm == 0 {
			imm = s.opts.TransactionTimeout.Milliseconds()
		}
		due := h.StoreMS + imm
		if h.LastCheckMS > 0 {
			due = max(due, h.LastCheckMS+interval)
		}
		switch {
		case svc.committed[h.Phys]:
			commits = append(commits, h)
		case due > nowMS:
			nextMS = min(nextMS, due)
			continue
		case int(h.Checks) >= s.opts.TransactionCheckMax:
			discards = append(discards, h)
		default:
			checks = append(checks, h)
			continue
		}
		svc.busy[h.Phys] = make(chan struct{}) // ends wait for the op below
	}
	svc.mu.Unlock()
	ctx := context.Background()
	s.txnEndBatch(ctx, txn.Commit, commits)
	s.txnEndBatch(ctx, txn.Discard, discards)
	for len(checks) > 0 {
		batch := checks[:min(len(checks), txn.MaxOpOffsets)]
		checks = checks[len(batch):]
		op := txn.Op{Kind: txn.Check}
		for _, h := range batch {
			op.Offsets = append(op.Offsets, h.Offset)
		}
		if _, err := s.putTxnOp(ctx, op); err != nil {
			s.logLimit.Event("txn check", s.opts.Logger.Warn()).Err(err).Msg("storage: transactions: check record not written; no checks sent")
			break
		}
		s.txnSvc.counts.checked.Add(uint64(len(batch)))
		c := s.txnSvc.checker.Load()
		for _, h := range batch {
			nextMS = min(nextMS, nowMS+interval)
			if c == nil {
				continue
			}
			rec, err := s.readRecord(h.Phys)
			if err != nil {
				continue
			}
			(*c).CheckTransaction(TransactionCheck{Half: rec, Topic: h.Topic, Queue: h.Queue, Checks: h.Checks})
		}
	}
	return time.UnixMilli(nextMS), false
}

// txnEndBatch writes kind's op for halves (marked busy by txnRound) and
// releases them.
func (s *Store) txnEndBatch(ctx context.Context, kind txn.Kind, halves []txn.Half) {
	svc := &s.txnSvc
	for len(halves) > 0 {
		batch := halves[:min(len(halves), txn.MaxOpOffsets)]
		halves = halves[len(batch):]
		op := txn.Op{Kind: kind}
		for _, h := range batch {
			op.Offsets = append(op.Offsets, h.Offset)
		}
		if _, err := s.putTxnOp(ctx, op); err != nil {
			s.logLimit.Event("txn end", s.opts.Logger.Warn()).Err(err).Str("kind", kind.String()).Msg("storage: transactions: op record not written; retried next round")
		} else if kind == txn.Discard {
			s.txnSvc.counts.discarded.Add(uint64(len(batch)))
			s.opts.Logger.Warn().Int("halves", len(batch)).Int("checks", s.opts.TransactionCheckMax).
				Msg("storage: transactions: half messages discarded (rolled back) after their last check")
		} else {
			s.txnSvc.counts.committed.Add(uint64(len(batch)))
		}
		svc.mu.Lock()
		for _, h := range batch {
			if ch := svc.busy[h.Phys]; ch != nil {
				delete(svc.busy, h.Phys)
				close(ch)
			}
		}
		svc.mu.Unlock()
	}
}
