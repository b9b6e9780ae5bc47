package storage

import (
	"fmt"
	"sort"

	"github.com/storaged/storaged/storage/consumequeue"
)

// What the store does with its topic table (topics.go): admission on the
// put path, adoption of older data dirs at Open, and the admin calls.

// QueueOffsets are the readable queue offsets [Min, Max) of one queue; both
// 0 for a queue that never received a message.
type QueueOffsets struct {
	QueueID  int32
	Min, Max int64
}

// TopicInfo is a topic's configuration and its queues' offsets.
type TopicInfo struct {
	TopicConfig
	// Queues has one entry per queue id in [0, Queues).
	Offsets []QueueOffsets
}

// MaxListTopics bounds the topics of one Topics answer: at most
// MaxListTopics × MaxQueues queue entries.
const MaxListTopics = 100

// checkAdmin refuses an admin change the store cannot take now: closed, a
// bad or system topic name, a slave (which takes no writes), or in a
// group a replica that is not the ready leader (*NotLeaderError).
func (s *Store) checkAdmin(name string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if p := TopicNameProblem(name); p != "" {
		return illegal("topic", p)
	}
	if SystemTopic(name) {
		return illegal("topic", fmt.Sprintf("topic %s is a system topic (RocketMQ TopicValidator); the admin calls do not manage it", name))
	}
	if s.Role() == RoleSlave {
		return ErrSlave
	}
	// In a group only the ready leader changes the table: a follower
	// answers with the leader's hint whatever its table says (it may not
	// have applied the leader's last change yet).
	return s.groupRefusal()
}

// CreateTopic creates a topic with queues queues (1 to MaxQueues). Errors:
// *ValidationError (bad name, system topic, queue count), ErrTopicExists,
// ErrTooManyTopics, ErrTopicConfig (not persisted: retry), ErrSlave,
// ErrClosed.
func (s *Store) CreateTopic(name string, queues int32) (TopicConfig, error) {
	if err := s.checkAdmin(name); err != nil {
		return TopicConfig{}, err
	}
	if verr := checkQueues(queues); verr != nil {
		return TopicConfig{}, verr
	}
	if _, err := s.topics.create(name, queues, false); err != nil {
		return TopicConfig{}, err
	}
	return TopicConfig{Name: name, Queues: queues}, nil
}

// UpdateTopic raises a topic's queue count; a lower count is
// ErrQueuesLowered, the same count a no-op. Other errors as CreateTopic,
// plus ErrTopicNotFound.
func (s *Store) UpdateTopic(name string, queues int32) (TopicConfig, error) {
	if err := s.checkAdmin(name); err != nil {
		return TopicConfig{}, err
	}
	if verr := checkQueues(queues); verr != nil {
		return TopicConfig{}, verr
	}
	if err := s.topics.update(name, queues); err != nil {
		return TopicConfig{}, err
	}
	return TopicConfig{Name: name, Queues: queues}, nil
}

// Topic returns a topic's configuration and queue offsets, or
// ErrTopicNotFound.
func (s *Store) Topic(name string) (TopicInfo, error) {
	if s.closed.Load() {
		return TopicInfo{}, ErrClosed
	}
	n, ok := s.topics.get(name)
	if !ok {
		return TopicInfo{}, fmt.Errorf("%w: %s", ErrTopicNotFound, name)
	}
	return s.topicInfo(TopicConfig{Name: name, Queues: n}), nil
}

// RouteQueues returns how many queues a client may address in topic, for a
// route answer (the RocketMQ protocol's QueryRoute): the topic's queue
// count (exists true), or, for a topic that does not exist while
// auto-creation is on, the count its first put will create it with
// (exists false), as RocketMQ's broker answers an unknown topic with its
// default route when autoCreateTopicEnable is on. A topic that does not
// exist with auto-creation off is ErrTopicNotFound. The name is not checked
// here: the caller checks it with the rules of what it serves.
func (s *Store) RouteQueues(topic string) (queues int32, exists bool, err error) {
	if s.closed.Load() {
		return 0, false, ErrClosed
	}
	if n, ok := s.topics.get(topic); ok {
		return n, true, nil
	}
	if !s.topics.autoCreate {
		return 0, false, fmt.Errorf("%w: %s (topic auto-creation is off: create it through the admin service)", ErrTopicNotFound, topic)
	}
	return s.topics.defaultQueues, false, nil
}

