package storage

// Consumer-group offsets (issue 17, point 1): the committed queue offset of
// every (group, topic, queue), kept in the commitlog itself.
//
// A commit is a record of the system topic OffsetTopic (queue 0), written
// through the put path (putSystem): it is as durable as an acknowledged
// put (sync mode: fsynced before CommitOffset returns; in a replication
// group: committed on a majority), it is recovered, checked and indexed
// like any record, and whatever carries the commitlog (recovery,
// replication: the Raft log is the commitlog) carries the offsets with no
// state of their own. The table in memory (storage/offsets) changes only
// by applying those records as they are indexed (sysrecords.go: never an
// uncommitted entry of a group, which a new leader may truncate), and Open
// rebuilds it by replaying the topic's consume queue with the same rule,
// so every replica holds the same table at the same log position and a
// restart rebuilds the table it had.
//
// Retention deletes whole commitlog files, offset records included. So
// that the latest value of every key outlives its record's file, retention
// asks the store, before it deletes files below an offset (DeletableEnd),
// to write again every latest value whose record lies below it
// (rewriteOffsets: records of up to offsets.MaxEntries entries, each
// naming the record it copies) and to make them durable and applied; only
// then are the old files deleted. A commit that reaches the log between
// the rewrite's reading of the table and its record wins (offsets.Apply:
// a rewrite never overwrites a newer value). When the rewrite cannot be
// done (the store is read-only, a slave, a group member that is not the
// ready leader), the files holding a latest value are kept: retention
// stops below the oldest one, until the leader's rewrite is applied here.
// A compaction by copy, as Kafka's log cleaner does for
// __consumer_offsets, but only of the live values in the files about to
// go.
//
// A topic delete drops every group's offsets of the topic, and the
// replay skips the topic's records below its tombstone (topicclear.go):
// a re-created topic reads as no committed offset.
//
// The cost of Open is one record read per offset record in the retained
// log (a consumer committing once a second per queue writes 86,400 records
// a day per queue) after the last snapshot of the table (offsets_snapshot.go:
// written at Close and every max(65,536, keys) records while running).
//
// Validation (RocketMQ Validators.checkGroup and the broker's offset
// checks): a group is 1-255 bytes of [%|a-zA-Z0-9_-]; the topic must exist
// in the topic table (not a reserved topic) with the queue id below its
// queue count; the offset must lie within the queue's readable offsets
// [min, max] (max itself means "consumed everything"). storaged refuses an
// offset outside that range with a *RangeError instead of clamping it, so
// a client bug is visible; a committed offset may later fall below min when
// retention trims the queue, and GetOffset returns it as committed (the
// pull then answers OUT_OF_RANGE with the bounds to reset to). At most
// Options.MaxConsumerOffsets keys exist (ErrTooManyOffsets beyond).
//
// In a replication group (Options.Group) the checks run on the ready
// leader (a follower refuses a commit with a *NotLeaderError, nothing
// stored), and every replica applies the committed records. A replica
// whose topic table lacks the topic (created through another member by a
// version before topic replication, grouptopics.go) takes a queue it has
// indexed messages of as existing.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/record"
)

const (
	// OffsetTopic is the system topic of consumer offset records. Clients
	// can neither put to it nor read it (topicrules.go).
	OffsetTopic = "RMQ_SYS_CONSUMER_OFFSET"
	// MaxGroupLength bounds a consumer group name (RocketMQ
	// Validators.CHARACTER_MAX_LENGTH).
	MaxGroupLength = 255
	// DefaultMaxConsumerOffsets bounds the (group, topic, queue) keys.
	DefaultMaxConsumerOffsets = 100000
)

var (
	// ErrOffsetNotFound: no offset was ever committed for that group,
	// topic and queue (RocketMQ QUERY_NOT_FOUND).
	ErrOffsetNotFound = errors.New("storage: no offset committed for this consumer group and queue")
	// ErrConsumerGroupNotFound: the group never committed an offset nor
	// received by POP (RocketMQ CONSUMER_NOT_ONLINE /
	// SUBSCRIPTION_GROUP_NOT_EXIST: storaged knows a group only by its
	// progress).
	ErrConsumerGroupNotFound = errors.New("storage: no offset committed and no POP receive by this consumer group")
	// ErrTooManyOffsets: the commit would add a key beyond
	// Options.MaxConsumerOffsets. Nothing was stored.
	ErrTooManyOffsets = offsets.ErrTooMany
	// ErrOffsetNotDurable: the commit was appended but its durability was
	// not confirmed (sync mode: no sync covered it within SyncFlushTimeout,
	// or the wait ended; a group: not seen committed in time). It may or may not survive a crash; committing the
	// same offset again is harmless.
	ErrOffsetNotDurable = errors.New("storage: offset commit appended, durability not confirmed")
)

