package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/replica"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/timers"
)

// Group mode (design replication.md §3): the store is one replica of a
// raft group whose log is its commitlog (storage/raftlog), driven by
// storage/replica's raft loop. What changes against a single node:
//
//   - puts are stamped (queue offsets, physical offset, store time) and
//     proposed on the ready leader only, and answered PUT_OK once their
//     entry commits (on a majority, each member synced); the bytes reach
//     the commitlog through the raft loop on every replica alike;
//   - readers and the dispatcher stop at the commit end, not the flushed
//     end, on the leader and on followers (followers index what commits,
//     so they serve reads);
//   - the flush policy is the raft loop itself (one sync per Ready).

// Transport carries marshalled raft messages to peers (replica.Transport):
// Send must not block and may drop.
type Transport = replica.Transport

// NotLeaderError: this replica did not take the put and nothing was
// stored; the cause is NOT_LEADER, NO_LEADER, LEADER_NOT_READY,
// TRANSFERRING or SUPERSEDED (proposed, then another term's entry
// committed over its position). It wraps ErrNotLeader.
type NotLeaderError = replica.NotLeaderError

// Causes of a NotLeaderError (NotLeaderError.Cause).
const (
	CauseNotLeader      = replica.CauseNotLeader
	CauseNoLeader       = replica.CauseNoLeader
	CauseLeaderNotReady = replica.CauseLeaderNotReady
	CauseTransferring   = replica.CauseTransferring
	CauseSuperseded     = replica.CauseSuperseded
	CauseRemoved        = replica.CauseRemoved
)

// ReplicaInfo is a replica's view of its group (Store.ReplicaInfo).
type ReplicaInfo = replica.Info

// ReplicaPeer is the leader's view of one member.
type ReplicaPeer = replica.PeerInfo

// Errors of group mode.
var (
	// ErrNotLeader is wrapped by every *NotLeaderError.
	ErrNotLeader = replica.ErrNotLeader
	// ErrInSyncReplicasNotEnough: the leader has too few recently active
	// followers (IN_SYNC_REPLICAS_NOT_ENOUGH); nothing stored.
	ErrInSyncReplicasNotEnough = replica.ErrInSyncReplicasNotEnough
	// ErrReplicationTimeout: proposed but not committed within
	// GroupOptions.ReplicationTimeout (FLUSH_SLAVE_TIMEOUT, returned as an
	// error): the outcome is unknown.
	ErrReplicationTimeout = replica.ErrReplicationTimeout
	// ErrLostEntries: this replica's leader counts entries as
	// acknowledged here that its log no longer holds (a rolled-back data
	// dir); the replica stopped (the store's sticky write error wraps it).
	ErrLostEntries = replica.ErrLostEntries
	// ErrReadIndexTimeout: a linearizable read's leadership check (raft
	// ReadIndex) did not complete within GroupOptions.ReplicationTimeout
	// (a leader cut off from its quorum, a slow index); nothing was read,
	// a retry is safe.
	ErrReadIndexTimeout = replica.ErrReadIndexTimeout
	// ErrReadIndexBusy: GroupOptions.MaxReadWaiters linearizable reads
	// wait already; nothing was read, retry shortly.
	ErrReadIndexBusy = replica.ErrReadIndexBusy
	// ErrNotGroup: a group-mode call on a standalone store.
	ErrNotGroup = errors.New("storage: the store is not in group mode")
	// ErrGroupUnsupported: an operation group mode does not replicate yet
	// (POP consumption).
	ErrGroupUnsupported = errors.New("storage: not supported in group mode yet")
)

// GroupOptions put the store in group mode. Phase 1: static membership,
// the sync path only (FlushMode must be FlushSync, Role RoleMaster).
type GroupOptions struct {
	// ID is this replica's raft id (never reused). Required, non-zero.
	ID uint64
	// Name is the group's name and ClusterID the cluster's UUID, recorded
	// in raft/meta at bootstrap and checked on every later Open.
	Name      string
	ClusterID string
	// Peers are the voters (this replica among them unless it is a
	// learner), Learners the non-voting members: the bootstrap ConfState.
	// Once a membership change applied (group_members.go), raft/conf
	// holds the membership and these are not checked any more.
	Peers    []uint64
	Learners []uint64
	// Join: this replica joins an existing group (AddLearner on its
	// leader): it bootstraps with no membership and learns it from the
	// leader's log or snapshot; Peers and Learners are not used. ClusterID
	// must be the group's (the one raft/meta of its members records).
	Join bool
	// OnMembership, if set, is told each membership change this replica
	// applies (and the membership of an installed snapshot), on the raft
	// goroutine, in log order: storaged adds and removes peers of its
	// transport there. It must not call the store's group methods.
	OnMembership func(MembershipUpdate)
	// Transport sends to peers. Required.
	Transport Transport
	// TickInterval is raft's tick (storaged --raft-tick). Default 100 ms
	// (tests 10-50 ms); at most MaxTickInterval unless Ticks is set.
	TickInterval time.Duration
	// Ticks, when set, replaces the ticker: one raft tick per receive
	// (a test seam).
	Ticks <-chan time.Time
	// ElectionTick (default 10) and HeartbeatTick (default 1) in ticks:
	// a follower that hears no leader for ElectionTick ticks (randomized
	// by raft up to twice that) campaigns, and the leader heartbeats every
	// HeartbeatTick. ElectionTick must be above HeartbeatTick and at most
	// MaxElectionTick; storaged sets it to --raft-election-timeout divided
	// by --raft-tick. The election timeout also bounds a leadership
	// transfer's wait (two of them) and the lease a follower keeps for
	// its leader (CheckQuorum): keep ElectionTick × TickInterval well
	// above the disk's sync tail, or a slow sync costs the leadership.
	ElectionTick  int
	HeartbeatTick int
	// ReplicationTimeout is how long a proposed put waits for its commit
	// before FLUSH_SLAVE_TIMEOUT (outcome unknown). Default
	// SyncFlushTimeout.
	ReplicationTimeout time.Duration
	// IndexUnits is raftlog's units per index file (0: its default; tests
	// use small files).
	IndexUnits int
	// MaxReadWaiters bounds the linearizable reads (ReadBarrier) waiting
	// for their leadership check at once; beyond it ErrReadIndexBusy.
	// Default replica.DefaultMaxReadWaiters (4096).
	MaxReadWaiters int
	// FollowerReads lets a follower or learner serve linearizable reads
	// (ReadBarrier): it asks the leader for its read index and answers
	// once it applied that far (replica.Options.FollowerReads). Off, a
	// follower refuses them with NOT_LEADER.
	FollowerReads bool
	// CatchUpWindow bounds, in commitlog bytes below the commit end, how
	// far back the leader keeps files that expired (FileReservedTime) for
	// a follower still catching up from the raft log: a follower further
	// behind gets a snapshot instead (design §3.5). Bytes, not entries:
	// retention deletes files, and catching up from the log costs reads
	// of cold pages on the raft goroutine in proportion to bytes (an entry
	// is one message or a 4 MiB batch). Default DefaultCatchUpWindow.
	CatchUpWindow int64
	// CatchUpReadahead: a leader asks the kernel (MADV_WILLNEED) to read
	// this many commitlog bytes ahead of a follower that is more than half
	// of it behind, so that the raft goroutine copies entries for it from
	// memory instead of faulting cold pages in one by one under the node's
	// lock, where every put waits (design §8). 0 (the default): off; at
	// most MaxCatchUpReadahead. Off by default because on the VM of
	// BENCHMARKS.md it did not help ("Reading ahead of a follower");
	// 32 MiB, four times what raft keeps in flight to one follower
	// (replica.DefaultMaxInflightBytes), is the size to try where cold
	// reads are slow (storaged_raft_storage_entries_seconds).
	CatchUpReadahead int64

	// installHook, if set (tests), is told each step of a snapshot
	// install as it completes: the crash points of the install tests.
	installHook func(step string)
	// dedupReadHook, if set (tests), is called before each full read of
	// the idempotent-put window (groupdedup.go).
	dedupReadHook func()
	// markEvery, if set (tests), replaces raftlog.MarkEvery: the
	// checkpoints write raft/mark that much more often.
	markEvery uint64
	// maxInflightBytes and maxSizePerMsg, if set (tests), lower raft's
	// bounds (replica.Options), so that a catch-up takes many rounds.
	maxInflightBytes, maxSizePerMsg uint64
	// maxUncommittedBytes, if set (tests), lowers raft's bound on the
	// bytes proposed and not committed, past which it drops proposals.
	maxUncommittedBytes uint64
}

