package storage

// POP consumption (issue 17, point 2): RocketMQ 5's SimpleConsumer model.
// A consumer group receives messages of a topic with an invisible
// duration; each comes with a receipt handle; a message not acknowledged
// within its invisible duration becomes visible again with its delivery
// attempt counted, through the group's retry topic %RETRY%<group>, and
// past the group's max attempts it goes to the group's dead-letter topic
// %DLQ%<group> instead.
//
// State. For every (group, topic, queue) the next queue offset to pop (the
// cursor), and for every message in flight its invisible deadline and
// generation (storage/pop). Every change is a record of the system topic
// PopTopic (queue 0) appended through the put path under the table's lock,
// so the log order of the records is the order of the changes (as for the
// consumer offsets, consumer_offsets.go, and RocketMQ 5's REVIVE topic of
// checkpoints and acks): a pop appends the new cursor and the messages put
// in flight; an ack, a move to the retry or dead-letter topic, drops them;
// a change of invisible duration puts the message in flight again with a
// new generation. The table is rebuilt at Open by replaying the topic in
// log order, from its last snapshot on (pop_snapshot.go). A receive, an ack and a change answer only once their record
// is durable (sync mode; written in async mode, as a put): a restart
// neither loses an acknowledged ack nor forgets a message handed out.
//
// Redelivery, as RocketMQ's revive service: when a message's deadline has
// passed, a copy is appended to %RETRY%<group> (queue 0, created with one
// queue when first needed) with its reconsume times + 1 and the properties
// RETRY_TOPIC (the original topic) and ORIGIN_MESSAGE_ID (the original
// msgId), then the original is dropped, in one critical section and in
// that log order: a crash between them keeps the copy and the original in
// flight, so the message is delivered again (at least once), never lost.
// A receive pops the group's retry topic first, then the topic's queues
// (from a queue that turns each call). A message whose delivery attempts
// (reconsume times + 1) have reached the group's max attempts goes to
// %DLQ%<group> instead, which no receive pops: it is an ordinary topic,
// read with any consumer. Due messages are moved by the group's next
// receive (at most maxRevive a call), not by a background goroutine: a
// group nobody receives for keeps its expired messages in flight, which
// is what it would see anyway.
//
// FIFO (PopRequest.Fifo, a RocketMQ 5 FIFO consumer group): a queue of
// the subscribed topic is not popped while the group has one of its
// messages in flight; a message not acknowledged in time is delivered
// again in place by the next receive (a Set of the same offset with a new
// generation and Redelivered + 1, the attempt counting it), not copied to
// the retry topic, which would let the queue's next message pass it; past
// the max attempts popRevive moves it to the dead-letter topic, which
// frees the queue. Order is kept per queue (one message group stays in
// one queue), as RocketMQ 4's orderly POP locks a queue.
//
// Where a group starts on a queue it never popped: at its committed
// consumer offset (CommitOffset) when it has one, else at the queue's
// first retained message (RocketMQ's CONSUME_FROM_FIRST_OFFSET).
//
// Bounds: messages in flight in total and per group
// (Options.MaxPopInflight, MaxPopInflightPerGroup: a receive beyond them
// gets ErrTooManyInflight), queue cursors (MaxConsumerOffsets), a
// receive's batch (MaxPopBatch), its entry scan (MaxPullScan), its
// invisible duration ([MinPopInvisible, MaxPopInvisible]), an ack's
// handles (MaxPopAckEntries).
//
// Retention: before it deletes files, the live state whose latest record
// lies in them is written again (rewritePop), as for consumer offsets.
//
// A topic delete drops every group's cursors and messages in flight of
// the topic, and the replay skips the topic's records below its tombstone
// (topicclear.go): a re-created topic is popped from offset 0.
//
// In a replication group (Options.Group) the records are system records
// (sysrecords.go): the ready leader decides a change on its table,
// proposes its record through putSystem and answers once the record is
// committed on a majority and applied here; every replica, the leader
// included, changes its table only by applying committed records as they
// are indexed (applyPopRecord), so all hold the same table at the same log
// position. As the table lags the decision until the record applies, a
// group's changes are serialized from decision to application (popLock,
// one raft round each: different groups proceed in parallel). A follower
// refuses every POP call with a *NotLeaderError naming the leader, as a
// put; the redelivery runs inside the leader's receives, so only there
// (its copies to %RETRY%/%DLQ% are puts through raft, each committed
// before the original's drop is proposed).
//
// After a failover the new leader holds the table as committed: an
// acknowledged message stays so, an unacknowledged one becomes visible
// again once its deadline passes (on the new leader's clock: deadlines
// are Unix milliseconds, so clock skew between members shifts them), and
// the old leader's receipt handles are taken, since a handle names only
// (queue, offset, generation), matched against the replicated table. A
// generation stays unique across leaders: one is answered only once its
// record committed, so every replica's table (whose generation counter is
// at least every generation applied) is past it before it can lead. A
// change whose outcome was unknown (FLUSH_SLAVE_TIMEOUT) may still commit
// later: at worst a message is delivered twice, never lost.
//
// A replica that installs a snapshot over a gap in its log (its applied
// records end below the snapshot's first file) empties its table and
// applies the snapshot's records (resetPopForSnapshot). Retention
// restates the live state whose record lies in a file about to go on the
// ready leader, through raft (rewritePopGroup); a follower keeps the
// files holding live state until the leader's restatement is applied
// there.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/pop"
	"github.com/storaged/storaged/storage/record"
)

