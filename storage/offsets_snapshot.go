package storage

import (
	"github.com/storaged/storaged/storage/offsets"
)

// The consumer offset table's snapshot (config/consumerOffsets.snap; the
// rules all snapshots follow are in state_snapshot.go). Open's replay of
// the offset topic reads one record per commit in the retained log (about
// 1-1.5 µs each on this 2-core machine: a million commits, 1.0-1.9 s;
// BENCHMARKS.md "Consumer offsets and POP state at start"), so a consumer
// committing every queue every few seconds made a restart slower every
// day until retention caught up. Restored entries go through liveOffsets'
// rule (an entry below a tombstone of its topic is dropped) and lose
// those whose record lies below the log's first offset (retention deleted
// it without a rewrite: its topic was gone).

const offsetsSnapshotName = "consumerOffsets.snap"

// saveOffsetsSnapshot writes the table's snapshot if the last record it
// applied is synced (else it waits for a later round).
func (s *Store) saveOffsetsSnapshot() error {
	es, last, applied := s.offsets.Cut()
	rec, err := s.snapshotRecord(OffsetTopic, last)
	if rec == nil || err != nil {
		return err
	}
	b := offsets.EncodeSnapshot(offsets.Snapshot{At: last, QueueOffset: rec.QueueOffset, BodyCRC: rec.BodyCRC, Entries: es})
	if err := s.writeStateSnapshot(offsetsSnapshotName, "consumer offsets", b); err != nil {
		return err
	}
	s.offSnap.applied = applied
	return nil
}

// loadOffsetsSnapshot restores the table from the snapshot if the log
// still holds the record it names, and returns the queue offset to
// replay from; 0 (the whole topic) when there is no usable snapshot.
func (s *Store) loadOffsetsSnapshot() int64 {
	snap, ok := readStateSnapshot(s, offsetsSnapshotName, OffsetTopic, "consumer offsets", offsets.DecodeSnapshot)
	if !ok {
		return 0
	}
	keep := s.restoredLive()
	live := snap.Entries[:0]
	for _, e := range snap.Entries {
		if keep(e.Key.Topic, e.At) {
			live = append(live, e)
		}
	}
	s.offsets.Restore(live, snap.At)
	s.offSnap.restored = true
	s.opts.Logger.Info().Int64("commitlog_offset", snap.At).Int("offsets", len(live)).
		Msg("storage: consumer offsets restored from their snapshot; replaying the records after it")
	return snap.QueueOffset + 1
}
