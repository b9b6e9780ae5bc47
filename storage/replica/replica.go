// Package replica runs one replica of a raft group over the commitlog
// (design replication.md §3.1-3.2): the etcd-raft RawNode, the classic
// Ready loop on one goroutine (a leader's Syncs on a second one, so that
// the loop can apply commits while it waits), the leader's tail and readiness barrier,
// and the waiters of proposed puts. It knows records only as bytes the
// store stamps; the raft dependency (raft, raftpb) stays inside storage/...
// and nothing outside sees a raftpb type: peers exchange marshalled
// messages through Transport and StepPeer.
package replica

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/internal/hist"
	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/record"
)

// Transport carries marshalled raftpb.Messages to peers. Send must not
// block and may drop (raft tolerates loss); a transport that finds a peer
// unreachable should call the store's ReportUnreachable. The node never
// changes a msg it handed to Send (each is a fresh marshal), so a
// transport may keep it and write it later.
type Transport interface {
	Send(to uint64, msg []byte)
}

// MaxMessageBytes bounds a message StepPeer takes: MaxSizePerMsg (1 MiB)
// of entries plus the largest entry (a 4 MiB batch and its records'
// headers), rounded up (design §4: the peer service's MaxRecvMsgSize).
const MaxMessageBytes = 16 << 20

// Causes of a NotLeaderError.
const (
	CauseNotLeader      = "NOT_LEADER"
	CauseNoLeader       = "NO_LEADER"
	CauseLeaderNotReady = "LEADER_NOT_READY"
	CauseTransferring   = "TRANSFERRING"
	// CauseSuperseded: the put was proposed, then an entry of another term
	// committed over its position, or one of a later term committed
	// (which a committed put would precede): definitely not stored.
	CauseSuperseded = "SUPERSEDED"
	// CauseRemoved: this replica was removed from the group (ErrRemoved);
	// the others serve.
	CauseRemoved = "REMOVED"
)

// Errors.
var (
	// ErrNotLeader: this replica cannot take the put, and nothing was
	// stored (a retry at the leader is safe). Wrapped by *NotLeaderError.
	ErrNotLeader = errors.New("replica: not the ready leader; nothing stored")
	// ErrInSyncReplicasNotEnough: the leader has too few recently active
	// followers to commit; nothing was proposed.
	ErrInSyncReplicasNotEnough = errors.New("replica: too few recently active followers; nothing stored")
	// ErrProposalDropped: raft dropped the proposal (uncommitted size
	// limit, a leader transfer); nothing stored, retry soon.
	ErrProposalDropped = errors.New("replica: proposal dropped by raft; nothing stored")
	// ErrReplicationTimeout: proposed, not seen committed in time. The
	// outcome is unknown: the entry may still commit, or be truncated by
	// the next leader.
	ErrReplicationTimeout = errors.New("replica: not committed within the replication timeout; outcome unknown")
	// ErrClosed: the replica stopped while the put waited (outcome unknown).
	ErrClosed = errors.New("replica: closed while the put waited; outcome unknown")
	// ErrBadMessage: StepPeer refused a message (undecodable, too big, not
	// for this node, from a non-member, a local message type).
	ErrBadMessage = errors.New("replica: bad peer message")
	// ErrLostEntries: the leader says this replica acknowledged entries
	// its log no longer holds (its data dir was rolled back: restored from
	// an old copy, or a disk that lied about a sync). The replica stops
	// rather than serve or vote with a log that forgot acknowledged
	// entries (etcd-raft itself would panic: "Was the raft log corrupted,
	// truncated, or lost?").
	ErrLostEntries = errors.New("replica: this replica's raft log lost entries it acknowledged")
	// ErrReadIndexTimeout: a linearizable read's ReadIndex was not
	// confirmed by a quorum (or not applied) within its bound; nothing was
	// read, a retry is safe. A partitioned leader answers this until
	// CheckQuorum deposes it, then NotLeaderError.
	ErrReadIndexTimeout = errors.New("replica: the leader could not confirm its leadership in time; nothing read")
	// ErrReadIndexBusy: MaxReadWaiters linearizable reads already wait for
	// their ReadIndex; nothing read, retry shortly.
	ErrReadIndexBusy = errors.New("replica: too many linearizable reads waiting; nothing read")
)

// DefaultMaxReadWaiters bounds the linearizable reads waiting for their
// ReadIndex at once (Options.MaxReadWaiters): each holds a goroutine of
// its caller and a few words here; beyond it a read is refused
// (ErrReadIndexBusy) rather than queued without bound.
const DefaultMaxReadWaiters = 4096

// NotLeaderError says why a replica refused a put (nothing stored) and
// where the leader is, when known. errors.Is(err, ErrNotLeader) holds.
type NotLeaderError struct {
	Cause    string // CauseNotLeader, CauseNoLeader, CauseLeaderNotReady, CauseTransferring, CauseSuperseded
	LeaderID uint64 // 0 when unknown
	Term     uint64
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("replica: %s (leader %d, term %d); nothing stored", e.Cause, e.LeaderID, e.Term)
}

// Unwrap implements errors.Unwrap.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Host is the store as the raft loop sees it. Every call comes from the
// raft goroutine.
type Host interface {
	// Committed: the entries up to commitEnd (a commitlog offset) are
	// committed and durable on this replica; lastStoreTS is the newest
	// store time among the records just committed (0: none); leader:
	// this replica is the ready leader (its put path took them). The
	// store makes them visible and wakes its dispatcher.
	Committed(commitEnd, lastStoreTS int64, leader bool)
	// BecomeReady is called, with proposals excluded, when this leader
	// has applied its term's first entry: log end = commit end = commitEnd.
	// The store indexes up to commitEnd and resets its stamping table
	// (queue offsets from the consume queues, store time from the log).
	// An error (the index cannot reach commitEnd yet) leaves the leader
	// not ready; it is retried at the next tick or commit.
	BecomeReady(commitEnd int64) error
	// ApplyCmd applies a committed CMD entry (a normal entry that is
	// neither empty nor records: a storaged command, ProposeCmd), in log
	// order, on every replica. It runs under the node's lock: it must not
	// call the node.
	ApplyCmd(index uint64, data []byte)
	// Fail: a write to the raft log failed; the replica stopped (sticky).
	Fail(err error)
	// SendSnapshot hands over raft's MsgSnap for peer to (marshalled, at
	// raft index index of term term, its data empty): snapshots travel
	// out of band of Transport (design §3.5), and the store builds their
	// data, the manifest, off the raft goroutine. The store must call
	// ReportSnapshot(to, ok) once the transfer ended, whatever happened;
	// it must not block.
	SendSnapshot(to uint64, msg []byte, index, term uint64)
	// InstallSnapshot installs the snapshot raft restored at raft index
	// index of term term (design §3.5, ApplySnapshot): the store swaps in
	// the files it staged and verified for it (StepSnapshot), resets the
	// raft log to a base at index and its consume queues, durably, and
	// returns the commit end at index and the newest store time below it.
	// It runs before the Ready's entries are appended and before any of
	// its messages leave (the MsgAppResp that acknowledges the snapshot).
	// An error stops the replica; a restart finishes the install.
	//
	// m is the membership at index (the snapshot's ConfState, which raft
	// restored): the store records it with the peer addresses and removals
	// its manifest carries before it installs anything (raftlog's
	// SetMembership), so that a restart, which finishes the install, finds
	// it.
	InstallSnapshot(index, term uint64, m raftlog.Membership) (commitEnd, lastStoreTS int64, err error)
	// MembershipChanged: a committed conf change was applied (raft/conf
	// holds it already): the store tells its transport about added and
	// removed peers. Called without the node's lock, in log order; it may
	// block briefly but must not wait for the raft goroutine.
	MembershipChanged(c raftlog.ConfChange)
}

// Options configure a Node.
type Options struct {
	ID       uint64
	Log      *raftlog.Log
	FileSize int64 // the commitlog's: the roll rule
	// Applied is the last index already applied (the store rebuilt its
	// consume queues up to it at Open).
	Applied   uint64
	Transport Transport
	Host      Host
	// Ticks drives raft's logical clock: one raft tick per receive. Nil: a
	// ticker at TickInterval.
	Ticks         <-chan time.Time
	TickInterval  time.Duration
	ElectionTick  int
	HeartbeatTick int
	// MaxReadWaiters bounds the linearizable reads waiting at once (0:
	// DefaultMaxReadWaiters).
	MaxReadWaiters int
	// FollowerReads lets a follower or learner that knows the leader
	// serve linearizable reads (ReadIndex) itself: it asks the leader for
	// its read index (raft's MsgReadIndex, which the leader confirms with
	// a quorum's heartbeat answers as for its own reads) and answers once
	// it applied that far. Without it a follower refuses them with
	// NOT_LEADER, naming the leader.
	FollowerReads bool
	// Logger receives raft's own log lines (nil: discarded).
	Logger raft.Logger
	// CatchUpReadahead: a leader asks the kernel to read this many
	// commitlog bytes ahead of a follower that is more than half of it
	// behind (Log.WillNeed), so that raft's Entries calls, made under the
	// node's lock, copy pages already in memory instead of faulting them
	// in from the disk one by one (design §8). 0: off.
	CatchUpReadahead int64
	// MaxInflightBytes and MaxSizePerMsg are raft's bounds on the entries
	// in flight to one follower and in one append (0: DefaultMaxInflightBytes
	// and 1 MiB). Tests lower them so that a catch-up takes many rounds.
	MaxInflightBytes, MaxSizePerMsg uint64
	// MaxUncommittedBytes is raft's bound on the payload a leader holds
	// proposed and not committed (0: DefaultMaxUncommittedBytes); past it
	// raft drops a proposal (ErrProposalDropped, nothing stored).
	MaxUncommittedBytes uint64
}

// DefaultMaxUncommittedBytes is Options.MaxUncommittedBytes' default.
const DefaultMaxUncommittedBytes = 64 << 20

// DefaultMaxInflightBytes is Options.MaxInflightBytes' default: at most
// this many bytes of entries in flight to one follower. It bounds what
// one answer of a follower that is catching up makes the leader read and
// send under the node's lock, where every put waits: with 64 MiB the
// first answer of a restarted follower had the leader read 64 appends of
// 1 MiB at once, and puts saw 179-252 ms without an ack; with 8 MiB,
// 45-87 ms, the catch-up as fast (BENCHMARKS.md "Catching up in smaller
// steps"). In steady replication far less is in flight (what one round
// carries, until the follower's answer).
const DefaultMaxInflightBytes = 8 << 20

