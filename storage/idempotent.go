package storage

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/storaged/storaged/storage/dedup"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
)

// Idempotent puts: a put whose message carries the UNIQ_KEY property
// (RocketMQ's client message id; a storaged.v1 client sets it in
// properties) is stored once per topic within Options.DedupWindow. A
// retried put of the same key, re-sent by a client or by a proxy that
// retries on its own after a connection failure, gets the first put's
// answer (same msgId, offsets, queue offset) and stores nothing; a
// duplicate arriving while the first is under way waits for its outcome;
// a first put that stored nothing leaves the key free. The window
// (storage/dedup) owns its state and lock; this file is the put path's
// only door to it, and rebuilds it from the log at Open.
//
// What is keyed:
//
//   - a single message (PutMessage, each PutMessageStream message, a
//     one-message batch): its UNIQ_KEY on its topic; a delayed message
//     apart from undelayed ones (its answer names the schedule queue);
//   - a batch of two or more: as a whole, by its first message's UNIQ_KEY
//     (RocketMQ clients give every message its own key; a retried batch
//     repeats them all). The other messages' keys are not looked at, and
//     a retried batch gets the first batch's whole answer;
//   - not transactional messages (prepared, commit and rollback records
//     of one transaction share its key), nor puts without the property.
//
// A key is remembered until its store time is DedupWindow old or, when
// puts with keys outpace the bound, until DedupMaxMessages newer
// messages pushed it out (Stats.Dedup.Evicted; Stats.Dedup.Oldest is the
// effective window).

// MaxUniqKeyLength is the longest UNIQ_KEY the store takes (a longer one
// is MESSAGE_ILLEGAL): the window holds every key it remembers, and
// RocketMQ's clients write 32 hexadecimal characters.
const MaxUniqKeyLength = 128

// DedupStats describes the idempotent-put window (storage/dedup.Stats).
type DedupStats = dedup.Stats

// dedupValue is what the window keeps per put: the append result a
// duplicate is answered with, without its topic (derived from the key
// when answering) and packed: 80 bytes where an AppendResult takes 160,
// and the window holds up to DedupMaxMessages of them, one per keyed put
// by default (TestDedupBytesPerKey). What few puts have (a batch's
// offsets, the timer topic of a timer message due when it was put) sits
// behind rare; the append's lock timing is not kept (a duplicate appends
// nothing: no append span).
type dedupValue struct {
	wroteOffset, storeTimestamp, queueOffset int64
	storeHost                                netip.AddrPort
	wroteBytes, queueID, msgNum              int32
	status                                   AppendStatus
	rare                                     *dedupRare
}

type dedupRare struct {
	topic   string
	offsets []int64
}

// packDedup is a's dedupValue (its LockedAt and LockHeld dropped).
func packDedup(a AppendResult) dedupValue {
	v := dedupValue{wroteOffset: a.WroteOffset, storeTimestamp: a.StoreTimestamp, queueOffset: a.QueueOffset,
		storeHost: a.StoreHost, wroteBytes: a.WroteBytes, queueID: a.QueueID, msgNum: a.MsgNum, status: a.Status}
	if a.Topic != "" || a.Offsets != nil {
		v.rare = &dedupRare{topic: a.Topic, offsets: a.Offsets}
	}
	return v
}

// result is the AppendResult v keeps.
func (v dedupValue) result() AppendResult {
	a := AppendResult{Status: v.status, WroteOffset: v.wroteOffset, WroteBytes: v.wroteBytes, StoreTimestamp: v.storeTimestamp,
		QueueID: v.queueID, QueueOffset: v.queueOffset, MsgNum: v.msgNum, StoreHost: v.storeHost}
	if v.rare != nil {
		a.Topic, a.Offsets = v.rare.topic, v.rare.offsets
	}
	return a
}

// PutMessage stores one message; see putMessage for the results. A
// message with a UNIQ_KEY property is stored once within the dedup window
// (above): a duplicate is answered with the first put's result, waiting
// for the durability and visibility its own WAIT asks for, and stores
// nothing.
func (s *Store) PutMessage(ctx context.Context, m *Message) (PutResult, error) {
	w := s.dedup.Load()
	if w == nil || m.SysFlag&record.TransactionMask != TransactionNotType {
		return s.putMessage(ctx, m, nil)
	}
	id, ok := record.Lookup(m.Properties, PropertyUniqKey)
	if !ok {
		return s.putMessage(ctx, m, nil)
	}
	kind := dedup.Single
	if record.DelayLevel(m.Properties) > 0 {
		kind = dedup.Delayed
	} else if hasTimerProperty(m.Properties) {
		kind = dedup.Timer // stored on the timer topic, or on its own when due already
	}
	return s.putOnce(ctx, w, dedup.Key{Topic: m.Topic, Kind: kind, ID: id}, m.WaitStoreOK(),
		func(fate *entryFate) (PutResult, error) { return s.putMessage(ctx, m, fate) })
}

