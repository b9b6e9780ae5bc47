package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/record"
)

// System records: the store's own state kept as records of system topics
// in the commitlog (consumer offsets; transactional half messages; POP
// state in a replication group, pop.go), so that whatever carries the log
// carries the state: recovery,
// and in a replication group the raft log, which is the commitlog.
//
// The one rule: such state changes only by applying its topic's records,
// in log order, as they are indexed (the consume-queue dispatcher passes
// each one to its applier; consumequeue.Options.Apply). Indexing stops at
// the visible end: the commit end in a group (never an uncommitted entry,
// which a new leader may truncate), the durable end in sync mode, the
// written end in async mode. So on every replica of a group the state at
// a log position is the same, and a write of such state is acknowledged
// like a put: proposed on the ready leader, answered once committed and
// indexed (the put path waits for both), never applied where it is
// written. At Open the state is rebuilt by replaying the topic's consume
// queue (what is indexed: the commit end in a group), then the hook is
// started from there (openSystemState), so the state after a restart
// equals the one built live.
//
// To add a system topic's state: give it a case in systemApplier (an
// Applier: quick, no call back into the index, never refusing a record it
// can decode: every replica must apply what its log holds), a replay in
// openSystemState, and write its records through s.putSystem. Keep it
// deterministic: an applier reads only its record and the state its own
// earlier records built (never the clock, the topic table or the
// replica's role), or replicas drift apart. Reads of it on a follower are
// as fresh as that follower's index; a linearizable read is
// Store.ReadBarrier first.

// systemApplier is the applier of topic's records, or nil (the
// dispatcher asks once per change of topic along the log).
func (s *Store) systemApplier(topic string) consumequeue.Applier {
	switch topic {
	case OffsetTopic:
		return s.applyOffsetRecord
	case PopTopic:
		if s.group != nil { // standalone, pop.go applies its records as it appends them
			return s.applyPopRecord
		}
	case TransHalfTopic:
		return s.applyHalfRecord
	case TransOpTopic:
		return s.applyOpRecord
	}
	return nil
}

// openSystemState rebuilds the state kept in system records from the
// consume queues, then starts the hook from the dispatch position: at
// Open, before the dispatcher starts. (A snapshot install does not call
// it again: the dispatcher goes on from the snapshot's first offset, and
// each state rebuilds what it needs, group_install.go.)
func (s *Store) openSystemState() error {
	began := time.Now()
	if err := s.openOffsets(); err != nil {
		return err
	}
	if err := s.openPop(); err != nil {
		return err
	}
	if err := s.openTxn(); err != nil {
		return err
	}
	// What the start cost, for an operator wondering why one was slow:
	// the records replayed past each table's snapshot (state_snapshot.go).
	s.opts.Logger.Info().Int("offset_records", s.offSnap.replayed).Bool("offsets_from_snapshot", s.offSnap.restored).
		Int("pop_records", s.popSnap.replayed).Bool("pop_from_snapshot", s.popSnap.restored).
		Int("transaction_records", s.txnSnap.replayed).Bool("transactions_from_snapshot", s.txnSnap.restored).
		Dur("took", time.Since(began)).Msg("storage: consumer offsets, POP and transaction state rebuilt")
	s.index.StartApplyingPaused()
	return nil
}

// replaySystem calls fn with every record of topic/queueID indexed from
// queue offset from on, in log order (Open's replay of a system topic;
// from is past the records a snapshot covers, 0 for all). Records whose file
// retention removed are skipped (queues are trimmed lazily): what they
// held was rewritten past them or is no longer needed. A record that
// fails its checks is an error: Open refuses rather than serve an older
// state.
func (s *Store) replaySystem(topic string, queueID int32, from int64, fn func(phys int64, rec *Record) error) error {
	q := s.index.Queue(topic, queueID)
	if q == nil {
		return nil
	}
	for off := max(q.Min(), from); off < q.Count(); off++ {
		phys, _, _, ok, err := q.Lookup(off)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if phys < s.log.MinOffset() {
			continue
		}
		rec, err := s.readRecord(phys)
		if errors.Is(err, ErrNoRecord) {
			err = fmt.Errorf("%w: consume queue %s/%d entry %d: %w", ErrCorrupt, topic, queueID, off, err)
		}
		if err != nil {
			return fmt.Errorf("storage: %s record %d: %w", topic, off, err)
		}
		if err := fn(phys, rec); err != nil {
			return err
		}
	}
	return nil
}

// putSystem writes one record of a system topic (queue 0) with body and
// waits until it is applied here: standalone, appended, durable in sync
// mode and indexed (afterAppend); in a group, proposed on the ready
// leader, committed and indexed (groupPut). The result tells the outcome
// as a put's: nothing stored (an error with a refusal status), stored
// (PutOK), or unknown (FlushDiskTimeout, FlushSlaveTimeout,
// UnknownError).
//
// freeing marks a write that lets retention free the disk (the rewrite of
// live offsets before their files go): it is taken above the disk
// warning watermark and while a background write retries, where a put is
// refused, or a full disk could never be freed.
//
// props, if any, are the record's properties (the transaction op records'
// TAGS and resolution).
func (s *Store) putSystem(ctx context.Context, topic string, body []byte, freeing bool, props ...record.Property) (PutResult, error) {
	check := s.checkBeforePut
	if freeing {
		check = s.checkBeforeFreeing
	}
	if err := check(); err != nil {
		return s.rejectErr(err)
	}
	if err := s.groupRefusal(); err != nil {
		return s.rejectErr(err)
	}
	if err := ctx.Err(); err != nil {
		return s.reject(UnknownError, err)
	}
	spec := record.Spec{
		Topic: topic, QueueID: 0, Body: body, Props: props, BornTS: s.opts.Clock.Now().UnixMilli(),
		BornHost: s.opts.StoreHost, StoreHost: s.opts.StoreHost, PropCRC: !s.opts.DisablePropCRC,
	}
	if ferr := spec.Size(); ferr != nil {
		return s.rejectErr(fieldError(ferr))
	}
	spec.BodyCRC = record.BodyCRC(spec.Body)
	if s.log.Busy(s.opts.PageCacheBusyTimeout) {
		return s.rejectErr(ErrBusy)
	}
	if s.group != nil {
		return s.groupPut(ctx, topic, 0, 0, []record.Spec{spec}, false, nil)
	}
	one := [1]record.Spec{spec}
	res, err := s.appendRecords(topic, 0, 0, one[:], false)
	if err != nil {
		return s.rejectErr(err)
	}
	return s.afterAppend(ctx, res, true)
}

// checkBeforeFreeing is checkBeforePut without the refusals a write that
// frees the disk must pass (the disk watermark, a background write
// retrying): closed, slave, a sticky write error.
func (s *Store) checkBeforeFreeing() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if s.Role() == RoleSlave {
		return ErrSlave
	}
	return s.WriteErr()
}

// systemRecordBody is the body of a system record as the hook hands it
// (lengths checked by the dispatcher's parse).
func systemRecordBody(rec []byte) ([]byte, error) {
	h, err := record.Parse(rec)
	if err != nil {
		return nil, err
	}
	return h.Body, nil
}
