package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/offsets"
)

// The offset table's snapshot: Open's replay of the offset topic reads one
// record per commit in the retained log (about 1 µs each on this 2-core
// machine when quiet: a million commits, 1.0-1.2 s; BENCHMARKS.md
// "Consumer offsets at start"), so a consumer committing every queue every few
// seconds makes a restart slower every day until retention catches up.
// The snapshot (config/consumerOffsets.snap) is the table as one durable
// offset record left it; Open restores it and replays only the records
// after that one. It is a cache, never the truth: the log is. Open uses it
// only when the record it names is still where the snapshot says (the
// offset topic's queue entry at its queue offset points at its commitlog
// offset, above the log's first offset, and the record there is an offset
// record with that queue offset and body CRC). Recovery only ever cuts a
// suffix of the log, so when that record is intact so is everything
// before it; otherwise (a suffix cut by an async crash or `storaged
// repair`, a file retention deleted, a damaged or missing snapshot) Open
// replays the whole topic as before, and says why.
//
// Restored entries then go through the rules a full replay applies to
// their records: an entry below a tombstone of its topic is dropped
// (liveOffsets), and so is one whose record lies below the log's first
// offset (retention deleted it without a rewrite: its topic was gone, so a
// full replay would not find it either; every other latest value was
// rewritten above the deleted files first). So the table Open builds from a
// snapshot is the one it would build from the whole log.
//
// When it is written: at Close, after the last checkpoint, and while
// running, from a loop on the checkpoint interval, once the records
// applied since the last snapshot reach the table's size (at least
// offsetsSnapshotRecords): writing it then costs no more than replaying
// those records would. Only a record the log has synced is named, so a
// crash cannot leave a snapshot ahead of the recovered log. A failed
// write is logged and tried again at the next round.

const (
	offsetsSnapshotName = "consumerOffsets.snap"
	// offsetsSnapshotRecords is the fewest records applied between two
	// snapshots written while running.
	offsetsSnapshotRecords = 1 << 16
)

// offsetsSnapshotter owns the running snapshot loop and what the last
// written snapshot covered.
type offsetsSnapshotter struct {
	rounds  *base.Rounds
	every   uint64 // records applied between two snapshots, at least (tests lower it with the loop halted)
	applied uint64 // Table.Applied at the last snapshot written; only the loop and Close touch it
	// What Open did: the records it replayed, and whether it restored a
	// snapshot first (tests, and the log line).
	replayed int
	restored bool
}

func (s *Store) offsetsSnapshotDir() string { return filepath.Join(s.opts.Dir, "config") }

// startOffsetsSnapshots runs the snapshot loop (Open, once the log and
// the index run).
func (s *Store) startOffsetsSnapshots() {
	s.offSnap.every = offsetsSnapshotRecords
	s.offSnap.rounds = base.NewRounds()
	s.offSnap.rounds.Start(s.opts.Clock, s.opts.CheckpointInterval, s.opts.CheckpointInterval, s.offsetsSnapshotRound)
}

// offsetsSnapshotRound writes a snapshot once the records applied since
// the last one reach max(every, keys).
func (s *Store) offsetsSnapshotRound() base.Round {
	if s.offsets.Applied()-s.offSnap.applied >= max(s.offSnap.every, uint64(s.offsets.Len())) {
		if err := s.saveOffsetsSnapshot(); err != nil {
			s.logLimit.Event("offsets snapshot", s.opts.Logger.Warn()).Err(err).
				Msg("storage: consumer offsets snapshot not written; the next start replays more (tried again later)")
		}
	}
	return base.Round{At: s.opts.Clock.Now()}
}

// haltOffsetsSnapshots ends the loop (Close, first).
func (s *Store) haltOffsetsSnapshots() {
	if s.offSnap.rounds != nil {
		s.offSnap.rounds.Halt()
	}
}

// saveFinalOffsetsSnapshot writes a last snapshot at a clean Close (after
// its last checkpoint: everything applied is synced), unless nothing was
// applied since the last one. REQUIRES: the loop halted.
func (s *Store) saveFinalOffsetsSnapshot() error {
	if s.offsets == nil || s.offsets.Applied() == s.offSnap.applied {
		return nil // nothing applied since the last one
	}
	return s.saveOffsetsSnapshot()
}

