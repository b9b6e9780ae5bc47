package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/timers"
)

// Timer messages (RocketMQ 5 TimerMessageStore; storage/timers): a
// message put with a delivery time is stored on TimerTopic until it is
// due, then put again to its topic. The put side is here (divertTimer);
// the due index, delivery, progress and recall are storage/timers'.

// Timer-message names (record.TimerTopic and the properties).
const (
	TimerTopic              = record.TimerTopic
	PropertyTimerDeliverMS  = record.PropertyTimerDeliverMS
	PropertyTimerDelaySec   = record.PropertyTimerDelaySec
	PropertyTimerDelayMS    = record.PropertyTimerDelayMS
	PropertyTimerOutMS      = record.PropertyTimerOutMS
	PropertyTimerDelUniqKey = record.PropertyTimerDelUniqKey
)

var (
	// ErrTimerFull refuses a timer put while the timer store holds
	// Options.MaxTimerMessages pending messages (WHEEL_TIMER_FLOW_CONTROL;
	// nothing stored, retry later).
	ErrTimerFull = errors.New("storage: the timer store holds its maximum of pending timer messages")
	// ErrTimerNotPending: a recall found no pending timer message with
	// that handle (delivered already, recalled already, or never stored).
	ErrTimerNotPending = timers.ErrNotPending
)

// TimerStats describe the timer service (storage/timers.Stats).
type TimerStats = timers.Stats

// TimerProgress is the timer service's resume point (storage/timers).
type TimerProgress = timers.Progress

// timerDeliverMS is the delivery time (Unix ms) props ask for, as
// RocketMQ's HookUtils reads them: TIMER_DELAY_SEC (now + seconds), else
// TIMER_DELAY_MS (now + ms), else TIMER_DELIVER_MS (absolute). ok is false
// when none is set. A value that is not an integer, or a delay beyond
// maxDelay, is a *ValidationError (WHEEL_TIMER_MSG_ILLEGAL); a negative
// delay or a time in the past is a time not in the future (delivered at
// once), as in RocketMQ.
func timerDeliverMS(props []Property, nowMS int64, maxDelay int64) (ms int64, ok bool, verr *ValidationError) {
	bad := func(key, v string) *ValidationError {
		return &ValidationError{Status: WheelTimerMsgIllegal, Field: "properties",
			Reason: fmt.Sprintf("%s %.32q is not an integer", key, v)}
	}
	far := func(key string) *ValidationError {
		return &ValidationError{Status: WheelTimerMsgIllegal, Field: "properties",
			Reason: fmt.Sprintf("%s asks for delivery more than %d s ahead (the maximum timer delay)", key, maxDelay/1000)}
	}
	if v, set := record.Lookup(props, PropertyTimerDelaySec); set {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			return 0, true, bad(PropertyTimerDelaySec, v)
		case n > maxDelay/1000:
			return 0, true, far(PropertyTimerDelaySec)
		case n < 0:
			return nowMS, true, nil
		}
		return nowMS + n*1000, true, nil
	}
	if v, set := record.Lookup(props, PropertyTimerDelayMS); set {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			return 0, true, bad(PropertyTimerDelayMS, v)
		case n > maxDelay:
			return 0, true, far(PropertyTimerDelayMS)
		case n < 0:
			return nowMS, true, nil
		}
		return nowMS + n, true, nil
	}
	if v, set := record.Lookup(props, PropertyTimerDeliverMS); set {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			return 0, true, bad(PropertyTimerDeliverMS, v)
		case n > nowMS && n-nowMS > maxDelay:
			return 0, true, far(PropertyTimerDeliverMS)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// hasTimerProperty reports whether props ask for a delivery time.
func hasTimerProperty(props []Property) bool {
	for _, p := range props {
		switch p.Key {
		case PropertyTimerDeliverMS, PropertyTimerDelaySec, PropertyTimerDelayMS:
			return true
		}
	}
	return false
}

// divertTimer rewrites a message due in the future for the timer topic
// (RocketMQ HookUtils.transformTimerMessage): topic TimerTopic, queue 0,
// TIMER_OUT_MS = its delivery time, REAL_TOPIC/REAL_QID. A time not in the
// future leaves it as it is (stored on its topic, readable at once). Only
// for messages without a delay level (a delay level wins, as in RocketMQ)
// and transaction types NOT and COMMIT. It copies the properties.
func (s *Store) divertTimer(r *record.Spec) *ValidationError {
	if _, ok := record.Lookup(r.Props, PropertyTimerDelUniqKey); ok {
		return &ValidationError{Status: WheelTimerMsgIllegal, Field: "properties",
			Reason: PropertyTimerDelUniqKey + " is the store's recall record; recall a timer message through RecallTimer"}
	}
	now := s.opts.Clock.Now().UnixMilli()
	due, ok, verr := timerDeliverMS(r.Props, now, s.opts.TimerMaxDelay.Milliseconds())
	if !ok || verr != nil {
		return verr
	}
	if due <= now {
		return nil
	}
	props := make([]record.Property, 0, len(r.Props)+3)
	for _, p := range r.Props {
		switch p.Key {
		case record.PropertyRealTopic, record.PropertyRealQueueID, PropertyTimerOutMS:
			continue // ours win
		}
		props = append(props, p)
	}
	props = append(props,
		record.Property{Key: PropertyTimerOutMS, Value: strconv.FormatInt(due, 10)},
		record.Property{Key: record.PropertyRealTopic, Value: r.Topic},
		record.Property{Key: record.PropertyRealQueueID, Value: strconv.Itoa(int(r.QueueID))})
	r.Props = props
	r.Topic = TimerTopic
	r.QueueID = 0
	return nil
}

// timerAdmit refuses a timer put while the timer store is full.
func (s *Store) timerAdmit() error {
	if n := s.timers.Pending(); n >= int64(s.timers.Max()) {
		return fmt.Errorf("%w (%d of %d)", ErrTimerFull, n, s.timers.Max())
	}
	return nil
}

// RecallTimer withdraws a pending timer message of topic (RocketMQ 5.3
// RecallMessage): the one due at dueMS whose timer record is at commitlog
// offset phys (what a put of it answered: the append's StoreTimestamp is
// not it, its TIMER_OUT_MS is; WroteOffset is phys). A recall is a record
// on the timer topic, durable (committed in a group) before RecallTimer
// returns nil, so the message is never delivered after that, across
// crashes and failovers too.
//
// Errors: ErrTimerNotPending (delivered already, recalled already, or no
// such message), *ValidationError (bad topic), the put's refusals
// (ErrClosed, ErrSlave, a *NotLeaderError in a group, …), or a failure of
// the recall record's put whose outcome is unknown (the message may then
// be delivered or not; a second RecallTimer tells).
func (s *Store) RecallTimer(ctx context.Context, topic string, dueMS, phys int64) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if p := TopicNameProblem(topic); p != "" {
		return illegal("topic", p)
	}
	if dueMS <= 0 || phys < 0 {
		return ErrTimerNotPending
	}
	err := s.timers.Recall(ctx, topic, dueMS, phys)
	if errors.Is(err, timers.ErrNotDelivering) {
		if gerr := s.groupRefusal(); gerr != nil {
			return gerr
		}
		if err := s.checkBeforePut(); err != nil {
			return err
		}
	}
	return err
}