// Node is one replica's raft node.
type Node struct {
	opts Options
	host Host

	mu      sync.Mutex // raftMu: the RawNode, the tail, the waiters
	rn      *raft.RawNode
	soft    raft.SoftState
	term    uint64
	ready   bool  // leader with its term's first entry applied
	ownTerm bool  // leader with an entry of its own term applied (ready once BecomeReady succeeds)
	retry   bool  // the host asked for the readiness barrier again (RetryReady)
	tail    int64 // ready leader: commitlog end of the last stamped put
	waiters map[key]*Waiter
	// pend is the ready leader's puts stamped since its last proposal
	// of them, proposed as one entry (flushLocked); pendLast is the
	// length of the last such entry, the capacity the next one starts
	// with, so that the puts of a round are not copied again as its
	// buffer grows under the lock.
	pend     pending
	pendLast int
	commit   uint64 // commit index applied
	end      int64  // commitEnd
	err      error  // sticky
	// leaving: a hand-over of the leadership runs (handOverLocked:
	// TransferLeadership, MoveLeadership, removeSelf); while this node
	// leads, puts are refused with TRANSFERRING, also after raft gave up a
	// transfer. Cleared when the node stops leading, and by a MoveLeadership
	// or removeSelf that gave up (resumeLocked) unless stopping.
	leaving bool
	// stopping: TransferLeadership ran, the process is stopping: no
	// hand-over that gives up makes this leader take puts again (a
	// MoveLeadership that was running when SIGTERM came must not undo the
	// stop's refusal). Never cleared.
	stopping bool
	// handing is the hand-over under way (handOverLocked), nil when none.
	// Raft gives a transfer up after an election timeout, and a transferee
	// with a committed membership change still to apply refuses to
	// campaign (raft's hup: a move right after a promotion), so each tick
	// asks raft again while this node leads in the hand-over's term
	// (retransferLocked).
	handing *handOver
	// softChanged is closed and replaced when the raft state or the
	// leader changes (TransferLeadership waits on it).
	softChanged chan struct{}
	// joining: bootstrapped empty and not caught up yet (raftlog's
	// joining marker): vote requests from candidates with a log are
	// dropped until the log holds entries and the applied index reached
	// seenCommit, the highest commit index a leader's MsgApp carried.
	joining    bool
	seenCommit uint64
	seenApp    bool // a leader's MsgApp arrived since this process started
	// lostTerm is the term in which this leader last handed leadership
	// away because a follower had lost entries it acknowledged.
	lostTerm uint64
	withheld uint64 // vote requests dropped while joining
	reads    reads  // linearizable reads waiting for their ReadIndex
	// readyTerm is the term in which this node last became ready.
	readyTerm uint64
	// ticks counts raft ticks; heard[id] is the tick count when a message
	// from member id last arrived. A member heard within ElectionTick
	// ticks is active (heardLocked) for the in-sync check of
	// refusalLocked, the membership checks and the choice of a transferee:
	// a sliding window, where raft's RecentActive is cleared for every
	// follower at each CheckQuorum (every election timeout) and would
	// refuse puts with IN_SYNC_REPLICAS_NOT_ENOUGH, or find no transferee,
	// until the next response arrived.
	ticks uint64
	heard map[uint64]uint64
	// hurry is the early election after PeerGone (leaderdown.go);
	// forgotten counts the leaders this follower forgot so, and
	// earlyCampaigns the campaigns it started for it (Info).
	hurry                     hurry
	forgotten, earlyCampaigns uint64
	// snap is the staged snapshot stepped into raft (StepSnapshot), waiting
	// for the next Ready to tell whether raft restored it.
	snap *snapWait
	// members is the membership as of the applied index (raft's
	// configuration once the conf changes proposed are applied), memberIDs
	// its ids (isMember). confWait is this leader's proposed membership
	// change (one at a time), confSeq numbers them (membership.go).
	members   raftlog.Membership
	memberIDs []uint64
	confWait  *confWaiter
	confSeq   uint64
	// confFloor is the raft index raft's own applied index must reach
	// before a conf change may be proposed: the last conf change this
	// replica applied, or where it became the ready leader. Raft counts
	// an entry applied only at Advance, the end of the Ready that applied
	// it here, and until then silently replaces a proposed conf change
	// with an empty entry (its pendingConfIndex check), which would never
	// apply: confReadyLocked. advanced, when not nil, is closed at the
	// next Advance (a proposer waits for it).
	confFloor uint64
	advanced  chan struct{}
	// selfRemoval: this replica, having led, asks the leader it handed
	// over to to remove it (removeSelf, stepRemovalRequest).
	selfRemoval *selfRemoval

	stop   chan struct{}
	done   chan struct{}
	wake   chan struct{}
	ticker *time.Ticker
	// tick is ticker's interval (0: the host drives the ticks), for Info.
	tick time.Duration

	// The syncer goroutine runs a leader's Log.Sync for a Ready (syncReq,
	// its error on syncRes) while the loop waits for it and for committed: a signal
	// from StepPeer that the leader's commit passed what it applied, so
	// that acks owed to entries synced in an earlier Ready do not wait
	// for this Ready's flush (applyEarly). syncStop/syncDone end it after
	// the loop.
	syncReq   chan struct{}
	syncRes   chan error
	syncStop  chan struct{}
	syncDone  chan struct{}
	committed chan struct{}

	// The prefetcher goroutine runs the leader's readahead (Log.WillNeed)
	// for the ranges the loop plans (planReadaheadLocked) on raStart, so
	// that neither the loop nor a lock waits for it; raStop/raDone end it
	// after the loop. advised[id] is the commitlog end asked for ahead of
	// follower id (under mu); raBytes and raCalls count what was asked.
	raStart chan raRange
	raStop  chan struct{}
	raDone  chan struct{}
	advised map[uint64]int64
	raBytes atomic.Int64
	raCalls atomic.Int64
	// readyLat times each Ready the loop handles (Info.ReadyHandling): its
	// writes, sync, sends and applies, while the proposals made meanwhile
	// wait for the next one.
	readyLat hist.Histogram
}

// raRange is a commitlog range to read ahead of a follower.
type raRange struct{ lo, hi int64 }

type key struct {
	term uint64
	pos  int64
}

// pending is the puts a ready leader stamped and has not proposed yet:
// their records, contiguous from the first put's place, which raft gets
// as one entry at the next flushLocked. Every put is its own raft entry
// otherwise, and the entry costs raft and both logs on every member as
// much as a put of a few records does (BENCHMARKS.md "Puts in one entry
// a round").
type pending struct {
	data []byte
	// from is the tail before the first put (it may start the next
	// file): the tail again if raft drops the entry.
	from int64
	puts []pendingPut
}

// pendingPut is a stamped put of pending: its waiter's key and the undo
// of its stamp.
type pendingPut struct {
	k    key
	undo func()
}

// New starts the node's goroutine; Close stops it. commitEnd is the
// commitlog offset past the last committed DATA entry.
func New(opts Options, commitEnd int64) (*Node, error) {
	if opts.ElectionTick == 0 {
		opts.ElectionTick = 10
	}
	if opts.HeartbeatTick == 0 {
		opts.HeartbeatTick = 1
	}
	if opts.MaxReadWaiters <= 0 {
		opts.MaxReadWaiters = DefaultMaxReadWaiters
	}
	if opts.Logger == nil {
		opts.Logger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}
	}
	if opts.MaxInflightBytes == 0 {
		opts.MaxInflightBytes = DefaultMaxInflightBytes
	}
	if opts.MaxSizePerMsg == 0 {
		opts.MaxSizePerMsg = maxSizePerMsg
	}
	if opts.MaxUncommittedBytes == 0 {
		opts.MaxUncommittedBytes = DefaultMaxUncommittedBytes
	}
	cfg := &raft.Config{
		ID: opts.ID, ElectionTick: opts.ElectionTick, HeartbeatTick: opts.HeartbeatTick, Storage: opts.Log,
		Applied: opts.Applied, MaxSizePerMsg: opts.MaxSizePerMsg, MaxInflightMsgs: 256, MaxInflightBytes: opts.MaxInflightBytes,
		MaxUncommittedEntriesSize: opts.MaxUncommittedBytes, CheckQuorum: true, PreVote: true, StepDownOnRemoval: true,
		// Mandatory: a follower would forward bytes it stamped itself.
		DisableProposalForwarding: true, Logger: opts.Logger,
	}
	rn, err := raft.NewRawNode(cfg)
	if err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	n := &Node{opts: opts, host: opts.Host, rn: rn, waiters: map[key]*Waiter{}, commit: opts.Applied, end: commitEnd,
		reads:       reads{batches: map[uint64]*readBatch{}, seq: readSeqStart()},
		softChanged: make(chan struct{}), heard: map[uint64]uint64{}, stop: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1),
		syncReq: make(chan struct{}), syncRes: make(chan error), syncStop: make(chan struct{}), syncDone: make(chan struct{}),
		committed: make(chan struct{}, 1),
		raStart:   make(chan raRange, 8), raStop: make(chan struct{}), raDone: make(chan struct{}), advised: map[uint64]int64{},
		joining: opts.Log.Joining()}
	if n.joining {
		opts.Logger.Infof("replica %d: bootstrapped empty: it votes only for candidates without a log until it has caught up with a leader", opts.ID)
	}
	st := rn.BasicStatus()
	n.soft, n.term = st.SoftState, st.GetTerm()
	// Raft restored the membership recorded at the commit; the conf
	// changes committed after that record apply again now (raftlog's
	// confName), before anything else runs.
	n.setMembersLocked(opts.Log.MembershipAt(st.GetCommit()))
	if err := n.replayConfs(opts.Applied); err != nil {
		return nil, fmt.Errorf("replica: apply the conf changes up to %d again: %w", opts.Applied, err)
	}
	if n.opts.Ticks == nil {
		iv := opts.TickInterval
		if iv <= 0 {
			iv = 100 * time.Millisecond
		}
		n.ticker, n.tick = time.NewTicker(iv), iv
		n.opts.Ticks = n.ticker.C
	}
	go n.syncer()
	go n.prefetcher()
	go n.loop()
	return n, nil
}

// prefetcher reads ahead the ranges the loop plans, one at a time.
func (n *Node) prefetcher() {
	defer close(n.raDone)
	for {
		select {
		case <-n.raStop:
			return
		case r := <-n.raStart:
			n.raBytes.Add(n.opts.Log.WillNeed(r.lo, r.hi))
			n.raCalls.Add(1)
		}
	}
}

// planReadaheadLocked asks the prefetcher to read ahead of every follower
// of this leader whose next entries start more than half of
// CatchUpReadahead below the log's data end: up to CatchUpReadahead bytes
// from there, and again once the follower has used half of what was read.
// A follower closer to the end reads what was just written, still in
// memory. Called once per round of the loop; for a follower that keeps
// up it costs a look at its progress and one raft index unit.
func (n *Node) planReadaheadLocked() {
	ahead := n.opts.CatchUpReadahead
	if ahead <= 0 {
		return
	}
	if n.soft.RaftState != raft.StateLeader {
		clear(n.advised)
		return
	}
	var end int64 = -1
	n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == n.opts.ID || pr.State == tracker.StateSnapshot {
			return
		}
		if end < 0 {
			end = n.opts.Log.DataEnd()
		}
		from, err := n.opts.Log.DataEndAt(pr.Next - 1) // where entry Next's bytes start
		if err != nil || end-from <= ahead/2 {
			delete(n.advised, id)
			return
		}
		done := n.advised[id]
		if done >= from+ahead/2 && done <= from+ahead {
			return // at least half the window is still ahead of it
		}
		lo := from
		if done > from && done < from+ahead {
			lo = done
		}
		hi := min(from+ahead, end)
		select {
		case n.raStart <- raRange{lo, hi}:
			n.advised[id] = hi
		default: // the prefetcher is busy: the next round asks again
		}
	})
}