// PutMessages stores a batch; see putMessages for the results. A batch
// whose first message carries a UNIQ_KEY is stored once within the dedup
// window, as a whole (above).
func (s *Store) PutMessages(ctx context.Context, b *Batch) (PutResult, error) {
	w := s.dedup.Load()
	if w == nil || len(b.Messages) == 0 || b.SysFlag&record.TransactionMask != TransactionNotType {
		return s.putMessages(ctx, b, nil)
	}
	id, ok := record.Lookup(b.Messages[0].Properties, PropertyUniqKey)
	if !ok {
		return s.putMessages(ctx, b, nil)
	}
	kind := dedup.Batch
	if len(b.Messages) == 1 {
		kind = dedup.Single // stored as a single message would be: the log cannot tell them apart
	}
	res, err := s.putOnce(ctx, w, dedup.Key{Topic: b.Topic, Kind: kind, ID: id}, b.WaitStoreOK(),
		func(fate *entryFate) (PutResult, error) { return s.putMessages(ctx, b, fate) })
	if res.Appended() && res.Append.Offsets == nil {
		res.Append.Offsets = []int64{res.Append.WroteOffset} // a batch answer has one offset per message
	}
	return res, err
}

// putOnce runs put as the first put of k, or answers k's first put, in
// window w.
//
// In a group a key is remembered once its entry commits, whatever the put
// answered (entryFate): a put that timed out waiting for the commit
// (FLUSH_SLAVE_TIMEOUT, outcome unknown) or whose client went away keeps
// its key pending until raft decides, and a retry meanwhile waits for that
// (at most ReplicationTimeout, then it is answered FLUSH_SLAVE_TIMEOUT
// itself, outcome unknown, storing nothing). So a retry is never stored
// beside a first put that commits late. An entry that never commits
// (superseded by another leader's, which then holds the key if it
// committed the first put) frees the key. A member that stops leading
// reads its window again from the committed log, as does a new leader
// (readyDedup), so a retry that goes to another member after a failover
// is answered from the log too.
func (s *Store) putOnce(ctx context.Context, w *dedup.Window[dedupValue], k dedup.Key, wait bool, put func(*entryFate) (PutResult, error)) (PutResult, error) {
	if len(k.ID) > MaxUniqKeyLength {
		return s.rejectErr(illegal("properties", fmt.Sprintf("%s of %d bytes exceeds the limit of %d", PropertyUniqKey, len(k.ID), MaxUniqKeyLength)))
	}
	if err := s.checkBeforePut(); err != nil {
		return s.rejectErr(err)
	}
	if err := s.groupRefusal(); err != nil { // a follower answers with its leader, not from its window
		return s.rejectErr(err)
	}
	var maxWait time.Duration
	if s.group != nil { // a first put may stay undecided as long as its leader lacks a quorum
		maxWait = s.group.opts.ReplicationTimeout
	}
	kept, t, err := w.BeginWithin(ctx, k, s.opts.Clock.Now().UnixMilli(), maxWait)
	if err != nil {
		if errors.Is(err, dedup.ErrWaitTimeout) {
			return s.reject(FlushSlaveTimeout, fmt.Errorf("%w: a put of the same %s is not decided yet", ErrReplicationTimeout, PropertyUniqKey))
		}
		return s.reject(UnknownError, err) // ctx ended waiting for the first put: nothing stored by this one
	}
	if t == nil {
		first := kept.result()
		if first.Topic == "" { // kept only when it is not the key's (TimerTopic)
			first.Topic = k.Topic
		}
		if k.Kind == dedup.Delayed {
			first.Topic = ScheduleTopic
		}
		return s.awaitDuplicate(ctx, first, wait)
	}
	var fate *entryFate
	if s.group != nil {
		fate = &entryFate{f: func(a AppendResult, err error) {
			if err != nil {
				t.Abort() // never stored, or no longer knowable here: the window is read again from the log
				return
			}
			rememberPut(t, a)
		}}
	}
	defer func() {
		if fate == nil || !fate.taken {
			t.Abort() // refused, or a panic: the key stays free (a no-op after Commit)
		}
	}()
	res, err := put(fate)
	if s.group == nil && res.Appended() {
		rememberPut(t, res.Append)
	}
	return res, err
}

// rememberPut resolves a first put's ticket with its append result a.
func rememberPut(t *dedup.Ticket[dedupValue], a AppendResult) {
	if a.Topic != TimerTopic {
		a.Topic = "" // from the key when answering (a timer message due already is on its own topic)
	}
	t.Commit(packDedup(a), a.StoreTimestamp, int(a.MsgNum))
}

