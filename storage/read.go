package storage

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/record"
)

// Read errors.
var (
	// ErrQueueNotFound: no message was ever dispatched to that topic-queue.
	ErrQueueNotFound = errors.New("storage: queue not found")
	// ErrOutOfRange wraps a *RangeError.
	ErrOutOfRange = errors.New("storage: offset out of range")
	// ErrNoRecord: the commitlog offset asked for is inside the log but no
	// record starts there (a wrong offset, not damage: the bytes there do
	// not even carry a record magic).
	ErrNoRecord = errors.New("storage: no record starts at this offset")
)

// RangeError says an offset is outside what can be read, and what can.
type RangeError struct {
	What     string // "queue offset" or "commitlog offset"
	Offset   int64
	Min, Max int64 // readable: [Min, Max)
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("storage: %s %d out of range [%d, %d)", e.What, e.Offset, e.Min, e.Max)
}

// Unwrap implements errors.Unwrap.
func (e *RangeError) Unwrap() error { return ErrOutOfRange }

// GetMessage reads the record that starts at commitlog offset off. It must
// be visible (durable in sync mode), pass every check, and start at a
// record boundary the store knows of; damaged bytes give an error wrapping
// ErrCorrupt, never a wrong record.
//
// Passing the CRCs does not prove a record starts at off: a body may hold
// bytes laid out as a record, with CRCs its producer computed. So the
// record is served only when the store can show it wrote a record there
// (provenRecord): its consume-queue entry points back at off, or, for a
// record the dispatcher has not indexed yet, the record chain from the
// dispatch position reaches off. Anything else is ErrNoRecord (NOT_FOUND),
// including records no consume queue holds: prepared and rolled-back
// transaction records, and records whose queue entries retention trimmed.
func (s *Store) GetMessage(off int64) (*Record, error) {
	rec, err := s.readRecord(off)
	if err != nil {
		return nil, err
	}
	if !s.provenRecord(rec, off) || HiddenTopic(rec.Topic) { // the store's own records are not served
		return nil, fmt.Errorf("commitlog offset %d: %w", off, ErrNoRecord)
	}
	return rec, nil
}

// readRecord reads and checks the record at commitlog offset off without
// proving that a record starts there: for callers that found off in a
// consume queue and check the record against the entry themselves (pulls,
// the scheduler).
func (s *Store) readRecord(off int64) (*Record, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return s.readRecordOpen(off)
}

// readRecordOpen is readRecord for the store's own reads while the log is
// still mapped, Close's included.
func (s *Store) readRecordOpen(off int64) (*Record, error) {
	lo, hi := s.log.MinOffset(), s.visibleEnd()
	if off < lo || off >= hi {
		return nil, &RangeError{What: "commitlog offset", Offset: off, Min: lo, Max: hi}
	}
	s.log.ReadLock() // retention unmaps the files it deletes only under the guard's write side
	defer s.log.ReadUnlock()
	b := s.log.At(off)
	if b == nil {
		return nil, &RangeError{What: "commitlog offset", Offset: off, Min: s.log.MinOffset(), Max: hi}
	}
	if !record.HasMagic(b) {
		return nil, fmt.Errorf("commitlog offset %d: %w", off, ErrNoRecord)
	}
	rec, _, err := record.DecodeChecked(b, !s.opts.DisablePropCRC)
	if err != nil {
		return nil, fmt.Errorf("commitlog offset %d: %w", off, err)
	}
	if rec.PhysicalOffset != off {
		return nil, fmt.Errorf("commitlog offset %d: %w", off, &DecodeError{Offset: off,
			Reason: fmt.Sprintf("the record here says it lies at %d", rec.PhysicalOffset)})
	}
	return rec, nil
}

