package storage

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/storaged/storaged/storage/replica"
	"github.com/storaged/storaged/storage/snapshot"
)

// Snapshots (design replication.md §3.5) are file transfers: a follower
// that fell behind what the leader's raft log still holds (FirstIndex,
// moved up by raftlog.Compact) gets the leader's commitlog files from the
// oldest one kept up to the commit end at the snapshot's index, described
// by a manifest (storage/snapshot). Built: the manifest (manifestAt), the
// sending side (raft's MsgSnap leaves the raft loop through
// groupHost.SendSnapshot; the transport's SendSnapshot streams the files,
// pinned against retention, and the outcome is reported to raft), the
// receiving side (ReceiveSnapshot: the MsgSnap checked against this
// replica and its manifest, the files staged in <data dir>/snapshot.tmp
// and verified by snapshot.Stage, then the MsgSnap stepped into raft,
// which restores it; the raft loop installs it: group_install.go) and the
// peer transport's InstallSnapshot stream (server/peer). StepPeer refuses
// a MsgSnap that comes without its files. Retention compacts the raft log
// before it deletes files (retentionHost.BeforeDelete), which is what
// makes raft send a snapshot to a follower behind it.

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
	info := s.group.node.Info() // applied index and its commit end, read together
	term, err := s.group.rlog.Term(info.Applied)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("storage: snapshot at %d: %w", info.Applied, err)
	}
	return s.manifestAt(info.Applied, term, info.CommitEnd)
}

// manifestAt builds the manifest of a snapshot at raft index index of
// term term, whose commit end is end.
func (s *Store) manifestAt(index, term uint64, end int64) (snapshot.Manifest, error) {
	if s.closed.Load() {
		return snapshot.Manifest{}, ErrClosed
	}
	fileSize := s.opts.FileSize
	minOff := s.log.MinOffset()
	if end < minOff {
		return snapshot.Manifest{}, fmt.Errorf("storage: snapshot at %d ends at %d, below the oldest commitlog file at %d", index, end, minOff)
	}
	if d := s.index.Dispatched(); d < minOff {
		return snapshot.Manifest{}, fmt.Errorf("storage: snapshot: indexed up to %d, below the oldest file at %d", d, minOff)
	}
	m := snapshot.Manifest{Version: snapshot.Version, Index: index, Term: term, FileSize: fileSize, MinOffset: minOff, End: end}
	var err error
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
	topics, deleted, topicsIndex := s.topics.state()
	for name, n := range topics {
		m.Topics = append(m.Topics, snapshot.Topic{Name: name, Queues: n})
	}
	slices.SortFunc(m.Topics, func(a, b snapshot.Topic) int { return strings.Compare(a.Name, b.Name) })
	for name, at := range deleted {
		m.Deleted = append(m.Deleted, snapshot.Tombstone{Name: name, At: at})
	}
	slices.SortFunc(m.Deleted, func(a, b snapshot.Tombstone) int { return strings.Compare(a.Name, b.Name) })
	m.TopicsIndex = topicsIndex
	// The delivery progress: its commands go with the compacted log.
	manifestProgress(&m, s.group.progress())
	if err := m.Check(); err != nil {
		return snapshot.Manifest{}, err
	}
	return m, nil
}

// SnapshotSender is implemented by a Transport that carries snapshots
// (server/peer's): SendSnapshot must not block, and must call s.Done once.
type SnapshotSender interface {
	SendSnapshot(to uint64, s snapshot.Outgoing)
}

// ErrNoSnapshotTransport: raft needs to send a snapshot and the transport
// carries none.
var ErrNoSnapshotTransport = errors.New("storage: the transport carries no snapshots")

// SendSnapshot is raft's MsgSnap for peer to, handed over by the raft loop
// (replica.Host): the snapshot goes out through the transport's
// SendSnapshot, never through Send. The commitlog files stay pinned
// (retention deletes none) until it is done, and its outcome is reported
// to raft.
func (h *groupHost) SendSnapshot(to uint64, msg []byte, index, term uint64) {
	s := (*Store)(h)
	ss, ok := s.group.opts.Transport.(SnapshotSender)
	if !ok {
		s.opts.Logger.Warn().Err(ErrNoSnapshotTransport).Uint64("peer", to).Msg("storage: snapshot not sent")
		s.group.node.ReportSnapshot(to, false)
		return
	}
	s.group.pins.Add(1)
	ss.SendSnapshot(to, &outgoingSnapshot{s: s, to: to, msg: msg, index: index, term: term})
}