// Topics lists up to limit topics (at most MaxListTopics; 0 means that)
// whose names sort after after, in name order, and reports whether more
// follow (continue from the last name returned).
func (s *Store) Topics(after string, limit int) ([]TopicInfo, bool, error) {
	if s.closed.Load() {
		return nil, false, ErrClosed
	}
	if limit <= 0 || limit > MaxListTopics {
		limit = MaxListTopics
	}
	cfgs, more := s.topics.list(after, limit)
	out := make([]TopicInfo, len(cfgs))
	for i, c := range cfgs {
		out[i] = s.topicInfo(c)
	}
	return out, more, nil
}

func (s *Store) topicInfo(c TopicConfig) TopicInfo {
	info := TopicInfo{TopicConfig: c, Offsets: make([]QueueOffsets, c.Queues)} // c.Queues ≤ MaxQueues
	for qid := range c.Queues {
		info.Offsets[qid].QueueID = qid
		if q := s.index.Queue(c.Name, qid); q != nil {
			info.Offsets[qid].Min, info.Offsets[qid].Max = q.Min(), q.Count()
		}
	}
	return info
}

// DeleteTopic deletes a topic: its configuration and its consume queues.
// It returns the commitlog offset the delete happened at.
//
// The topic's records stay in the commitlog until retention removes their
// files: GetMessage by offset or msgId still serves them until then, but
// no consume queue indexes them again, not even after a consume-queue
// rebuild. A put racing the delete is refused (ErrTopicNotFound) or lands
// after it; a topic re-created later under the same name starts at queue
// offset 0.
//
// The delete clears the topic's consumer state, as RocketMQ's broker does
// (ConsumerOffsetManager.cleanOffsetByTopic, the POP checkpoints): every
// consumer group's committed offsets of its queues and POP cursors and
// messages in flight there are forgotten, so a re-created topic reads as
// no committed offset and is POP-received from offset 0, and the old
// receipt handles are refused. Standalone it is as durable as the delete
// itself (the tombstone in config/topics.json, fsynced before the delete
// is published; the replay of the offset and POP records skips those
// below it); see topicclear.go, also for what is left alone (retry and
// dead-letter topics, transaction halves, the idempotent-put window).
//
// Errors: *ValidationError (bad name, system topic),
// ErrTopicNotFound, ErrTopicConfig (nothing changed: retry), ErrSlave,
// ErrClosed; an error removing the queue files after the delete is
// returned too (the topic is deleted; a restart drops the files).
//
// In group mode the delete is a raft command (grouptopics.go): the ready
// leader proposes it and answers once applied, with the offset every
// replica tombstoned the topic at (and dropped its consumer state at,
// deterministically: topicclear.go); a follower answers *NotLeaderError,
// and a delete not seen applied within the replication timeout
// ErrTopicChangeTimeout (it may still apply).
func (s *Store) DeleteTopic(name string) (int64, error) {
	if err := s.checkAdmin(name); err != nil {
		return 0, err
	}
	if s.group != nil {
		return s.replicateDelete(name) // grouptopics.go
	}
	// No consumer-state change decided on the old topic lands after the
	// delete (topicclear.go): offset commits wait on the fence, POP
	// changes (appended and applied under the POP lock) on the lock.
	s.deleteFence.Lock()
	defer s.deleteFence.Unlock()
	s.pop.Mu.Lock()
	defer s.pop.Mu.Unlock()
	t := s.topics
	t.wmu.Lock()
	defer t.wmu.Unlock()
	old := t.cur.Load()
	if _, ok := old.topics[name]; !ok {
		return 0, fmt.Errorf("%w: %s", ErrTopicNotFound, name)
	}
	// Stop puts to the topic first: under the append lock, so every record
	// of it lies below at, and none is appended after (appendRecords checks
	// the table under the same lock).
	interim := old.clone()
	delete(interim.topics, name)
	var saved map[consumequeue.Key]*queueNext
	var at int64
	s.log.Locked(func(end int64) {
		at = end
		t.cur.Store(interim)
		saved = s.seq.take(name)
	})

	next := interim.clone()
	next.deleted[name] = at
	if err := t.persistLocked(next); err != nil {
		// Undo: no put to the topic went through meanwhile, so its queue
		// offsets are exactly as saved.
		s.log.Locked(func(int64) {
			t.cur.Store(old)
			s.seq.restore(saved)
		})
		return 0, err
	}
	// Publish the tombstone, drop the queues and the consumer state of
	// the topic with the dispatcher paused, so that it neither indexes an
	// old record of the topic after this nor writes into a queue being
	// removed, nor applies an offset record meanwhile; the puts waiting to
	// index are woken after (consumequeue/visible.go).
	var err error
	s.index.Paused(func() {
		err = s.index.DropTopicPaused(name)
		s.dropConsumerStateLocked(name, at)
		t.cur.Store(next) // last: a tombstone seen means all of it dropped
	})
	s.opts.Logger.Info().Str("topic", name).Int64("commitlog_offset", at).Msg("storage: topic deleted")
	if err != nil {
		return at, fmt.Errorf("storage: topic %s deleted, but removing its consume queues failed (a restart drops them): %w", name, err)
	}
	return at, nil
}