// maxSizePerMsg is raft's MaxSizePerMsg: the bytes of entries one MsgApp
// carries (and one Ready commits).
const maxSizePerMsg = 1 << 20

// syncer runs the Log's Syncs the loop asks for, one at a time.
func (n *Node) syncer() {
	defer close(n.syncDone)
	for {
		select {
		case <-n.syncStop:
			return
		case <-n.syncReq:
			n.syncRes <- n.opts.Log.Sync()
		}
	}
}

// Close stops the goroutine and answers every waiter with ErrClosed.
func (n *Node) Close() {
	select {
	case <-n.stop:
		return
	default:
	}
	close(n.stop)
	<-n.done
	close(n.syncStop) // after the loop: it asks for no Sync any more
	<-n.syncDone
	close(n.raStop) // after the loop too: it plans no readahead any more
	<-n.raDone
	if n.ticker != nil {
		n.ticker.Stop()
	}
	n.mu.Lock()
	if n.err == nil {
		// Refuse every later Step and Propose: the store closes the raft
		// log next, and raft panics on a storage that fails.
		n.err = ErrClosed
	}
	for k, w := range n.waiters {
		w.finish(ErrClosed)
		delete(n.waiters, k)
	}
	n.failReadsLocked(ErrClosed)
	n.failSnapLocked(ErrClosed)
	n.mu.Unlock()
}

func (n *Node) kick() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *Node) loop() {
	defer close(n.done)
	for {
		select {
		case <-n.stop:
			return
		case <-n.opts.Ticks:
			n.mu.Lock()
			n.ticks++
			n.rawLocked().Tick()
			n.hurryLocked()
			n.retransferLocked()
			n.maybeReadyLocked()
			n.mu.Unlock()
		case <-n.wake:
		}
		n.mu.Lock()
		if n.retry {
			n.retry = false
			n.maybeReadyLocked()
		}
		req := n.selfRemovalMsgLocked()
		n.mu.Unlock()
		if req != nil {
			n.sendRaw(req)
		}
		for {
			n.mu.Lock()
			// Reads registered while the last Ready was handled go into
			// the next one: under a steady write load Readys follow each
			// other without a pause, and reads issued only when the loop
			// ran dry waited for that.
			n.issueReadsLocked()
			if n.err == nil {
				n.planReadaheadLocked()
			}
			if n.err != nil || !n.rawLocked().HasReady() {
				n.mu.Unlock()
				break
			}
			rd := n.rn.Ready()
			sw := n.snap // raft's answer to a stepped snapshot is in this Ready
			n.snap = nil
			n.mu.Unlock()
			start := time.Now()
			err := n.handle(rd)
			n.readyLat.Observe(time.Since(start))
			if err != nil {
				n.mu.Lock()
				n.err = err
				n.failReadsLocked(err)
				n.failSnapLocked(err)
				n.mu.Unlock()
				n.host.Fail(err)
			}
			if sw != nil { // after a failure is sticky: the caller sees the node stopped
				installed := !raft.IsEmptySnap(rd.Snapshot) && rd.Snapshot.GetMetadata().GetIndex() == sw.index
				sw.done <- snapResult{installed: installed && err == nil, err: err}
			}
			if err != nil {
				break
			}
			select {
			case <-n.stop:
				return
			default:
			}
		}
	}
}

// handle processes one Ready in the classic order (design §3.2), with two
// changes: committed entries this replica already holds durably, and that
// change no persisted state, are applied before the Ready's write
// (applyFirst), as etcd's server applies while it saves; the others after
// the Sync, as before. And while the Sync runs, a leader applies what its
// followers' answers commit meanwhile (sync, applyEarly).
func (n *Node) handle(rd raft.Ready) error {
	if rd.SoftState != nil {
		n.mu.Lock()
		if rd.SoftState.RaftState != raft.StateLeader || rd.SoftState.Lead != n.soft.Lead {
			n.ready, n.ownTerm = false, false // drop the tail; waiters stay
			// Raft forgets a deposed leader's pending ReadIndex requests
			// (reset): answer their reads now, nothing read.
			n.failReadsLocked(lostLeadership(rd.SoftState, n.opts.ID, n.rn.BasicStatus().GetTerm()))
		}
		if rd.SoftState.RaftState != raft.StateLeader {
			n.leaving = false
			if w := n.confWait; w != nil && w.forwarded {
				n.confWait = nil // a member's removal it proposed for it: that member asks the next leader
			}
		}
		n.soft = *rd.SoftState
		close(n.softChanged)
		n.softChanged = make(chan struct{})
		n.mu.Unlock()
	}
	early, late := splitMessages(n.soft.RaftState == raft.StateLeader, rd.Messages)
	n.send(early)
	if len(rd.ReadStates) > 0 {
		// A read index is confirmed by a quorum's heartbeat answers, which
		// owe nothing to this Ready's own write: a batch whose index is
		// applied already is answered now, not after the Sync (apply
		// answers the others once it reaches their index).
		n.mu.Lock()
		n.readStatesLocked(rd.ReadStates)
		n.mu.Unlock()
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		// Only StepSnapshot steps a MsgSnap, once the store has its files
		// staged and verified: install them before the entries that follow
		// the snapshot and before the MsgAppResp that acknowledges it.
		md := rd.Snapshot.GetMetadata()
		m := raftlog.MembershipOf(md.GetIndex(), md.GetConfState())
		end, lastTS, err := n.host.InstallSnapshot(md.GetIndex(), md.GetTerm(), m)
		if err != nil {
			return fmt.Errorf("replica: install the snapshot at %d: %w", md.GetIndex(), err)
		}
		n.mu.Lock()
		n.commit, n.end = md.GetIndex(), end
		n.setMembersLocked(m)
		// This replica's own proposals from an earlier leadership: the
		// snapshot may or may not hold them, and their entries will not
		// be seen applied.
		for k, w := range n.waiters {
			w.finish(fmt.Errorf("%w: a snapshot replaced this replica's log", ErrReplicationTimeout))
			delete(n.waiters, k)
		}
		n.mu.Unlock()
		n.host.Committed(end, lastTS, false)
	}
	l := n.opts.Log
	setTerm := func() {
		n.mu.Lock()
		n.term = rd.HardState.GetTerm()
		n.mu.Unlock()
	}
	hasHS := rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState)
	appliedFirst := n.applyFirst(rd)
	if appliedFirst {
		// Committed entries this replica holds durably already (a leader's
		// commit comes from followers' answers to entries it synced in an
		// earlier Ready) are applied before this Ready's own write, as
		// etcd's server applies while it saves: the PUT_OKs they hold do
		// not wait for a flush of unrelated new entries. Their commit is
		// written first (not synced: it rides along, raftlog's
		// hardstate.go), so a checkpoint taken meanwhile finds it.
		if err := l.WriteHardState(rd.HardState); err != nil {
			return err
		}
		if hasHS {
			setTerm()
		}
		if err := n.apply(rd.CommittedEntries); err != nil {
			return err
		}
	}
	if err := l.Append(rd.Entries); err != nil {
		return err
	}
	if hasHS && !appliedFirst { // after Append: its truncation checks the commit before this Ready's
		if err := l.SetHardState(rd.HardState); err != nil {
			return err
		}
		setTerm()
	}
	if len(rd.Entries) > 0 || rd.HardState != nil {
		if err := n.sync(); err != nil {
			return err
		}
	}
	n.send(late) // MsgAppResp and votes: only after Sync
	committed := rd.CommittedEntries
	if appliedFirst {
		committed = nil
	}
	if appliesState(committed) {
		// A command's effects are persisted by the store with the raft
		// index that made them (the topic table, the delivery progress):
		// the commit on disk must not lag behind them, or a power cut
		// would leave files ahead of the raft log's commit. DATA entries
		// need no such sync: what depends on them (the checkpoint) syncs
		// the commit itself (raftlog.Log.SyncCommit).
		if err := l.SyncCommit(); err != nil {
			return err
		}
	}
	if err := n.apply(committed); err != nil {
		return err
	}
	n.mu.Lock()
	n.rawLocked().Advance(rd)
	if n.advanced != nil {
		close(n.advanced)
		n.advanced = nil
	}
	joined := n.joining && n.caughtUpLocked()
	n.mu.Unlock()
	if joined {
		if err := n.opts.Log.Joined(); err != nil {
			return err
		}
		n.mu.Lock()
		n.joining = false
		n.mu.Unlock()
		n.opts.Logger.Infof("replica %d: caught up with the leader (applied %d): it votes again", n.opts.ID, n.commit)
	}
	return nil
}

// sync runs the Log's Sync; a leader's on the syncer goroutine, so that
// while it runs the leader applies what it learns committed (applyEarly):
// followers answer an append while the leader flushes the next one, and
// the PUT_OKs of the entries they made committed would otherwise wait for
// that flush (about one msync: BENCHMARKS.md "Acks while the leader
// flushes").
func (n *Node) sync() error {
	if n.soft.RaftState != raft.StateLeader { // n.soft: only this goroutine writes it
		// Only a leader has anything to apply meanwhile: the others sync
		// on the loop itself, without two goroutine switches a Ready.
		return n.opts.Log.Sync()
	}
	n.syncReq <- struct{}{}
	for {
		select {
		case err := <-n.syncRes:
			return err
		case <-n.committed:
			if err := n.applyEarly(); err != nil {
				// The Sync in progress ends first; the node stops.
				return errors.Join(err, <-n.syncRes)
			}
		}
	}
}

// applyEarly applies, on a leader, the entries raft's commit covers that
// this replica synced in an earlier Ready and has not applied, up to the
// first command or conf change (those wait for their Ready: their effects
// need the commit synced first, handle). Their commit is written first
// (Log.AdvanceCommit), as applyFirst writes it, so a checkpoint taken
// meanwhile finds it. The next Readys carry them again; apply skips what
// is applied. Raft's commit on a leader counts its own append only after
// the Ready that held it was synced (raft.appendEntry's self-ack at
// Advance), and SyncedIndex bounds it again: nothing is answered that a
// majority has not synced.
func (n *Node) applyEarly() error {
	n.mu.Lock()
	st := n.rn.BasicStatus()
	from := n.commit + 1
	leader := st.RaftState == raft.StateLeader && n.soft.RaftState == raft.StateLeader
	n.mu.Unlock()
	if !leader {
		return nil
	}
	l := n.opts.Log
	hi := min(st.GetCommit(), l.SyncedIndex())
	if hi < from {
		return nil
	}
	// At most about what raft hands a Ready (MaxCommittedSizePerReady
	// defaults to MaxSizePerMsg); the rest waits for the Readys.
	ents, err := l.Entries(from, hi+1, maxSizePerMsg)
	if err != nil {
		return nil // compacted or moved meanwhile: the next Ready applies them
	}
	for i, e := range ents {
		if appliesState([]*pb.Entry{e}) {
			ents = ents[:i]
			break
		}
	}
	if len(ents) == 0 {
		return nil
	}
	if err := l.AdvanceCommit(ents[len(ents)-1].GetIndex()); err != nil {
		return err
	}
	return n.apply(ents) // no conf change among them: nothing to fail
}