const (
	// PopTopic is the system topic of POP state records. Clients can
	// neither put to it nor read it (topicrules.go).
	PopTopic = "RMQ_SYS_POP_STATE"
	// RetryTopicPrefix and DLQTopicPrefix make a group's retry and
	// dead-letter topics (RocketMQ MixAll.RETRY_GROUP_TOPIC_PREFIX,
	// DLQ_GROUP_TOPIC_PREFIX).
	RetryTopicPrefix = "%RETRY%"
	DLQTopicPrefix   = "%DLQ%"
	// PropertyRetryTopic is the original topic of a retry or dead-letter
	// copy (RocketMQ MessageConst.PROPERTY_RETRY_TOPIC).
	PropertyRetryTopic = "RETRY_TOPIC"
	// PropertyOriginMessageID is the original msgId of a copy (RocketMQ
	// MessageConst.PROPERTY_ORIGIN_MESSAGE_ID).
	PropertyOriginMessageID = "ORIGIN_MESSAGE_ID"

	// MaxPopBatch bounds the messages of one receive (the RocketMQ proxy's
	// default receive batch bound).
	MaxPopBatch = 32
	// MinPopInvisible and MaxPopInvisible bound an invisible duration
	// (MaxPopInvisible: the RocketMQ proxy's 12 hours).
	MinPopInvisible = time.Second
	MaxPopInvisible = 12 * time.Hour
	// MaxPopAckEntries bounds the handles of one ack.
	MaxPopAckEntries = 1024
	// DefaultPopMaxAttempts is a group's delivery attempts when the
	// request names none: RocketMQ's 16 retries after the first delivery.
	DefaultPopMaxAttempts = 17
	// MaxPopAttempts bounds a group's max attempts.
	MaxPopAttempts = 1000
	// DefaultMaxPopInflight and DefaultMaxPopInflightPerGroup are the
	// defaults of Options.MaxPopInflight and MaxPopInflightPerGroup.
	DefaultMaxPopInflight         = 200000
	DefaultMaxPopInflightPerGroup = 20000
	// maxRevive bounds the due messages one receive moves.
	maxRevive = 64
)

var (
	// ErrTooManyInflight: the group or the store has as many messages in
	// flight as it may; ack some first. Nothing was popped.
	ErrTooManyInflight = pop.ErrTooManyInflight
	// ErrInvalidHandle: a receipt handle is malformed, of another group
	// or topic, or of a delivery that is over (acknowledged, renewed,
	// moved to the retry or dead-letter topic).
	ErrInvalidHandle = errors.New("storage: invalid receipt handle")
	// ErrPopNotDurable: the change was appended but its durability was
	// not confirmed (as ErrOffsetNotDurable).
	ErrPopNotDurable = errors.New("storage: POP state change appended, durability not confirmed")
)

// RetryTopic and DLQTopic are group's retry and dead-letter topics.
func RetryTopic(group string) string { return RetryTopicPrefix + group }

// DLQTopic is group's dead-letter topic.
func DLQTopic(group string) string { return DLQTopicPrefix + group }

// PopRequest is one receive.
type PopRequest struct {
	Group, Topic string
	// Tags, if not empty, keeps only messages whose TAGS is one of them
	// (the group's retry topic is not filtered). Messages skipped are
	// consumed for the group.
	Tags []string
	// MaxMessages is 1 to MaxPopBatch.
	MaxMessages int
	// Invisible is how long the messages stay invisible unless
	// acknowledged: MinPopInvisible to MaxPopInvisible.
	Invisible time.Duration
	// Wait is how long to wait for a message when none is visible.
	Wait time.Duration
	// MaxAttempts is the group's delivery attempts before a message goes
	// to its dead-letter topic: 0 means DefaultPopMaxAttempts.
	MaxAttempts int
	// Fifo: the group consumes in order (a RocketMQ 5 FIFO consumer
	// group). A queue of Topic is not popped while the group has a
	// message of it in flight, so a message group's next message (one
	// message group stays in one queue) is never handed out before the
	// previous one is acknowledged or dead-lettered; a message not
	// acknowledged in time is delivered again in place (same queue
	// offset, attempt + 1, before anything after it) instead of through
	// the retry topic, which would let the next one pass it; past
	// MaxAttempts it goes to the dead-letter topic and the queue moves
	// on.
	Fifo bool
}

// PopMessage is one message received.
type PopMessage struct {
	Record *Record
	// Topic is the topic the message was sent to (for a retry copy, its
	// RETRY_TOPIC); MsgID the msgId it was stored with first.
	Topic, MsgID string
	// Handle is the receipt handle; Attempt the delivery attempt (1 the
	// first); Deadline when it becomes visible again.
	Handle   string
	Attempt  int32
	Deadline time.Time
}

// checkPop refuses a POP call this replica cannot take (closed; in a
// group, not the ready leader: a *NotLeaderError naming the leader, as a
// put or CommitOffset) and validates the group and the topics named
// after it.
func (s *Store) checkPop(group, topic string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.groupRefusal(); err != nil { // a follower answers with its leader before anything else
		return err
	}
	if p := GroupProblem(group); p != "" {
		return illegal("consumer_group", p)
	}
	// Only the length: the percent rule of TopicNameProblem would refuse
	// a group starting with two hex digits ("%DLQ%ab…" decodes), and
	// these names are made here, not sent.
	if n := len(DLQTopic(group)); n > MaxTopicLength { // the longer of the two
		return illegal("consumer_group", fmt.Sprintf("consumer group %s is too long for its dead-letter topic (%d bytes, limit %d)", group, n, MaxTopicLength))
	}
	if p := TopicNameProblem(topic); p != "" {
		return illegal("topic", p)
	}
	if HiddenTopic(topic) || NotAllowedSendTopic(topic) {
		return illegal("topic", fmt.Sprintf("topic %s is a system topic of the store", topic))
	}
	return nil
}