// Bounds of the raft timing options (GroupOptions.TickInterval,
// ElectionTick).
const (
	MaxTickInterval = 10 * time.Second
	MaxElectionTick = 1000
)

// DefaultCatchUpWindow is GroupOptions.CatchUpWindow's default (design
// §3.5: 4 GiB, about a minute of a saturated disk here).
const DefaultCatchUpWindow = 4 << 30

// MaxCatchUpReadahead bounds GroupOptions.CatchUpReadahead.
const MaxCatchUpReadahead = 1 << 30

func (g *GroupOptions) withDefaults(o Options) {
	if g.TickInterval == 0 {
		g.TickInterval = 100 * time.Millisecond
	}
	if g.ElectionTick == 0 {
		g.ElectionTick = 10
	}
	if g.HeartbeatTick == 0 {
		g.HeartbeatTick = 1
	}
	if g.ReplicationTimeout == 0 {
		g.ReplicationTimeout = o.SyncFlushTimeout
	}
	if g.MaxReadWaiters == 0 {
		g.MaxReadWaiters = replica.DefaultMaxReadWaiters
	}
	if g.CatchUpWindow == 0 {
		g.CatchUpWindow = DefaultCatchUpWindow
	}
}

func (g *GroupOptions) validate(o Options) []error {
	var errs []error
	if o.FlushMode != FlushSync {
		errs = append(errs, errors.New("group mode needs FlushMode sync (an async replica could forget acknowledged entries and elect a leader without them)"))
	}
	if o.Role != RoleMaster {
		errs = append(errs, errors.New("group mode elects its leader: Role slave is not allowed"))
	}
	members := append(append([]uint64(nil), g.Peers...), g.Learners...)
	slices.Sort(members)
	switch {
	case g.ID == 0:
		errs = append(errs, errors.New("Group.ID must be non-zero"))
	case !g.Join && !slices.Contains(members, g.ID):
		errs = append(errs, fmt.Errorf("Group.ID %d is not among the peers %v or learners %v", g.ID, g.Peers, g.Learners))
	}
	if !g.Join && (len(g.Peers) == 0 || slices.Contains(members, 0) || len(slices.Compact(members)) != len(g.Peers)+len(g.Learners)) {
		errs = append(errs, fmt.Errorf("Group.Peers %v / Learners %v: want at least one voter, distinct non-zero ids", g.Peers, g.Learners))
	}
	if g.Transport == nil {
		errs = append(errs, errors.New("Group.Transport is required"))
	}
	if g.CatchUpWindow < 0 {
		errs = append(errs, fmt.Errorf("Group.CatchUpWindow %d must not be negative", g.CatchUpWindow))
	}
	if g.CatchUpReadahead < 0 || g.CatchUpReadahead > MaxCatchUpReadahead {
		errs = append(errs, fmt.Errorf("Group.CatchUpReadahead %d: want 0 (off) to %d", g.CatchUpReadahead, int64(MaxCatchUpReadahead)))
	}
	if g.TickInterval < 0 || g.ReplicationTimeout < 0 || g.ElectionTick < 0 || g.HeartbeatTick < 0 || g.MaxReadWaiters < 0 ||
		(g.ElectionTick > 0 && g.HeartbeatTick > 0 && g.ElectionTick <= g.HeartbeatTick) {
		errs = append(errs, errors.New("Group: negative durations, or ElectionTick not above HeartbeatTick"))
	}
	// (A test driving the ticks itself may set a long TickInterval: it
	// then bounds only a leadership transfer's wait.)
	if (g.TickInterval > MaxTickInterval && g.Ticks == nil) || g.ElectionTick > MaxElectionTick {
		errs = append(errs, fmt.Errorf("Group: TickInterval %v (at most %v), ElectionTick %d (at most %d)",
			g.TickInterval, MaxTickInterval, g.ElectionTick, MaxElectionTick))
	}
	return errs
}

