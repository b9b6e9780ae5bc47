package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
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
	if !s.provenRecord(rec, off) {
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
	lo, hi := s.queue.minOffset(), s.visibleEnd()
	if off < lo || off >= hi {
		return nil, &RangeError{What: "commitlog offset", Offset: off, Min: lo, Max: hi}
	}
	s.ret.readers.RLock() // retention unmaps the files it deletes only under the write lock
	defer s.ret.readers.RUnlock()
	f := s.queue.findByOffset(off)
	if f == nil {
		return nil, &RangeError{What: "commitlog offset", Offset: off, Min: s.queue.minOffset(), Max: hi}
	}
	b := f.data[off-f.from:]
	if len(b) < 8 || (binary.BigEndian.Uint32(b[posMagic:]) != MagicV1 && binary.BigEndian.Uint32(b[posMagic:]) != MagicV2) {
		return nil, fmt.Errorf("commitlog offset %d: %w", off, ErrNoRecord)
	}
	rec, _, err := decodeRecord(b, !s.opts.DisablePropCRC)
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
	if d := s.dispatch.dispatched.Load(); off >= d {
		return s.chainReaches(d, off)
	}
	q := s.dispatch.queue(rec.Topic, rec.QueueID)
	if q == nil {
		return false
	}
	phys, _, _, ok := q.get(rec.QueueOffset)
	return ok && phys == off
}

// chainReaches reports whether walking the commitlog's records from from,
// a record boundary, lands on off.
func (s *Store) chainReaches(from, off int64) bool {
	s.ret.readers.RLock()
	defer s.ret.readers.RUnlock()
	pos := from
	for pos < off {
		f := s.queue.findByOffset(pos)
		if f == nil {
			return false
		}
		b := f.data[pos-f.from:]
		if len(b) < BlankLen || IsBlank(b) {
			pos = f.from + f.size
			continue
		}
		total := int64(int32(binary.BigEndian.Uint32(b[posTotalSize:])))
		if total < minRecordLen || total > int64(len(b)) {
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
	// NextOffset is the queue offset to ask for next.
	NextOffset int64
	// MinOffset and MaxOffset bound the queue: offsets [Min, Max) exist.
	MinOffset, MaxOffset int64
}

// QueueInfo returns the readable queue offsets of a queue: [min, max).
func (s *Store) QueueInfo(topic string, queueID int32) (minOff, maxOff int64, err error) {
	if s.closed.Load() {
		return 0, 0, ErrClosed
	}
	q := s.dispatch.queue(topic, queueID)
	if q == nil {
		return 0, 0, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, topic, queueID)
	}
	return q.min.Load(), q.count.Load(), nil
}

// Queues lists the topic-queues that have messages.
func (s *Store) Queues() []QueueID {
	s.dispatch.mu.RLock()
	defer s.dispatch.mu.RUnlock()
	out := make([]QueueID, 0, len(s.dispatch.queues))
	for k := range s.dispatch.queues {
		out = append(out, QueueID{Topic: k.topic, QueueID: k.queue})
	}
	return out
}

// QueueID names a topic-queue.
type QueueID struct {
	Topic   string
	QueueID int32
}

// PullMessages reads messages of a queue from req.Offset on. An offset
// equal to the queue's max returns no messages (after waiting up to
// req.Wait for one to arrive); one outside [min, max] is ErrOutOfRange; an
// unknown queue is ErrQueueNotFound (after waiting, too: a queue appears
// with its first message). Each record is fully checked; a damaged one is
// an error wrapping ErrCorrupt.
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
	for {
		if s.closed.Load() {
			return PullResult{}, ErrClosed
		}
		arrived := s.dispatch.arrival() // take it before looking: no lost wake-up
		res, err := s.pullOnce(req)
		if err != nil && !errors.Is(err, ErrQueueNotFound) {
			return res, err
		}
		if len(res.Messages) > 0 || deadline == nil || (err == nil && res.NextOffset < res.MaxOffset) {
			return res, err
		}
		select {
		case <-arrived:
		case <-deadline:
			return res, err
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
}

func (s *Store) pullOnce(req PullRequest) (PullResult, error) {
	q := s.dispatch.queue(req.Topic, req.QueueID)
	if q == nil {
		return PullResult{}, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, req.Topic, req.QueueID)
	}
	res := PullResult{MinOffset: q.min.Load(), MaxOffset: q.count.Load(), NextOffset: req.Offset}
	if req.Offset < res.MinOffset || req.Offset > res.MaxOffset {
		return res, &RangeError{What: "queue offset", Offset: req.Offset, Min: res.MinOffset, Max: res.MaxOffset}
	}
	var codes []int64
	for _, t := range req.Tags {
		codes = append(codes, TagsCode(t))
	}
	bytes := 0
	for off := req.Offset; off < res.MaxOffset && len(res.Messages) < req.MaxMessages; off++ {
		phys, size, tags, ok, err := q.lookup(off)
		if err != nil {
			return res, err
		}
		if !ok {
			break
		}
		if len(res.Messages) > 0 && bytes+int(size) > req.MaxBytes {
			break
		}
		res.NextOffset = off + 1
		if len(codes) > 0 && !containsCode(codes, tags) {
			continue
		}
		rec, err := s.readRecord(phys)
		if errors.Is(err, ErrNoRecord) { // the index says a record is there
			err = fmt.Errorf("%w: consume queue %s/%d entry %d: %w", ErrCorrupt, req.Topic, req.QueueID, off, err)
		}
		if err != nil {
			return res, err
		}
		if rec.Topic != req.Topic || rec.QueueID != req.QueueID || rec.QueueOffset != off {
			return res, fmt.Errorf("%w: consume queue %s/%d entry %d points at a record of %s/%d offset %d",
				ErrCorrupt, req.Topic, req.QueueID, off, rec.Topic, rec.QueueID, rec.QueueOffset)
		}
		if len(req.Tags) > 0 { // hash codes collide: compare the real tag
			t, _ := rec.Property(PropertyTags)
			if !containsString(req.Tags, t) {
				continue
			}
		}
		res.Messages = append(res.Messages, rec)
		bytes += int(size)
	}
	return res, nil
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
