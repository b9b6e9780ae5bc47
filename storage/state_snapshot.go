package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
)

// Snapshots of the state kept in system records (sysrecords.go): the
// consumer offset table (offsets_snapshot.go), the POP table
// (pop_snapshot.go) and the transaction table (txn_snapshot.go, which
// names two records, one of each of its topics). Each is the table as one
// synced record of its topic left it, in config/, so that Open replays
// only that topic's records after it. All follow the same rules, kept
// here:
//
//   - A snapshot names the record it reflects by commitlog offset, queue
//     offset and body CRC, and only a record the log has synced
//     (snapshotRecord), so a crash cannot leave it ahead of the recovered
//     log.
//   - Open uses it only while the log still holds that record as it was
//     (checkSnapshotRecord): the topic's queue entry at the queue offset
//     points at the commitlog offset, above the log's first offset, and
//     the record there is of the topic with that queue offset and body
//     CRC. Recovery only ever cuts a suffix of the log, so when that
//     record is intact so is everything before it. Otherwise Open logs
//     why and replays the whole topic, as without a snapshot: it is a
//     cache, and deleting it is always safe.
//   - Restored state goes through the rules a whole replay applies to
//     the records it came from (a topic's tombstone; state whose record
//     lies below the log's first offset is dropped, since retention
//     deletes a file only once the live state in it was written again
//     above it), so the table equals the one a whole replay builds.
//   - They are written at a clean Close (after the last checkpoint) and
//     by one loop on the checkpoint interval, once the records applied
//     since a table's last snapshot reach its size (at least
//     stateSnapshotRecords): writing one then costs no more than
//     replaying those records would. A failed write is logged and tried
//     again at the next round.

// stateSnapshotRecords is the fewest records applied between two
// snapshots of a table written while running.
const stateSnapshotRecords = 1 << 16

// tableSnapshot is what a table's last snapshot covered and what Open did
// with it.
type tableSnapshot struct {
	applied  uint64 // the table's Applied at the last snapshot written; only the loop and Close touch it
	replayed int    // records Open replayed (tests, and the start's log line)
	restored bool   // Open restored the snapshot first
}

// stateSnapshots is the loop writing the snapshots while running.
type stateSnapshots struct {
	rounds *base.Rounds
	every  uint64 // records applied between two snapshots of a table, at least (tests lower it with the loop halted)
}

func (s *Store) stateSnapshotDir() string { return filepath.Join(s.opts.Dir, "config") }

// startStateSnapshots runs the snapshot loop (Open, once the log and the
// index run).
func (s *Store) startStateSnapshots() {
	s.snaps.every = stateSnapshotRecords
	s.snaps.rounds = base.NewRounds()
	s.snaps.rounds.Start(s.opts.Clock, s.opts.CheckpointInterval, s.opts.CheckpointInterval, s.stateSnapshotRound)
}

// stateTable is one table with a snapshot, as the loop and Close see it.
type stateTable struct {
	what string
	snap *tableSnapshot
	// count is the records the table applied since Open and its size
	// (taken under the table's lock).
	count func() (applied uint64, size int)
	save  func() error
}

func (s *Store) stateTables() []stateTable {
	return []stateTable{
		{"consumer offsets", &s.offSnap, func() (uint64, int) { return s.offsets.Applied(), s.offsets.Len() }, s.saveOffsetsSnapshot},
		{"POP state", &s.popSnap, s.popCount, s.savePopSnapshot},
		{"transactions", &s.txnSnap, s.txnCount, s.saveTxnSnapshot},
	}
}

// stateSnapshotRound writes each table's snapshot once the records
// applied since its last one reach max(every, its size).
func (s *Store) stateSnapshotRound() base.Round {
	for _, t := range s.stateTables() {
		applied, size := t.count()
		if applied-t.snap.applied < max(s.snaps.every, uint64(size)) {
			continue
		}
		if err := t.save(); err != nil {
			s.logLimit.Event(t.what+" snapshot", s.opts.Logger.Warn()).Err(err).
				Msgf("storage: %s snapshot not written; the next start replays more (tried again later)", t.what)
		}
	}
	return base.Round{At: s.opts.Clock.Now()}
}

// haltStateSnapshots ends the loop (Close, first).
func (s *Store) haltStateSnapshots() {
	if s.snaps.rounds != nil {
		s.snaps.rounds.Halt()
	}
}