// applyFirst: rd's committed entries may be applied before its write:
// there are some, none changes persisted state (appliesState: those wait
// for the commit to be synced), and this replica synced them all, and
// everything up to the new commit, before this Ready. Not when the
// Ready's own entries reach down to them: a single-voter group commits
// its new entries at once, and a follower's commit can cover entries
// that replace a synced suffix; those are applied after the Sync.
func (n *Node) applyFirst(rd raft.Ready) bool {
	ents := rd.CommittedEntries
	if len(ents) == 0 || appliesState(ents) {
		return false
	}
	last := ents[len(ents)-1].GetIndex()
	if rd.HardState != nil {
		last = max(last, rd.HardState.GetCommit())
	}
	if len(rd.Entries) > 0 && rd.Entries[0].GetIndex() <= last {
		return false
	}
	return last <= n.opts.Log.SyncedIndex()
}

// appliesState: some of the entries is a command or a conf change, whose
// application the store persists beside the raft log.
func appliesState(ents []*pb.Entry) bool {
	for _, e := range ents {
		if k := raftlog.KindOf(e); k == raftlog.KindCmd || k == raftlog.KindConf {
			return true
		}
	}
	return false
}

// splitMessages divides a Ready's messages into those sent before its
// write (early) and those sent only after the Sync (late). The leader
// writes in parallel with its followers (thesis §10.2.1): its appends and
// heartbeats leave first. A heartbeat answer vouches for nothing on disk
// and leaves first in every role, as etcd-raft's own asynchronous-write
// mode sends it (raft.send holds back only MsgAppResp, MsgVoteResp and
// MsgPreVoteResp): a leader's ReadIndex round then waits for no
// follower's disk. Nor does a follower's read index request or the
// leader's answer to it (FollowerReads): the index answered is a commit
// a quorum holds already. Everything else (MsgAppResp, votes: a node may
// have answered as a follower earlier in this Ready) waits for the Sync.
func splitMessages(leader bool, msgs []*pb.Message) (early, late []*pb.Message) {
	for _, m := range msgs {
		switch t := m.GetType(); {
		case t == pb.MsgHeartbeatResp, t == pb.MsgReadIndex, t == pb.MsgReadIndexResp,
			leader && (t == pb.MsgApp || t == pb.MsgHeartbeat):
			early = append(early, m)
		default:
			late = append(late, m)
		}
	}
	return early, late
}

// caughtUpLocked: this replica holds entries and has applied up to the
// highest commit index a leader told it. A replica bootstrapped empty may
// have acknowledged entries in an earlier life (a wiped data dir); every
// entry committed with such an acknowledgement is at or below the commit
// index of the leader it next hears from, so once it holds that much its
// own log's up-to-date check protects them again. REQUIRES: n.mu.
//
// The highest commit index seen is not persisted, so after a restart a
// joining replica waits for a leader's MsgApp again (it may have been
// halfway through catching up). A leader is caught up by definition: it
// won a vote with a log at least as up to date as a majority's.
func (n *Node) caughtUpLocked() bool {
	last, err := n.opts.Log.LastIndex()
	if err != nil || last == 0 {
		return false
	}
	return n.soft.RaftState == raft.StateLeader || (n.seenApp && n.commit >= n.seenCommit)
}

// send marshals and hands msgs to the transport (a snapshot to the
// store's sender), one raft message per follower for a run of appends
// (coalesce).
func (n *Node) send(msgs []*pb.Message) {
	for _, m := range coalesce(msgs) {
		b, err := proto.Marshal(m)
		if err != nil {
			continue // cannot happen for raft's own messages
		}
		if m.GetType() == pb.MsgSnap {
			md := m.GetSnapshot().GetMetadata()
			n.host.SendSnapshot(m.GetTo(), b, md.GetIndex(), md.GetTerm())
			continue
		}
		n.opts.Transport.Send(m.GetTo(), b)
	}
}

// sendRaw sends one message of this replica's own, outside raft.
func (n *Node) sendRaw(m *pb.Message) {
	if b, err := proto.Marshal(m); err == nil {
		n.opts.Transport.Send(m.GetTo(), b)
	}
}

// ReportSnapshot tells raft how the snapshot sent to peer id ended: ok, it
// took it (raft waits for its MsgAppResp to move on), or not (raft probes
// the peer again, and sends a new snapshot if it still needs one).
func (n *Node) ReportSnapshot(id uint64, ok bool) {
	st := raft.SnapshotFailure
	if ok {
		st = raft.SnapshotFinish
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return
	}
	n.rawLocked().ReportSnapshot(id, st)
	n.kick()
}

// SnapshotMessage returns msg, a marshalled MsgSnap, with its snapshot
// data set to data (the manifest).
func SnapshotMessage(msg, data []byte) ([]byte, error) {
	m := &pb.Message{}
	if err := proto.Unmarshal(msg, m); err != nil || m.GetType() != pb.MsgSnap || m.GetSnapshot() == nil {
		return nil, fmt.Errorf("%w: not a MsgSnap (%v)", ErrBadMessage, err)
	}
	m.Snapshot.Data = data
	return proto.Marshal(m)
}

// SnapshotOf decodes a marshalled MsgSnap: who sent it to whom, the raft
// index and term it is taken at, and its data (the manifest).
func SnapshotOf(msg []byte) (from, to, index, term uint64, data []byte, err error) {
	if len(msg) > MaxMessageBytes {
		return 0, 0, 0, 0, nil, fmt.Errorf("%w: %d bytes", ErrBadMessage, len(msg))
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(msg, m); err != nil {
		return 0, 0, 0, 0, nil, fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	if m.GetType() != pb.MsgSnap || m.GetSnapshot() == nil {
		return 0, 0, 0, 0, nil, fmt.Errorf("%w: a %v, not a MsgSnap", ErrBadMessage, m.GetType())
	}
	md := m.GetSnapshot().GetMetadata()
	return m.GetFrom(), m.GetTo(), md.GetIndex(), md.GetTerm(), m.GetSnapshot().GetData(), nil
}

// apply walks the committed entries: DATA entries advance commitEnd and
// answer waiters; a leader's first entry of its own term makes it ready;
// conf changes change the membership, and the host hears of them once the
// node's lock is released. An error (raft/conf not written, this replica
// removed) stops the node.
func (n *Node) apply(ents []*pb.Entry) error {
	changes, err := n.applyLocked(ents)
	for _, c := range changes {
		n.host.MembershipChanged(c)
	}
	return err
}

func (n *Node) applyLocked(ents []*pb.Entry) ([]raftlog.ConfChange, error) {
	if len(ents) == 0 {
		return nil, nil
	}
	var (
		lastTS   int64
		lastTerm uint64
		done     []*Waiter
		changes  []raftlog.ConfChange
		confErr  error
	)
	n.mu.Lock()
	defer n.mu.Unlock()
	for len(ents) > 0 && ents[0].GetIndex() <= n.commit {
		ents = ents[1:] // applied already (applyEarly)
	}
	if len(ents) == 0 {
		return nil, nil
	}
	for _, e := range ents {
		if t := e.GetType(); t == pb.EntryConfChange || t == pb.EntryConfChangeV2 {
			c, ok, err := n.applyConfLocked(e)
			if ok {
				changes = append(changes, c)
				n.commit = e.GetIndex()
			}
			if err != nil {
				// The entries after it are not applied: the node stops
				// (a failed raft/conf write restarts into the replay; a
				// removed member stops for good).
				confErr = err
				break
			}
		}
		n.commit, lastTerm = e.GetIndex(), e.GetTerm()
		if d := e.GetData(); e.GetType() == pb.EntryNormal && len(d) >= record.MinLen && record.HasMagic(d) {
			pos := record.PhysOffset(d)
			n.end = pos + int64(len(d))
			var ts int64
			ts, done = n.appliedPutsLocked(e.GetTerm(), pos, d, done)
			lastTS = max(lastTS, ts)
		} else if e.GetType() == pb.EntryNormal && len(d) > 0 {
			n.host.ApplyCmd(e.GetIndex(), d)
		}
		if n.soft.RaftState == raft.StateLeader && e.GetTerm() == n.term {
			n.ownTerm = true
		}
	}
	// The store first learns the commit end, then the putters hear PUT_OK:
	// a putter woken earlier would find its record not yet visible, be
	// answered before the index covered it (read your writes broken).
	n.host.Committed(n.end, lastTS, n.ready)
	for _, w := range done {
		w.finish(nil)
	}
	// Never stored: commit passed these positions with other entries, or
	// committed an entry of a later term than theirs. Terms only grow
	// along a log, so had such a waiter's entry committed, it would sit
	// before that entry and have been applied (and its waiter answered)
	// already. The term rule answers a deposed leader's putters as soon
	// as the next leader commits its first (empty) entry, not only once
	// a put of its passes their positions, which in a quiet group may
	// be never before their replication timeout.
	for k, w := range n.waiters {
		if k.pos < n.end || k.term < lastTerm {
			w.finish(&NotLeaderError{Cause: CauseSuperseded, LeaderID: n.soft.Lead, Term: n.term})
			delete(n.waiters, k)
		}
	}
	n.serveReadsLocked()
	n.maybeReadyLocked()
	return changes, confErr
}

// maybeReadyLocked passes the readiness barrier (design §3.2): a leader
// that applied its own term's first entry (proposals are refused until
// now, so log end = commit end) has the store reset its stamping table,
// then takes puts from the tail = the commit end. REQUIRES: n.mu.
func (n *Node) maybeReadyLocked() {
	if n.ready || !n.ownTerm || n.soft.RaftState != raft.StateLeader {
		return
	}
	if err := n.host.BecomeReady(n.end); err != nil {
		return
	}
	n.tail = n.end
	n.ready = true
	n.readyTerm = n.term
	n.confFloor = max(n.confFloor, n.commit)
}

// ProposedEnd is the commitlog offset past the last entry proposed here
// while the ready leader (its bytes may not be in the log yet; the commit
// end otherwise): once the commit end reaches it, every proposal made
// before has committed (the store's POP rewrite waits for that).
func (n *Node) ProposedEnd() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.flushLocked()
	return n.tail
}

// ReadyTerm is the term in which this replica became the ready leader,
// or 0 when it is not the ready leader: a caller that acted on state of
// one leadership (the delay scheduler's progress) tells a later one apart.
func (n *Node) ReadyTerm() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.ready || n.soft.RaftState != raft.StateLeader || n.err != nil {
		return 0
	}
	return n.readyTerm
}

// ProposeCmd proposes a storaged command (a CMD entry, applied by every
// replica through Host.ApplyCmd) on the ready leader of term readyTerm
// only (ReadyTerm): a command computed in an earlier leadership is
// refused (a *NotLeaderError), since what it covers may have been cut.
// It does not wait for the commit: a lost command is superseded by the
// next one. data must not look like records (record.HasMagic) nor be
// empty.
func (n *Node) ProposeCmd(readyTerm uint64, data []byte) error {
	if len(data) < 8 || record.HasMagic(data) {
		return fmt.Errorf("replica: a command must not be empty nor look like records")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.readRefusalLocked(); err != nil {
		return err
	}
	if n.readyTerm != readyTerm {
		return &NotLeaderError{Cause: CauseNotLeader, LeaderID: n.soft.Lead, Term: n.term}
	}
	if err := n.rawLocked().Propose(data); err != nil {
		if errors.Is(err, raft.ErrProposalDropped) {
			return ErrProposalDropped
		}
		return fmt.Errorf("replica: propose: %w", err)
	}
	n.kick()
	return nil
}

// RetryReady has the raft loop try the readiness barrier again now, not
// at its next tick: what made the host's BecomeReady fail has come about
// since (the store's idempotent-put window, read off the raft loop). It
// must not be called with anything held that BecomeReady takes.
func (n *Node) RetryReady() {
	n.mu.Lock()
	n.retry = true
	n.mu.Unlock()
	n.kick()
}

// Ready reports whether this replica is the ready leader (it takes puts).
func (n *Node) Ready() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready && n.soft.RaftState == raft.StateLeader && n.err == nil
}