// putRecall appends a recall record through the put path (group: the
// proposal, committed) and waits until it is durable. It returns the
// commitlog offset past it.
func (s *Store) putRecall(ctx context.Context, spec record.Spec) (int64, error) {
	if err := s.checkBeforePut(); err != nil {
		return 0, err
	}
	if err := s.groupRefusal(); err != nil {
		return 0, err
	}
	spec.BornHost, spec.StoreHost, spec.PropCRC = s.opts.StoreHost, s.opts.StoreHost, !s.opts.DisablePropCRC
	if ferr := spec.Size(); ferr != nil {
		return 0, fieldError(ferr)
	}
	spec.BodyCRC = record.BodyCRC(spec.Body)
	var res PutResult
	var err error
	if s.group != nil {
		res, err = s.groupPut(ctx, TimerTopic, 0, 0, []record.Spec{spec}, false, nil)
	} else {
		one := [1]record.Spec{spec}
		var ar AppendResult
		if ar, err = s.appendRecords(TimerTopic, 0, 0, one[:], false); err != nil {
			return 0, err
		}
		res, err = s.afterAppend(ctx, ar, true)
		if err == nil {
			err = s.durableTo(ar.NextOffset()) // async mode too: a recall answered is a recall kept
		}
	}
	if err != nil {
		return 0, err
	}
	if res.Status != PutOK {
		return 0, fmt.Errorf("storage: recall record stored with status %s: durability unknown", res.Status)
	}
	return res.Append.NextOffset(), nil
}

// timerHost is the store as the timer service sees it.
type timerHost Store

var _ timers.Host = (*timerHost)(nil)

func (h *timerHost) Queue() *consumequeue.Queue { return h.index.Queue(TimerTopic, 0) }
func (h *timerHost) Dispatched() int64          { return h.index.Dispatched() }
func (h *timerHost) ReadRecord(phys int64) (*record.Record, error) {
	return (*Store)(h).readRecord(phys)
}
func (h *timerHost) DurableTo(off int64) error { return (*Store)(h).durableTo(off) }
func (h *timerHost) Delivering() bool {
	return (*Store)(h).Role() == RoleMaster && (*Store)(h).groupDelivering()
}
func (h *timerHost) Epoch() uint64                       { return (*Store)(h).groupEpoch() }
func (h *timerHost) Replicated() (timers.Progress, bool) { return (*Store)(h).groupTimerProgress() }
func (h *timerHost) ProposeProgress(e uint64, p timers.Progress) error {
	return (*Store)(h).groupProposeTimerProgress(e, p)
}
func (h *timerHost) PutRecall(ctx context.Context, spec record.Spec) (int64, error) {
	return (*Store)(h).putRecall(ctx, spec)
}

// Redeliver puts a due message back through the put path; refusals by
// validation or by the topic config can never pass and are marked
// timers.ErrUndeliverable.
func (h *timerHost) Redeliver(m *record.Message) (int64, error) {
	res, err := (*Store)(h).PutMessage(context.Background(), m)
	if res.Appended() {
		return res.Append.NextOffset(), nil
	}
	var verr *ValidationError
	if errors.As(err, &verr) || errors.Is(err, ErrTopicNotFound) || errors.Is(err, ErrTooManyTopics) {
		return 0, errors.Join(timers.ErrUndeliverable, err)
	}
	return 0, err
}

// timerProtectedFrom is where retention must stop for the timer store: the
// oldest timer record not resolved by the persisted progress; in a group,
// by the replicated progress (on every replica: any may lead next and
// rebuild its index from there).
func (s *Store) timerProtectedFrom() int64 {
	if s.timers == nil {
		return math.MaxInt64
	}
	if p, ok := s.groupTimerProgress(); ok {
		return s.timers.ProtectedFromLow(p.Low)
	}
	return s.timers.ProtectedFrom()
}