// GroupProblem returns why group is not a valid consumer group name, or "".
func GroupProblem(group string) string {
	switch {
	case group == "":
		return "consumer group is required"
	case len(group) > MaxGroupLength:
		return fmt.Sprintf("consumer group is %d bytes long, limit %d", len(group), MaxGroupLength)
	}
	for i := 0; i < len(group); i++ {
		if !record.TopicByte(group[i]) {
			return fmt.Sprintf("consumer group must contain only the characters [%%|a-zA-Z0-9_-]; byte %d is %q", i, group[i])
		}
	}
	return ""
}

// checkOffsetKey validates group, topic and queue id for the offset calls.
func (s *Store) checkOffsetKey(group, topic string, queueID int32) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if p := GroupProblem(group); p != "" {
		return illegal("consumer_group", p)
	}
	if p := TopicNameProblem(topic); p != "" {
		return illegal("topic", p)
	}
	if queueID < 0 {
		return illegal("queue_id", "queue id must not be negative")
	}
	n, ok := s.topics.get(topic)
	if !ok && s.group != nil && s.index.Queue(topic, queueID) != nil {
		return nil // a queue with committed messages (see the top of this file)
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
	}
	if queueID >= n {
		return illegal("queue_id", fmt.Sprintf("queue id %d is out of range: topic %s has %d queues (ids 0-%d)", queueID, topic, n, n-1))
	}
	return nil
}

// queueBounds is [min, max] of a queue, [0, 0] for one never written.
func (s *Store) queueBounds(topic string, queueID int32) (int64, int64) {
	if q := s.index.Queue(topic, queueID); q != nil {
		return q.Min(), q.Count()
	}
	return 0, 0
}

// CommitOffset records offset as group's committed offset of topic/queueID
// (RocketMQ ConsumerOffsetManager.commitOffset), durably as an
// acknowledged put: it returns nil only once the record is stored (in sync
// mode fsynced; in a group committed on a majority) and, unless indexing
// is stalled (a failing consume-queue write: the put path's
// AwaitDispatched gives up), applied to this store's table, so a GetOffset
// here after it sees the commit. Errors: *ValidationError (group, topic, queue id),
// ErrTopicNotFound, *RangeError (offset outside [min, max]: wraps
// ErrOutOfRange), ErrTooManyOffsets, the put path's refusals (ErrClosed,
// ErrSlave, ErrNotWritable, ErrWriteFailed, ErrBusy; in a group a
// *NotLeaderError, ErrInSyncReplicasNotEnough: nothing stored), and
// *NotDurableError wrapping ErrOffsetNotDurable (appended, outcome
// unknown; in a group it also wraps ErrReplicationTimeout when the commit
// was not seen committed in time).
func (s *Store) CommitOffset(ctx context.Context, group, topic string, queueID int32, offset int64) error {
	_, err := s.commitOffset(ctx, group, topic, queueID, offset)
	return err
}

// commitOffset is CommitOffset; it also returns where the record went
// (tests check it against the log).
func (s *Store) commitOffset(ctx context.Context, group, topic string, queueID int32, offset int64) (AppendResult, error) {
	if s.closed.Load() {
		return AppendResult{}, ErrClosed
	}
	if err := s.groupRefusal(); err != nil { // a follower answers with its leader before anything else
		return AppendResult{}, err
	}
	// Shared with the other commits, exclusive of a topic delete: a commit
	// checked against a topic is in the log before its delete
	// (topicclear.go).
	s.deleteFence.RLock()
	defer s.deleteFence.RUnlock()
	if err := s.checkOffsetKey(group, topic, queueID); err != nil {
		return AppendResult{}, err
	}
	if s.topics.deleting(topic) {
		return AppendResult{}, fmt.Errorf("%w: %s is being deleted", ErrTopicNotFound, topic)
	}
	if lo, hi := s.queueBounds(topic, queueID); offset < lo || offset > hi {
		return AppendResult{}, &RangeError{What: "committed offset", Offset: offset, Min: lo, Max: hi + 1}
	}
	k := offsets.Key{Group: group, Topic: topic, Queue: queueID}
	release, err := s.offsets.Reserve(k)
	if err != nil {
		return AppendResult{}, err
	}
	defer release()
	out, err := s.putSystem(ctx, OffsetTopic, offsets.Encode([]offsets.Entry{{Key: k, Offset: offset}}), false)
	switch {
	case !out.Appended():
		return AppendResult{}, err // refused: nothing stored
	case err != nil || out.Status != PutOK:
		return out.Append, &NotDurableError{Status: out.Status, Err: err}
	}
	return out.Append, nil
}