// provenRecord reports whether the store knows that rec, read at off,
// starts a record it wrote. Below the dispatched offset the proof is the
// consume-queue entry named by the record (topic, queue id, queue offset):
// it must exist and point at off. Forged bytes name some entry, but that
// entry points at the real record, so it cannot point inside a body. One
// map lookup and one entry read, O(1).
//
// At or past the dispatched offset (a record visible but not yet indexed,
// for the dispatcher's pause), the proof is the record chain: from the
// dispatch position, a record boundary, each record's total size leads to
// the next one, and off must be one of them. That walk covers only the
// records not yet indexed, normally those of the last millisecond. Walking
// from a file's start would prove any offset but costs a whole file.
func (s *Store) provenRecord(rec *Record, off int64) bool {
	if d := s.index.Dispatched(); off >= d {
		return s.chainReaches(d, off)
	}
	q := s.index.Queue(rec.Topic, rec.QueueID)
	if q == nil {
		return false
	}
	phys, _, _, ok := q.Get(rec.QueueOffset)
	return ok && phys == off
}

// chainReaches reports whether walking the commitlog's records from from,
// a record boundary, lands on off.
func (s *Store) chainReaches(from, off int64) bool {
	s.log.ReadLock()
	defer s.log.ReadUnlock()
	pos := from
	for pos < off {
		b := s.log.At(pos)
		if b == nil {
			return false
		}
		if len(b) < BlankLen || IsBlank(b) {
			pos = s.log.FileStart(pos) + s.log.FileSize()
			continue
		}
		total := int64(record.TotalSize(b))
		if total < record.MinLen || total > int64(len(b)) {
			return false
		}
		pos += total
	}
	return pos == off
}

// GetMessageByID reads the record named by an offset msgId.
func (s *Store) GetMessageByID(msgID string) (*Record, error) {
	_, off, err := ParseMsgID(msgID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrIllegal, err)
	}
	return s.GetMessage(off)
}

// PullRequest selects messages of one queue.
type PullRequest struct {
	Topic   string
	QueueID int32
	// Offset is the first queue offset wanted.
	Offset int64
	// MaxMessages and MaxBytes bound the answer (at least one message is
	// returned when one is available). Zero means 32 messages, 4 MiB.
	// MaxPullScan bounds both.
	MaxMessages int
	MaxBytes    int
	// Tags, if not empty, keeps only messages whose TAGS is one of them.
	Tags []string
	// Wait is how long to wait for a message when none is available at
	// Offset (long polling). Zero answers at once.
	Wait time.Duration
}

// PullResult is the answer to a pull.
type PullResult struct {
	Messages []*Record
	// NextOffset is the queue offset to ask for next: past every entry the
	// pull read, including those its tag filter skipped.
	NextOffset int64
	// MinOffset and MaxOffset bound the queue: offsets [Min, Max) exist.
	MinOffset, MaxOffset int64
}

// QueueInfo returns the readable queue offsets of a queue: [min, max).
// It covers every record visible when it was called (catchUp).
func (s *Store) QueueInfo(topic string, queueID int32) (minOff, maxOff int64, err error) {
	if s.closed.Load() {
		return 0, 0, ErrClosed
	}
	s.catchUp(context.Background())
	q := s.index.Queue(topic, queueID)
	if q == nil || HiddenTopic(topic) {
		return 0, 0, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, topic, queueID)
	}
	return q.Min(), q.Count(), nil
}

// Queues lists the topic-queues that have messages.
func (s *Store) Queues() []QueueID {
	keys := s.index.Keys()
	out := make([]QueueID, 0, len(keys))
	for _, k := range keys {
		if HiddenTopic(k.Topic) {
			continue
		}
		out = append(out, QueueID{Topic: k.Topic, QueueID: k.Queue})
	}
	return out
}