// saveOffsetsSnapshot writes the table's snapshot if the last record it
// applied is synced (else it waits for a later round).
func (s *Store) saveOffsetsSnapshot() error {
	es, last, applied := s.offsets.Cut()
	if last < 0 {
		return nil
	}
	rec, err := s.readRecordOpen(last)
	if err != nil {
		return fmt.Errorf("storage: offsets snapshot: record at %d: %w", last, err)
	}
	if rec.Topic != OffsetTopic {
		return fmt.Errorf("%w: offsets snapshot: the record at %d is of %s", ErrCorrupt, last, rec.Topic)
	}
	if last+int64(rec.TotalSize) > s.log.Flushed() {
		return nil // not synced yet: a crash could take it
	}
	b := offsets.EncodeSnapshot(offsets.Snapshot{At: last, QueueOffset: rec.QueueOffset, BodyCRC: rec.BodyCRC, Entries: es})
	if err := base.WriteAtomic(s.opts.FS, s.offsetsSnapshotDir(), offsetsSnapshotName, b); err != nil {
		return fmt.Errorf("storage: offsets snapshot: %w", err)
	}
	s.offSnap.applied = applied
	return nil
}

// loadOffsetsSnapshot restores the table from the snapshot if the log
// still holds the record it names, and returns the queue offset to
// replay from; 0 (the whole topic) when there is no usable snapshot.
func (s *Store) loadOffsetsSnapshot() int64 {
	b, err := s.opts.FS.ReadFile(filepath.Join(s.offsetsSnapshotDir(), offsetsSnapshotName))
	if errors.Is(err, iofs.ErrNotExist) {
		return 0
	}
	snap, why := offsets.Snapshot{}, error(nil)
	if err != nil {
		why = err
	} else if snap, why = offsets.DecodeSnapshot(b); why == nil {
		why = s.checkOffsetsSnapshot(snap)
	}
	if why != nil {
		s.opts.Logger.Warn().Err(why).Msg("storage: consumer offsets snapshot not used; replaying every offset record")
		return 0
	}
	tombs, minOff := s.topics.tombstones(), s.log.MinOffset()
	live := snap.Entries[:0]
	for _, e := range snap.Entries {
		if e.At >= minOff && !deletedAfter(tombs, e.Key.Topic, e.At) {
			live = append(live, e)
		}
	}
	s.offsets.Restore(live, snap.At)
	s.offSnap.restored = true
	s.opts.Logger.Info().Int64("commitlog_offset", snap.At).Int("offsets", len(live)).
		Msg("storage: consumer offsets restored from their snapshot; replaying the records after it")
	return snap.QueueOffset + 1
}

// checkOffsetsSnapshot is why the log no longer holds the record snap
// names, or nil.
func (s *Store) checkOffsetsSnapshot(snap offsets.Snapshot) error {
	q := s.index.Queue(OffsetTopic, 0)
	if q == nil || snap.QueueOffset < q.Min() || snap.QueueOffset >= q.Count() {
		return fmt.Errorf("storage: offsets snapshot: queue offset %d is not in the offset topic's queue", snap.QueueOffset)
	}
	phys, _, _, ok, err := q.Lookup(snap.QueueOffset)
	switch {
	case err != nil:
		return err
	case !ok || phys != snap.At || phys < s.log.MinOffset():
		return fmt.Errorf("storage: offsets snapshot: queue offset %d is at commitlog offset %d (found %v), the snapshot says %d",
			snap.QueueOffset, phys, ok, snap.At)
	}
	rec, err := s.readRecord(phys)
	if err != nil {
		return err
	}
	if rec.Topic != OffsetTopic || rec.QueueOffset != snap.QueueOffset || rec.BodyCRC != snap.BodyCRC {
		return fmt.Errorf("storage: offsets snapshot: the record at %d is %s queue offset %d body CRC %08x, the snapshot names %s %d %08x",
			phys, rec.Topic, rec.QueueOffset, rec.BodyCRC, OffsetTopic, snap.QueueOffset, snap.BodyCRC)
	}
	return nil
}
