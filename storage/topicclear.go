package storage

import (
	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/pop"
)

// What a topic delete does to the consumer state kept by topic, as
// Apache RocketMQ's broker does on deleteTopic (ConsumerOffsetManager
// cleanOffsetByTopic, and the POP checkpoints of the topic): every
// consumer group's committed offsets of the topic's queues, and its POP
// cursors and messages in flight there, are forgotten. Without it a
// topic re-created under the same name (its queues start at offset 0
// again) would be read from a group's old offset, past its end, and old
// receipt handles would name messages of the new queues.
//
// The rule is the tombstone's (topics.go): the delete happened at
// commitlog offset at, and a consumer-state record below at is of the
// deleted topic. So
//
//   - the delete drops, when it is published, the state of the topic
//     whose latest record lies below at (dropConsumerStateLocked);
//   - every application of an offset or POP record, live or at Open's
//     replay, skips what it says of a topic tombstoned above the record
//     (for an offset rewrite: above the record it copies), so a record
//     of the deleted topic indexed after the delete, or replayed by a
//     restart, changes nothing (liveOffsets, livePops);
//   - a snapshot install drops what the snapshot's tombstones cover, and
//     over a gap in the log rebuilds the offsets from the snapshot's
//     records, as it does the POP state (group_install.go).
//
// The rule reads only the log and the tombstones, which every member of
// a replication group holds alike at the same log position (the delete
// is a raft command, its tombstone the data end at its index), so the
// members agree, and a restart, which replays the tombstones before the
// offset and POP records, rebuilds the state it had. Standalone the
// tombstone is in config/topics.json, written durably before the delete
// is published: after a crash the state is cleared exactly when the
// delete itself survived. The offset records themselves stay in the
// commitlog until retention removes their files, like the topic's
// messages.
//
// No state of the deleted topic is written after its tombstone: a
// change decided on the old table would otherwise land past it, apply,
// and outlive the tombstone once retention drops it. Standalone the
// delete holds the POP table's lock and the delete fence (offset commits
// and rewrites hold it shared from their checks to their record
// applied) across its critical section. In a group the leader holds the
// fence and popRewrite (every POP change holds it shared from its
// decision to its record applied) from blocking the topic to proposing
// the delete: a change decided before is in the log before the delete,
// one decided after finds the topic blocked (refused: commits, a change
// of invisible duration; skipped: a receive, the rewrites before
// retention) until the delete applied and cleared it. An ack, or a move
// to the retry or dead-letter topic, of a message of the deleted topic
// after the delete finds nothing in flight: a Drop of nothing.
//
// Left alone, on purpose:
//   - the groups' retry topics (%RETRY%group) and dead-letter topics:
//     topics of their own (a retry of a message of the deleted topic is
//     still delivered; delete the retry topic to drop it);
//   - pending transactional half messages of the topic: a half lives on
//     the half topic until ended or checked out; a commit after the
//     delete puts its message through the put path as any put, so it
//     lands in the re-created topic, or auto-creates the topic, or is
//     refused with ErrTopicNotFound when auto-creation is off (the half
//     stays pending and its check ends it). RocketMQ does the same;
//   - the idempotent-put window (idempotent.go): a retry of a put
//     answered before the delete gets that answer again (its message was
//     stored, then deleted with the topic), not a second copy.

// dropConsumerStateLocked forgets topic's committed offsets and POP
// state whose latest record lies below at, the commitlog offset the
// topic was deleted at. REQUIRES: s.pop.Mu, and no offset or POP record
// being applied meanwhile (the dispatcher paused, or not started yet);
// the tables may not exist yet (Open's replay of the raft log): Open
// builds them with the rule.
func (s *Store) dropConsumerStateLocked(topic string, at int64) {
	var keys, cursors, inflight int
	if s.offsets != nil {
		keys = s.offsets.DropTopic(topic, at)
	}
	if s.pop != nil {
		cursors, inflight = s.pop.DropTopic(topic, at)
	}
	if keys+cursors+inflight > 0 {
		s.opts.Logger.Info().Str("topic", topic).Int64("commitlog_offset", at).Int("offsets", keys).
			Int("pop_cursors", cursors).Int("pop_inflight", inflight).
			Msg("storage: consumer state of the deleted topic dropped")
	}
}

// dropConsumerState is dropConsumerStateLocked taking the POP table's
// lock (a group's apply of a delete, inside the dispatcher's pause).
func (s *Store) dropConsumerState(topic string, at int64) {
	if s.pop == nil {
		s.dropConsumerStateLocked(topic, at)
		return
	}
	s.pop.Mu.Lock()
	defer s.pop.Mu.Unlock()
	s.dropConsumerStateLocked(topic, at)
}

// dropTombstonedConsumerState drops, for every tombstone of the topic
// table, the consumer state below it (a snapshot installed: its
// tombstones may cover deletes this replica never applied as commands).
// REQUIRES: the dispatcher paused.
func (s *Store) dropTombstonedConsumerState() {
	tombs := s.topics.tombstones()
	if len(tombs) == 0 {
		return
	}
	for topic, at := range tombs {
		s.dropConsumerState(topic, at)
	}
}

// deletedAfter reports whether topic was deleted at a commitlog offset
// above at: a consumer-state record at at is of the deleted topic.
func deletedAfter(tombs map[string]int64, topic string, at int64) bool {
	d, ok := tombs[topic]
	return ok && d > at
}

// liveOffsets is es, the entries of the offset record at commitlog offset
// at, without those of a topic deleted after them: a commit below the
// topic's tombstone, or a rewrite copying a value written below it. It
// returns es itself when nothing is dropped (the common case: no
// allocation).
func (s *Store) liveOffsets(es []offsets.Entry, at int64) []offsets.Entry {
	tombs := s.topics.tombstones()
	if len(tombs) == 0 {
		return es
	}
	var out []offsets.Entry
	for i, e := range es {
		src := at
		if e.Rewrite {
			src = e.From
		}
		if !deletedAfter(tombs, e.Key.Topic, src) {
			if out != nil {
				out = append(out, e)
			}
			continue
		}
		if out == nil {
			out = append(make([]offsets.Entry, 0, len(es)), es[:i]...)
		}
	}
	if out == nil {
		return es
	}
	return out
}

// livePops is ops, the ops of the POP record at commitlog offset at,
// without those of a queue whose topic was deleted after it.
func (s *Store) livePops(ops []pop.Op, at int64) []pop.Op {
	tombs := s.topics.tombstones()
	if len(tombs) == 0 {
		return ops
	}
	var out []pop.Op
	for i, op := range ops {
		if !deletedAfter(tombs, op.Key.Topic, at) {
			if out != nil {
				out = append(out, op)
			}
			continue
		}
		if out == nil {
			out = append(make([]pop.Op, 0, len(ops)), ops[:i]...)
		}
	}
	if out == nil {
		return ops
	}
	return out
}

// resetOffsetsForSnapshot empties the offset table when a snapshot is
// installed over a gap, as resetPopForSnapshot the POP table: the records
// between this replica's applied end and the snapshot's first offset are
// never applied here (a delete among them may have dropped keys this
// table still holds, its tombstone gone since with the files below it),
// and the snapshot's records hold every live value (the leader's
// retention deletes a file only once the latest values in it are
// rewritten past it), so the dispatcher rebuilds the leader's table from
// them. REQUIRES: the dispatcher paused.
func (s *Store) resetOffsetsForSnapshot(minOffset int64) {
	if s.index.Dispatched() >= minOffset {
		return
	}
	s.offsets.Reset()
}
