package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/vfs"
)

// Installing a snapshot (design replication.md §3.5) replaces a
// follower's commitlog with the leader's files from the snapshot's oldest
// one to its commit end, resets the raft log to a base at the snapshot's
// index and moves the consume queues onto the new files. It touches three
// things a crash may leave half done, so it runs under a journal:
//
//  1. the files are staged and verified in snapshot.tmp (ReceiveSnapshot)
//     and the MsgSnap is stepped into raft; raft restores it, and the raft
//     loop calls InstallSnapshot before it appends anything after it;
//  2. snapshot.install, the manifest sealed, is written atomically: from
//     here on Open finishes the install (rollForwardInstall), before it
//     the old state stands and Open removes snapshot.tmp;
//  3. the staged files are renamed into commitlog/ and every other
//     commitlog file is deleted, the directory synced, each file's CRC
//     checked against the manifest (installFiles);
//  4. the raft log is reset to a base at the snapshot's index:
//     HardState commit ≥ S, raft/base, meta-log emptied, index files gone
//     (raftlog.InstallBase);
//  5. the consume queues jump onto the new files (consumequeue.Jump: a
//     queue whose entries the leader deleted starts at its manifest's
//     first offset), the manifest's topic table and delivery progress
//     are taken (the commands that built them are below the new base;
//     the progress is written to config/groupProgress.json,
//     group_progress.go), and a checkpoint makes the queues durable;
//  6. snapshot.install and snapshot.tmp are removed.
//
// Every step is idempotent, and the roll-forward at Open reruns 3 and 4,
// takes the topic table and the delivery progress again, then rebuilds the consume queues from the new files (removing the old
// ones, starting each queue of the manifest at its first offset) and
// checkpoints before it removes the journal. So a crash at any point
// leaves, after Open, either the old state or the installed one, never a
// mix. Readers never see past the commit point meanwhile: the commit end
// moves to the snapshot's only after step 5, and the bytes below the old
// commit end are the same in the old and the new files (committed
// prefixes are byte-identical).

// installJournal is the install's journal in the data dir (see above).
const installJournal = "snapshot.install"

// ErrInstallPending: the offline tools refuse a data dir whose snapshot
// install a crash interrupted; starting the member finishes it.
var ErrInstallPending = errors.New("storage: a snapshot install is unfinished in this data dir; start the member once to finish it")

// groupHost.InstallSnapshot is replica.Host's: the raft loop restored the
// snapshot at index of term, staged by ReceiveSnapshot, whose membership
// is mem.
func (h *groupHost) InstallSnapshot(index, term uint64, mem raftlog.Membership) (int64, int64, error) {
	s := (*Store)(h)
	g := s.group
	s.forgetDedup() // the log is replaced: the window is read again
	g.stagedMu.Lock()
	st := g.staged
	g.staged = nil
	g.stagedMu.Unlock()
	if st == nil {
		return 0, 0, fmt.Errorf("storage: raft restored a snapshot at %d, and none is staged", index)
	}
	m := st.Manifest()
	if m.Index != index || m.Term != term {
		return 0, 0, fmt.Errorf("storage: raft restored a snapshot at %d/%d, the staged one is at %d/%d", index, term, m.Index, m.Term)
	}
	// The membership first: raft restarts with the one recorded at its
	// commit, which the install raises to index (a record above the commit
	// waits for it), and a restart finishes an install its journal began.
	if err := g.rlog.SetMembership(raftlog.ConfChange{Membership: mem, Addrs: m.PeerAddrs, Removed: m.Removed}); err != nil {
		return 0, 0, err
	}
	s.membershipChanged(raftlog.ConfChange{Membership: mem, Addrs: m.PeerAddrs, Removed: m.Removed})
	if err := s.installSnapshot(m, st.Dir()); err != nil {
		return 0, 0, err
	}
	return m.End, m.LastStoreTS, nil
}

// installStep tells the test seam a step of the install is done.
func (s *Store) installStep(step string) {
	if s.opts.Group != nil && s.opts.Group.installHook != nil {
		s.opts.Group.installHook(step)
	}
}