// NotDurableError is an offset commit appended whose durability was not
// confirmed: Status is FlushDiskTimeout (no sync covered it in time, Err
// nil), FlushSlaveTimeout (a group: not seen committed within the
// replication timeout, Err ErrReplicationTimeout) or UnknownError (the
// wait ended: Err says why). It wraps ErrOffsetNotDurable and Err.
type NotDurableError struct {
	Status PutStatus
	Err    error
}

func (e *NotDurableError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%v: %s", ErrOffsetNotDurable, e.Status)
	}
	return fmt.Sprintf("%v: %s: %v", ErrOffsetNotDurable, e.Status, e.Err)
}

// Unwrap implements errors.Unwrap.
func (e *NotDurableError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrOffsetNotDurable}
	}
	return []error{ErrOffsetNotDurable, e.Err}
}

// GetOffset returns group's committed offset of topic/queueID
// (RocketMQ queryOffset). Errors: *ValidationError, ErrTopicNotFound,
// ErrOffsetNotFound, ErrClosed.
//
// It answers what this store has applied: a commit that is stored (sync
// mode: durable; in a group: committed) and indexed here. On a follower
// that may lag the leader (ReadBarrier first for a linearizable answer).
// It covers every commit applied when it was called (catchUp).
func (s *Store) GetOffset(group, topic string, queueID int32) (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	s.catchUp(context.Background())
	kerr := s.checkOffsetKey(group, topic, queueID)
	if kerr != nil && (s.group == nil || !errors.Is(kerr, ErrTopicNotFound)) {
		return 0, kerr
	}
	// In a group the topic table is this replica's own (not replicated
	// yet): a replica may hold offsets of a topic it never saw created.
	off, ok := s.offsets.Get(offsets.Key{Group: group, Topic: topic, Queue: queueID})
	switch {
	case ok:
		return off, nil
	case kerr != nil:
		return 0, kerr
	}
	return 0, fmt.Errorf("%w: group %s, %s/%d", ErrOffsetNotFound, group, topic, queueID)
}

// GetOffsetByTime returns the first queue offset of topic/queueID whose
// message was stored at or after t (RocketMQ getOffsetInQueueByTime with
// BoundaryType.LOWER), by binary search over the consume queue and the
// records' store times, which never decrease in log order: O(log n)
// record reads. A time before the first readable message gives the
// queue's min offset; a time after the last gives its max (the offset the
// next message will get), so a consumer reset there reads only what comes
// next. It covers every record visible when it was called (catchUp).
// Errors: *ValidationError, ErrTopicNotFound, ErrQueueNotFound (no
// message ever stored in the queue), ErrCorrupt, ErrClosed.
func (s *Store) GetOffsetByTime(topic string, queueID int32, t time.Time) (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	s.catchUp(context.Background())
	if p := TopicNameProblem(topic); p != "" {
		return 0, illegal("topic", p)
	}
	if queueID < 0 {
		return 0, illegal("queue_id", "queue id must not be negative")
	}
	q := s.index.Queue(topic, queueID)
	if _, ok := s.topics.get(topic); !ok && (s.group == nil || q == nil) {
		return 0, fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
	}
	if q == nil {
		return 0, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, topic, queueID)
	}
	ms := t.UnixMilli()
	lo, hi := q.Min(), q.Count() // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		ts, err := s.storeTimeAt(topic, queueID, mid)
		if errors.Is(err, ErrOutOfRange) && mid < q.Min() { // retention trimmed it meanwhile
			lo = q.Min()
			continue
		}
		if err != nil {
			return 0, err
		}
		if ts >= ms {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// storeTimeAt is the store time of the message at queue offset off.
func (s *Store) storeTimeAt(topic string, queueID int32, off int64) (int64, error) {
	q := s.index.Queue(topic, queueID)
	if q == nil {
		return 0, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, topic, queueID)
	}
	phys, _, _, ok, err := q.Lookup(off)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, &RangeError{What: "queue offset", Offset: off, Min: q.Min(), Max: q.Count()}
	}
	rec, err := s.readRecord(phys)
	if errors.Is(err, ErrNoRecord) {
		err = fmt.Errorf("%w: consume queue %s/%d entry %d: %w", ErrCorrupt, topic, queueID, off, err)
	}
	if err != nil {
		return 0, err
	}
	if rec.Topic != topic || rec.QueueID != queueID || rec.QueueOffset != off {
		return 0, fmt.Errorf("%w: consume queue %s/%d entry %d points at a record of %s/%d offset %d",
			ErrCorrupt, topic, queueID, off, rec.Topic, rec.QueueID, rec.QueueOffset)
	}
	return rec.StoreTimestamp, nil
}