// appliedPutsLocked walks the records of a DATA entry of term applied at
// commitlog offset pos: it returns the store time of the last (store
// times never go backwards along the log) and done with the waiters of
// the puts the entry holds (one put an entry, or the puts a leader
// stamped together: Propose) appended and removed from n.waiters.
// REQUIRES: n.mu.
func (n *Node) appliedPutsLocked(term uint64, pos int64, d []byte, done []*Waiter) (int64, []*Waiter) {
	var ts int64
	for off := 0; off+record.MinLen <= len(d); {
		h, err := record.Parse(d[off:])
		if err != nil || h.Total <= 0 {
			break
		}
		ts = record.StoreTimestamp(d[off:])
		if len(n.waiters) > 0 {
			k := key{term, pos + int64(off)}
			if w, ok := n.waiters[k]; ok {
				done = append(done, w)
				delete(n.waiters, k)
			}
		}
		off += int(h.Total)
	}
	return ts, done
}

// Stamp is the store's part of a proposal: it appends to dst the records
// stamped for commitlog offset pos and returns the longer slice, a commit
// func and an undo func. The node calls commit at once (the store
// advances its stamping table: the next put on the queue takes the next
// offsets), and undo, in the reverse order of the commits, for each put
// of an entry raft refused (nothing of it stored). All run under the
// node's lock.
type Stamp func(pos int64, dst []byte) (data []byte, commit, undo func(), err error)

// Propose stamps a put of size bytes of records: only on a ready leader
// with enough recently active followers and no transfer in progress
// (else a *NotLeaderError or ErrInSyncReplicasNotEnough, nothing stored).
// The returned waiter tells the outcome.
//
// The put is not handed to raft at once: the puts stamped until the
// raft loop next asks raft for a Ready (or anything else asks raft to
// act: rawLocked) are proposed as one entry. They would have gone into
// that Ready anyway, as entries of their own.
func (n *Node) Propose(size int, stamp Stamp) (*Waiter, int64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proposeLocked(size, stamp)
}

// proposeLocked is Propose. REQUIRES: n.mu.
func (n *Node) proposeLocked(size int, stamp Stamp) (*Waiter, int64, error) {
	if err := n.refusalLocked(); err != nil {
		return nil, 0, err
	}
	pos := raftlog.Place(n.tail, size, n.opts.FileSize)
	if p := len(n.pend.data); p > 0 && (pos != n.tail || uint64(p+size) > n.opts.MaxSizePerMsg) {
		// An entry lies in one file, and holds at most what one append
		// carries (a larger put is an entry of its own).
		if err := n.flushLocked(); err != nil {
			return nil, 0, err
		}
		pos = raftlog.Place(n.tail, size, n.opts.FileSize)
	}
	if len(n.pend.data) == 0 {
		n.pend.from = n.tail
		n.pend.data = make([]byte, 0, max(size, min(n.pendLast, int(n.opts.MaxSizePerMsg))))
	}
	data, commit, undo, err := stamp(pos, n.pend.data)
	if err != nil {
		return nil, 0, err
	}
	if len(data)-len(n.pend.data) != size {
		undo()
		return nil, 0, fmt.Errorf("replica: a put of %d bytes stamped %d", size, len(data)-len(n.pend.data))
	}
	commit()
	n.pend.data = data
	n.tail = pos + int64(size)
	k := key{n.rn.BasicStatus().GetTerm(), pos}
	w := &Waiter{done: make(chan struct{})}
	n.waiters[k] = w
	n.pend.puts = append(n.pend.puts, pendingPut{k: k, undo: undo})
	n.kick()
	return w, pos, nil
}

// flushLocked proposes the stamped puts as one entry. It runs before raft
// is asked for anything else (rawLocked), so the entry goes to raft in
// the term and leadership its puts were stamped in, after every entry
// stamped before. When raft drops it all the same (its bound on the
// uncommitted bytes), the stamps are undone in reverse, the tail goes
// back, and every put of it fails with ErrProposalDropped, nothing
// stored. REQUIRES: n.mu.
func (n *Node) flushLocked() error {
	p := n.pend
	if len(p.data) == 0 {
		return nil
	}
	n.pend, n.pendLast = pending{}, len(p.data)
	err := n.rn.Propose(p.data)
	if err == nil {
		return nil
	}
	if errors.Is(err, raft.ErrProposalDropped) {
		err = ErrProposalDropped
	} else {
		err = fmt.Errorf("replica: propose: %w", err)
	}
	for i := len(p.puts) - 1; i >= 0; i-- {
		pp := p.puts[i]
		pp.undo()
		if w, ok := n.waiters[pp.k]; ok {
			w.finish(err)
			delete(n.waiters, pp.k)
		}
	}
	n.tail = p.from
	return err
}

// rawLocked is the RawNode, for every call that makes raft act (a Step
// and the reports that are steps, a Tick, a Ready and its Advance, a
// proposal of another kind, a conf change applied, a campaign, a
// transfer), the stamped puts proposed first (flushLocked); only calls
// that read raft's state (BasicStatus, Status, WithProgress) go to
// n.rn itself. REQUIRES: n.mu.
func (n *Node) rawLocked() *raft.RawNode {
	n.flushLocked()
	return n.rn
}

// Refusal is why this replica would refuse a put now, or nil: the check
// Propose makes, for a caller that wants to refuse before doing anything
// else (the store, before it auto-creates a topic).
func (n *Node) Refusal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refusalLocked()
}

// heardLocked: a message from member id arrived within the last election
// timeout (the ticks field says why not raft's RecentActive). REQUIRES:
// n.mu.
func (n *Node) heardLocked(id uint64) bool {
	last, ok := n.heard[id]
	return ok && n.ticks-last < uint64(n.opts.ElectionTick)
}

// refusalLocked is why this replica takes no put now, or nil.
func (n *Node) refusalLocked() error {
	st := n.rn.BasicStatus()
	if err := n.leadRefusalLocked(st); err != nil {
		return err
	}
	voters, active := 0, 0
	n.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		if typ != raft.ProgressTypePeer || id == n.opts.ID {
			return
		}
		if pr.IsLearner {
			return
		}
		voters++
		if n.heardLocked(id) {
			active++
		}
	})
	// A quorum of voters+1 (self) needs quorum-1 followers, each heard
	// from within the last election timeout (n.heard).
	if need := (voters+1)/2 + 1 - 1; active < need {
		return fmt.Errorf("%w: %d of %d followers active, %d needed", ErrInSyncReplicasNotEnough, active, voters, need)
	}
	return nil
}

// leadRefusalLocked is why this replica is not a leader free to act (to
// take a put, or to hand its leadership over), or nil: stopped or removed,
// a follower (naming the leader it knows), no leader, a leader whose
// leadership is moving (TRANSFERRING, naming the transferee raft knows),
// or one not ready yet (its term's first entry not applied: entries of
// earlier terms, a conf change among them, may still be pending). st is
// raft's status now. REQUIRES: n.mu.
func (n *Node) leadRefusalLocked(st raft.BasicStatus) error {
	if errors.Is(n.err, ErrRemoved) {
		return &NotLeaderError{Cause: CauseRemoved, Term: n.term}
	}
	if n.err != nil {
		return n.err
	}
	switch {
	case st.RaftState != raft.StateLeader && st.Lead == raft.None:
		return &NotLeaderError{Cause: CauseNoLeader, Term: st.GetTerm()}
	case st.RaftState != raft.StateLeader:
		return &NotLeaderError{Cause: CauseNotLeader, LeaderID: st.Lead, Term: st.GetTerm()}
	case st.LeadTransferee != raft.None || n.leaving:
		return &NotLeaderError{Cause: CauseTransferring, LeaderID: st.LeadTransferee, Term: st.GetTerm()}
	case !n.ready:
		return &NotLeaderError{Cause: CauseLeaderNotReady, LeaderID: st.ID, Term: st.GetTerm()}
	}
	return nil
}

// Waiter is a proposed put waiting for its outcome.
type Waiter struct {
	done chan struct{}
	err  error
	then func(error) // Then's; guarded by the node's lock
}

// finish answers the waiter: then first, so that what it records is in
// place before a putter woken by done answers. REQUIRES: the node's lock,
// at most once.
func (w *Waiter) finish(err error) {
	w.err = err
	if w.then != nil {
		w.then(err)
		w.then = nil
	}
	close(w.done)
}

// Done is closed once the outcome is known; Err tells it then: nil
// (committed), a *NotLeaderError with CauseSuperseded or
// ErrProposalDropped (not stored), or ErrClosed (unknown).
func (w *Waiter) Done() <-chan struct{} { return w.done }

// Err is the outcome; valid once Done is closed.
func (w *Waiter) Err() error { return w.err }

// Then has f told w's outcome when it is known (at once if it is): the
// error Err gives, after the putter's own wait may have ended (timeout,
// ctx). The waiter stays until its outcome is known (commit passes its
// position or reaches a later term, on whichever leader; raft drops its
// entry) or the node closes: never Forget a waiter given to Then. f runs
// under the node's lock, before Done is closed: it must be quick and
// take no lock of the node's callers but a leaf one. At most one f per
// waiter.
func (n *Node) Then(w *Waiter, f func(error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-w.done:
		f(w.err)
	default:
		w.then = f
	}
}

// Forget drops a waiter that stopped waiting (timeout, ctx).
func (n *Node) Forget(w *Waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, v := range n.waiters {
		if v == w {
			delete(n.waiters, k)
		}
	}
}