// outgoingSnapshot is one snapshot on its way (snapshot.Outgoing).
type outgoingSnapshot struct {
	s            *Store
	to           uint64
	msg          []byte
	index, term  uint64
	m            snapshot.Manifest
	built, ended bool
}

// Message builds the manifest and the MsgSnap carrying it. The snapshot
// is taken at this replica's applied index when that is past raft's
// (the log's base, FirstIndex-1): the base's own data may lie in files
// retention has just deleted (it compacts to the deletion point), and a
// later committed index costs the follower fewer entries afterwards.
func (o *outgoingSnapshot) Message() ([]byte, error) {
	g := o.s.group
	info := g.node.Info() // the applied index and the membership at it, read together
	if info.Applied > o.index {
		if term, err := g.rlog.Term(info.Applied); err == nil {
			o.index, o.term = info.Applied, term
		}
	}
	// The membership at o.index: the one at the applied index, unless a
	// conf change applied between them (then the next attempt is at the
	// applied index).
	mem := info.Membership
	if mem.Index > o.index {
		return nil, fmt.Errorf("storage: snapshot at %d: the membership changed at %d since", o.index, mem.Index)
	}
	end, err := g.rlog.DataEndAt(o.index)
	if err != nil {
		return nil, err
	}
	if o.m, err = o.s.manifestAt(o.index, o.term, end); err != nil {
		return nil, err
	}
	conf := g.rlog.Conf()
	o.m.PeerAddrs, o.m.Removed = conf.Addrs, conf.Removed
	data, err := o.m.Encode()
	if err != nil {
		return nil, err
	}
	o.built = true
	return replica.SnapshotMessageAt(o.msg, o.index, o.term, data, mem)
}

func (o *outgoingSnapshot) Read(chunkBytes int, send func(file, offset int64, data []byte, crc uint32) error) error {
	if !o.built {
		return errors.New("storage: snapshot read before its message")
	}
	return snapshot.Read(o.s.log, &o.m, chunkBytes, func(c snapshot.Chunk) error { return send(c.File, c.Offset, c.Data, c.CRC) })
}

func (o *outgoingSnapshot) Done(err error) {
	if o.ended {
		return
	}
	o.ended = true
	o.s.group.pins.Add(-1)
	if err != nil {
		o.s.opts.Logger.Warn().Err(err).Uint64("peer", o.to).Uint64("index", o.index).Msg("storage: snapshot not taken")
	}
	o.s.group.node.ReportSnapshot(o.to, err == nil)
}

// snapshotDir is the staging directory of an incoming snapshot, inside
// the data dir so that an install is a rename.
const snapshotDir = "snapshot.tmp"

// ErrBadSnapshot wraps the reasons ReceiveSnapshot refuses a snapshot.
var ErrBadSnapshot = errors.New("storage: snapshot refused")