// openOffsets rebuilds the offset table at Open from the offset topic's
// consume queue, in log order, with the rule the live table follows
// (offsets.Table.Apply). A record that fails its checks is ErrCorrupt:
// Open refuses rather than serve an older offset.
func (s *Store) openOffsets() error {
	s.offsets = offsets.New(s.opts.MaxConsumerOffsets)
	from := s.loadOffsetsSnapshot()
	err := s.replaySystem(OffsetTopic, 0, from, func(phys int64, rec *Record) error {
		es, err := offsets.Decode(rec.Body)
		if err != nil {
			return fmt.Errorf("%w: consumer offsets: record at commitlog offset %d: %w", ErrCorrupt, phys, err)
		}
		s.offsets.Apply(s.liveOffsets(es, phys), phys)
		s.offSnap.replayed++
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: consumer offsets: %w", err)
	}
	if n := s.offsets.Len(); n > s.opts.MaxConsumerOffsets {
		s.opts.Logger.Warn().Int("offsets", n).Int("max", s.opts.MaxConsumerOffsets).
			Msg("storage: more consumer offsets than the limit; new keys are refused until the limit is raised")
	}
	return nil
}

// applyOffsetRecord is the offset topic's applier (sysrecords.go): the
// record at phys, indexed just now, changes the table. One that does not
// decode is logged and skipped; Open would refuse it (openOffsets), so a
// restart shows the damage rather than serving around it.
func (s *Store) applyOffsetRecord(phys int64, rec []byte) {
	body, err := systemRecordBody(rec)
	var es []offsets.Entry
	if err == nil {
		es, err = offsets.Decode(body)
	}
	if err != nil {
		s.logLimit.Event("bad offset record", s.opts.Logger.Error()).Err(err).Int64("commitlog_offset", phys).
			Msg("storage: a consumer offset record does not decode; skipped (the next Open refuses it)")
		return
	}
	s.offsets.Apply(s.liveOffsets(es, phys), phys)
}

// rewriteOffsets writes again every latest offset whose record lies below
// end and waits until the copies are stored and applied, so that
// retention may delete the files below end (see the top of this file).
// Standalone, keys of topics deleted since are dropped instead. It returns
// the lowest commitlog offset that must stay: end when everything below it
// was rewritten. In a group only the ready leader writes (through raft);
// every other replica keeps what its table still needs, which moves once
// the leader's rewrite is applied here.
func (s *Store) rewriteOffsets(end int64) int64 {
	t := s.offsets
	if t == nil {
		return end
	}
	keep := func() int64 {
		if at, ok := t.OldestAt(); ok && at < end {
			return at
		}
		return end
	}
	if s.closed.Load() || s.Role() != RoleMaster || s.WriteErr() != nil || s.groupRefusal() != nil {
		return keep()
	}
	// Exclusive of a topic delete: the copies of a topic's values are in
	// the log before its delete, or not written (topicclear.go).
	s.deleteFence.RLock()
	defer s.deleteFence.RUnlock()
	es := t.Below(end)
	live := es[:0]
	for _, e := range es {
		if s.topics.deleting(e.Key.Topic) {
			continue // the delete being applied drops it; its file stays until then (keep)
		}
		// Standalone, the keys of a topic that does not exist are dropped
		// here (a delete dropped its own already). In a group the table
		// is the same on every replica only if it changes through the
		// log: every key stays.
		if _, ok := s.topics.get(e.Key.Topic); ok || s.group != nil {
			e.Rewrite, e.From = true, e.At
			live = append(live, e)
		} else {
			t.Delete(e.Key)
		}
	}
	var last int64
	for len(live) > 0 {
		n := 0
		for n < len(live) && n < offsets.MaxEntries && offsets.EncodedLen(live[:n+1]) <= 256<<10 {
			n++
		}
		out, err := s.putSystem(context.Background(), OffsetTopic, offsets.Encode(live[:n]), true)
		if err != nil || out.Status != PutOK {
			s.opts.Logger.Warn().Err(err).Stringer("status", out.Status).
				Msg("storage: consumer offsets not rewritten; retention keeps the files holding them")
			return keep()
		}
		last = out.Append.NextOffset()
		live = live[n:]
	}
	if last > 0 && s.group == nil {
		// Async mode answered once the copies were written: make them
		// durable before a file they replace goes.
		if err := s.durableTo(last); err != nil {
			s.opts.Logger.Warn().Err(err).Msg("storage: rewritten consumer offsets not durable; retention keeps the files holding them")
			// The table now points at the copies: nothing below end is
			// known to be safe to delete.
			return min(end, s.log.MinOffset())
		}
	}
	return keep()
}