// StepPeer hands a marshalled raftpb.Message from a peer to raft.
func (n *Node) StepPeer(b []byte) error {
	if len(b) > MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBadMessage, len(b), MaxMessageBytes)
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	if m.GetTo() != n.opts.ID {
		return fmt.Errorf("%w: for node %d, this is %d", ErrBadMessage, m.GetTo(), n.opts.ID)
	}
	if m.GetType() == pb.MsgProp {
		return n.stepRemovalRequest(m) // a member asking to be removed; no other proposal comes from a peer
	}
	if raft.IsLocalMsg(m.GetType()) {
		return fmt.Errorf("%w: message type %v is not a peer's", ErrBadMessage, m.GetType())
	}
	if m.GetType() == pb.MsgSnap {
		// A snapshot reaches raft only after its files are staged and
		// verified (StepSnapshot): raft would take its index as applied
		// over data that is not here.
		return fmt.Errorf("%w: a MsgSnap comes only with its files (the InstallSnapshot stream)", ErrBadMessage)
	}
	n.mu.Lock()
	member := n.isMember(m.GetFrom())
	if !member && !n.strangerMayLocked(m.GetFrom(), m.GetType()) {
		n.mu.Unlock()
		return fmt.Errorf("%w: from %d, not a member", ErrBadMessage, m.GetFrom())
	}
	if n.err != nil {
		n.mu.Unlock()
		return n.err
	}
	if member {
		n.heard[m.GetFrom()] = n.ticks
	}
	if skip, lost := n.screenLocked(m); lost != nil {
		n.err = lost
		n.failReadsLocked(lost)
		n.failSnapLocked(lost)
		n.mu.Unlock()
		n.host.Fail(lost)
		return lost
	} else if skip {
		n.mu.Unlock()
		return nil
	}
	err := n.rawLocked().Step(m)
	moved := m.GetType() == pb.MsgAppResp && n.rn.BasicStatus().GetCommit() > n.commit
	n.mu.Unlock()
	if err != nil {
		return fmt.Errorf("replica: step: %w", err)
	}
	if moved {
		select { // the loop may be waiting for a Sync (Node.sync)
		case n.committed <- struct{}{}:
		default:
		}
	}
	n.kick()
	return nil
}

// screenLocked looks at a peer's message before raft does (issue 14: a
// member that lost its log). It returns skip to drop the message, or an
// error wrapping ErrLostEntries that stops this replica.
//
//   - A replica bootstrapped empty and not caught up (joining) drops vote
//     requests from candidates that have a log: it may have acknowledged
//     entries in an earlier life that such a candidate lacks. Candidates
//     without a log (a new group's first election) get its vote as usual.
//   - A heartbeat whose commit index is past this replica's last index
//     says the leader counts entries this replica no longer holds (the
//     leader sends min(match, commit)). Joining, the replica drops it and
//     waits for a leader that probes it from scratch; otherwise its data
//     dir was rolled back, and it stops (etcd-raft would panic).
//   - On the leader, a rejected append whose hint is below the follower's
//     match says the follower lost entries it acknowledged. Raft never
//     moves a match index back, so this leader could not catch it up: it
//     hands leadership to the most caught-up active follower (once per
//     term), whose fresh progress probes the member from its real end.
//
// REQUIRES: n.mu.
func (n *Node) screenLocked(m *pb.Message) (skip bool, lost error) {
	switch m.GetType() {
	case pb.MsgApp:
		n.seenCommit = max(n.seenCommit, m.GetCommit())
		n.seenApp = true
	case pb.MsgVote, pb.MsgPreVote:
		if n.joining && m.GetIndex() > 0 && !n.caughtUpLocked() {
			n.withheld++
			n.opts.Logger.Infof("replica %d: joining: no vote for candidate %d (term %d, last index %d) before catching up",
				n.opts.ID, m.GetFrom(), m.GetTerm(), m.GetIndex())
			return true, nil
		}
	case pb.MsgHeartbeat:
		last, err := n.opts.Log.LastIndex()
		if err != nil || m.GetCommit() <= last {
			return false, nil
		}
		if n.joining {
			return true, nil
		}
		return true, fmt.Errorf("%w: leader %d counts entries up to %d as acknowledged here, the log ends at %d: the data dir "+
			"was rolled back (restored from an old copy?); wipe it to rejoin as an empty member, or restore the latest copy",
			ErrLostEntries, m.GetFrom(), m.GetCommit(), last)
	case pb.MsgAppResp:
		if !m.GetReject() || n.soft.RaftState != raft.StateLeader || n.lostTerm == n.term {
			return false, nil
		}
		from := m.GetFrom()
		var match, best, bestMatch uint64
		n.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
			switch {
			case id == from:
				match = pr.Match
			case id != n.opts.ID && typ == raft.ProgressTypePeer && pr.RecentActive && pr.Match >= bestMatch:
				best, bestMatch = id, pr.Match
			}
		})
		if m.GetIndex() < match || m.GetRejectHint() >= match {
			return false, nil // a stale rejection, or one raft handles
		}
		if best == 0 {
			n.opts.Logger.Warningf("replica %d: member %d lost entries it acknowledged (its log ends at %d, match %d); "+
				"no other active follower to hand leadership to", n.opts.ID, from, m.GetRejectHint(), match)
			return false, nil
		}
		n.lostTerm = n.term
		n.opts.Logger.Warningf("replica %d: member %d lost entries it acknowledged (its log ends at %d, match %d): "+
			"handing leadership to member %d so that a new leader catches it up from its real end", n.opts.ID, from,
			m.GetRejectHint(), match, best)
		n.rawLocked().TransferLeader(best)
		n.kick()
	}
	return false, nil
}

// isMember: id is a voter or a learner of the group as of the applied
// index; a replica that joined an existing group and knows no membership
// yet takes every peer its transport admits. REQUIRES: n.mu.
func (n *Node) isMember(id uint64) bool {
	return len(n.memberIDs) == 0 || slices.Contains(n.memberIDs, id)
}

// strangerMayLocked: a message of type t from id, which this replica's
// applied membership does not name, is stepped all the same when id was
// never removed from the group and the message is one a leader sends its
// followers (appends, heartbeats, a snapshot) or a candidate's vote
// request. A member that missed the addition of id (cut off, or down,
// while it joined) would otherwise refuse id for ever once id leads: the
// entries that add id are the ones it would have to take from id. And
// if the group's only other live voters are such members, id could never
// be elected without their votes (voters 1, 4, 5 with 4 down: 5 needs
// the vote of 1, which missed the additions of 4 and 5). Raft's safety
// does not rest on a follower or a voter knowing the configuration: a
// leader of a term at least the follower's was elected by a quorum of its
// own, the follower's log check (index and term of the previous entry)
// is the same for anyone, and a vote is granted on terms and logs alone
// (pre-vote and the leader lease still keep a candidate from disrupting
// a working leader). Answers and everything else from a stranger stay
// refused (this replica sent it nothing to answer), and a removed
// member, whose id is never reused, gets nothing stepped (ErrRemoved's
// contract). The transport learns where to answer from the stranger's
// batch header (server/peer). REQUIRES: n.mu.
func (n *Node) strangerMayLocked(id uint64, t pb.MessageType) bool {
	switch t {
	case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap, pb.MsgVote, pb.MsgPreVote:
	default:
		return false
	}
	return id != 0 && id != n.opts.ID && !slices.Contains(n.opts.Log.Conf().Removed, id)
}

// ReportUnreachable tells raft that sends to id failed.
func (n *Node) ReportUnreachable(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rawLocked().ReportUnreachable(id)
}

// Errors of a hand-over of the leadership (TransferLeadership,
// MoveLeadership).
var (
	// ErrNoTransferee: no recently active voter to hand the leadership to.
	// TransferLeadership's node refuses puts (TRANSFERRING) and stops as it
	// is; MoveLeadership changed nothing.
	ErrNoTransferee = errors.New("replica: no recently active voter to transfer leadership to")
	// ErrTransferTimeout: leadership did not move within the wait.
	ErrTransferTimeout = errors.New("replica: leadership did not move in time")
	// ErrNotVoter: MoveLeadership was asked for an id that is not a voter
	// of the group: a learner (raft never makes one leader), an unknown or
	// a removed id. Nothing changed.
	ErrNotVoter = errors.New("replica: not a voter of the group; the leadership stays")
	// ErrTransfereeInactive: MoveLeadership was asked for a voter not
	// heard from within the last election timeout: raft would wait for it
	// in vain while the leader refuses puts. Nothing changed.
	ErrTransfereeInactive = errors.New("replica: the voter was not heard from within an election timeout; the leadership stays")
)

// TransferLeadership is a stopping leader's last act (design §4
// "SIGTERM"): from now on this node refuses puts with TRANSFERRING
// (nothing stored; raft itself drops proposals while a transfer runs),
// for good (stopping: a MoveLeadership or removeSelf that gives up does
// not undo it), hands leadership to the recently active voter with the
// highest Match (or to the transferee of a hand-over running already) and
// waits until another member leads, the stop channel is closed, or wait
// has passed (handOverLocked). Puts proposed before it stay waiters: the
// new leader commits them, and this node, a follower now, answers them
// when it learns the commit. It returns the new leader's id; on a node
// that does not lead, the leader it knows (0: none) and nil at once.
func (n *Node) TransferLeadership(wait time.Duration, stop <-chan struct{}) (uint64, error) {
	n.mu.Lock()
	n.stopping = true
	return n.transferLeadershipLocked(wait, stop)
}

// transferLeadershipLocked is TransferLeadership without the stop, for a
// removeSelf attempt as well: puts stay refused when it fails (the
// caller's resumeLocked takes them again). REQUIRES: n.mu, which it
// unlocks.
func (n *Node) transferLeadershipLocked(wait time.Duration, stop <-chan struct{}) (uint64, error) {
	if n.err != nil {
		n.mu.Unlock()
		return 0, n.err
	}
	if st := n.rn.BasicStatus(); st.RaftState != raft.StateLeader {
		n.mu.Unlock()
		return st.Lead, nil
	}
	n.leaving = true // also when no voter can take over: the node stops as it is
	return n.handOverLocked(0, wait, stop)
}

// MoveLeadership is an operator's move of the leadership (etcd's
// move-leader) to voter to, or with to 0 to the recently active voter with
// the highest Match, as TransferLeadership chooses: while it runs this
// leader refuses puts with TRANSFERRING (nothing stored), and it returns
// the id of the member that leads next, once it leads. On to == this
// leader it returns at once, nothing changed.
//
// Refused, nothing changed: a *NotLeaderError on a member that is not the
// leader (naming the leader it knows), on a leader whose leadership is
// moving already (TRANSFERRING: another MoveLeadership, a removal of
// itself, a stop), or on one not ready yet (LEADER_NOT_READY: a conf
// change of an earlier term may be pending); ErrConfChangePending while a membership change this
// leader proposed has not applied (the change would be applied by the new
// leader, and a move to a voter being removed would leave the group
// without a leader for an election timeout: the caller retries once it
// applied; a change proposed while a move runs is refused TRANSFERRING);
// ErrNotVoter; ErrTransfereeInactive; ErrNoTransferee (to 0).
//
// ErrTransferTimeout: no other member led within two election timeouts
// or before ctx ended. If this member still leads in the same term, it
// aborts raft's transfer and takes puts again, unless the process began
// stopping meanwhile (TransferLeadership: its refusal stays). A
// transferee that got raft's MsgTimeoutNow before the abort may still win
// the election it starts: read the leader before trying again.
func (n *Node) MoveLeadership(ctx context.Context, to uint64) (uint64, error) {
	n.mu.Lock()
	st := n.rn.BasicStatus()
	if err := n.leadRefusalLocked(st); err != nil {
		n.mu.Unlock()
		return 0, err
	}
	if to == n.opts.ID {
		n.mu.Unlock()
		return to, nil
	}
	if n.confWait != nil {
		n.mu.Unlock()
		return 0, fmt.Errorf("%w: the leadership moves once it applied", ErrConfChangePending)
	}
	lead, err := n.handOverLocked(to, n.transferWait(), ctx.Done())
	if errors.Is(err, ErrTransferTimeout) {
		n.mu.Lock()
		n.resumeLocked(st.GetTerm())
		n.mu.Unlock()
	}
	return lead, err
}

