package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// slotSize is the size of one HardState slot; the file holds two.
const slotSize = 64

// slot is one HardState slot (design §2.1): {seq, term, vote, commit},
// zero padding, and the CRC-32C of bytes 0..60 at +60. The file holds two;
// the valid slot with the highest seq wins, so a write torn by a power cut
// leaves the other, older slot in force. Both slots lie in the file's first
// 512 B sector, which a device writes whole (the assumption PostgreSQL
// makes for pg_control; MemFS.Crash tears pages at sector granularity).
//
// Which slot a write goes to, and when it is synced (design §3.2 step 4:
// "HardState with fdatasync when MustSync (term or vote changed; a
// commit-only change rides along)"): a write always goes to the slot that
// does not hold the newest synced one (the durable slot), and it is synced
// only when its term or vote differs from the durable slot's, or when no
// slot was ever synced. A commit-only change is written without a sync.
// So a power cut leaves either the durable slot or a newer one with the
// same term and vote: the term and vote raft requires before any message
// are never lost, and the commit index on disk may lag the one raft acted
// on. Raft allows that (etcd-raft's MustSync ignores the commit, and a
// follower relearns the commit from its leader); what the store persists
// beyond the commit is made safe by syncing the commit first
// (Log.SyncCommit), so no file of the data dir records a raft index above
// the commit on disk.
type slot struct {
	Seq, Term, Vote, Commit uint64
}

func (s slot) encode(dst []byte) {
	_ = dst[slotSize-1]
	clear(dst[:slotSize])
	binary.BigEndian.PutUint64(dst[0:], s.Seq)
	binary.BigEndian.PutUint64(dst[8:], s.Term)
	binary.BigEndian.PutUint64(dst[16:], s.Vote)
	binary.BigEndian.PutUint64(dst[24:], s.Commit)
	binary.BigEndian.PutUint32(dst[60:], crc32c(dst[:60]))
}

// decodeSlot reads a slot; ok is false for a zeroed, torn or damaged one.
func decodeSlot(b []byte) (s slot, ok bool) {
	if len(b) < slotSize {
		return slot{}, false
	}
	if crc32c(b[:60]) != binary.BigEndian.Uint32(b[60:]) {
		return slot{}, false
	}
	for _, c := range b[32:60] {
		if c != 0 {
			return slot{}, false
		}
	}
	s = slot{Seq: binary.BigEndian.Uint64(b[0:]), Term: binary.BigEndian.Uint64(b[8:]),
		Vote: binary.BigEndian.Uint64(b[16:]), Commit: binary.BigEndian.Uint64(b[24:])}
	return s, s.Seq != 0
}

// decodeHardState picks the newest valid slot of the file's bytes; found
// is false when neither is valid (a new file, or one never synced).
func decodeHardState(b []byte) (s slot, found bool) {
	s, _, found = decodeHardStateAt(b)
	return s, found
}

// decodeHardStateAt is decodeHardState that also tells which slot (0, 1)
// the newest valid one is.
func decodeHardStateAt(b []byte) (s slot, at int, found bool) {
	for i := 0; i < 2; i++ {
		if len(b) < (i+1)*slotSize {
			break
		}
		if c, ok := decodeSlot(b[i*slotSize:]); ok && (!found || c.Seq > s.Seq) {
			s, at, found = c, i, true
		}
	}
	return s, at, found
}

// hardStateFile is raft/hardstate.
type hardStateFile struct {
	f       vfs.File
	cur     slot // the newest slot written, synced or not (Seq 0: none)
	curAt   int  // the slot cur is in
	durable slot // the newest slot synced: at least this survives a power cut
	durAt   int  // the slot durable is in; no write touches it
}

func openHardState(fs vfs.FS, path string) (*hardStateFile, error) {
	f, err := fs.OpenFile(path, true)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open hardstate: %w", err)
	}
	buf := make([]byte, 2*slotSize)
	n, _ := f.ReadAt(buf, 0) // a short file (new, or torn at creation) reads as zeros
	h := &hardStateFile{f: f}
	var found bool
	h.cur, h.curAt, found = decodeHardStateAt(buf[:n])
	if found {
		// What was read may be in the page cache only (an unsynced
		// commit-only write, then a kill -9): sync it, so that it is the
		// durable slot the next writes keep clear of.
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("raftlog: sync hardstate: %w", err)
		}
	} else {
		h.curAt = 1 // none valid: the first write goes to slot 0
	}
	h.durable, h.durAt = h.cur, h.curAt
	return h, nil
}