// dropDeletedQueues removes, at Open, the consume queues a delete left
// behind (a crash between the config change and the file removal): queues
// of a tombstoned topic whose first entry lies below the tombstone.
func (s *Store) dropDeletedQueues() {
	tombs := s.topics.tombstones()
	if len(tombs) == 0 {
		return
	}
	stale := map[string]bool{}
	for _, k := range s.index.Keys() {
		at, ok := tombs[k.Topic]
		if !ok {
			continue
		}
		q := s.index.Queue(k.Topic, k.Queue)
		if phys, _, _, ok := q.Get(q.Min()); !ok || phys < at {
			stale[k.Topic] = true
		}
	}
	for topic := range stale {
		if err := s.index.DropTopicPaused(topic); err != nil {
			s.opts.Logger.Warn().Err(err).Str("topic", topic).Msg("storage: cannot remove the consume queues of a deleted topic")
		}
	}
}

// checkpointCount is the entry count cp recorded for topic/qid, or 0 when
// the topic was deleted after cp was written (what cp counted was the
// deleted topic's).
func (s *Store) checkpointCount(cp consumequeue.Checkpoint, topic string, qid int32) int64 {
	if at, ok := s.topics.tombstones()[topic]; ok && at > cp.Dispatched {
		return 0
	}
	return cp.Queues[consumequeue.QueueName(topic, qid)]
}

// adoptTopics, at Open, puts every topic that has consume queues but no
// configuration into the table: a data dir written before topic
// configuration existed. Each gets a queue count covering the queues
// found (at least DefaultQueues), never above MaxQueues: a queue id at or
// above it is logged once, in one line, and its messages stay readable.
// The schedule topic is the scheduler's (see newScheduler).
func (s *Store) adoptTopics() {
	t := s.topics
	t.wmu.Lock()
	defer t.wmu.Unlock()
	cur := t.cur.Load()
	want := map[string]int32{}
	bogus, example := 0, QueueID{}
	for _, k := range s.index.Keys() {
		if NotAllowedSendTopic(k.Topic) || TopicNameProblem(k.Topic) != "" {
			continue
		}
		n := k.Queue + 1 // covers the queue found
		if k.Queue >= MaxQueues {
			bogus++
			example = QueueID{Topic: k.Topic, QueueID: k.Queue}
			n = MaxQueues
		}
		if n > want[k.Topic] {
			want[k.Topic] = n
		}
	}
	if bogus > 0 {
		s.opts.Logger.Warn().Int("queues", bogus).Str("topic", example.Topic).Int32("queue_id", example.QueueID).
			Int("max_queues", MaxQueues).
			Msg("storage: consume queues with a queue id at or above the queue bound found; their messages stay readable, puts to them are refused")
	}
	var adopt []string
	for name, n := range want {
		have, ok := cur.topics[name]
		if !ok {
			want[name] = max(n, t.defaultQueues) // a new topic: at least what a put would create
		}
		if !ok || have < n {
			adopt = append(adopt, name)
		}
	}
	if len(adopt) == 0 {
		return
	}
	sort.Strings(adopt)
	next := cur.clone()
	for _, name := range adopt {
		next.topics[name] = max(next.topics[name], want[name])
	}
	s.opts.Logger.Info().Int("topics", len(adopt)).Str("first", adopt[0]).
		Msg("storage: adopted topics found in the consume queues into the topic config")
	if len(next.topics) > t.maxTopics {
		s.opts.Logger.Warn().Int("topics", len(next.topics)).Int("max_topics", t.maxTopics).
			Msg("storage: more topics than the limit; no topic can be created until some are deleted")
	}
	if err := t.persistLocked(next); err != nil {
		// Serve anyway: the next Open adopts them again, the next change
		// persists them.
		s.opts.Logger.Warn().Err(err).Msg("storage: adopted topics not persisted yet")
	}
	t.cur.Store(next)
}