// groupState is the store's side of group mode.
type groupState struct {
	opts GroupOptions
	rlog *raftlog.Log
	node *replica.Node
	// running is node once startGroup has set it: the one way to reach
	// the node from a goroutine Open starts before it (the consume
	// queues' checkpoint, raftPoint). Everything else runs after Open
	// returns, which orders it after the write of node.
	running   atomic.Pointer[replica.Node]
	commitEnd atomic.Int64
	// pins counts the snapshots being sent: while any is, retention
	// deletes no commitlog file (their manifests name them).
	pins atomic.Int64
	// receiving: a snapshot is being staged (ReceiveSnapshot).
	receiving atomic.Bool
	// staged is the verified snapshot whose MsgSnap is being stepped into
	// raft (incomingSnapshot.Finish): the raft loop installs it.
	stagedMu sync.Mutex
	staged   *snapshot.Stage

	mu       sync.Mutex
	advanced chan struct{} // closed and replaced when commitEnd moves

	// dedup is the state of the idempotent-put window (groupdedup.go).
	dedup *dedupReader

	// delayMu guards the delay progress replicated in the log (design
	// §3.5): level → next queue offset, from the last committed progress
	// command (recovered at Open from the raft log, then applied by the
	// raft goroutine), and that command's raft index.
	delayMu    sync.Mutex
	delayProg  map[int]int64
	delayIndex uint64
	// timerProg is the timer progress replicated in the log (the last
	// committed command; timerIndex its raft index); guarded by delayMu.
	timerProg  timers.Progress
	timerIndex uint64
	// progressMu serializes writes of config/groupProgress.json;
	// progressWritten is the delay and timer command indexes it holds,
	// progressThrough its Through.
	progressMu      sync.Mutex
	progressWritten [2]uint64
	progressThrough uint64
}

func (g *groupState) waitChan() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.advanced
}

func (g *groupState) signal() {
	g.mu.Lock()
	close(g.advanced)
	g.advanced = make(chan struct{})
	g.mu.Unlock()
}

// groupCommitEnd is what recovery must treat as acknowledged in group
// mode: the commit end of the raft log (read before anything is
// recovered, design §3.4), at least the checkpoint's flushed offset; and
// the synced extents past it, where only a torn write may be cut.
func (s *Store) groupCommitEnd(cpFlushed int64) (int64, commitlog.Synced, error) {
	g := s.opts.Group
	dir := filepath.Join(s.opts.Dir, "raft")
	ce, err := raftlog.CommitEnd(s.opts.FS, dir, g.IndexUnits)
	if err != nil {
		return 0, nil, err
	}
	synced, err := raftlog.SyncedData(s.opts.FS, dir, g.IndexUnits)
	if err != nil {
		return 0, nil, err
	}
	return max(ce, cpFlushed), synced, nil
}

// openGroupLog opens the raft log over the recovered commitlog (which it
// starts) and sets the commit end readers stop at.
func (s *Store) openGroupLog(cp consumequeue.Checkpoint, checked int64) error {
	g := s.opts.Group
	s.log.Start()
	// A snapshot staged when the last run stopped was never installed (an
	// install it started has its journal, and rollForwardInstall has used
	// the staged files already): it is garbage.
	if err := s.opts.FS.RemoveAll(filepath.Join(s.opts.Dir, snapshotDir)); err != nil {
		return fmt.Errorf("storage: remove a stale snapshot staging dir: %w", err)
	}
	var voters, learners []uint64
	if !g.Join { // a joining member learns the membership from the group
		voters = slices.Sorted(slices.Values(g.Peers))
		if len(g.Learners) > 0 {
			learners = slices.Sorted(slices.Values(g.Learners))
		}
	}
	rl, err := raftlog.Open(raftlog.Options{FS: s.opts.FS, Dir: filepath.Join(s.opts.Dir, "raft"), Commitlog: s.log,
		Meta: raftlog.Meta{NodeID: g.ID, Group: g.Name, ClusterUUID: g.ClusterID, FileSize: s.opts.FileSize,
			Voters: voters, Learners: learners},
		RequireCRC: !s.opts.DisablePropCRC, Flushed: cp.Flushed, Checked: checked, IndexUnits: g.IndexUnits})
	if err != nil {
		return err
	}
	first, _ := rl.FirstIndex()
	from, last := rl.RecoveryWalk()
	s.opts.Logger.Info().Uint64("first_index", first).Uint64("walk_from", from).Uint64("last_index", last).
		Uint64("units_walked", (last+1)-min(from, last+1)).Msg("storage: raft log recovered")
	ce, err := raftlog.CommitEnd(s.opts.FS, filepath.Join(s.opts.Dir, "raft"), g.IndexUnits)
	if err != nil {
		rl.Close()
		return err
	}
	if err := checkCheckpointRaft(rl, cp); err != nil {
		rl.Close()
		return err
	}
	s.group = &groupState{opts: *g, rlog: rl, advanced: make(chan struct{}), dedup: newDedupReader(g.dedupReadHook)}
	s.group.commitEnd.Store(ce)
	// The topic commands committed after the table on disk, before the
	// consume queues are loaded: a delete's tombstone must hold then.
	hs, _, err := rl.InitialState()
	if err == nil {
		err = s.replayTopicCmds(hs.GetCommit())
	}
	if err != nil {
		rl.Close()
		s.group = nil
		return err
	}
	return nil
}

// raftPoint is the raft state the checkpoint records (design §3.6):
// the applied index, its term and commit end, read together, and the
// raft log's durable data end; ok is false standalone or before the raft
// node runs.
func (s *Store) raftPoint() (consumequeue.RaftPoint, bool) {
	g := s.group
	if g == nil {
		return consumequeue.RaftPoint{}, false
	}
	node := g.running.Load()
	if node == nil {
		return consumequeue.RaftPoint{}, false
	}
	info := node.Info()
	if info.Applied == 0 {
		return consumequeue.RaftPoint{}, false
	}
	// The applied index the checkpoint records must be at or below the
	// commit on disk (Open starts raft with Applied = that commit).
	if err := g.rlog.SyncCommit(); err != nil {
		return consumequeue.RaftPoint{}, false
	}
	term, err := g.rlog.Term(info.Applied)
	if err != nil {
		return consumequeue.RaftPoint{}, false // compacted meanwhile: record none this time
	}
	// The raft log's own mark (raftlog.SaveMark), every MarkEvery entries:
	// where the next start's walk of the index begins.
	every := uint64(raftlog.MarkEvery)
	if g.opts.markEvery > 0 {
		every = g.opts.markEvery
	}
	if err := g.rlog.SaveMark(every); err != nil {
		s.logLimit.Event("raft mark", s.opts.Logger.Warn()).Err(err).Msg("storage: raft/mark not written (the next start walks the raft index further)")
	}
	// The delivery progress likewise, through the applied index read
	// above (before the progress is): a start reads the progress commands
	// past it only (loadProgress).
	if err := s.persistProgress(info.Applied, every); err != nil {
		s.logLimit.Event("progress file", s.opts.Logger.Warn()).Err(err).Msg("storage: replicated delivery progress not written (the next start reads the raft log further)")
	}
	return consumequeue.RaftPoint{RaftApplied: info.Applied, RaftAppliedTerm: term, CommitEnd: info.CommitEnd,
		LogEnd: g.rlog.DurableEnd()}, true
}