// installSnapshot runs steps 2-6 on the open store (the raft goroutine).
func (s *Store) installSnapshot(m snapshot.Manifest, stage string) error {
	fsys, g := s.opts.FS, s.group
	s.installStep("staged")
	b, err := m.Encode()
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(fsys, s.opts.Dir, installJournal, b); err != nil {
		return fmt.Errorf("storage: write the snapshot install journal: %w", err)
	}
	s.installStep("journal")
	// The topic table first (the commands that built it up to the
	// snapshot are not in this replica's raft log), tombstones included,
	// then the queues of topics the snapshot says were deleted since this
	// replica last applied a command are dropped, with the dispatcher
	// paused: the tombstones keep it from indexing their records again.
	oldTombs, err := s.topics.applySnapshot(snapshotTopics(m), snapshotTombstones(m), max(m.Index, m.TopicsIndex))
	if err != nil {
		return fmt.Errorf("storage: the snapshot's topic table: %w", err)
	}
	s.installStep("topics")
	s.index.Paused(func() { err = s.dropStaleQueues(m, oldTombs) })
	if err != nil {
		return fmt.Errorf("storage: drop the queues of topics the snapshot deleted: %w", err)
	}
	clDir := filepath.Join(s.opts.Dir, "commitlog")
	// No retention round and no dispatch round or checkpoint runs while
	// the files change: they read (and delete) them.
	err = s.ret.Exclusive(func() error {
		err := s.index.Jump(m.MinOffset, queueStarts(m), func() error {
			if err := s.log.Install(func() error { return installFiles(fsys, stage, clDir, m, s.installStep) }, m.End); err != nil {
				return err
			}
			s.installStep("commitlog")
			if err := g.rlog.InstallSnapshot(m.Index, m.Term, m.End, s.installStep); err != nil {
				return err
			}
			// Still paused: no round applies a record of the snapshot
			// before the table is emptied (pop.go).
			s.resetPopForSnapshot(m.MinOffset)
			s.resetTxnForSnapshot(m.MinOffset)     // likewise (transactions.go)
			s.resetOffsetsForSnapshot(m.MinOffset) // likewise (topicclear.go)
			// The consumer state of topics the snapshot's tombstones
			// cover: deletes this replica may never have applied as
			// commands (topicclear.go).
			s.dropTombstonedConsumerState()
			return nil
		})
		if err != nil {
			return err
		}
		_, err = s.index.TrimBelow(m.MinOffset)
		return err
	})
	if err != nil {
		return err
	}
	s.installStep("queues")
	// The delivery progress likewise (group_progress.go): applied, and
	// written before the journal goes.
	g.setProgress(snapshotProgress(m))
	if err := s.persistProgress(0, 0); err != nil {
		return fmt.Errorf("storage: the snapshot's delivery progress: %w", err)
	}
	s.installStep("progress")
	// The snapshot is committed: its end is visible from now on (the raft
	// loop tells Committed the same right after).
	if lastTS := m.LastStoreTS; lastTS > s.seq.lastStoreTS.Load() {
		s.seq.lastStoreTS.Store(lastTS)
	}
	g.commitEnd.Store(m.End)
	s.index.Wake()
	g.signal()
	if err := s.index.Checkpoint(); err != nil {
		return fmt.Errorf("storage: checkpoint after a snapshot install: %w", err)
	}
	s.installStep("checkpoint")
	if err := finishInstall(fsys, s.opts.Dir); err != nil {
		return err
	}
	s.installStep("done")
	s.opts.Logger.Info().Uint64("index", m.Index).Int64("min_offset", m.MinOffset).Int64("end", m.End).
		Int("files", len(m.Files)).Int64("bytes", m.Bytes()).Msg("storage: snapshot installed")
	return nil
}

// snapshotTopics is the manifest's topic table.
func snapshotTopics(m snapshot.Manifest) map[string]int32 {
	out := make(map[string]int32, len(m.Topics))
	for _, tp := range m.Topics {
		out[tp.Name] = tp.Queues
	}
	return out
}

// snapshotTombstones is the manifest's deleted topics.
func snapshotTombstones(m snapshot.Manifest) map[string]int64 {
	out := make(map[string]int64, len(m.Deleted))
	for _, d := range m.Deleted {
		out[d.Name] = d.At
	}
	return out
}