// awaitDuplicate answers a duplicate of a put stored at a: PUT_OK once a
// is as durable and readable as the duplicate's WAIT asks (afterAppend's
// waits, on the duplicate's context), counted in no put statistics.
func (s *Store) awaitDuplicate(ctx context.Context, a AppendResult, wait bool) (PutResult, error) {
	out := PutResult{Status: PutOK, Append: a}
	if !wait {
		return out, nil
	}
	var err error
	if s.opts.FlushMode == FlushSync {
		err = s.flusher.Wait(ctx, a.NextOffset())
	}
	if err == nil {
		if werr := s.index.AwaitDispatched(ctx, a.NextOffset()); errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded) {
			err = werr
		}
	}
	if err != nil {
		out.Status, err = waitOutcome(err)
	}
	return out, err
}

// DedupHorizon is how far back this store surely remembers a keyed put
// now (dedup.Window.Horizon): DedupWindow, or less while DedupMaxMessages
// pushes keys out sooner; 0 when deduplication is off. A client that does
// not know whether a keyed put was stored may send it again within it and
// have it stored once: on the leader that took it (putOnce) or, in a
// group, on the next (readyDedup).
func (s *Store) DedupHorizon() time.Duration {
	w := s.dedup.Load()
	if w == nil {
		return 0
	}
	return w.Horizon(s.opts.Clock.Now().UnixMilli())
}

// dedupStats returns the window's statistics (zero when it is off).
func (s *Store) dedupStats() DedupStats {
	w := s.dedup.Load()
	if w == nil {
		return DedupStats{}
	}
	return w.Stats(s.opts.Clock.Now().UnixMilli())
}

// openDedup creates the window (nil when Options.DedupWindow is negative)
// and fills it from the log: every keyed put stored within the window, in
// the newest DedupRebuildBytes of the log at most. It runs in Open after
// recovery, so it sees exactly the records a reader can be served, and
// before any put. In a group the window starts empty: a member reads it
// from the committed log, off its raft loop, as it starts, and keeps it
// up to the commit (groupdedup.go).
func (s *Store) openDedup() {
	if s.opts.DedupWindow < 0 {
		return
	}
	if s.group != nil {
		s.dedup.Store(s.newDedup())
		return
	}
	s.dedup.Store(s.buildDedup(s.log.MaxOffset(), true, nil))
}

func (s *Store) newDedup() *dedup.Window[dedupValue] {
	w, err := dedup.New[dedupValue](dedup.Options{Window: s.opts.DedupWindow, MaxMessages: s.opts.DedupMaxMessages})
	if err != nil { // resolve rules this out
		panic(err)
	}
	return w
}

// buildDedup returns a window filled from the log below end (the commit
// end in a group: an uncommitted entry may be truncated). A record that
// fails its checks ends the rebuild there (logged): the keys after it are
// not remembered, nothing else changes. The files are read under the read
// guard (retention does not unmap them meanwhile). verify checks each
// record's CRC (Open, over what recovery may not have scanned); a group
// member only parses (every length checked, no CRC: its committed bytes
// were checked as they arrived). A closed stop ends the read early (the
// window then partial, for the caller to drop).
func (s *Store) buildDedup(end int64, verify bool, stop <-chan struct{}) *dedup.Window[dedupValue] {
	w := s.newDedup()
	cutoff := s.opts.Clock.Now().UnixMilli() - s.opts.DedupWindow.Milliseconds()
	s.log.ReadLock()
	files := s.log.Files().Snapshot()
	for len(files) > 0 && files[len(files)-1].From() >= end {
		files = files[:len(files)-1]
	}
	if len(files) == 0 {
		s.log.ReadUnlock()
		return w
	}
	// Start at the newest file whose first record is older than the
	// window (store times never go backwards along the log), or as far
	// back as DedupRebuildBytes allows.
	start := len(files) - 1
	for start > 0 {
		if ts, ok := firstStoreTime(files[start]); !ok || ts < cutoff {
			break
		}
		if end-files[start-1].From() > s.opts.DedupRebuildBytes {
			break
		}
		start--
	}
	from := files[start].From()
	s.log.ReadUnlock()
	t0 := time.Now()
	scanned, added := s.scanDedup(w, from, end, verify, stop)
	s.opts.Logger.Info().Int64("from", from).Int64("to", end).Int64("bytes_scanned", scanned).Int64("keys", added).
		Stringer("window", s.opts.DedupWindow).Dur("took", time.Since(t0)).Msg("storage: idempotent-put window rebuilt from the log")
	return w
}