// checkCheckpointRaft checks the checkpoint's raft point against the raft
// log recovered at Open: the log must still hold the applied index the
// checkpoint records (entries applied were synced first, so a log that
// ends below it lost acknowledged entries, or is another member's), with
// the same term where the log still has it (a compacted index cannot be
// checked). Either failure is a *CorruptionError: starting would serve
// consume queues and state built from entries the raft log does not
// hold. A checkpoint without a raft point (standalone before, or an
// older version) is not checked.
func checkCheckpointRaft(rl *raftlog.Log, cp consumequeue.Checkpoint) error {
	p := cp.RaftPoint
	if p.RaftApplied == 0 {
		return nil
	}
	last, err := rl.LastIndex()
	if err != nil {
		return err
	}
	if last < p.RaftApplied {
		return &CorruptionError{File: consumequeue.CheckpointName, Reason: fmt.Sprintf(
			"the checkpoint records raft index %d applied, the raft log ends at %d: the raft directory lost entries this member applied (restore it, or repair the member from a peer)",
			p.RaftApplied, last)}
	}
	first, err := rl.FirstIndex()
	if err != nil {
		return err
	}
	if p.RaftApplied+1 < first {
		return nil // compacted past it
	}
	term, err := rl.Term(p.RaftApplied)
	if err != nil {
		return err
	}
	if term != p.RaftAppliedTerm {
		return &CorruptionError{File: consumequeue.CheckpointName, Reason: fmt.Sprintf(
			"the checkpoint records raft index %d applied in term %d, the raft log holds term %d there: the raft directory is not the log this data dir applied",
			p.RaftApplied, p.RaftAppliedTerm, term)}
	}
	return nil
}

// startGroup starts the raft node, once everything up to the commit end
// is indexed: raft hands back only entries above Applied = the commit
// index (the consume queues were rebuilt up to it).
func (s *Store) startGroup() error {
	g := s.group
	hs, _, err := g.rlog.InitialState()
	if err != nil {
		return err
	}
	// The replicated delivery progress (group_progress.go).
	if err := s.loadProgress(hs.GetCommit()); err != nil {
		return err
	}
	// The replicated topic table (grouptopics.go): the commands committed
	// after the table on disk were replayed by openGroupLog; changes go
	// through the log from now on.
	s.topics.replicate = s.replicateTopic
	g.node, err = replica.New(replica.Options{ID: g.opts.ID, Log: g.rlog, FileSize: s.opts.FileSize, Applied: hs.GetCommit(),
		Transport: g.opts.Transport, Host: (*groupHost)(s), Ticks: g.opts.Ticks, TickInterval: g.opts.TickInterval,
		ElectionTick: g.opts.ElectionTick, HeartbeatTick: g.opts.HeartbeatTick, MaxReadWaiters: g.opts.MaxReadWaiters,
		FollowerReads: g.opts.FollowerReads, CatchUpReadahead: g.opts.CatchUpReadahead, MaxInflightBytes: g.opts.maxInflightBytes, MaxSizePerMsg: g.opts.maxSizePerMsg,
		MaxUncommittedBytes: g.opts.maxUncommittedBytes, Logger: raftLogger{s.opts.Logger.With().Str("component", "raft").Uint64("raft_id", g.opts.ID).Logger()}}, g.commitEnd.Load())
	if err != nil {
		return err
	}
	g.running.Store(g.node)
	// The window's first read, up to the commit end recovered at Open,
	// under way before this member's first commit or election (a group
	// started whole would otherwise elect a leader that only then begins
	// its read, and waits for it: groupdedup.go).
	s.dedupUpTo(g.commitEnd.Load())
	go s.dedupLoop()
	return nil
}

// groupHost is the store as the raft loop sees it.
type groupHost Store

var _ replica.Host = (*groupHost)(nil)

func (h *groupHost) Committed(commitEnd, lastTS int64, leader bool) {
	s := (*Store)(h)
	s.trackDedup(commitEnd, leader)
	if lastTS > s.seq.lastStoreTS.Load() {
		s.seq.lastStoreTS.Store(lastTS) // only the raft goroutine and (under the node's lock) Propose write it
	}
	if s.group.commitEnd.Load() != commitEnd {
		s.group.commitEnd.Store(commitEnd)
		s.index.Wake()
		s.group.signal()
	}
}

func (h *groupHost) BecomeReady(commitEnd int64) error {
	s := (*Store)(h)
	// The keys of every put committed so far, whichever leader took it
	// (idempotent.go): a retry sent here after a failover is answered,
	// not stored again. A follower kept its window up to the commit
	// (trackDedup): only what lies past it is read now. A full read runs
	// off the raft loop (groupdedup.go); until it ends this leader is not
	// ready, and the reader has it try again when it ends.
	if err := s.readyDedup(commitEnd); err != nil {
		return err
	}
	s.index.Run(commitEnd)
	if d := s.index.Dispatched(); d < commitEnd {
		return fmt.Errorf("storage: indexed up to %d, the commit end is %d", d, commitEnd)
	}
	// The stamping table from the consume queues (everything committed is
	// indexed): a former leader's stamps of a truncated suffix are gone.
	s.seq.init()
	// A delete proposed in an earlier leadership has applied by now, or
	// was cut from the log: its block goes (grouptopics.go).
	s.topics.clearBlocked()
	for _, k := range s.index.Keys() {
		if q := s.index.Queue(k.Topic, k.Queue); q != nil {
			s.seq.set(k, q.Count())
		}
	}
	s.forgetDedup() // the put path keeps the window from now on
	return nil
}