// catchUp indexes the commitlog up to the visible end before a read, so
// the read reflects every record visible when it began: in a group, the
// member's commit point, which GetReplicaInfo reports as applied. Without
// it a read would lag that point by up to the dispatcher's pause, and
// more on a loaded machine: the records whose putters stopped waiting
// (the call was cancelled) are indexed by the dispatcher's round alone.
// It usually costs one atomic load, or a round run by the reader itself
// (AwaitDispatched). A stalled or slow index is not the read's failure:
// the read answers from what is indexed, as it would have. It returns
// only ctx's error.
func (s *Store) catchUp(ctx context.Context) error {
	err := s.index.AwaitDispatched(ctx, s.visibleEnd())
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// QueueID names a topic-queue.
type QueueID struct {
	Topic   string
	QueueID int32
}

// pullStats counts pull work (tests read it).
type pullStats struct {
	scanned atomic.Uint64 // consume-queue entries read
}

// MaxPullScan is how many consume-queue entries one PullMessages call
// reads at most, waiting included: a pull whose tag filter matches nothing
// costs a bounded amount of work, and answers with NextOffset past what it
// read, so the client goes on from there. It is also the most messages a
// pull returns.
const MaxPullScan = 4096

// PullMessages reads messages of a queue from req.Offset on. An offset
// equal to the queue's max returns no messages (after waiting up to
// req.Wait for one to arrive); one outside [min, max] is ErrOutOfRange; an
// unknown queue is ErrQueueNotFound (after waiting, too: a queue appears
// with its first message). Each record is fully checked; a damaged one, or
// a consume-queue entry that disagrees with its record, is an error
// wrapping ErrCorrupt.
//
// It covers every record visible when it was called (catchUp), and, while
// it waits, the records indexed since.
//
// It reads at most MaxPullScan entries. The answer's NextOffset is past
// every entry read, matched or not: with a tag filter it may be far past
// the last message returned, or past req.Offset with none returned.
//
// A long poll waits for its own queue only (queueNotifier): a put to
// another queue does not wake it. A filtered poll that found nothing goes
// on, when woken, from where its scan stopped, so each entry is read once
// per call.
func (s *Store) PullMessages(ctx context.Context, req PullRequest) (PullResult, error) {
	if req.MaxMessages <= 0 {
		req.MaxMessages = 32
	}
	if req.MaxBytes <= 0 {
		req.MaxBytes = 4 << 20
	}
	var deadline <-chan time.Time
	if req.Wait > 0 {
		t := time.NewTimer(req.Wait)
		defer t.Stop()
		deadline = t.C
	}
	var (
		advanced <-chan struct{} // registered with the notifier when not nil
		release  func()
	)
	defer func() {
		if advanced != nil {
			release()
		}
	}()
	if err := s.catchUp(ctx); err != nil {
		return PullResult{}, err
	}
	budget := MaxPullScan
	for {
		if s.closed.Load() {
			return PullResult{}, ErrClosed
		}
		res, scanned, err := s.pullOnce(req, budget)
		budget -= scanned
		if err != nil && !errors.Is(err, ErrQueueNotFound) {
			return res, err
		}
		if len(res.Messages) > 0 || deadline == nil || budget <= 0 || (err == nil && res.NextOffset < res.MaxOffset) {
			return res, err
		}
		if err == nil {
			req.Offset = res.NextOffset // what was read is not read again
		}
		if advanced == nil {
			// Register, then look again: an entry dispatched before the
			// registration is seen by that look, one after it wakes us.
			advanced, release = s.index.WaitAdvance(consumequeue.Key{Topic: req.Topic, Queue: req.QueueID})
			continue
		}
		select {
		case <-advanced:
			release()
			advanced = nil
		case <-deadline:
			return res, err
		case <-ctx.Done():
			return res, ctx.Err()
		case <-s.index.Done():
			return PullResult{}, ErrClosed
		}
	}
}

// pullOnce reads the queue from req.Offset without waiting, at most budget
// entries, and returns how many it read.
func (s *Store) pullOnce(req PullRequest, budget int) (PullResult, int, error) {
	q := s.index.Queue(req.Topic, req.QueueID)
	if q == nil || HiddenTopic(req.Topic) { // the store's own state is read through its calls
		return PullResult{}, 0, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, req.Topic, req.QueueID)
	}
	res := PullResult{MinOffset: q.Min(), MaxOffset: q.Count(), NextOffset: req.Offset}
	if req.Offset < res.MinOffset || req.Offset > res.MaxOffset {
		return res, 0, &RangeError{What: "queue offset", Offset: req.Offset, Min: res.MinOffset, Max: res.MaxOffset}
	}
	var codes []int64
	for _, t := range req.Tags {
		codes = append(codes, TagsCode(t))
	}
	// The schedule and timer topics' tags codes are delivery times, not
	// tag hashes.
	checkTags := req.Topic != ScheduleTopic && req.Topic != TimerTopic
	bytes, scanned := 0, 0
	defer func() { s.pulls.scanned.Add(uint64(scanned)) }()
	for off := req.Offset; off < res.MaxOffset && len(res.Messages) < req.MaxMessages && scanned < budget; off++ {
		phys, size, tags, ok, err := q.Lookup(off)
		if err != nil {
			return res, scanned, err
		}
		if !ok {
			break
		}
		if len(res.Messages) > 0 && bytes+int(size) > req.MaxBytes {
			break
		}
		scanned++
		res.NextOffset = off + 1
		if len(codes) > 0 && !containsCode(codes, tags) {
			// Skipped on its tags code alone: check that the code is
			// the record's (a flipped code would hide the message).
			if err := s.checkSkipped(req, off, phys, size, tags, checkTags); err != nil {
				return res, scanned, err
			}
			continue
		}
		rec, err := s.readRecord(phys)
		if errors.Is(err, ErrNoRecord) { // the index says a record is there
			err = fmt.Errorf("%w: consume queue %s/%d entry %d: %w", ErrCorrupt, req.Topic, req.QueueID, off, err)
		}
		if err != nil {
			return res, scanned, err
		}
		if rec.Topic != req.Topic || rec.QueueID != req.QueueID || rec.QueueOffset != off {
			return res, scanned, fmt.Errorf("%w: consume queue %s/%d entry %d points at a record of %s/%d offset %d",
				ErrCorrupt, req.Topic, req.QueueID, off, rec.Topic, rec.QueueID, rec.QueueOffset)
		}
		t, _ := rec.Property(PropertyTags)
		if rec.TotalSize != size || (checkTags && TagsCode(t) != tags) {
			return res, scanned, entryMismatch(req, off, size, tags, rec.TotalSize, TagsCode(t))
		}
		if len(req.Tags) > 0 && !containsString(req.Tags, t) { // hash codes collide: compare the real tag
			continue
		}
		res.Messages = append(res.Messages, rec)
		bytes += int(size)
	}
	return res, scanned, nil
}