// scanDedup adds to w the keyed puts stored in [from, end) of the log
// (from a record boundary), within the window; it returns the bytes read
// and the keys added. A record that fails its checks ends the scan there
// (logged). The files are read under the read guard (retention does not
// unmap them meanwhile); those retention removed already are skipped. A
// closed stop (nil: never) ends the scan early, w then partial: a group's
// reader goroutine stopping (groupdedup.go). With a stop (that reader's
// long scans), the guard is let go every 4,096 records: retention's unmap
// waits for the readers inside, and every reader after it (the raft
// loop's among them) waits for the unmap.
func (s *Store) scanDedup(w *dedup.Window[dedupValue], from, end int64, verify bool, stop <-chan struct{}) (scanned, added int64) {
	now := s.opts.Clock.Now().UnixMilli()
	cutoff := now - s.opts.DedupWindow.Milliseconds()
	s.log.ReadLock()
	defer s.log.ReadUnlock()
	for _, f := range s.log.Files().Snapshot() {
		if f.From() >= end || f.From()+f.Size() <= from {
			continue
		}
		data, wrote := f.Data(), min(f.Wrote(), end-f.From())
		for n, pos := 0, max(from-f.From(), 0); pos < wrote; n++ {
			if stop != nil && n%4096 == 0 {
				if closed(stop) {
					return scanned, added
				}
				if n > 0 {
					s.log.ReadUnlock()
					if s.scanYield != nil {
						s.scanYield()
					}
					s.log.ReadLock()
					if data = f.Data(); data == nil {
						break // retention unmapped it meanwhile
					}
				}
			}
			b := data[pos:wrote]
			if record.IsBlank(b) {
				break
			}
			var h record.Header
			var err error
			if verify {
				h, err = record.Check(b, false)
			} else {
				h, err = record.Parse(b)
			}
			if err != nil {
				s.opts.Logger.Warn().Err(err).Int64("offset", f.From()+pos).
					Msg("storage: idempotent-put window read up to a damaged record; later keys are not remembered")
				return scanned, added
			}
			count, size, batch, err := h.Batch()
			if err != nil || !batch {
				count, size = 1, int64(h.Total)
			}
			size = min(size, wrote-pos) // a batch lies in its file: recovery checked it
			if s.rebuildEntry(w, f.From()+pos, data[pos:pos+size], &h, count, cutoff, now) {
				added++
			}
			scanned += size
			pos += size
		}
	}
	return scanned, added
}

// rebuildEntry adds the put whose records (count of them: a batch, or
// one) are recs, stored at commitlog offset at, when it is keyed and
// within the window. h is the first record's header.
func (s *Store) rebuildEntry(w *dedup.Window[dedupValue], at int64, recs []byte, h *record.Header, count, cutoff, now int64) bool {
	if h.StoreTS < cutoff || h.Tx() != TransactionNotType {
		return false
	}
	id := h.Property(PropertyUniqKey)
	if len(id) == 0 || len(id) > MaxUniqKeyLength {
		return false
	}
	topic := string(h.Topic)
	kind := dedup.Single
	switch {
	case count > 1:
		kind = dedup.Batch
	case topic == ScheduleTopic:
		kind = dedup.Delayed
		realTopic := h.Property(PropertyRealTopic)
		if len(realTopic) == 0 {
			return false
		}
		topic = string(realTopic)
	case topic == TimerTopic:
		realTopic := h.Property(PropertyRealTopic)
		if len(realTopic) == 0 || h.Property(PropertyTimerDelUniqKey) != nil {
			return false // a recall record is no put of a client
		}
		kind, topic = dedup.Timer, string(realTopic)
	case h.Property(PropertyDelayLevel) == nil && (h.Property(PropertyTimerDeliverMS) != nil ||
		h.Property(PropertyTimerDelaySec) != nil || h.Property(PropertyTimerDelayMS) != nil):
		kind = dedup.Timer // a timer message due when it was put, stored on its topic
	}
	v := AppendResult{
		Status: AppendOK, WroteOffset: at, WroteBytes: int32(len(recs)), StoreTimestamp: h.StoreTS,
		QueueID: h.QueueID, QueueOffset: h.QueueOffset, MsgNum: int32(count), StoreHost: record.StoreHost(recs),
	}
	if count > 1 {
		v.Offsets = make([]int64, 0, count)
		for p := 0; p+4 <= len(recs) && len(v.Offsets) < int(count); {
			v.Offsets = append(v.Offsets, at+int64(p))
			p += int(record.TotalSize(recs[p:]))
		}
	}
	if kind == dedup.Timer && string(h.Topic) == TimerTopic {
		v.Topic = TimerTopic
	}
	w.Add(dedup.Key{Topic: topic, Kind: kind, ID: string(id)}, packDedup(v), h.StoreTS, int(count), now)
	return true
}

// firstStoreTime is the store time of f's first record (ok false when f
// holds none).
func firstStoreTime(f *segment.File) (int64, bool) {
	b := f.Data()
	if f.Wrote() < record.MinLen || record.IsBlank(b) || !record.HasMagic(b) {
		return 0, false
	}
	return record.StoreTimestamp(b), true
}