func (h *groupHost) Fail(err error) {
	s := (*Store)(h)
	if errors.Is(err, ErrRemoved) {
		// Not a failed write: the group goes on without this member, which
		// keeps serving reads of what it holds and refuses puts (REMOVED).
		s.opts.Logger.Warn().Err(err).Msg("storage: this member was removed from its group; it no longer replicates")
		return
	}
	s.fail(err)
}

// ApplyCmd applies a committed command: the delay or the timer progress.
// A command this version does not know, or one that does not decode, is
// logged and skipped (the progress then lags: deliveries repeat, none is
// lost).
func (h *groupHost) ApplyCmd(index uint64, data []byte) {
	s := (*Store)(h)
	if isTimerProgress(data) {
		p, err := decodeTimerProgress(data)
		if err != nil {
			s.opts.Logger.Error().Err(err).Uint64("raft_index", index).Msg("storage: bad timer progress command skipped")
			return
		}
		s.group.setTimerProgress(p, index)
		return
	}
	if isTopicCmd(data) {
		s.applyTopicCmd(index, data) // grouptopics.go
		return
	}
	if isTopicDeleteCmd(data) {
		if err := s.applyTopicDelete(index, data); err != nil {
			s.fail(err)
		}
		return
	}
	if !isDelayProgress(data) {
		s.opts.Logger.Warn().Uint64("raft_index", index).Int("bytes", len(data)).Msg("storage: unknown group command skipped")
		return
	}
	p, err := decodeDelayProgress(data)
	if err != nil {
		s.opts.Logger.Error().Err(err).Uint64("raft_index", index).Msg("storage: bad delay progress command skipped")
		return
	}
	s.group.setDelayProgress(p, index)
}

// setDelayProgress records the replicated delay progress of the command
// at index (never moving a level back: commands only grow it).
func (g *groupState) setDelayProgress(p map[int]int64, index uint64) {
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	if g.delayProg == nil {
		g.delayProg = map[int]int64{}
	}
	for level, off := range p {
		g.delayProg[level] = max(g.delayProg[level], off)
	}
	g.delayIndex = max(g.delayIndex, index)
}

// setTimerProgress records the replicated timer progress of the command
// at index. Commands apply in log order, and each leader proposes only
// after resuming from the last committed one, so the last is the one.
func (g *groupState) setTimerProgress(p timers.Progress, index uint64) {
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	if index >= g.timerIndex {
		g.timerProg, g.timerIndex = p, index
	}
}

// groupTimerProgress is the replicated timer progress; ok is false
// standalone.
func (s *Store) groupTimerProgress() (timers.Progress, bool) {
	if s.group == nil {
		return timers.Progress{}, false
	}
	g := s.group
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	return g.timerProg, true
}

// TimerProgress is the timer progress replicated in the group's log and
// the raft index of the command that set it last (0: none yet);
// standalone, the zero progress and 0.
func (s *Store) TimerProgress() (TimerProgress, uint64) {
	if s.group == nil {
		return TimerProgress{}, 0
	}
	g := s.group
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	return g.timerProg, g.timerIndex
}

// groupProposeTimerProgress proposes the timer progress as a command, on
// the ready leader of epoch only; standalone it does nothing.
func (s *Store) groupProposeTimerProgress(epoch uint64, p timers.Progress) error {
	if s.group == nil {
		return nil
	}
	return s.group.node.ProposeCmd(epoch, encodeTimerProgress(p))
}

// groupDelayProgress is the replicated delay progress (a copy); ok is
// false standalone.
func (s *Store) groupDelayProgress() (map[int]int64, bool) {
	if s.group == nil {
		return nil, false
	}
	g := s.group
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	return maps.Clone(g.delayProg), true
}

// DelayProgress is the delay progress replicated in the group's log
// (level → next queue offset of its schedule queue) and the raft index of
// the command that set it last (0: none yet); standalone, nil and 0.
func (s *Store) DelayProgress() (map[int]int64, uint64) {
	if s.group == nil {
		return nil, 0
	}
	g := s.group
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	return maps.Clone(g.delayProg), g.delayIndex
}

// groupEpoch is the term in which this replica became the ready leader
// (0: not the ready leader, or standalone).
func (s *Store) groupEpoch() uint64 {
	if s.group == nil || s.group.node == nil {
		return 0
	}
	return s.group.node.ReadyTerm()
}

// groupProposeProgress proposes the delay progress as a command, on the
// ready leader of epoch only; standalone it does nothing.
func (s *Store) groupProposeProgress(epoch uint64, next []int64) error {
	if s.group == nil {
		return nil
	}
	return s.group.node.ProposeCmd(epoch, encodeDelayProgress(next))
}

// groupCQLog is the commitlog as the consume queues see it in group mode.
// The checkpoint's flushed offset is the commit end: durable here (the
// raft loop applies only after its Sync), at most raftlog.DurableEnd, and
// never truncated, unlike the uncommitted suffix between the two, which a
// new leader may cut (a flushed offset past a truncation would make the
// next Open call the cut bytes damage). The commitlog is not synced here:
// the raft loop syncs everything it writes.
type groupCQLog struct {
	*commitlog.Log
	s *Store
}

func (g groupCQLog) Sync(int) (int64, error) {
	// The commit end first, then the commit made durable: a checkpoint
	// then never records as dispatched what a power cut could make
	// uncommitted again on this replica (the raft loop writes a
	// commit-only HardState change without syncing it, raftlog.SyncCommit).
	end := g.s.group.commitEnd.Load()
	if err := g.s.group.rlog.SyncCommit(); err != nil {
		return 0, err
	}
	return min(end, g.s.group.rlog.DurableEnd()), nil
}

// groupFlusher is the flush policy in group mode: the raft loop syncs, so
// a wait for an offset is a wait for the commit end to pass it.
type groupFlusher struct{ s *Store }