// PopReceive pops up to req.MaxMessages visible messages of req.Topic (and
// of the group's retry topic) for req.Group and puts them in flight for
// req.Invisible, waiting up to req.Wait for one. It first moves the
// group's due messages to the retry or dead-letter topic. Errors:
// *ValidationError, ErrTopicNotFound (the topic does not exist and would
// not be created by a put), ErrTooManyInflight, the put path's refusals
// (in a group a *NotLeaderError on a follower; nothing popped), *PopNotDurableError (popped, the
// state's durability unknown: the messages become visible again after
// their invisible duration), ErrCorrupt, ErrClosed, ctx's error.
func (s *Store) PopReceive(ctx context.Context, req PopRequest) ([]PopMessage, error) {
	if err := s.checkPop(req.Group, req.Topic); err != nil {
		return nil, err
	}
	switch {
	case req.MaxMessages < 1 || req.MaxMessages > MaxPopBatch:
		return nil, illegal("batch_size", fmt.Sprintf("batch size %d out of range [1, %d]", req.MaxMessages, MaxPopBatch))
	case req.Invisible < MinPopInvisible || req.Invisible > MaxPopInvisible:
		return nil, illegal("invisible_duration", fmt.Sprintf("invisible duration %v out of range [%v, %v]", req.Invisible, MinPopInvisible, MaxPopInvisible))
	case req.MaxAttempts < 0 || req.MaxAttempts > MaxPopAttempts:
		return nil, illegal("max_attempts", fmt.Sprintf("max attempts %d out of range [1, %d]", req.MaxAttempts, MaxPopAttempts))
	}
	if req.MaxAttempts == 0 {
		req.MaxAttempts = DefaultPopMaxAttempts
	}
	var deadline <-chan time.Time
	if req.Wait > 0 {
		t := time.NewTimer(req.Wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		if err := s.checkBeforePut(); err != nil {
			return nil, err
		}
		if err := s.groupRefusal(); err != nil { // leadership lost during the long poll
			return nil, err
		}
		queues, ok := s.topics.get(req.Topic) // again each round: it may be created meanwhile
		if !ok {
			if s.opts.NoAutoCreateTopics {
				return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, req.Topic)
			}
			queues = int32(s.opts.DefaultQueues) // a put would create it so: wait for its queues
		}
		// Register before looking, so that what arrives between the look
		// and the wait wakes it (as PullMessages).
		var cases []reflect.SelectCase
		var releases []func()
		if deadline != nil {
			add := func(k consumequeue.Key) {
				ch, release := s.index.WaitAdvance(k)
				releases = append(releases, release)
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
			}
			add(consumequeue.Key{Topic: RetryTopic(req.Group), Queue: 0})
			for q := range queues {
				add(consumequeue.Key{Topic: req.Topic, Queue: q})
			}
		}
		release := func() {
			for _, r := range releases {
				r()
			}
		}
		if err := s.popRevive(ctx, req.Group, req.MaxAttempts, req.Fifo); err != nil {
			release()
			return nil, err
		}
		msgs, err := s.popOnce(ctx, req, queues)
		if err != nil || len(msgs) > 0 || deadline == nil {
			release()
			return msgs, err
		}
		var stopDue func()
		s.pop.Mu.Lock()
		next, due := s.pop.NextDeadline(req.Group)
		s.pop.Mu.Unlock()
		if due {
			ch, stop := s.clockAt(time.UnixMilli(next))
			stopDue = stop
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
		}
		fixed := len(cases)
		cases = append(cases,
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.index.Done())})
		chosen, _, _ := reflect.Select(cases)
		release()
		if stopDue != nil {
			stopDue()
		}
		switch chosen - fixed {
		case 0:
			return nil, nil
		case 1:
			return nil, ctx.Err()
		case 2:
			return nil, ErrClosed
		}
	}
}

// clockAt returns a channel that fires once the store's clock reaches t:
// through the clock when it is a TimerClock (tests), else a real timer,
// re-armed at most a second ahead so that a wall-clock jump delays it by
// at most that. stop releases it.
func (s *Store) clockAt(t time.Time) (<-chan struct{}, func()) {
	if tc, ok := s.opts.Clock.(TimerClock); ok {
		return tc.At(t), func() {}
	}
	d := min(max(t.Sub(s.opts.Clock.Now()), 0), time.Second)
	ch := make(chan struct{})
	timer := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { timer.Stop() }
}

