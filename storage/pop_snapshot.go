package storage

import (
	"github.com/storaged/storaged/storage/pop"
)

// The POP table's snapshot (config/popState.snap; the rules all snapshots
// follow are in state_snapshot.go). Every receive, ack, change of
// invisible duration and redelivery is a POP record, so a POP consumer
// writes about one record per message it consumes, and Open replayed all
// of them in the retained log. Restored state goes through livePops'
// rule (state of a topic deleted after its record is dropped) and loses
// what lies below the log's first offset, and the cursors a scan moved in
// memory only (Advance: a whole replay does not have them either; the
// scan after the start pops nothing from the entries it skips again).

const popSnapshotName = "popState.snap"

// popCount is the ops the POP table applied since Open and its size.
func (s *Store) popCount() (uint64, int) {
	s.pop.Mu.Lock()
	defer s.pop.Mu.Unlock()
	return s.pop.Applied(), s.pop.Size()
}

// savePopSnapshot writes the POP table's snapshot if the last record it
// applied is synced (else a later round does).
func (s *Store) savePopSnapshot() error {
	s.pop.Mu.Lock()
	snap, applied := s.pop.Cut()
	s.pop.Mu.Unlock()
	rec, err := s.snapshotRecord(PopTopic, snap.At)
	if rec == nil || err != nil {
		return err
	}
	snap.Sort()
	snap.QueueOffset, snap.BodyCRC = rec.QueueOffset, rec.BodyCRC
	if err := s.writeStateSnapshot(popSnapshotName, "POP state", pop.EncodeSnapshot(snap)); err != nil {
		return err
	}
	s.popSnap.applied = applied
	return nil
}

// loadPopSnapshot restores the POP table from its snapshot if the log
// still holds the record it names, and returns the queue offset to
// replay from; 0 (the whole topic) when there is no usable snapshot.
func (s *Store) loadPopSnapshot() int64 {
	snap, ok := readStateSnapshot(s, popSnapshotName, PopTopic, "POP state", pop.DecodeSnapshot)
	if !ok {
		return 0
	}
	keep := s.restoredLive()
	cursors := snap.Cursors[:0]
	for _, c := range snap.Cursors {
		if keep(c.Key.Topic, c.At) {
			cursors = append(cursors, c)
		}
	}
	inflight := snap.Inflight[:0]
	for _, it := range snap.Inflight {
		if keep(it.Key.Topic, it.At) {
			inflight = append(inflight, it)
		}
	}
	snap.Cursors, snap.Inflight = cursors, inflight
	s.pop.Mu.Lock()
	s.pop.Restore(snap)
	s.pop.Mu.Unlock()
	s.popSnap.restored = true
	s.opts.Logger.Info().Int64("commitlog_offset", snap.At).Int("cursors", len(cursors)).Int("inflight", len(inflight)).
		Msg("storage: POP state restored from its snapshot; replaying the records after it")
	return snap.QueueOffset + 1
}