// handOverLocked is the hand-over TransferLeadership, MoveLeadership and
// removeSelf share. On this leader it finds the transferee
// (transfereeLocked), refuses puts from now on (leaving: TRANSFERRING),
// asks raft to transfer the leadership and waits until another member
// leads (its id), wait has passed (0: no bound but stop) or stop is
// closed (ErrTransferTimeout), or the node closes (ErrClosed). A refused
// transferee changes nothing. Puts stay refused when it fails: the caller
// decides (resumeLocked). REQUIRES: n.mu held by the leader; it unlocks
// it.
func (n *Node) handOverLocked(to uint64, wait time.Duration, stop <-chan struct{}) (uint64, error) {
	to, err := n.transfereeLocked(to)
	if err != nil {
		n.mu.Unlock()
		return 0, err
	}
	n.leaving = true
	h := &handOver{to: to, term: n.rn.BasicStatus().GetTerm()}
	n.handing = h
	n.rawLocked().TransferLeader(to)
	n.kick()
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		if n.handing == h { // not a later one's (a stop during a move)
			n.handing = nil
		}
		n.mu.Unlock()
	}()
	var expired <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		expired = timer.C
	}
	for {
		n.mu.Lock()
		lead, changed := n.soft.Lead, n.softChanged
		n.mu.Unlock()
		if lead != raft.None && lead != n.opts.ID {
			return lead, nil
		}
		select {
		case <-changed:
		case <-expired:
			return 0, fmt.Errorf("%w: transferring to %d, still %d after %v", ErrTransferTimeout, to, lead, wait)
		case <-stop:
			return 0, fmt.Errorf("%w: transferring to %d, given up", ErrTransferTimeout, to)
		case <-n.done:
			return 0, ErrClosed
		}
	}
}

// handOver is a hand-over under way: its transferee and the term it
// began in.
type handOver struct{ to, term uint64 }

// retransferLocked asks raft again for the hand-over under way once raft
// has given it up, while this node leads in the term it began in.
// REQUIRES: n.mu.
func (n *Node) retransferLocked() {
	h := n.handing
	if h == nil || !n.leaving {
		return
	}
	if st := n.rn.BasicStatus(); st.RaftState == raft.StateLeader && st.GetTerm() == h.term && st.LeadTransferee == raft.None {
		n.rawLocked().TransferLeader(h.to)
	}
}

// transfereeLocked is the voter a hand-over goes to: voter to, if it is
// one (raft's configuration: a learner, an unknown or a removed id is
// ErrNotVoter) heard from within the last election timeout
// (ErrTransfereeInactive). With to 0: the transferee of the transfer raft
// runs already (a stop during a move keeps the move's target), else the
// recently active voter with the highest Match, the one that needs the
// fewest entries before raft sends it MsgTimeoutNow, so that it campaigns
// at once instead of after an election timeout (ErrNoTransferee: none).
// REQUIRES: n.mu.
func (n *Node) transfereeLocked(to uint64) (uint64, error) {
	st := n.rn.Status()
	if to != 0 {
		if pr, ok := st.Progress[to]; !ok || pr.IsLearner || to == n.opts.ID {
			return 0, fmt.Errorf("%w: member %d (voters %v, learners %v)", ErrNotVoter, to, n.members.Voters, n.members.Learners)
		}
		if !n.heardLocked(to) {
			return 0, fmt.Errorf("%w: voter %d", ErrTransfereeInactive, to)
		}
		return to, nil
	}
	if st.LeadTransferee != raft.None {
		return st.LeadTransferee, nil
	}
	var match uint64
	for id, pr := range st.Progress {
		// Active as for a put (heardLocked), not raft's RecentActive: a
		// leader stopped just after a check-quorum round found no voter
		// (TestGroupTransferAfterQuorumCheck).
		if id == n.opts.ID || pr.IsLearner || !n.heardLocked(id) {
			continue
		}
		if to == 0 || pr.Match > match || (pr.Match == match && id < to) {
			to, match = id, pr.Match
		}
	}
	if to == 0 {
		return 0, ErrNoTransferee
	}
	return to, nil
}

// resumeLocked makes a leader whose hand-over gave up take puts again: it
// aborts raft's transfer (a transfer to the leader itself does) and clears
// leaving, only while it leads in the term the hand-over began (a leader
// deposed meanwhile had leaving cleared when it stepped down, and once
// elected again may run another hand-over) and never once the process
// began stopping (TransferLeadership's refusal is for good). REQUIRES:
// n.mu.
func (n *Node) resumeLocked(term uint64) {
	st := n.rn.BasicStatus()
	if n.stopping || st.RaftState != raft.StateLeader || st.GetTerm() != term {
		return
	}
	if st.LeadTransferee != raft.None {
		n.rawLocked().TransferLeader(n.opts.ID)
		n.kick()
	}
	n.leaving = false
}

// transferWait bounds a MoveLeadership or a removeSelf attempt: two
// election timeouts, as the store gives a stopping leader (raft itself
// gives a transfer up after one); with ticks given by the host (tests:
// no TickInterval) the caller's ctx alone.
func (n *Node) transferWait() time.Duration {
	return 2 * time.Duration(n.opts.ElectionTick) * max(n.opts.TickInterval, 0)
}

// Campaign starts an election now (tests, operators).
func (n *Node) Campaign() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.rawLocked().Campaign()
	n.kick()
	return err
}

// Info is a replica's view of the group.
type Info struct {
	ID        uint64
	Role      string // leader, follower, candidate (pre-candidate too), learner
	Term      uint64
	LeaderID  uint64
	Commit    uint64
	Applied   uint64
	CommitEnd int64
	Ready     bool       // the leader takes puts (not while it transfers leadership)
	Peers     []PeerInfo // on the leader
	// Joining: bootstrapped empty, not caught up with a leader yet; it
	// withholds its vote from candidates that have a log. VotesWithheld
	// counts the vote requests it dropped so.
	Joining       bool
	VotesWithheld uint64
	// LeadersForgotten counts the leaders this member forgot because their
	// process was gone (PeerGone), EarlyCampaigns the elections it
	// started for that before raft's election timeout.
	LeadersForgotten, EarlyCampaigns uint64
	// ReadaheadBytes and Readaheads: the commitlog bytes this member,
	// leading, asked the kernel to read ahead of followers behind it, and
	// in how many requests (Options.CatchUpReadahead).
	ReadaheadBytes, Readaheads int64
	// ReadyHandling times each Ready the raft loop handled (its write,
	// sync, sends and applies); LogSync each sync of the raft log in it
	// (raftlog.Log.SyncLatency).
	ReadyHandling, LogSync hist.Snapshot
	// StorageEntries times raft's reads of this member's log
	// (raftlog.Log.EntriesLatency).
	StorageEntries hist.Snapshot
	// Membership is the group's membership as of Applied (read with it).
	Membership raftlog.Membership
	// TickInterval and ElectionTick are the raft timing this node runs
	// with, after New's defaults: what the host's options (storaged's
	// --raft-tick and --raft-election-timeout) reached raft as, so that
	// an operator or a test can check them on a running member rather
	// than infer them from how long an election took. TickInterval is 0
	// when the host drives the ticks (Options.Ticks).
	TickInterval time.Duration
	ElectionTick int
}

// PeerInfo is the leader's view of one member.
type PeerInfo struct {
	ID           uint64
	Match, Next  uint64
	RecentActive bool
	Learner      bool
}

// Info returns the replica's view of the group.
func (n *Node) Info() Info {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.rn.Status()
	in := Info{ID: n.opts.ID, Term: st.GetTerm(), LeaderID: st.Lead, Commit: st.GetCommit(), Applied: n.commit, CommitEnd: n.end,
		Ready: n.ready && st.RaftState == raft.StateLeader && !n.leaving && st.LeadTransferee == raft.None, Joining: n.joining, VotesWithheld: n.withheld,
		LeadersForgotten: n.forgotten, EarlyCampaigns: n.earlyCampaigns,
		ReadaheadBytes: n.raBytes.Load(), Readaheads: n.raCalls.Load(), StorageEntries: n.opts.Log.EntriesLatency(),
		ReadyHandling: n.readyLat.Snapshot(), LogSync: n.opts.Log.SyncLatency(), Membership: n.members.Clone(),
		TickInterval: n.tick, ElectionTick: n.opts.ElectionTick}
	switch st.RaftState {
	case raft.StateLeader:
		in.Role = "leader"
	case raft.StateCandidate, raft.StatePreCandidate:
		in.Role = "candidate"
	default:
		in.Role = "follower"
		if n.members.IsLearner(n.opts.ID) {
			in.Role = "learner"
		}
	}
	for id, pr := range st.Progress {
		in.Peers = append(in.Peers, PeerInfo{ID: id, Match: pr.Match, Next: pr.Next, RecentActive: pr.RecentActive, Learner: pr.IsLearner})
	}
	slices.SortFunc(in.Peers, func(a, b PeerInfo) int { return int(a.ID) - int(b.ID) })
	return in
}

// Linearizable reads (design replication.md §3.3). A read on the leader
// is linearizable once the leader has confirmed, after the read began,
// that it still leads (a quorum answered a heartbeat of its term: raft's
// ReadIndex, ReadOnlySafe) and has applied up to the commit index it had
// then: every put acknowledged before the read began is at or below that
// index. Readers register (ReadIndex); the raft goroutine gives every
// reader registered since its last pass one ReadIndex with a fresh request
// context (a batch), matches the Ready's ReadStates to the batches, and
// answers a batch once the applied index reaches its read index, with the
// commit end then (the store waits for its index to cover it). A
// follower, a node without a leader and a leader not ready refuse at once
// (NotLeaderError, nothing read); losing the leadership answers every
// waiting read the same way, since raft drops the pending requests.

// reads holds the linearizable reads waiting. REQUIRES: the node's lock.
type reads struct {
	queued  []*ReadWaiter         // registered, not yet in a ReadIndex
	batches map[uint64]*readBatch // by request context
	seq     uint64                // the last request context issued
	waiting int                   // unanswered readers, queued or batched
}

// readBatch is the readers of one ReadIndex request.
type readBatch struct {
	index   uint64 // the read index, once its ReadState came
	known   bool
	waiters []*ReadWaiter
}

// ReadWaiter is one linearizable read waiting for its read index.
type ReadWaiter struct {
	done     chan struct{}
	finished bool   // answered (done closed); REQUIRES: the node's lock
	batch    uint64 // its batch's request context; 0 while queued
	end      int64
	err      error
}

func (w *ReadWaiter) finish(end int64, err error) {
	w.end, w.err, w.finished = end, err, true
	close(w.done)
}

// lostLeadership is the answer of the reads waiting on a leader whose
// soft state just changed to ss.
func lostLeadership(ss *raft.SoftState, self, term uint64) error {
	switch {
	case ss.Lead == raft.None:
		return &NotLeaderError{Cause: CauseNoLeader, Term: term}
	case ss.Lead == self: // a new leadership of this node: not ready yet
		return &NotLeaderError{Cause: CauseLeaderNotReady, LeaderID: self, Term: term}
	}
	return &NotLeaderError{Cause: CauseNotLeader, LeaderID: ss.Lead, Term: term}
}

