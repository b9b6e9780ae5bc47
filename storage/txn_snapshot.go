package storage

import (
	"github.com/storaged/storaged/storage/txn"
)

// The transaction table's snapshot (config/transactions.snap; the rules
// all snapshots follow are in state_snapshot.go). Every transactional
// message is a half record and, once it ends, an op record naming it
// (checks add more), so Open's replay of both topics read about two
// records per transaction in the retained log. The table applies half and
// op records in log order, so one point of the log is named by two
// records, the last of each topic applied, and Open checks both. Restored
// state loses what lies below the log's first offset (a whole replay
// does not see those halves, nor so the ends of them): retention keeps
// the oldest pending half's file (txnProtectedFrom), so only ends go.
// Unlike a whole replay, a snapshot does not refuse a malformed op record
// it covers: the live table skipped it, and so does the restored one.

const txnSnapshotName = "transactions.snap"

// txnCount is the records the table applied since Open and its size.
func (s *Store) txnCount() (uint64, int) {
	s.txn.Mu.Lock()
	defer s.txn.Mu.Unlock()
	return s.txn.Applied(), s.txn.Size()
}

// saveTxnSnapshot writes the table's snapshot if the last half and op
// records it applied are synced (else a later round does). A table that
// never applied a half has nothing to keep.
func (s *Store) saveTxnSnapshot() error {
	s.txn.Mu.Lock()
	snap, applied := s.txn.Cut()
	s.txn.Mu.Unlock()
	half, err := s.snapshotRecord(TransHalfTopic, snap.Half.At)
	if half == nil || err != nil {
		return err
	}
	if snap.Op.At >= 0 {
		op, err := s.snapshotRecord(TransOpTopic, snap.Op.At)
		if op == nil || err != nil {
			return err
		}
		snap.Op.QueueOffset, snap.Op.BodyCRC = op.QueueOffset, op.BodyCRC
	}
	snap.Sort()
	snap.Half.QueueOffset, snap.Half.BodyCRC = half.QueueOffset, half.BodyCRC
	if err := s.writeStateSnapshot(txnSnapshotName, "transactions", txn.EncodeSnapshot(snap)); err != nil {
		return err
	}
	s.txnSnap.applied = applied
	return nil
}

// txnReplay is where Open's replay of the two topics starts: their
// queue offsets, and the commitlog offset of the snapshot's point (the
// later of its two records), past which alone records are applied (-1:
// all).
type txnReplay struct {
	halfFrom, opFrom, after int64
}

// loadTxnSnapshot restores the table from its snapshot if the log still
// holds both records it names, and says where the replay starts: at the
// start of both topics when there is no usable snapshot. REQUIRES: the
// table empty.
func (s *Store) loadTxnSnapshot() txnReplay {
	whole := txnReplay{after: -1}
	snap, ok := readStateSnapshot(s, txnSnapshotName, TransHalfTopic, "transactions", txn.DecodeSnapshot)
	if !ok {
		return whole
	}
	if snap.Op.At >= 0 {
		if err := s.checkSnapshotRecord(TransOpTopic, snap.Op.QueueOffset, snap.Op.At, snap.Op.BodyCRC); err != nil {
			s.opts.Logger.Warn().Err(err).Msgf("storage: transactions snapshot not used; replaying every record of %s and %s",
				TransHalfTopic, TransOpTopic)
			return whole
		}
	}
	minOff := s.log.MinOffset()
	pending := snap.Pending[:0]
	for _, h := range snap.Pending {
		if h.Phys >= minOff {
			pending = append(pending, h)
		}
	}
	done := snap.Done[:0]
	for _, e := range snap.Done {
		if e.Phys >= minOff {
			done = append(done, e)
		}
	}
	snap.Pending, snap.Done = pending, done
	s.txn.Mu.Lock()
	s.txn.Restore(snap)
	s.txn.Mu.Unlock()
	s.txnSnap.restored = true
	s.opts.Logger.Info().Int64("half_offset", snap.Half.At).Int64("op_offset", snap.Op.At).Int("pending", len(pending)).
		Int("ended", len(done)).Msg("storage: transactions restored from their snapshot; replaying the records after it")
	r := txnReplay{halfFrom: snap.Half.QueueOffset + 1, after: max(snap.Half.At, snap.Op.At)}
	if snap.Op.At >= 0 {
		r.opFrom = snap.Op.QueueOffset + 1
	}
	return r
}