// dropStaleQueues drops, before the queues jump onto a snapshot's files,
// the consume queues of every topic the snapshot's sender deleted and
// this replica did not (it was behind): a topic tombstoned by the
// manifest at an offset past this replica's own tombstone for it; a
// queue with entries that the manifest does not list (the sender dropped
// it); or a queue whose entries all lie below the snapshot's oldest file
// and count past the manifest's first offset for it (deleted and
// re-created, the tombstone gone with the files below it: on one log a
// queue's offsets below the oldest file are below that first offset).
// A re-created topic's queue then starts again at the manifest's first
// offset (Jump). REQUIRES: inside Index.Paused.
func (s *Store) dropStaleQueues(m snapshot.Manifest, oldTombs map[string]int64) error {
	tombs := snapshotTombstones(m)
	firsts := queueStarts(m)
	stale := map[string]bool{}
	for _, k := range s.index.Keys() {
		if at, ok := tombs[k.Topic]; ok && at > oldTombs[k.Topic] {
			stale[k.Topic] = true
			continue
		}
		q := s.index.Queue(k.Topic, k.Queue)
		if q == nil || q.Count() == 0 {
			continue
		}
		first, listed := firsts[k]
		if !listed {
			stale[k.Topic] = true
			continue
		}
		if phys, _, _, ok := q.Get(q.Count() - 1); (!ok || phys < m.MinOffset) && q.Count() > first {
			stale[k.Topic] = true
		}
	}
	var errs []error
	for topic := range stale {
		s.opts.Logger.Info().Str("topic", topic).Msg("storage: the snapshot being installed deleted this topic; its consume queues are dropped")
		errs = append(errs, s.index.DropTopicPaused(topic))
	}
	return errors.Join(errs...)
}

// queueStarts is the manifest's queues as consumequeue.Jump takes them.
func queueStarts(m snapshot.Manifest) map[consumequeue.Key]int64 {
	out := make(map[consumequeue.Key]int64, len(m.Queues))
	for _, q := range m.Queues {
		out[consumequeue.Key{Topic: q.Topic, Queue: q.Queue}] = q.First
	}
	return out
}

// finishInstall removes the journal and the staging dir, durably: the
// install is complete.
func finishInstall(fsys vfs.FS, dir string) error {
	if err := fsys.Remove(filepath.Join(dir, installJournal)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("storage: remove the snapshot install journal: %w", err)
	}
	if err := fsys.RemoveAll(filepath.Join(dir, snapshotDir)); err != nil {
		return fmt.Errorf("storage: remove the snapshot staging dir: %w", err)
	}
	return base.SyncDir(fsys, dir)
}

// installFiles is step 3: it moves the manifest's files from the staging
// dir into the commitlog dir (a file no longer staged was moved by an
// earlier, interrupted run), deletes every other commitlog file, syncs
// the directory and checks each file's bytes against the manifest's CRC.
// A file that is neither staged nor right in the commitlog is a
// *CorruptionError.
func installFiles(fsys vfs.FS, stage, clDir string, m snapshot.Manifest, step func(string)) error {
	want := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		name := segment.FileName(f.From)
		want[name] = true
		_, err := fsys.Size(filepath.Join(stage, name))
		switch {
		case err == nil:
			if err := fsys.Rename(filepath.Join(stage, name), filepath.Join(clDir, name)); err != nil {
				return fmt.Errorf("storage: install snapshot file %s: %w", name, err)
			}
			step("rename " + name)
		case !errors.Is(err, iofs.ErrNotExist):
			return fmt.Errorf("storage: install snapshot file %s: %w", name, err)
		}
	}
	ents, err := fsys.ReadDir(clDir)
	if err != nil {
		return fmt.Errorf("storage: install snapshot: %w", err)
	}
	for _, e := range ents {
		if _, ok := segment.ParseFileName(e.Name); ok && !e.IsDir && !want[e.Name] {
			if err := fsys.Remove(filepath.Join(clDir, e.Name)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				return fmt.Errorf("storage: install snapshot: remove %s: %w", e.Name, err)
			}
		}
	}
	step("remove old files")
	if err := base.SyncDir(fsys, clDir); err != nil {
		return fmt.Errorf("storage: install snapshot: %w", err)
	}
	step("sync commitlog dir")
	for _, f := range m.Files {
		name := segment.FileName(f.From)
		seg, err := fsys.OpenSegment(filepath.Join(clDir, name), m.FileSize)
		if err != nil {
			return &CorruptionError{File: "commitlog/" + name, Offset: f.From,
				Reason: fmt.Sprintf("a file of the snapshot being installed (journal %s) is missing: %v", installJournal, err)}
		}
		crc := snapshot.CRC(seg.Bytes()[:f.Size])
		seg.Close()
		if crc != f.CRC {
			return &CorruptionError{File: "commitlog/" + name, Offset: f.From,
				Reason: fmt.Sprintf("a file of the snapshot being installed has CRC %08x, the manifest says %08x", crc, f.CRC)}
		}
	}
	return nil
}