// popOnce pops without waiting: the group's retry topic, then the
// topic's queues from the one after the last call's first.
func (s *Store) popOnce(ctx context.Context, req PopRequest, queues int32) ([]PopMessage, error) {
	defer s.popLock(req.Group)()
	t := s.pop
	now := s.opts.Clock.Now()
	deadline := now.Add(req.Invisible).UnixMilli()
	t.Mu.Lock()
	room := min(req.MaxMessages, t.Room(req.Group))
	if room == 0 {
		t.Mu.Unlock()
		return nil, fmt.Errorf("%w: group %s has %d in flight (limits: %d a group, %d in all)", ErrTooManyInflight,
			req.Group, t.Inflight(req.Group), s.opts.MaxPopInflightPerGroup, s.opts.MaxPopInflight)
	}
	var (
		ops    []pop.Op
		picked []PopMessage
		budget = MaxPullScan
	)
	scan := func(topic string, qid int32, tags []string) error {
		q := s.index.Queue(topic, qid)
		if q == nil {
			return nil
		}
		k := pop.QueueKey{Group: req.Group, Topic: topic, Queue: qid}
		if req.Fifo && topic == req.Topic {
			if held := t.QueueInflight(k); len(held) > 0 {
				// In order: nothing after a message in flight. Once
				// every one in flight is due (popRevive dead-lettered
				// those out of attempts), they go out again in place.
				for _, it := range held {
					if it.Deadline > now.UnixMilli() {
						return nil
					}
				}
				op := pop.Op{Kind: pop.Set, Key: k, Cursor: pop.NoCursor}
				for _, it := range held {
					if len(picked) >= req.MaxMessages {
						break
					}
					rec, err := s.popRecord(pop.Key{QueueKey: k, Offset: it.Offset})
					if err != nil {
						return err // a later receive's popRevive drops what cannot be read
					}
					nit := pop.Item{Offset: it.Offset, Deadline: deadline, Gen: t.NextGen(), Redelivered: it.Redelivered + 1}
					op.Items = append(op.Items, nit)
					picked = append(picked, s.popMessage(rec, req.Group, nit))
				}
				if len(op.Items) > 0 {
					ops = append(ops, op)
				}
				return nil
			}
		}
		cur, ok := t.Cursor(k)
		if !ok {
			if err := t.AdmitCursor(k); err != nil {
				return err
			}
			cur = q.Min()
			if topic == req.Topic {
				if off, ok := s.offsets.Get(offsets.Key{Group: req.Group, Topic: topic, Queue: qid}); ok {
					cur = off
				}
			}
		}
		cur = min(max(cur, q.Min()), q.Count())
		if cur == q.Count() {
			return nil
		}
		res, scanned, err := s.pullOnce(PullRequest{Topic: topic, QueueID: qid, Offset: cur, MaxMessages: room - len(picked),
			MaxBytes: 1 << 30, Tags: tags}, budget)
		budget -= scanned
		if err != nil {
			return err
		}
		op := pop.Op{Kind: pop.Set, Key: k, Cursor: res.NextOffset}
		for _, rec := range res.Messages {
			it := pop.Item{Offset: rec.QueueOffset, Deadline: deadline, Gen: t.NextGen()}
			op.Items = append(op.Items, it)
			picked = append(picked, s.popMessage(rec, req.Group, it))
		}
		if len(op.Items) == 0 {
			switch {
			case s.group == nil:
				t.Advance(k, res.NextOffset)
			case res.NextOffset != cur:
				// A replica's table changes only through the log: the
				// skipped messages' cursor is a record too.
				ops = append(ops, op)
			}
			return nil
		}
		ops = append(ops, op)
		return nil
	}
	err := scan(RetryTopic(req.Group), 0, nil)
	if s.topics.deleting(req.Topic) {
		queues = 0 // its delete is proposed: nothing of it goes in flight past it (topicclear.go)
	}
	if queues > 0 {
		first := int32(s.popTurn.Add(1) % uint32(queues))
		for i := int32(0); err == nil && i < queues && len(picked) < room && budget > 0; i++ {
			err = scan(req.Topic, (first+i)%queues, req.Tags)
		}
	}
	if len(ops) == 0 {
		t.Mu.Unlock()
		return nil, err // err may be set with nothing popped: return it
	}
	// What was popped before an error is handed out; the error waits for
	// the next call.
	if err := s.popCommit(ctx, ops); err != nil {
		return nil, err
	}
	for i := range picked {
		picked[i].Deadline = time.UnixMilli(deadline)
	}
	return picked, nil
}

// popMessage is rec, popped as it, as a receive hands it out.
func (s *Store) popMessage(rec *Record, group string, it pop.Item) PopMessage {
	m := PopMessage{Record: rec, Topic: rec.Topic, MsgID: MsgID(rec.StoreHost, rec.PhysicalOffset),
		Attempt: rec.ReconsumeTimes + 1 + int32(min(it.Redelivered, MaxPopAttempts))}
	retry := rec.Topic == RetryTopic(group)
	if retry {
		if t, ok := rec.Property(PropertyRetryTopic); ok {
			m.Topic = t
		}
		if id, ok := rec.Property(PropertyOriginMessageID); ok {
			m.MsgID = id
		}
	}
	m.Handle = pop.EncodeHandle(pop.Handle{Retry: retry, Queue: rec.QueueID, Offset: rec.QueueOffset, Gen: it.Gen})
	return m
}

// appendPop appends one POP state record holding ops. REQUIRES: s.pop.Mu.
func (s *Store) appendPop(ops []pop.Op) (AppendResult, error) {
	if err := s.checkBeforePut(); err != nil {
		return AppendResult{}, err
	}
	spec := record.Spec{
		Topic: PopTopic, QueueID: 0, Body: pop.Encode(ops), BornTS: s.opts.Clock.Now().UnixMilli(),
		BornHost: s.opts.StoreHost, StoreHost: s.opts.StoreHost, PropCRC: !s.opts.DisablePropCRC,
	}
	if ferr := spec.Size(); ferr != nil {
		return AppendResult{}, fieldError(ferr)
	}
	spec.BodyCRC = record.BodyCRC(spec.Body)
	if s.log.Busy(s.opts.PageCacheBusyTimeout) {
		return AppendResult{}, ErrBusy
	}
	one := [1]record.Spec{spec}
	return s.appendRecords(PopTopic, 0, 0, one[:], false)
}

// popLock serializes group's POP changes in group mode, each from its
// decision (read of the table) to its record applied, and returns the
// unlock: there the table changes only when a record is applied (after
// its commit), so two receives of a group deciding on the same table
// would hand out the same messages. Groups are striped over a fixed set
// of locks (bounded memory); different groups rarely wait for each other.
// Standalone it does nothing: t.Mu is held from the decision to the
// append, which applies the record at once.
func (s *Store) popLock(group string) func() {
	if s.group == nil {
		return func() {}
	}
	s.popRewrite.RLock()    // a rewrite excludes every change (rewritePopGroup)
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(group); i++ {
		h = (h ^ uint32(group[i])) * 16777619
	}
	m := &s.popLocks[h%uint32(len(s.popLocks))]
	m.Lock()
	return func() {
		m.Unlock()
		s.popRewrite.RUnlock()
	}
}