func (f groupFlusher) Wait(ctx context.Context, off int64) error {
	g := f.s.group
	timer := time.NewTimer(g.opts.ReplicationTimeout)
	defer timer.Stop()
	for {
		ch := g.waitChan()
		if g.commitEnd.Load() >= off {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return ErrReplicationTimeout
		}
	}
}
func (groupFlusher) Wake()        {}
func (groupFlusher) Close() error { return nil }

// entryFate tells a keyed put in a group (putOnce) its entry's outcome,
// also when raft decides it after the put stopped waiting (a replication
// timeout, ctx): groupPut sets taken once the entry is proposed, and then
// f is called exactly once, under the replica's lock (a leaf lock only),
// with the entry's append result and nil when it committed, or an error
// when it will never be stored (superseded) or this replica can no longer
// tell (closed; its log replaced by a snapshot).
type entryFate struct {
	f     func(AppendResult, error)
	taken bool
}

// groupPut stamps records on the ready leader, proposes them (in one
// entry with the other puts stamped before the raft loop's next round:
// replica.Node.Propose) and waits for its outcome (design §3.1). A put in group mode always
// waits for the commit (WAIT=false too): before it the entry may still be
// truncated. With fate, the entry's outcome is told to it whenever raft
// decides (entryFate), and the replica keeps the entry's waiter until
// then.
func (s *Store) groupPut(ctx context.Context, topic string, queueID, sysFlag int32, specs []record.Spec, batch bool, fate *entryFate) (PutResult, error) {
	b := s.stampBatch(topic, queueID, sysFlag, specs, batch)
	stamp := func(pos int64, dst []byte) ([]byte, func(), func(), error) {
		if err := b.admit(s.opts.Clock.Now()); err != nil {
			return nil, nil, nil, err
		}
		dst = slices.Grow(dst, b.total)
		b.encode(specs, dst[len(dst):len(dst)+b.total], pos)
		return dst[:len(dst)+b.total], b.commit, b.undo, nil
	}
	w, pos, err := s.group.node.Propose(b.total, stamp)
	if err != nil {
		return s.rejectErr(err)
	}
	res := b.result(pos)
	out := PutResult{Status: PutOK, Append: res}
	if fate != nil {
		fate.taken = true
		s.group.node.Then(w, func(err error) { fate.f(res, err) })
	}
	forget := func() {
		if fate == nil { // a waiter given to Then stays until its outcome
			s.group.node.Forget(w)
		}
	}
	start := time.Now()
	timer := time.NewTimer(s.group.opts.ReplicationTimeout)
	select {
	case <-w.Done():
		err = w.Err()
	case <-timer.C:
		forget()
		err = ErrReplicationTimeout
	case <-ctx.Done():
		forget()
		err = ctx.Err()
	}
	timer.Stop()
	out.FlushWaitStart, out.FlushWait = start, time.Since(start)
	switch {
	case err == nil:
		s.stats.putLatency.Observe(out.FlushWait)
		if werr := s.index.AwaitDispatched(ctx, res.NextOffset()); errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded) {
			out.Status, err = UnknownError, werr
		}
	case isNotLeader(err): // superseded: definitely not stored
		return s.reject(ServiceNotAvailable, err)
	case errors.Is(err, replica.ErrProposalDropped): // its entry was refused: not stored
		return s.reject(OSPageCacheBusy, err)
	case errors.Is(err, ErrReplicationTimeout):
		out.Status = FlushSlaveTimeout
	default: // closed, ctx: unknown
		out.Status = UnknownError
	}
	s.stats.record(out.Status, int(res.MsgNum), int(res.WroteBytes))
	return out, err
}

// isNotLeader: err is a *NotLeaderError. Apart from groupPut so that
// the target errors.As needs is allocated only when a put failed, not for
// every put (it escapes).
func isNotLeader(err error) bool {
	var nl *NotLeaderError
	return errors.As(err, &nl)
}

// groupRefusal is why a group-mode store refuses a put now (not the
// ready leader, too few active followers), or nil; standalone, nil.
// Checked before the topic is admitted, so a follower creates no topic.
func (s *Store) groupRefusal() error {
	if s.group == nil {
		return nil
	}
	return s.group.node.Refusal()
}

// groupRejectStatus maps group-mode refusals (nothing stored) to their
// status; ok is false for any other error.
func groupRejectStatus(err error) (PutStatus, bool) {
	switch {
	case errors.Is(err, ErrNotLeader):
		return ServiceNotAvailable, true
	case errors.Is(err, ErrInSyncReplicasNotEnough):
		return InSyncReplicasNotEnough, true
	case errors.Is(err, replica.ErrProposalDropped):
		return OSPageCacheBusy, true
	case errors.Is(err, raftlog.ErrStopped):
		return ServiceNotAvailable, true
	}
	return 0, false
}