func entryMismatch(req PullRequest, off int64, size int32, code int64, recSize int32, recCode int64) error {
	return fmt.Errorf("%w: consume queue %s/%d entry %d says size %d, tags code %d; its record has size %d, tags code %d",
		ErrCorrupt, req.Topic, req.QueueID, off, size, code, recSize, recCode)
}

// checkSkipped checks a consume-queue entry that a tag filter skips
// against its record: the record must start at phys, belong to the entry,
// and have the entry's size and tags code. It reads only the record's
// header and properties in place, with bounds checks but no CRC (the
// record is not returned, so its body is not read): a few cache lines per
// entry instead of the entry's 20 bytes, and a page fault for a cold
// record. That is the price of never skipping a message on a damaged
// code; MaxPullScan bounds it per call.
func (s *Store) checkSkipped(req PullRequest, off, phys int64, size int32, code int64, checkTags bool) error {
	s.log.ReadLock() // retention unmaps the files it deletes only under the guard's write side
	defer s.log.ReadUnlock()
	lo, hi := s.log.MinOffset(), s.visibleEnd()
	if phys < lo || phys >= hi {
		return &RangeError{What: "commitlog offset", Offset: phys, Min: lo, Max: hi}
	}
	b := s.log.At(phys)
	if b == nil {
		return &RangeError{What: "commitlog offset", Offset: phys, Min: s.log.MinOffset(), Max: hi}
	}
	b = b[:min(int64(len(b)), hi-phys)]
	h, err := record.Parse(b)
	switch {
	case err != nil:
		return fmt.Errorf("%w: consume queue %s/%d entry %d: no well-formed record at commitlog offset %d",
			ErrCorrupt, req.Topic, req.QueueID, off, phys)
	case h.PhysOffset != phys || string(h.Topic) != req.Topic || h.QueueID != req.QueueID || h.QueueOffset != off:
		return fmt.Errorf("%w: consume queue %s/%d entry %d points at a record of %s/%d offset %d",
			ErrCorrupt, req.Topic, req.QueueID, off, h.Topic, h.QueueID, h.QueueOffset)
	}
	recCode := record.TagsCodeBytes(h.Property(PropertyTags))
	if h.Total != size || (checkTags && recCode != code) {
		return entryMismatch(req, off, size, code, h.Total, recCode)
	}
	return nil
}

func containsCode(codes []int64, c int64) bool {
	for _, x := range codes {
		if x == c {
			return true
		}
	}
	return false
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