// popCommit writes ops (any number: one record per pop.MaxOps ops or 256
// KiB) and waits until they are durable and applied here. REQUIRES:
// s.pop.Mu, which it releases; in a group, the group's popLock.
//
// Standalone each record is appended and applied under t.Mu (so the log
// order is the order of the changes), and the wait for durability comes
// after. In a group the records are proposed through putSystem once t.Mu
// is released (the applier takes it when the record is indexed; the
// decision is kept from going stale by popLock), one after the other,
// each answered once committed on a majority and applied here.
//
// Errors: a refusal (nothing of that record stored; the records before
// it are), or *PopNotDurableError.
func (s *Store) popCommit(ctx context.Context, ops []pop.Op) error {
	t := s.pop
	var chunks [][]pop.Op
	for len(ops) > 0 {
		n := 1
		for n < len(ops) && n < pop.MaxOps && pop.EncodedLen(ops[:n+1]) <= 256<<10 {
			n++
		}
		chunks, ops = append(chunks, ops[:n]), ops[n:]
	}
	if s.group != nil {
		t.Mu.Unlock()
		for _, c := range chunks {
			out, err := s.putSystem(ctx, PopTopic, pop.Encode(c), false)
			switch {
			case !out.Appended():
				return err // refused: nothing of it stored
			case err != nil || out.Status != PutOK:
				return &PopNotDurableError{Status: out.Status, Err: err}
			}
		}
		return nil
	}
	var res AppendResult
	for _, c := range chunks {
		var err error
		if res, err = s.appendPop(c); err != nil {
			t.Mu.Unlock()
			return err
		}
		for _, op := range c {
			t.Apply(op, res.WroteOffset)
		}
	}
	t.Mu.Unlock()
	return s.popDurable(ctx, res)
}

// applyPopRecord is PopTopic's applier in a group (sysrecords.go): the
// record at phys, committed and indexed just now, changes the table. One
// that does not decode is logged and skipped; Open would refuse it
// (openPop), so a restart shows the damage rather than serving around it.
func (s *Store) applyPopRecord(phys int64, rec []byte) {
	body, err := systemRecordBody(rec)
	var ops []pop.Op
	if err == nil {
		ops, err = pop.Decode(body)
	}
	if err != nil {
		s.logLimit.Event("bad POP record", s.opts.Logger.Error()).Err(err).Int64("commitlog_offset", phys).
			Msg("storage: a POP state record does not decode; skipped (the next Open refuses it)")
		return
	}
	t := s.pop
	t.Mu.Lock()
	for _, op := range s.livePops(ops, phys) {
		t.Apply(op, phys)
	}
	t.Mu.Unlock()
}

// PopNotDurableError is a POP change appended whose durability was not
// confirmed (as NotDurableError for offsets). It wraps ErrPopNotDurable.
type PopNotDurableError struct {
	Status PutStatus
	Err    error
}

func (e *PopNotDurableError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%v: %s", ErrPopNotDurable, e.Status)
	}
	return fmt.Sprintf("%v: %s: %v", ErrPopNotDurable, e.Status, e.Err)
}

// Unwrap implements errors.Unwrap.
func (e *PopNotDurableError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrPopNotDurable}
	}
	return []error{ErrPopNotDurable, e.Err}
}

// popDurable waits until the record of res (and all before it: copies to
// the retry and dead-letter topics) is durable and indexed, as a put.
func (s *Store) popDurable(ctx context.Context, res AppendResult) error {
	out, err := s.afterAppend(ctx, res, true)
	if err != nil || out.Status != PutOK {
		return &PopNotDurableError{Status: out.Status, Err: err}
	}
	return nil
}

// popRevive moves up to maxRevive of group's due messages to its retry
// topic, or its dead-letter topic past maxAttempts, and drops them from
// flight: each copy is stored before the drop is written (a crash, or a
// leader change, between them delivers the message twice, never loses
// it). For a FIFO group (fifo) a due message of a subscribed topic is
// left in flight to be delivered again in place (popOnce), unless its
// deliveries have reached maxAttempts: then it goes to the dead-letter
// topic. Standalone the copies are appended under t.Mu, before the drop in
// the log; in a group each is put through raft and committed first (t.Mu
// released: the applier needs it to index them).
func (s *Store) popRevive(ctx context.Context, group string, maxAttempts int, fifo bool) error {
	defer s.popLock(group)()
	t := s.pop
	t.Mu.Lock()
	due := t.Due(group, s.opts.Clock.Now().UnixMilli(), maxRevive)
	if len(due) == 0 {
		t.Mu.Unlock()
		return nil
	}
	items := make([]pop.Item, len(due))
	for i, k := range due {
		items[i], _ = t.Item(k)
	}
	if s.group != nil {
		t.Mu.Unlock()
	}
	var (
		drops   = map[pop.QueueKey]*pop.Op{}
		order   []pop.QueueKey
		copyErr error
	)
	for i, k := range due {
		rec, err := s.popRecord(k)
		inPlace := fifo && k.Topic != RetryTopic(group)
		switch {
		case err == nil && inPlace && int(rec.ReconsumeTimes)+1+int(items[i].Redelivered) < maxAttempts:
			continue // delivered again in place by popOnce
		case err == nil:
			target := RetryTopic(group)
			reconsume := rec.ReconsumeTimes + 1
			if inPlace || int(rec.ReconsumeTimes)+1 >= maxAttempts {
				target, reconsume = DLQTopic(group), rec.ReconsumeTimes+int32(min(items[i].Redelivered, MaxPopAttempts))
			}
			if err := s.appendCopy(ctx, target, rec, group, reconsume); err != nil {
				copyErr = err
			}
		case errors.Is(err, ErrOutOfRange), errors.Is(err, ErrQueueNotFound), errors.Is(err, ErrCorrupt):
			// Retention deleted it, its topic was deleted, or it is
			// damaged: there is nothing left to deliver.
			s.opts.Logger.Warn().Err(err).Str("group", group).Str("topic", k.Topic).Int32("queue", k.Queue).
				Int64("offset", k.Offset).Msg("storage: POP message in flight cannot be read; dropped")
		default:
			copyErr = err
		}
		if copyErr != nil {
			break
		}
		op := drops[k.QueueKey]
		if op == nil {
			op = &pop.Op{Kind: pop.Drop, Key: k.QueueKey, Cursor: pop.NoCursor}
			drops[k.QueueKey] = op
			order = append(order, k.QueueKey)
		}
		op.Items = append(op.Items, pop.Item{Offset: k.Offset, Gen: items[i].Gen})
	}
	if s.group != nil {
		t.Mu.Lock()
	}
	if len(order) == 0 {
		t.Mu.Unlock()
		return copyErr
	}
	ops := make([]pop.Op, len(order))
	for i, k := range order {
		ops[i] = *drops[k]
	}
	// On an error the copies are stored, the originals still in flight:
	// they are moved again later (delivered twice, never lost).
	if err := s.popCommit(ctx, ops); err != nil {
		return err
	}
	return copyErr
}