// StepPeer hands a marshalled raft message from a peer to this replica
// (the peer transport calls it). Messages over replica.MaxMessageBytes,
// undecodable ones, ones for another node or from a non-member are
// refused (an error wrapping replica.ErrBadMessage). The group name and
// cluster are the transport's to check: the message does not carry them.
func (s *Store) StepPeer(msg []byte) error {
	if s.group == nil {
		return ErrNotGroup
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return s.group.node.StepPeer(msg)
}

// ErrBadPeerMessage is wrapped by StepPeer's refusals of a message.
var ErrBadPeerMessage = replica.ErrBadMessage

// ReportUnreachable tells raft that a send to peer id failed (the
// transport dropped it), so the leader probes instead of streaming.
func (s *Store) ReportUnreachable(id uint64) {
	if s.group != nil && !s.closed.Load() {
		s.group.node.ReportUnreachable(id)
	}
}

// PeerGone tells raft that peer id's process is gone (its stream ended,
// and it was not heard from while two attempts failed: server/peer's
// Stepper): a follower whose leader it is forgets it and the survivors
// elect another at once rather than after the election timeout
// (replica's leaderdown.go).
func (s *Store) PeerGone(id uint64) {
	if s.group != nil && !s.closed.Load() {
		s.group.node.PeerGone(id)
	}
}

// Errors of TransferLeadership and MoveLeadership (see there).
var (
	ErrNoTransferee       = replica.ErrNoTransferee
	ErrTransferTimeout    = replica.ErrTransferTimeout
	ErrNotVoter           = replica.ErrNotVoter
	ErrTransfereeInactive = replica.ErrTransfereeInactive
)

// TransferLeadership is for a stopping replica (storaged on SIGTERM,
// design §4): on the leader it refuses puts from now on with TRANSFERRING
// (UNAVAILABLE, nothing stored), hands leadership to the recently active
// voter with the highest match and waits, at most two election timeouts
// or until ctx ends, until another member leads; it returns that member's
// id. The new leader campaigns at once (raft's MsgTimeoutNow), so the
// group takes puts again after one election round instead of an election
// timeout. Puts proposed before are committed by the new leader and
// answered here once this replica learns the commit. On a follower it
// returns the known leader (0: none) at once. ErrNoTransferee: no
// follower was active (the leader just stops); ErrTransferTimeout:
// leadership did not move in time.
func (s *Store) TransferLeadership(ctx context.Context) (uint64, error) {
	if s.group == nil {
		return 0, ErrNotGroup
	}
	if s.closed.Load() {
		return 0, ErrClosed
	}
	g := s.group.opts
	return s.group.node.TransferLeadership(2*time.Duration(g.ElectionTick)*g.TickInterval, ctx.Done())
}

// MoveLeadership is an operator's move of the leadership (storaged
// replica transfer, etcd's move-leader) on the group's leader: it hands
// the leadership to voter to (0: the recently active voter with the
// highest match, as TransferLeadership chooses) and waits, at most two
// election timeouts or until ctx ends, until another member leads; it
// returns that member's id (to itself at once when to is this leader).
// While it runs, puts are refused with TRANSFERRING (UNAVAILABLE, nothing
// stored); puts proposed before are committed by the new leader. Unlike
// TransferLeadership it refuses on a member that does not lead, and a
// leader that gives up takes puts again.
//
// Refusals, nothing changed: a *NotLeaderError (a follower, naming the
// leader; TRANSFERRING while the leadership moves already),
// ErrConfChangePending (a membership change has not applied yet),
// ErrNotVoter (a learner, an unknown or a removed id), ErrTransfereeInactive
// (the voter was not heard from within an election timeout),
// ErrNoTransferee (to 0: no voter was). ErrTransferTimeout: no other
// member led in time; this one leads still and takes puts again (a
// transferee that was already told to campaign may still win: read the
// leader before retrying). ErrClosed: the store closed meanwhile.
func (s *Store) MoveLeadership(ctx context.Context, to uint64) (uint64, error) {
	if s.group == nil || s.group.node == nil {
		return 0, ErrNotGroup
	}
	if s.closed.Load() {
		return 0, ErrClosed
	}
	lead, err := s.group.node.MoveLeadership(ctx, to)
	switch {
	case errors.Is(err, replica.ErrClosed):
		// The node's ErrClosed says a put's outcome is unknown; a move has
		// no outcome to lose: the store is closing (UNAVAILABLE, retry on
		// the group's leader).
		return 0, fmt.Errorf("storage: move the leadership to %d: %w", to, ErrClosed)
	case err != nil:
		return 0, fmt.Errorf("storage: move the leadership to %d: %w", to, err)
	}
	return lead, nil
}

// Campaign makes this replica start an election now (tests, operators).
func (s *Store) Campaign() error {
	if s.group == nil {
		return ErrNotGroup
	}
	return s.group.node.Campaign()
}

// ReplicaInfo returns the replica's view of its group: role (leader,
// follower, candidate, learner), term, leader, commit and applied index,
// commit end, readiness and, on the leader, every member's progress. A
// standalone store returns Role "standalone" and nothing else.
func (s *Store) ReplicaInfo() ReplicaInfo {
	if s.group == nil || s.group.node == nil {
		return ReplicaInfo{Role: "standalone"}
	}
	return s.group.node.Info()
}

// ReadBarrier makes the reads that follow it linearizable: once it
// returns nil, every read this store serves (QueueInfo, PullMessages,
// GetMessage) sees every put acknowledged before ReadBarrier was called,
// and never an older state. Standalone, that holds already (a put is
// indexed before its PUT_OK, and nobody else writes), so it returns nil
// at once (ErrClosed once closed).
//
// In group mode only the ready leader passes it (design replication.md
// §3.3): it confirms with a quorum that it still leads (raft ReadIndex,
// one request for all the reads that arrived together), waits until it
// has applied the commit index of that moment, then until its consume
// queues cover the commit end. With GroupOptions.FollowerReads a
// follower or learner that knows the leader passes it too: it asks the
// leader for that commit index (the leader confirms it as for its own
// reads), then waits until it applied that far and its consume queues
// cover it. Every refusal means nothing was read and
// a retry is safe: a *NotLeaderError (follower, learner, no leader, a
// leader not ready, or one that lost the leadership meanwhile: the same
// answer as a refused put, with the leader's id when known; a follower
// whose leader changed while it waited for its read index answers it
// too),
// ErrReadIndexTimeout (not confirmed within ReplicationTimeout: a leader
// cut off from its quorum answers this, never a stale state, until
// CheckQuorum deposes it), ErrReadIndexBusy (MaxReadWaiters reads wait
// already), ctx's error, ErrClosed, or ErrWriteFailed (the replica
// stopped after a failed write).
func (s *Store) ReadBarrier(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if s.group == nil {
		return nil
	}
	end, err := s.group.node.ReadIndex(ctx, s.group.opts.ReplicationTimeout)
	var nl *NotLeaderError
	switch {
	case err == nil:
	case errors.As(err, &nl), errors.Is(err, ErrReadIndexTimeout), errors.Is(err, ErrReadIndexBusy),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, replica.ErrClosed):
		return ErrClosed
	default: // the raft loop stopped on a failed write (sticky)
		return fmt.Errorf("%w: %w", ErrWriteFailed, err)
	}
	// The commit end is visible to the dispatcher already (Committed runs
	// before reads are answered): index up to it, bounded like a put's
	// wait. A wait that cannot finish is not a stale answer: refuse.
	if err := s.index.AwaitDispatched(ctx, end); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if s.closed.Load() {
			return ErrClosed
		}
		return fmt.Errorf("%w: the index did not reach the commit end %d: %w", ErrReadIndexTimeout, end, err)
	}
	return nil
}

// groupDelivering: only the ready leader runs the delay scheduler.
func (s *Store) groupDelivering() bool { return s.group == nil || s.group.node.Ready() }