func (h *hardStateFile) hardState() *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(h.cur.Term), Vote: proto.Uint64(h.cur.Vote), Commit: proto.Uint64(h.cur.Commit)}
}

// write writes {term, vote, commit} into the slot the durable one is not
// in, and syncs it when the term or vote differs from the durable slot's
// (or none was ever synced): then it is the durable slot. A commit-only
// change is left to the page cache (slot's comment): syncCommit makes it
// durable when something is about to depend on it.
func (h *hardStateFile) write(term, vote, commit uint64) error {
	s := slot{Seq: h.cur.Seq + 1, Term: term, Vote: vote, Commit: commit}
	at := 1 - h.durAt
	var buf [slotSize]byte
	s.encode(buf[:])
	if _, err := h.f.WriteAt(buf[:], int64(at)*slotSize); err != nil {
		return fmt.Errorf("raftlog: write hardstate: %w", err)
	}
	h.cur, h.curAt = s, at
	if h.durable.Seq != 0 && term == h.durable.Term && vote == h.durable.Vote {
		return nil
	}
	return h.syncCommit()
}

// syncCommit makes the newest slot written durable, if it is not yet.
func (h *hardStateFile) syncCommit() error {
	if h.cur.Seq == h.durable.Seq {
		return nil
	}
	if err := h.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: sync hardstate: %w", err)
	}
	h.durable, h.durAt = h.cur, h.curAt
	return nil
}

func (h *hardStateFile) close() error { return h.f.Close() }

// hardStateName is raft/hardstate.
const hardStateName = "hardstate"

// readHardState reads raft/hardstate of the raft directory dir offline:
// the newest valid slot; found is false when the file is missing or
// neither slot is valid.
func readHardState(fsys vfs.FS, dir string) (s slot, found bool, err error) {
	b, err := fsys.ReadFile(filepath.Join(dir, hardStateName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return slot{}, false, fmt.Errorf("raftlog: read hardstate: %w", err)
	}
	s, found = decodeHardState(b)
	return s, found, nil
}

// initHardState writes the first slot {seq 1, term 0, vote 0, commit 0}
// of raft/hardstate at bootstrap, before raft/meta: from then on the file
// always has a valid slot (each write goes to the slot the newest synced
// one is not in), so a raft dir whose hardstate has none while its log holds
// entries lost it (lostHardState) and is never mistaken for a new one.
// (Dirs bootstrapped before this rule got their first slot with their
// first Sync, after their first units: a power cut between the two is
// refused like damage, and repair rebuilds it.)
func initHardState(fsys vfs.FS, dir string) error {
	h, err := openHardState(fsys, filepath.Join(dir, hardStateName))
	if err != nil {
		return err
	}
	if h.cur.Seq == 0 {
		err = h.write(0, 0, 0)
	}
	return errors.Join(err, h.close())
}

// holdsEntries reports whether the raft directory dir holds a raft log:
// raft/base (a compacted prefix, so entries were committed) or a unit
// that is not zero at the first index. units is the index file size in
// units.
func holdsEntries(fsys vfs.FS, dir string, units int) (bool, error) {
	if _, err := fsys.Size(filepath.Join(dir, baseName)); err == nil {
		return true, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("raftlog: %w", err)
	}
	if _, err := fsys.ReadDir(filepath.Join(dir, "index")); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("raftlog: %w", err)
	}
	x, err := loadIndex(fsys, filepath.Join(dir, "index"), uint64(units), 1)
	if err != nil {
		return false, err
	}
	defer x.close()
	b := x.slot(1)
	return b != nil && !commitlog.AllZero(b), nil
}

// lostHardState is the refusal to start on a raft log whose HardState is
// gone (no valid slot, or no file) while the log holds entries: the term
// this member reached and the vote it gave in it are lost, and a member
// that restarted at term 0 could vote a second time in a term it already
// voted in, electing two leaders of one term (design replication.md
// §3.4). `storaged replica repair --from PEER` rebuilds a safe one.
func lostHardState(missing bool) error {
	what := "has no valid slot (zeroed or damaged)"
	if missing {
		what = "is missing"
	}
	return &base.CorruptionError{File: "raft/" + hardStateName, Reason: fmt.Sprintf("raft/hardstate %s while the raft log holds entries: "+
		"the term and the vote this member gave are lost, and starting could vote twice in one term (storaged replica repair "+
		"--from PEER rebuilds it from the peers' terms)", what)}
}