// popRecord reads the message in flight k and checks it is k's.
func (s *Store) popRecord(k pop.Key) (*Record, error) {
	q := s.index.Queue(k.Topic, k.Queue)
	if q == nil {
		return nil, fmt.Errorf("%w: %s/%d", ErrQueueNotFound, k.Topic, k.Queue)
	}
	phys, _, _, ok, err := q.Lookup(k.Offset)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &RangeError{What: "queue offset", Offset: k.Offset, Min: q.Min(), Max: q.Count()}
	}
	rec, err := s.readRecord(phys)
	if errors.Is(err, ErrNoRecord) {
		err = fmt.Errorf("%w: consume queue %s/%d entry %d: %w", ErrCorrupt, k.Topic, k.Queue, k.Offset, err)
	}
	if err != nil {
		return nil, err
	}
	if rec.Topic != k.Topic || rec.QueueID != k.Queue || rec.QueueOffset != k.Offset {
		return nil, fmt.Errorf("%w: consume queue %s/%d entry %d points at a record of %s/%d offset %d",
			ErrCorrupt, k.Topic, k.Queue, k.Offset, rec.Topic, rec.QueueID, rec.QueueOffset)
	}
	return rec, nil
}

// appendCopy stores a copy of rec in target (a group's retry or
// dead-letter topic, queue 0, created with one queue when missing) with
// reconsume times reconsume and the original topic and msgId as
// properties. Standalone it appends the copy (REQUIRES: s.pop.Mu, so the
// drop of the original follows it in the log); in a group it puts it
// through raft and returns once it is committed (REQUIRES: the group's
// popLock, not s.pop.Mu), or an error (the copy may still commit: the
// original stays in flight and is copied again later).
func (s *Store) appendCopy(ctx context.Context, target string, rec *Record, group string, reconsume int32) error {
	if !s.topics.has(target, 0) {
		if _, err := s.topics.create(target, 1, true); err != nil {
			return err
		}
	}
	origTopic, origID := rec.Topic, MsgID(rec.StoreHost, rec.PhysicalOffset)
	if rec.Topic == RetryTopic(group) {
		if v, ok := rec.Property(PropertyRetryTopic); ok {
			origTopic = v
		}
		if v, ok := rec.Property(PropertyOriginMessageID); ok {
			origID = v
		}
	}
	props := make([]Property, 0, len(rec.Properties)+2)
	for _, p := range rec.Properties {
		switch p.Key {
		case PropertyCRC32, PropertyBatch, PropertyInnerNum, PropertyRetryTopic, PropertyOriginMessageID:
			continue // the store's own, or set below
		}
		props = append(props, p)
	}
	props = append(props, Property{Key: PropertyRetryTopic, Value: origTopic}, Property{Key: PropertyOriginMessageID, Value: origID})
	spec := record.Spec{
		Topic: target, QueueID: 0, Flag: rec.Flag, Body: rec.Body, Props: props,
		SysFlag: rec.SysFlag &^ (record.TransactionMask | FlagInnerBatch), BornTS: rec.BornTimestamp, BornHost: rec.BornHost,
		StoreHost: s.opts.StoreHost, Reconsume: reconsume, PropCRC: !s.opts.DisablePropCRC,
	}
	if ferr := spec.Size(); ferr != nil {
		return fieldError(ferr)
	}
	spec.BodyCRC = record.BodyCRC(spec.Body)
	if err := s.checkBeforePut(); err != nil {
		return err
	}
	if s.group != nil {
		if err := s.groupRefusal(); err != nil {
			return err
		}
		res, err := s.groupPut(ctx, target, 0, spec.SysFlag, []record.Spec{spec}, false, nil)
		if err == nil && res.Status != PutOK {
			err = fmt.Errorf("storage: copy to %s stored with status %s: outcome unknown", target, res.Status)
		}
		return err
	}
	one := [1]record.Spec{spec}
	_, err := s.appendRecords(target, 0, spec.SysFlag, one[:], false)
	return err
}

// handleKey is the message in flight a handle names, for group and the
// topic a request names.
func handleKey(group, topic, handle string) (pop.Key, pop.Handle, error) {
	h, err := pop.DecodeHandle(handle)
	if err != nil {
		return pop.Key{}, h, fmt.Errorf("%w: %w", ErrInvalidHandle, err)
	}
	if h.Retry {
		topic = RetryTopic(group)
	}
	return pop.Key{QueueKey: pop.QueueKey{Group: group, Topic: topic, Queue: h.Queue}, Offset: h.Offset}, h, nil
}

// errHandleOver is the error of a handle whose delivery is over.
func errHandleOver(k pop.Key) error {
	return fmt.Errorf("%w: no message of group %s in flight at %s/%d offset %d with this handle "+
		"(acknowledged, its invisible duration changed, or redelivered since)", ErrInvalidHandle, k.Group, k.Topic, k.Queue, k.Offset)
}