// RaftRange is a run of raft entries as a peer's range repair reads them
// (Store.ReadRaftRange, RepairReplica).
type RaftRange = raftlog.Range

// RaftRangeEntry is one entry of a RaftRange: unit and payload.
type RaftRangeEntry = raftlog.RangeEntry

// ReplicaRepairReport is what RepairReplica found and did.
type ReplicaRepairReport = raftlog.RepairReport

// RepairAnswer is what one peer told RepairReplica about itself.
type RepairAnswer = raftlog.PeerAnswer

// ErrReplicaRepair wraps RepairReplica's refusals to take a peer's entry.
var ErrReplicaRepair = raftlog.ErrRepair

// ReadRaftRange copies up to maxBytes of payload (one entry at least) of
// the synced raft entries [lo, hi), each checked against its unit, for a
// peer repairing its copy (the FetchRange peer RPC). A damaged entry here
// is an error wrapping ErrCorrupt.
func (s *Store) ReadRaftRange(lo, hi uint64, maxBytes int) (RaftRange, error) {
	if s.group == nil {
		return RaftRange{}, ErrNotGroup
	}
	if s.closed.Load() {
		return RaftRange{}, ErrClosed
	}
	return s.group.rlog.ReadRange(lo, hi, maxBytes)
}

// RepairPeer is one member RepairReplica asks: its raft id, its state
// (the FetchState peer RPC) and its entries (FetchRange).
type RepairPeer = raftlog.Peer

// ReplicaState is a member's identity and durable raft state as a peer's
// repair asks for it (Store.ReplicaState, the FetchState peer RPC).
type ReplicaState = raftlog.PeerState

// ReplicaRepair says whom RepairReplica asks and who this member is.
type ReplicaRepair struct {
	// Peers are the members to ask, the leader first if known.
	Peers []RepairPeer
	// Self is this member as its flags name it (ID, Name, ClusterID,
	// Peers, Learners; the rest unused): required to rebuild a damaged
	// raft/meta, checked against an intact one. nil: raft/meta must hold.
	Self *GroupOptions
}

// RepairReplica repairs the raft log of a stopped group member in
// opts.Dir from its peers, offline (storaged replica repair --from,
// design §3.4, raftlog.Repair): a damaged raft/meta is rebuilt from a
// peer's, a lost raft/hardstate from the peers' terms and commit indexes
// (at least the checkpoint's applied index); the entries whose unit or
// payload fails its CRC are fetched (each fetch may return fewer entries
// than asked, none where the peer's log ends), taken only when they are
// the same entries by raft's Log Matching rule, checked record by record
// and rewritten in place, synced; a damaged entry past the commit index
// that no peer holds is cut when enough voters provably lack it. The
// data dir is locked meanwhile. Afterwards the member starts and rejoins
// as usual.
func RepairReplica(opts Options, rr ReplicaRepair) (ReplicaRepairReport, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return ReplicaRepairReport{}, err
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return ReplicaRepairReport{}, err
	}
	defer lf.Close()
	l, err := openOffline(opts)
	if err != nil {
		return ReplicaRepairReport{}, err
	}
	defer l.Close()
	units := 0
	if opts.Group != nil {
		units = opts.Group.IndexUnits
	}
	ro := raftlog.RepairOptions{FS: opts.FS, Dir: filepath.Join(opts.Dir, "raft"), Commitlog: l,
		IndexUnits: units, RequireCRC: !opts.DisablePropCRC, Peers: rr.Peers}
	if g := rr.Self; g != nil {
		ro.Self = raftlog.Meta{NodeID: g.ID, Group: g.Name, ClusterUUID: g.ClusterID, FileSize: opts.FileSize,
			Voters: slices.Sorted(slices.Values(g.Peers))}
		if len(g.Learners) > 0 {
			ro.Self.Learners = slices.Sorted(slices.Values(g.Learners))
		}
	}
	// The checkpoint's raft point bounds a rebuilt HardState's commit from
	// below; a checkpoint that does not read leaves it unbounded here (the
	// start refuses such a checkpoint anyway).
	if cp, _, err := consumequeue.ReadCheckpoint(opts.FS, opts.Dir); err == nil {
		ro.Applied, ro.AppliedTerm = cp.RaftApplied, cp.RaftAppliedTerm
	}
	return raftlog.Repair(ro)
}

// ReplicaState returns this member's identity and durable raft state, for
// a peer repairing its raft/meta or raft/hardstate (FetchState).
func (s *Store) ReplicaState() (ReplicaState, error) {
	if s.group == nil {
		return ReplicaState{}, ErrNotGroup
	}
	if s.closed.Load() {
		return ReplicaState{}, ErrClosed
	}
	return s.group.rlog.State()
}

// ReplicaMeta is a group member's identity as its data dir records it.
type ReplicaMeta = raftlog.Meta

// ReadReplicaMeta reads the group identity (node id, group, cluster) of
// the data dir in opts.Dir, offline.
func ReadReplicaMeta(opts Options) (ReplicaMeta, error) {
	opts = opts.withDefaults()
	return raftlog.ReadMeta(opts.FS, filepath.Join(opts.Dir, "raft"))
}

// raftLogger is etcd-raft's Logger over the store's: elections, leader
// changes and this package's own notes at info and above (raft's debug
// lines are dropped).
type raftLogger struct{ l zerolog.Logger }

func (r raftLogger) Debug(...any)             {}
func (r raftLogger) Debugf(string, ...any)    {}
func (r raftLogger) Info(v ...any)            { r.l.Info().Msg(fmt.Sprint(v...)) }
func (r raftLogger) Infof(f string, v ...any) { r.l.Info().Msgf(f, v...) }
func (r raftLogger) Warning(v ...any)         { r.l.Warn().Msg(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) {
	r.l.Warn().Msgf(f, v...)
}
func (r raftLogger) Error(v ...any)            { r.l.Error().Msg(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any) { r.l.Error().Msgf(f, v...) }
func (r raftLogger) Fatal(v ...any)            { r.Panic(v...) }
func (r raftLogger) Fatalf(f string, v ...any) { r.Panicf(f, v...) }
func (r raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.l.Error().Msg(s)
	panic(s)
}
func (r raftLogger) Panicf(f string, v ...any) {
	s := fmt.Sprintf(f, v...)
	r.l.Error().Msg(s)
	panic(s)
}
