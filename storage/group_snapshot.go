package storage

import (
	"fmt"
	"slices"

	"github.com/storaged/storaged/storage/snapshot"
)

// Snapshots (design replication.md §3.5) are file transfers: a follower
// that fell behind what the leader's raft log still holds gets the
// leader's commitlog files from the oldest one kept up to the commit end
// at the leader's applied index S, described by a manifest
// (storage/snapshot). What is built so far: the manifest of a replica's
// state (SnapshotManifest), the sender's chunk reader and the receiver's
// verified staging (storage/snapshot), and the peer transport's
// InstallSnapshot stream (server/peer). Not yet: raft never asks for a
// snapshot, because FirstIndex stays 1 and retention stays off in group
// mode, and the install (the atomic swap of the staged files into the
// commitlog, the raft log's reset to a base at S, the consume queues
// rebuilt from per-queue first offsets) is not written.

// SnapshotManifest returns the manifest of a snapshot of this replica at
// its applied index S: the commitlog files from the oldest one kept to the
// commit end at S, with the CRC-32C of their bytes, the newest store time
// below that end and every consume queue's first offset at or above the
// oldest file (its next offset as indexed now, for information). The
// files are read in chunks under the commitlog's read guard; a file that
// retention deletes meanwhile fails it (snapshot.ErrGone). Reads cost one
// pass over the files: call it off the raft goroutine.
func (s *Store) SnapshotManifest() (snapshot.Manifest, error) {
	if s.group == nil || s.group.node == nil {
		return snapshot.Manifest{}, ErrNotGroup
	}
	if s.closed.Load() {
		return snapshot.Manifest{}, ErrClosed
	}
	info := s.group.node.Info() // applied index and its commit end, read together
	term, err := s.group.rlog.Term(info.Applied)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("storage: snapshot at %d: %w", info.Applied, err)
	}
	fileSize := s.opts.FileSize
	minOff, end := s.log.MinOffset(), info.CommitEnd
	if end < minOff {
		minOff = end - end%fileSize
	}
	if d := s.index.Dispatched(); d < minOff {
		return snapshot.Manifest{}, fmt.Errorf("storage: snapshot: indexed up to %d, below the oldest file at %d", d, minOff)
	}
	m := snapshot.Manifest{Version: snapshot.Version, Index: info.Applied, Term: term, FileSize: fileSize,
		MinOffset: minOff, End: end}
	if m.Files, err = snapshot.Files(s.log, fileSize, minOff, end); err != nil {
		return snapshot.Manifest{}, err
	}
	if n := len(m.Files); n > 0 {
		if m.LastStoreTS, err = snapshot.LastStoreTS(s.log, m.Files[n-1].From, end); err != nil {
			return snapshot.Manifest{}, err
		}
	}
	for _, k := range s.index.Keys() {
		q := s.index.Queue(k.Topic, k.Queue)
		if q == nil {
			continue
		}
		first, err := q.FirstAtOrAbove(minOff)
		if err != nil {
			return snapshot.Manifest{}, fmt.Errorf("storage: snapshot: %w", err)
		}
		m.Queues = append(m.Queues, snapshot.Queue{Topic: k.Topic, Queue: k.Queue, First: first, Next: max(first, q.Count())})
	}
	snapshot.SortQueues(m.Queues)
	m.Queues = slices.Clip(m.Queues)
	if err := m.Check(); err != nil {
		return snapshot.Manifest{}, err
	}
	return m, nil
}