// PopAck acknowledges the messages named by handles (received by group
// from topic): they are never delivered again. It returns one error per
// handle (nil: acknowledged; ErrInvalidHandle: not in flight with that
// handle) and an error for the call (nothing acknowledged, or
// *PopNotDurableError). A handle repeated in one call is acknowledged
// once and answered nil each time.
func (s *Store) PopAck(ctx context.Context, group, topic string, handles []string) ([]error, error) {
	if err := s.checkPop(group, topic); err != nil {
		return nil, err
	}
	if len(handles) == 0 || len(handles) > MaxPopAckEntries {
		return nil, illegal("entries", fmt.Sprintf("an ack names 1 to %d receipt handles, got %d", MaxPopAckEntries, len(handles)))
	}
	errs := make([]error, len(handles))
	defer s.popLock(group)()
	t := s.pop
	t.Mu.Lock()
	drops := map[pop.QueueKey]*pop.Op{}
	var order []pop.QueueKey
	seen := map[pop.Key]uint64{}
	for i, hs := range handles {
		k, h, err := handleKey(group, topic, hs)
		if err != nil {
			errs[i] = err
			continue
		}
		if g, ok := seen[k]; ok && g == h.Gen {
			continue
		}
		if _, gen, ok := t.Get(k); !ok || gen != h.Gen {
			errs[i] = errHandleOver(k)
			continue
		}
		seen[k] = h.Gen
		op := drops[k.QueueKey]
		if op == nil {
			op = &pop.Op{Kind: pop.Drop, Key: k.QueueKey, Cursor: pop.NoCursor}
			drops[k.QueueKey] = op
			order = append(order, k.QueueKey)
		}
		op.Items = append(op.Items, pop.Item{Offset: k.Offset, Gen: h.Gen})
	}
	if len(order) == 0 {
		t.Mu.Unlock()
		return errs, nil
	}
	ops := make([]pop.Op, 0, len(order))
	for _, k := range order {
		ops = append(ops, *drops[k])
	}
	if err := s.popCommit(ctx, ops); err != nil {
		var nd *PopNotDurableError
		if errors.As(err, &nd) {
			return errs, err
		}
		return nil, err
	}
	return errs, nil
}

// PopChangeInvisible puts the message named by handle in flight again for
// d from now (a nack with a delay, or more time to process it) and returns
// its new handle; the old one is no longer good. Errors as PopAck's.
func (s *Store) PopChangeInvisible(ctx context.Context, group, topic, handle string, d time.Duration) (PopMessage, error) {
	if err := s.checkPop(group, topic); err != nil {
		return PopMessage{}, err
	}
	if d < 0 || d > MaxPopInvisible {
		return PopMessage{}, illegal("invisible_duration", fmt.Sprintf("invisible duration %v out of range [0, %v]", d, MaxPopInvisible))
	}
	k, h, err := handleKey(group, topic, handle)
	if err != nil {
		return PopMessage{}, err
	}
	defer s.popLock(group)()
	if s.topics.deleting(k.Topic) {
		// Its delete is proposed: a Set after it would put an old message
		// in flight on the re-created topic (topicclear.go).
		return PopMessage{}, fmt.Errorf("%w: %s is being deleted", ErrTopicNotFound, k.Topic)
	}
	t := s.pop
	t.Mu.Lock()
	cur, ok := t.Item(k)
	if !ok || cur.Gen != h.Gen {
		t.Mu.Unlock()
		return PopMessage{}, errHandleOver(k)
	}
	it := pop.Item{Offset: k.Offset, Deadline: s.opts.Clock.Now().Add(d).UnixMilli(), Gen: t.NextGen(), Redelivered: cur.Redelivered}
	op := pop.Op{Kind: pop.Set, Key: k.QueueKey, Cursor: pop.NoCursor, Items: []pop.Item{it}}
	if err := s.popCommit(ctx, []pop.Op{op}); err != nil {
		return PopMessage{}, err
	}
	h.Gen = it.Gen
	return PopMessage{Handle: pop.EncodeHandle(h), Deadline: time.UnixMilli(it.Deadline)}, nil
}

// PopForwardDLQ moves the message named by handle to the group's
// dead-letter topic now, and drops it from flight (the client gave up on
// it). Errors as PopAck's.
func (s *Store) PopForwardDLQ(ctx context.Context, group, topic, handle string) error {
	if err := s.checkPop(group, topic); err != nil {
		return err
	}
	k, h, err := handleKey(group, topic, handle)
	if err != nil {
		return err
	}
	defer s.popLock(group)()
	t := s.pop
	t.Mu.Lock()
	cur, ok := t.Item(k)
	if !ok || cur.Gen != h.Gen {
		t.Mu.Unlock()
		return errHandleOver(k)
	}
	rec, err := s.popRecord(k)
	if err != nil {
		t.Mu.Unlock()
		return err
	}
	if s.group != nil {
		t.Mu.Unlock() // the copy is indexed, and so applied, under it
	}
	err = s.appendCopy(ctx, DLQTopic(group), rec, group, rec.ReconsumeTimes+int32(min(cur.Redelivered, MaxPopAttempts)))
	if s.group != nil {
		t.Mu.Lock()
	}
	if err != nil {
		t.Mu.Unlock()
		return err
	}
	op := pop.Op{Kind: pop.Drop, Key: k.QueueKey, Cursor: pop.NoCursor, Items: []pop.Item{{Offset: k.Offset, Gen: h.Gen}}}
	return s.popCommit(ctx, []pop.Op{op})
}

// PopInflight returns the messages in flight of group ("" for all).
func (s *Store) PopInflight(group string) int {
	s.pop.Mu.Lock()
	defer s.pop.Mu.Unlock()
	return s.pop.Inflight(group)
}