// readRefusalLocked is why this replica serves no linearizable read now
// (not the ready leader: a *NotLeaderError; stopped: the sticky error), or
// nil. Unlike a put, a read does not check the followers' recent activity:
// the ReadIndex round is that check. REQUIRES: n.mu.
func (n *Node) readRefusalLocked() error {
	if n.err != nil {
		return n.err
	}
	st := n.rn.BasicStatus()
	switch {
	case st.RaftState != raft.StateLeader && st.Lead == raft.None:
		return &NotLeaderError{Cause: CauseNoLeader, Term: st.GetTerm()}
	case st.RaftState != raft.StateLeader:
		return &NotLeaderError{Cause: CauseNotLeader, LeaderID: st.Lead, Term: st.GetTerm()}
	case !n.ready:
		return &NotLeaderError{Cause: CauseLeaderNotReady, LeaderID: st.ID, Term: st.GetTerm()}
	}
	return nil
}

// readIndexRefusalLocked is readRefusalLocked for a linearizable read:
// with FollowerReads a follower or learner that knows the leader may
// serve it (its ReadIndex goes to the leader, issueReadsLocked), where
// every other caller of readRefusalLocked (a command's proposal) needs the
// ready leader. REQUIRES: n.mu.
func (n *Node) readIndexRefusalLocked() error {
	if n.err == nil && n.opts.FollowerReads {
		if st := n.rn.BasicStatus(); st.RaftState == raft.StateFollower && st.Lead != raft.None {
			return nil
		}
	}
	return n.readRefusalLocked()
}

// ReadIndex waits until a linearizable read may be served here: this node
// is the ready leader, confirmed its leadership by a quorum after the call
// began, and applied everything committed at that point; or, with
// FollowerReads, this follower or learner got the leader's confirmed
// commit index for a request made after the call began, and applied that
// far. It returns the commit end then: the caller serves the read once
// its index covers it. Refusals (nothing read, a retry is safe): a
// *NotLeaderError (follower or learner without FollowerReads, no leader,
// leader not ready, or leadership lost meanwhile; on a follower, its
// leader changed),
// ErrReadIndexBusy (MaxReadWaiters reads wait already),
// ErrReadIndexTimeout (not confirmed within timeout), ctx's error, or the
// node's sticky error (ErrClosed once closed).
func (n *Node) ReadIndex(ctx context.Context, timeout time.Duration) (int64, error) {
	n.mu.Lock()
	if err := n.readIndexRefusalLocked(); err != nil {
		n.mu.Unlock()
		return 0, err
	}
	if n.reads.waiting >= n.opts.MaxReadWaiters {
		n.mu.Unlock()
		return 0, fmt.Errorf("%w: %d waiting", ErrReadIndexBusy, n.reads.waiting)
	}
	w := &ReadWaiter{done: make(chan struct{})}
	n.reads.queued = append(n.reads.queued, w)
	n.reads.waiting++
	n.mu.Unlock()
	n.kick()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	select {
	case <-w.done:
		return w.end, w.err
	case <-timer.C:
		err = ErrReadIndexTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if w.finished { // answered meanwhile
		return w.end, w.err
	}
	n.abandonReadLocked(w, err)
	return 0, err
}

// abandonReadLocked answers w with err and drops its batch once no reader
// waits for it (raft may never confirm it: a partitioned leader).
func (n *Node) abandonReadLocked(w *ReadWaiter, err error) {
	w.finish(0, err)
	n.reads.waiting--
	if w.batch == 0 {
		return // still queued: issueReadsLocked skips it
	}
	b := n.reads.batches[w.batch]
	if b == nil {
		return
	}
	for _, o := range b.waiters {
		if !o.finished {
			return
		}
	}
	delete(n.reads.batches, w.batch)
}

// issueReadsLocked gives the readers queued since the last pass one
// ReadIndex request, or refuses them when this node cannot serve them now.
func (n *Node) issueReadsLocked() {
	if len(n.reads.queued) == 0 {
		return
	}
	q := n.reads.queued
	n.reads.queued = nil
	if err := n.readIndexRefusalLocked(); err != nil {
		for _, w := range q {
			if !w.finished {
				w.finish(0, err)
				n.reads.waiting--
			}
		}
		return
	}
	b := &readBatch{}
	n.reads.seq++
	for _, w := range q {
		if !w.finished {
			w.batch = n.reads.seq
			b.waiters = append(b.waiters, w)
		}
	}
	if len(b.waiters) == 0 {
		return
	}
	n.reads.batches[n.reads.seq] = b
	n.rawLocked().ReadIndex(readCtx(n.opts.ID, n.reads.seq))
}

// readSeqStart is a random first batch number. A follower's read index
// answer can arrive late, after the follower restarted: were the numbers
// to start at 0 again, an answer to a batch of its earlier life (a read
// index from before puts that a new batch must see) could be taken for
// the new batch of the same number, and the read would miss them. The
// leader's term does not catch it (a follower back within the same term
// accepts the answer).
func readSeqStart() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails (Go 1.24+)
	return binary.BigEndian.Uint64(b[:])
}

// readCtx is the request context of a batch of reads: this member's id
// and the batch's number. The leader keys its pending read requests by
// it, its own and its followers' (FollowerReads) alike, and drops a
// request whose context it already holds (raft's readOnly.addRequest):
// the id keeps two members' batches apart.
func readCtx(id, seq uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, id)
	binary.BigEndian.PutUint64(b[8:], seq)
	return b
}

// readStatesLocked records the read indexes raft confirmed, then serves
// the batches already applied. A ReadState whose batch is gone (its
// readers gave up, or were answered at a step-down) is ignored.
func (n *Node) readStatesLocked(rss []raft.ReadState) {
	for _, rs := range rss {
		if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.opts.ID {
			continue
		}
		if b := n.reads.batches[binary.BigEndian.Uint64(rs.RequestCtx[8:])]; b != nil {
			b.index, b.known = rs.Index, true
		}
	}
	n.serveReadsLocked()
}

// serveReadsLocked answers the batches whose read index is applied, with
// the commit end: the store has been told it (Committed) already.
func (n *Node) serveReadsLocked() {
	for id, b := range n.reads.batches {
		if !b.known || b.index > n.commit {
			continue
		}
		for _, w := range b.waiters {
			if !w.finished {
				w.finish(n.end, nil)
				n.reads.waiting--
			}
		}
		delete(n.reads.batches, id)
	}
}

// failReadsLocked answers every waiting read with err (nothing read).
func (n *Node) failReadsLocked(err error) {
	for _, w := range n.reads.queued {
		if !w.finished {
			w.finish(0, err)
			n.reads.waiting--
		}
	}
	n.reads.queued = nil
	for id, b := range n.reads.batches {
		for _, w := range b.waiters {
			if !w.finished {
				w.finish(0, err)
				n.reads.waiting--
			}
		}
		delete(n.reads.batches, id)
	}
}

// ReadsWaiting is how many linearizable reads wait for their read index
// (tests, metrics).
func (n *Node) ReadsWaiting() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reads.waiting
}

// snapWait is a snapshot stepped into raft, waiting for the raft loop.
type snapWait struct {
	index uint64
	done  chan snapResult // buffered: the raft loop never blocks on it
}

type snapResult struct {
	installed bool
	err       error
}

// failSnapLocked answers a waiting StepSnapshot with err. REQUIRES: n.mu.
func (n *Node) failSnapLocked(err error) {
	if n.snap != nil {
		n.snap.done <- snapResult{err: err}
		n.snap = nil
	}
}

// ErrSnapshotBusy: another snapshot is being stepped into raft.
var ErrSnapshotBusy = errors.New("replica: a snapshot is being installed already")

// StepSnapshot steps a marshalled MsgSnap whose files the store has
// staged and verified (design §3.5, etcd's SaveDBFrom before Process) and
// waits until raft has dealt with it: restored, then installed by the raft
// loop through Host.InstallSnapshot (installed true, err its outcome), or
// not needed (raft ignored a stale term, or this replica has committed the
// index, or holds it with the same term and just commits up to it:
// installed false, err nil; the staged files are of no use then). Refused
// like StepPeer: a message too big, undecodable, not a MsgSnap, not for
// this node, from a non-member (ErrBadMessage).
func (n *Node) StepSnapshot(b []byte) (installed bool, err error) {
	if len(b) > MaxMessageBytes {
		return false, fmt.Errorf("%w: %d bytes, limit %d", ErrBadMessage, len(b), MaxMessageBytes)
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(b, m); err != nil {
		return false, fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	if m.GetType() != pb.MsgSnap || m.GetSnapshot() == nil || m.GetTo() != n.opts.ID {
		return false, fmt.Errorf("%w: a %v for node %d, want a MsgSnap for %d", ErrBadMessage, m.GetType(), m.GetTo(), n.opts.ID)
	}
	n.mu.Lock()
	if !n.takesSnapshotFromLocked(m.GetFrom()) {
		n.mu.Unlock()
		return false, fmt.Errorf("%w: from %d, not a peer", ErrBadMessage, m.GetFrom())
	}
	if n.err != nil {
		err := n.err
		n.mu.Unlock()
		return false, err
	}
	if n.snap != nil {
		n.mu.Unlock()
		return false, ErrSnapshotBusy
	}
	n.heard[m.GetFrom()] = n.ticks
	// A leader's snapshot tells a joining replica what is committed, as
	// its appends do.
	idx := m.GetSnapshot().GetMetadata().GetIndex()
	n.seenCommit, n.seenApp = max(n.seenCommit, idx), true
	if err := n.rawLocked().Step(m); err != nil {
		n.mu.Unlock()
		return false, fmt.Errorf("replica: step: %w", err)
	}
	if !n.rawLocked().HasReady() {
		n.mu.Unlock()
		return false, nil // ignored (a stale term): nothing to install
	}
	w := &snapWait{index: idx, done: make(chan snapResult, 1)}
	n.snap = w
	n.mu.Unlock()
	n.kick()
	select {
	case r := <-w.done:
		return r.installed, r.err
	case <-n.done:
		return false, ErrClosed
	}
}

// SnapshotMessageAt returns msg, a marshalled MsgSnap, taken at raft index
// index of term term instead of raft's own (a sender may ship a later,
// committed index than the log's base: the follower then needs fewer
// entries after it), with its data set to data (the manifest) and its
// ConfState to m, the membership at index (raft restores the follower's
// configuration from it).
func SnapshotMessageAt(msg []byte, index, term uint64, data []byte, mem raftlog.Membership) ([]byte, error) {
	m := &pb.Message{}
	if err := proto.Unmarshal(msg, m); err != nil || m.GetType() != pb.MsgSnap || m.GetSnapshot() == nil {
		return nil, fmt.Errorf("%w: not a MsgSnap (%v)", ErrBadMessage, err)
	}
	md := m.GetSnapshot().GetMetadata()
	if md == nil || index < md.GetIndex() {
		return nil, fmt.Errorf("%w: a snapshot moved back from %d to %d", ErrBadMessage, md.GetIndex(), index)
	}
	md.Index, md.Term = proto.Uint64(index), proto.Uint64(term)
	md.ConfState = mem.ConfState()
	m.Snapshot.Data = data
	return proto.Marshal(m)
}