// saveFinalStateSnapshots writes the last snapshots at a clean Close
// (after its last checkpoint: everything applied is synced), of each
// table that applied a record since its last one. REQUIRES: the loop
// halted.
func (s *Store) saveFinalStateSnapshots() {
	for _, t := range s.stateTables() {
		if applied, _ := t.count(); applied == t.snap.applied {
			continue
		}
		if err := t.save(); err != nil {
			s.opts.Logger.Warn().Err(err).Msgf("storage: %s snapshot not written at close; the next start replays more", t.what)
		}
	}
}

// writeStateSnapshot replaces config/name with b (what: for the error).
func (s *Store) writeStateSnapshot(name, what string, b []byte) error {
	if err := base.WriteAtomic(s.opts.FS, s.stateSnapshotDir(), name, b); err != nil {
		return fmt.Errorf("storage: %s snapshot: %w", what, err)
	}
	return nil
}

// readStateSnapshot reads and decodes config/name, a snapshot of topic's
// state, and reports whether Open may use it: not when the file is
// missing, and (logged, with why) not when it does not decode or names a
// record the log no longer holds (checkSnapshotRecord).
func readStateSnapshot[T interface{ Head() base.SnapshotHead }](s *Store, name, topic, what string,
	decode func([]byte) (T, error)) (T, bool) {
	var snap T
	b, err := s.opts.FS.ReadFile(filepath.Join(s.stateSnapshotDir(), name))
	if errors.Is(err, iofs.ErrNotExist) {
		return snap, false
	}
	if err == nil {
		if snap, err = decode(b); err == nil {
			h := snap.Head()
			err = s.checkSnapshotRecord(topic, h.QueueOffset, h.At, h.BodyCRC)
		}
	}
	if err != nil {
		s.opts.Logger.Warn().Err(err).Msgf("storage: %s snapshot not used; replaying every record of %s", what, topic)
		return snap, false
	}
	return snap, true
}

// restoredLive is the rule restored state goes through (see the top of
// this file): live unless its record lies below the log's first offset or
// below a tombstone of its topic.
func (s *Store) restoredLive() func(topic string, at int64) bool {
	tombs, minOff := s.topics.tombstones(), s.log.MinOffset()
	return func(topic string, at int64) bool { return at >= minOff && !deletedAfter(tombs, topic, at) }
}

// snapshotRecord reads the record at last (a table's last applied) for
// a snapshot of topic's state: nil, and no error, when there is none
// (last < 0) or it is not synced yet (a crash could take it).
func (s *Store) snapshotRecord(topic string, last int64) (*Record, error) {
	if last < 0 {
		return nil, nil
	}
	rec, err := s.readRecordOpen(last)
	if err != nil {
		return nil, fmt.Errorf("storage: %s snapshot: record at %d: %w", topic, last, err)
	}
	if rec.Topic != topic {
		return nil, fmt.Errorf("%w: %s snapshot: the record at %d is of %s", ErrCorrupt, topic, last, rec.Topic)
	}
	if last+int64(rec.TotalSize) > s.log.Flushed() {
		return nil, nil
	}
	return rec, nil
}

// checkSnapshotRecord is why the log no longer holds, as a snapshot of
// topic's state names it, the record at commitlog offset at with queue
// offset queueOffset and body CRC bodyCRC; nil when it does.
func (s *Store) checkSnapshotRecord(topic string, queueOffset, at int64, bodyCRC uint32) error {
	q := s.index.Queue(topic, 0)
	if q == nil || queueOffset < q.Min() || queueOffset >= q.Count() {
		return fmt.Errorf("storage: %s snapshot: queue offset %d is not in the topic's queue", topic, queueOffset)
	}
	phys, _, _, ok, err := q.Lookup(queueOffset)
	switch {
	case err != nil:
		return err
	case !ok || phys != at || phys < s.log.MinOffset():
		return fmt.Errorf("storage: %s snapshot: queue offset %d is at commitlog offset %d (found %v), the snapshot says %d",
			topic, queueOffset, phys, ok, at)
	}
	rec, err := s.readRecord(phys)
	if err != nil {
		return err
	}
	if rec.Topic != topic || rec.QueueOffset != queueOffset || rec.BodyCRC != bodyCRC {
		return fmt.Errorf("storage: %s snapshot: the record at %d is %s queue offset %d body CRC %08x, the snapshot names %d %08x",
			topic, phys, rec.Topic, rec.QueueOffset, rec.BodyCRC, queueOffset, bodyCRC)
	}
	return nil
}