// openPop rebuilds the POP state at Open from PopTopic's consume queue, in
// log order (replaySystem: what is indexed, the commit end in a group). A
// record that fails its checks is ErrCorrupt: Open refuses rather than
// forget a message in flight.
func (s *Store) openPop() error {
	s.pop = pop.New(pop.Limits{Inflight: s.opts.MaxPopInflight, InflightPerGroup: s.opts.MaxPopInflightPerGroup,
		Cursors: s.opts.MaxConsumerOffsets})
	from := s.loadPopSnapshot()
	err := s.replaySystem(PopTopic, 0, from, func(phys int64, rec *Record) error {
		ops, err := pop.Decode(rec.Body)
		if err != nil {
			return fmt.Errorf("%w: POP state: record at commitlog offset %d: %w", ErrCorrupt, phys, err)
		}
		for _, op := range s.livePops(ops, phys) {
			s.pop.Apply(op, phys)
		}
		s.popSnap.replayed++
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: POP state: %w", err)
	}
	s.seedPopGen()
	return nil
}

// seedPopGen makes the generations handed out from now on exceed, by the
// clock, those of records retention deleted (pop.Table.SeedGen). Those of
// the records replayed or applied since are above by Apply.
func (s *Store) seedPopGen() {
	s.pop.Mu.Lock()
	s.pop.SeedGen(uint64(max(s.opts.Clock.Now().UnixMilli(), 0)) << 20)
	s.pop.Mu.Unlock()
}

// resetPopForSnapshot empties the POP table when a snapshot is installed
// over a gap: this replica indexed (and applied) the log only up to
// below the snapshot's first offset, so the records between are never
// applied here, a Drop among them included. The dispatcher goes on from
// the snapshot's first offset and applies every POP record of the
// snapshot, which hold all the live state: the leader's retention deletes
// a file only once the live state it holds is restated past it
// (rewritePopGroup), so a replay from the leader's oldest file rebuilds
// its table (a Drop whose Set is older finds nothing and changes
// nothing). REQUIRES: the dispatcher paused.
func (s *Store) resetPopForSnapshot(minOffset int64) {
	if s.index.Dispatched() >= minOffset {
		return // no gap: the records below were applied here, the rest will be
	}
	s.pop.Mu.Lock()
	s.pop.Reset()
	s.pop.Mu.Unlock()
}

// rewritePopGroup is rewritePop in a group: on the ready leader only, the
// live state whose latest record lies below end is restated by records
// proposed through raft (so every replica applies them and may then let
// its own files go: its keep follows its table). A restated message must
// not outlive a drop decided before it, so no change runs meanwhile (the
// popRewrite lock), and the table is read only once every record this
// leader appended so far is applied: a change whose outcome was unknown
// to its caller (a replication timeout) is then committed and applied, or
// the wait fails and nothing is restated. Elsewhere, or when anything
// fails, the files holding live state are kept (keep).
func (s *Store) rewritePopGroup(end int64, keep func() int64) int64 {
	if s.closed.Load() || s.WriteErr() != nil || s.groupRefusal() != nil {
		return keep()
	}
	s.popRewrite.Lock()
	defer s.popRewrite.Unlock()
	if err := s.awaitAppliedHere(); err != nil {
		s.opts.Logger.Warn().Err(err).Msg("storage: POP state not rewritten (earlier changes not applied in time); retention keeps the files holding it")
		return keep()
	}
	t := s.pop
	t.Mu.Lock()
	ops := t.Below(end)
	t.Mu.Unlock()
	live := ops[:0]
	for _, op := range ops {
		// A topic whose delete is proposed is not restated past it: the
		// delete drops its state, and retention keeps the files until it
		// applied (keep; topicclear.go).
		if !s.topics.deleting(op.Key.Topic) {
			live = append(live, op)
		}
	}
	ops = live
	for len(ops) > 0 {
		n := 0
		for n < len(ops) && n < pop.MaxOps && pop.EncodedLen(ops[:n+1]) <= 256<<10 {
			n++
		}
		n = max(n, 1)
		out, err := s.putSystem(context.Background(), PopTopic, pop.Encode(ops[:n]), true)
		if err != nil || out.Status != PutOK {
			s.opts.Logger.Warn().Err(err).Stringer("status", out.Status).
				Msg("storage: POP state not rewritten; retention keeps the files holding it")
			return keep()
		}
		ops = ops[n:]
	}
	return keep()
}

// awaitAppliedHere waits, at most the replication timeout, until
// everything this replica proposed or appended so far is committed and
// indexed (its system records applied).
func (s *Store) awaitAppliedHere() error {
	g := s.group
	target := max(s.log.MaxOffset(), g.node.ProposedEnd())
	timer := time.NewTimer(g.opts.ReplicationTimeout)
	defer timer.Stop()
	for {
		ch := g.waitChan()
		if g.commitEnd.Load() >= target {
			break
		}
		if s.closed.Load() {
			return ErrClosed
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%w: commit end %d, appended up to %d", ErrReplicationTimeout, g.commitEnd.Load(), target)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.ReplicationTimeout)
	defer cancel()
	return s.index.AwaitDispatched(ctx, target)
}

// rewritePop writes again the live POP state whose latest record lies
// below end and waits until the copies are durable, so that retention may
// delete the files below end (as rewriteOffsets). Cursors of topics
// deleted since are dropped. It returns the lowest commitlog offset that
// must stay.
func (s *Store) rewritePop(end int64) int64 {
	t := s.pop
	if t == nil {
		return end
	}
	keep := func() int64 {
		t.Mu.Lock()
		defer t.Mu.Unlock()
		if at, ok := t.OldestAt(); ok && at < end {
			return at
		}
		return end
	}
	if s.group != nil {
		return s.rewritePopGroup(end, keep)
	}
	if s.closed.Load() || s.Role() != RoleMaster || s.WriteErr() != nil {
		return keep()
	}
	t.Mu.Lock()
	for _, k := range t.Cursors() {
		if _, ok := s.topics.get(k.Topic); !ok {
			t.DropCursor(k)
		}
	}
	ops := t.Below(end)
	var last int64
	for len(ops) > 0 {
		n := 0
		for n < len(ops) && n < pop.MaxOps && pop.EncodedLen(ops[:n+1]) <= 256<<10 {
			n++
		}
		n = max(n, 1)
		res, err := s.appendPop(ops[:n])
		if err != nil {
			t.Mu.Unlock()
			s.opts.Logger.Warn().Err(err).Msg("storage: POP state not rewritten; retention keeps the files holding it")
			return keep()
		}
		for _, op := range ops[:n] {
			t.Apply(op, res.WroteOffset)
		}
		last = res.NextOffset()
		ops = ops[n:]
	}
	t.Mu.Unlock()
	if last > 0 {
		if err := s.durableTo(last); err != nil {
			s.opts.Logger.Warn().Err(err).Msg("storage: rewritten POP state not durable; retention keeps the files holding it")
			// The table now points at the copies: nothing below end is
			// known to be safe to delete.
			return min(end, s.log.MinOffset())
		}
	}
	return keep()
}
