package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// Meta is raft/meta: who this replica is, fixed at bootstrap. A data dir
// belongs to one node id of one group for its whole life (etcd-raft: an id
// is used only once), so Open refuses a Meta that differs from the one on
// disk.
type Meta struct {
	NodeID      uint64 `json:"node_id"`
	Group       string `json:"group"`
	ClusterUUID string `json:"cluster_uuid"`
	FileSize    int64  `json:"file_size"` // the commitlog's file size: entries are placed by it
	// LogBase is the commitlog offset the first DATA entry goes to (the
	// written end at bootstrap).
	LogBase int64 `json:"log_base"`
	// Voters and Learners are the bootstrap ConfState: InitialState returns
	// it until a conf change is applied (raft/conf, conf.go). A member that
	// joins an existing group bootstraps with neither: it learns the
	// membership from the log or a snapshot.
	Voters   []uint64 `json:"voters,omitempty"`
	Learners []uint64 `json:"learners,omitempty"`
}

// ErrMetaMismatch: the data dir belongs to another node, group or cluster,
// or was made with another file size.
var ErrMetaMismatch = errors.New("raftlog: raft/meta does not match")

const metaName = "meta"

// joiningName marks a raft dir bootstrapped empty that has not yet caught
// up with a leader (Log.Joining). A member whose data dir was wiped (or
// lost) comes back through a bootstrap like a new one: it has forgotten
// its votes and the entries it acknowledged, so until it holds entries
// and has applied up to the highest commit index a leader told it, it
// must not vote for a candidate that has a log (its empty log would let a
// candidate lacking entries it helped commit win; issue 14). The marker
// survives restarts until then.
const joiningName = "joining"

// Joining reports whether this replica was bootstrapped empty and has not
// caught up with a leader since (see joiningName).
func (l *Log) Joining() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.joining
}

// Joined records, durably, that this replica has caught up with a leader
// once: the joining marker is removed (and the directory synced).
func (l *Log) Joined() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.joining {
		return nil
	}
	if err := l.opts.FS.Remove(filepath.Join(l.opts.Dir, joiningName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raftlog: remove the joining marker: %w", err)
	}
	if err := base.SyncDir(l.opts.FS, l.opts.Dir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	l.joining = false
	return nil
}

// loadOrBootstrapMeta reads dir/meta; when it is absent it writes want
// (atomically, synced). A present meta must equal want in every field
// but LogBase (which only the bootstrap knows); the one on disk is
// returned.
//
// A raft dir without raft/meta whose log holds entries lost it: that is a
// *CorruptionError (bootstrapping again would forget who this member is
// and where its first entry lies); `storaged replica repair --from PEER
// --raft-id N …` rebuilds it. units is the index file size in units.
//
// changed: raft/conf records conf changes, so the membership and the
// cluster id (a digest of the bootstrap membership) are no longer what the
// flags of a later start can say; only the node, group and file size are
// checked then.
func loadOrBootstrapMeta(fsys vfs.FS, dir string, want Meta, units int, changed bool) (Meta, bool, error) {
	b, err := fsys.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, fs.ErrNotExist) {
		if held, err := holdsEntries(fsys, dir, units); err != nil {
			return Meta{}, false, err
		} else if held {
			return Meta{}, false, lostMeta("is missing")
		}
		body, err := json.Marshal(want)
		if err != nil {
			return Meta{}, false, err
		}
		if err := initHardState(fsys, dir); err != nil {
			return Meta{}, false, fmt.Errorf("raftlog: bootstrap: %w", err)
		}
		// The joining marker goes first: a dir with raft/meta and without
		// the marker is a member that has caught up once.
		if err := base.WriteAtomic(fsys, dir, joiningName, []byte("bootstrapped empty; removed once caught up with a leader\n")); err != nil {
			return Meta{}, false, fmt.Errorf("raftlog: bootstrap: %w", err)
		}
		if err := base.WriteAtomic(fsys, dir, metaName, base.Seal(body)); err != nil {
			return Meta{}, false, fmt.Errorf("raftlog: bootstrap: %w", err)
		}
		return want, true, nil
	}
	if err != nil {
		return Meta{}, false, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(b)
	if !ok {
		return Meta{}, false, lostMeta("fails its CRC")
	}
	var got Meta
	if err := json.Unmarshal(body, &got); err != nil {
		return Meta{}, false, lostMeta(err.Error())
	}
	if changed {
		want.ClusterUUID, want.Voters, want.Learners = "", got.Voters, got.Learners
	}
	return got, false, checkMeta(got, want)
}

// checkMeta says how got (raft/meta on disk) differs from want (what the
// member's flags say), wrapping ErrMetaMismatch; nil when it does not
// (LogBase aside, which only the bootstrap knows).
func checkMeta(got, want Meta) error {
	switch {
	case got.NodeID != want.NodeID:
		return fmt.Errorf("%w: the data dir belongs to node %d, not %d (ids are never reused)", ErrMetaMismatch, got.NodeID, want.NodeID)
	case got.Group != want.Group:
		return fmt.Errorf("%w: the data dir belongs to group %q, not %q", ErrMetaMismatch, got.Group, want.Group)
	case want.ClusterUUID != "" && got.ClusterUUID != want.ClusterUUID:
		return fmt.Errorf("%w: cluster %s, not %s", ErrMetaMismatch, got.ClusterUUID, want.ClusterUUID)
	case got.FileSize != want.FileSize:
		return fmt.Errorf("%w: commitlog file size %d, not %d", ErrMetaMismatch, got.FileSize, want.FileSize)
	case !slices.Equal(got.Voters, want.Voters) || !slices.Equal(got.Learners, want.Learners):
		return fmt.Errorf("%w: bootstrap members %v/%v, not %v/%v", ErrMetaMismatch, got.Voters, got.Learners, want.Voters, want.Learners)
	}
	return nil
}

// lostMeta is the refusal to start on a damaged raft/meta (or a missing
// one while the log holds entries).
func lostMeta(why string) error {
	return &base.CorruptionError{File: "raft/meta", Reason: "raft/meta " + why + " (storaged replica repair --from PEER with this " +
		"member's --raft-id, --raft-peers and --raft-group rebuilds it from a peer's)"}
}

// ReadMeta reads raft/meta from the raft directory dir, offline (the
// repair tool names its group, cluster and id from it). A dir never
// bootstrapped is an error wrapping fs.ErrNotExist.
func ReadMeta(fsys vfs.FS, dir string) (Meta, error) {
	b, err := fsys.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		return Meta{}, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(b)
	var m Meta
	if !ok || json.Unmarshal(body, &m) != nil {
		return Meta{}, lostMeta("is damaged")
	}
	return m, nil
}

// PeerState is a member's identity and durable raft state as it serves
// them to a peer repairing its raft/meta or raft/hardstate (State, the
// FetchState peer RPC).
type PeerState struct {
	Meta Meta
	// Term and Commit are the HardState on disk; First is FirstIndex and
	// Last the last synced index.
	Term, Commit, First, Last uint64
	// Joining: bootstrapped empty and not caught up with a leader yet
	// (Joining): its log may lack entries it acknowledged before its data
	// dir was lost, so it proves nothing about what was committed.
	Joining bool
}

// State returns raft/meta and the durable raft state.
func (l *Log) State() (PeerState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return PeerState{}, l.stopped
	}
	m := l.meta
	m.Voters, m.Learners = slices.Clone(m.Voters), slices.Clone(m.Learners)
	return PeerState{Meta: m, Term: l.hs.cur.Term, Commit: l.hs.cur.Commit, First: l.first, Last: l.synced, Joining: l.joining}, nil
}