// ReceiveSnapshot starts receiving a snapshot from member from (server/peer's
// SnapshotReceiver): msg is raft's MsgSnap, its data the manifest. It is
// refused unless it is a MsgSnap from that member, a member of the group,
// to this replica, whose manifest is at the MsgSnap's index and term, of
// this replica's commitlog file size, past this replica's commit index,
// holding at least one file and within the disk the data dir has free;
// one at a time. The files are staged in <data dir>/snapshot.tmp and
// verified (snapshot.Stage); Finish then steps the MsgSnap into raft and
// returns once the raft loop has installed it (group_install.go), or
// found it not needed. Until the install's journal is written nothing
// this replica stored changes.
func (s *Store) ReceiveSnapshot(from uint64, msg []byte) (snapshot.Incoming, error) {
	if s.group == nil || s.group.node == nil {
		return nil, ErrNotGroup
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if err := s.WriteErr(); err != nil {
		// Stopped, maybe by an install that failed: its staging dir must
		// stay for the restart to finish it.
		return nil, err
	}
	sfrom, to, index, term, data, err := replica.SnapshotOf(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSnapshot, err)
	}
	switch {
	case to != s.group.opts.ID:
		return nil, fmt.Errorf("%w: for member %d, this is %d", ErrBadSnapshot, to, s.group.opts.ID)
	case sfrom != from || from == s.group.opts.ID || !s.group.node.TakesSnapshotFrom(from):
		return nil, fmt.Errorf("%w: from member %d on member %d's stream", ErrBadSnapshot, sfrom, from)
	}
	m, err := snapshot.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSnapshot, err)
	}
	if m.Index != index || m.Term != term {
		return nil, fmt.Errorf("%w: a manifest at %d/%d in a MsgSnap at %d/%d", ErrBadSnapshot, m.Index, m.Term, index, term)
	}
	if c := s.group.node.Info().Commit; index <= c {
		return nil, fmt.Errorf("%w: at index %d, this replica has committed up to %d", ErrBadSnapshot, index, c)
	}
	if len(m.Files) == 0 {
		return nil, fmt.Errorf("%w: a snapshot without a commitlog file (ends at %d)", ErrBadSnapshot, m.End)
	}
	room := int64(0)
	if u, err := s.opts.StatDisk(s.opts.Dir); err == nil {
		room = int64(u.Avail) - s.opts.FileSize // keep a file's worth for the log itself
	}
	if !s.group.receiving.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: a snapshot is already being received", ErrBadSnapshot)
	}
	st, err := snapshot.NewStage(snapshot.StageOptions{FS: s.opts.FS, Dir: filepath.Join(s.opts.Dir, snapshotDir),
		FileSize: s.opts.FileSize, MaxBytes: max(room, 1), RequireCRC: !s.opts.DisablePropCRC}, m)
	if err != nil {
		s.group.receiving.Store(false)
		return nil, fmt.Errorf("%w: %w", ErrBadSnapshot, err)
	}
	return &incomingSnapshot{s: s, st: st, msg: msg}, nil
}

// incomingSnapshot is one snapshot being staged (snapshot.Incoming).
type incomingSnapshot struct {
	s    *Store
	st   *snapshot.Stage
	msg  []byte // the MsgSnap
	done bool
}

func (in *incomingSnapshot) Write(file, offset int64, data []byte, crc uint32) error {
	return in.st.Write(snapshot.Chunk{File: file, Offset: offset, Data: data, CRC: crc})
}

// Finish verifies the staged files, hands them to the raft loop and steps
// the MsgSnap into raft; it returns once raft has dealt with it: installed
// (nil), not needed (nil: raft ignored a stale snapshot, the staged files
// are removed), or the install's error (the replica stopped; the staging
// dir stays for the restart, which finishes the install when its journal
// was written and removes the dir otherwise).
func (in *incomingSnapshot) Finish() error {
	if err := in.st.Finish(); err != nil {
		in.Discard()
		return err
	}
	g := in.s.group
	m := in.st.Manifest()
	g.stagedMu.Lock()
	g.staged = in.st
	g.stagedMu.Unlock()
	installed, err := g.node.StepSnapshot(in.msg)
	g.stagedMu.Lock()
	g.staged = nil
	g.stagedMu.Unlock()
	log := in.s.opts.Logger
	switch {
	case err != nil:
		in.done = true
		g.receiving.Store(false)
		log.Error().Err(err).Uint64("index", m.Index).Msg("storage: snapshot not installed")
		return err
	case !installed:
		log.Info().Uint64("index", m.Index).Msg("storage: snapshot staged and verified, not needed by raft (stale); discarded")
	}
	in.Discard()
	return nil
}

func (in *incomingSnapshot) Discard() {
	if in.done {
		return
	}
	in.done = true
	if err := in.st.Discard(); err != nil {
		in.s.opts.Logger.Warn().Err(err).Msg("storage: could not remove the snapshot staging dir")
	}
	in.s.group.receiving.Store(false)
}