// rollForwardInstall finishes an install a crash interrupted (Open, with
// the data dir locked, before anything else is opened): with a journal,
// steps 3 and 4 again, then the consume queues and their checkpoint are
// removed, to be rebuilt from the new files with each queue of the
// manifest started at its first offset (rebuildQueues, then
// completeInstall). It returns the journal's manifest, or nil without one.
func (s *Store) rollForwardInstall() (*snapshot.Manifest, error) {
	fsys, dir := s.opts.FS, s.opts.Dir
	b, err := fsys.ReadFile(filepath.Join(dir, installJournal))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: read the snapshot install journal: %w", err)
	}
	m, err := snapshot.Decode(b)
	if err != nil {
		return nil, &CorruptionError{File: installJournal, Reason: fmt.Sprintf("the snapshot install journal: %v", err)}
	}
	if s.opts.Group == nil {
		return nil, fmt.Errorf("storage: the data dir holds an unfinished snapshot install (%s); open it as a group member", installJournal)
	}
	if m.FileSize != s.opts.FileSize {
		return nil, fmt.Errorf("storage: the unfinished snapshot install has file size %d, the store %d", m.FileSize, s.opts.FileSize)
	}
	s.opts.Logger.Warn().Uint64("index", m.Index).Msg("storage: finishing a snapshot install the last run did not complete")
	if err := installFiles(fsys, filepath.Join(dir, snapshotDir), filepath.Join(dir, "commitlog"), m, func(string) {}); err != nil {
		return nil, err
	}
	if err := raftlog.InstallBase(fsys, filepath.Join(dir, "raft"), m.Index, m.Term, m.End, nil); err != nil {
		return nil, err
	}
	// The delivery progress the install carries (the commands that set it
	// are below the new base): merged into the file, whatever the
	// interrupted run wrote there already.
	prev, err := readProgress(fsys, dir)
	if err != nil {
		s.opts.Logger.Warn().Err(err).Msg("storage: replicated delivery progress file replaced by the snapshot's")
	}
	if err := writeProgress(fsys, dir, mergeProgress(prev, snapshotProgress(m))); err != nil {
		return nil, err
	}
	if err := fsys.RemoveAll(filepath.Join(dir, "consumequeue")); err != nil {
		return nil, fmt.Errorf("storage: remove the consume queues for a rebuild: %w", err)
	}
	if err := fsys.Remove(filepath.Join(dir, consumequeue.CheckpointName)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return nil, fmt.Errorf("storage: remove the checkpoint for a rebuild: %w", err)
	}
	if err := base.SyncDir(fsys, dir); err != nil {
		return nil, err
	}
	return &m, nil
}

// startInstalledQueues starts each queue of an install being finished at
// its first offset, before the rebuild dispatches into them.
func (s *Store) startInstalledQueues(m *snapshot.Manifest) error {
	for _, q := range m.Queues {
		if q.First == 0 || s.index.Queue(q.Topic, q.Queue) != nil {
			continue
		}
		if err := s.index.StartAt(q.Topic, q.Queue, q.First); err != nil {
			return err
		}
	}
	return nil
}

// completeInstall checkpoints the rebuilt consume queues and removes the
// journal: the install rolled forward at Open is complete.
func (s *Store) completeInstall() error {
	if err := s.index.Checkpoint(); err != nil {
		return fmt.Errorf("storage: checkpoint after finishing a snapshot install: %w", err)
	}
	return finishInstall(s.opts.FS, s.opts.Dir)
}
