package storage

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/storaged/storaged/storage/dedup"
)

// A group member's idempotent-put window (idempotent.go) holds the keys of
// the puts committed up to the commit end, whichever leader took them, so
// that a retry sent to a new leader after a failover is answered, not
// stored again. Every member keeps its window up to the commit as commits
// arrive (trackDedup: a parse of the newly committed records on the raft
// goroutine), so that a member that becomes the leader reads only what
// lies past it (readyDedup), not the last DedupRebuildBytes of its log:
// a failover's time without writes would grow with the log (BENCHMARKS.md
// "Failover").
//
// A window that does not hold exactly the committed keys is read again
// from the log in full: a member just started (its window starts empty;
// read up to the commit end recovered at Open, startGroup),
// one that led (its window misses the keys of puts whose outcome it did
// not learn, and may hold first puts under way), one whose log a snapshot
// replaced. A full read grows with the keys and with the log it parses
// (up to DedupRebuildBytes): 0.15-0.2 s for a window at its bound (262,144
// keys) on the machine of BENCHMARKS.md, more on a slower or loaded CPU.
// So it runs on a goroutine of its own (dedupLoop), never on the raft
// goroutine, where the member would answer nothing meanwhile: a leader
// would send no heartbeat (past the election timeout its followers elect
// another), a follower would acknowledge no append. Commits go on during
// the read; the reader then
// catches up with them and installs the window. A leader whose window is
// still being read is not ready (its puts are refused LEADER_NOT_READY,
// nothing stored); the reader has it try again once the window is in
// (BecomeReady, replica.Node.RetryReady).

// errDedupReading: a new leader's window is still being read from the log.
var errDedupReading = errors.New("storage: the idempotent-put window is still being read from the log")

// dedupCatchUpUnlocked: when the commits a finished read has to catch up
// with span more than this, the reader reads them without the lock
// first (the raft goroutine takes it at each commit).
const dedupCatchUpUnlocked = 1 << 20

// dedupReader is a group member's state of its window (groupState.dedup).
type dedupReader struct {
	mu sync.Mutex
	// to: the window holds exactly the keyed puts committed below this
	// commitlog offset (within the window's time); -1 when it does not.
	to int64
	// want is the last commit end the raft goroutine reported.
	want int64
	// gen counts the times the log was replaced or this member began to
	// lead: a read asked for in an earlier generation is dropped when it
	// ends.
	gen uint64
	// reading: a read of generation gen was asked for and has not ended.
	reading bool
	// ask is the read asked for and not yet taken by dedupLoop.
	ask *dedupAsk

	wake chan struct{} // capacity 1: a read was asked for
	stop chan struct{} // closed by Close
	done chan struct{} // closed when dedupLoop returns
	// reads counts the full reads asked for (tests).
	reads atomic.Int64
	// hook, if set (tests), is called before each read.
	hook func()
}

// dedupAsk: read the window from the log below end, in generation gen.
type dedupAsk struct {
	gen uint64
	end int64
}

func newDedupReader(hook func()) *dedupReader {
	return &dedupReader{to: -1, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), hook: hook}
}

// trackDedup keeps the window up to commitEnd (replica.Host.Committed, the
// raft goroutine). The ready leader's put path keeps its own window: it
// forgot the committed state when it became ready (BecomeReady), and
// nothing reads it again until it stops leading or a snapshot replaces
// its log.
func (s *Store) trackDedup(commitEnd int64, leader bool) {
	if !leader {
		s.dedupUpTo(commitEnd)
	}
}

// readyDedup: the window must hold the keys of every put committed up to
// commitEnd before this new leader takes puts (BecomeReady). What
// trackDedup did not read yet is read now; errDedupReading while a full
// read runs.
func (s *Store) readyDedup(commitEnd int64) error {
	if !s.dedupUpTo(commitEnd) {
		return errDedupReading
	}
	return nil
}

// forgetDedup: the window no longer holds exactly the committed keys. The
// member became the ready leader (its put path keeps the window from now
// on, with first puts under way and the keys of puts whose outcome it may
// not learn: should it stop leading, the window is read again), or a
// snapshot replaced its log. A read under way is dropped.
func (s *Store) forgetDedup() {
	r := s.group.dedup
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to = -1
	r.gen++
	r.reading = false
	r.ask = nil
}

// dedupUpTo makes the window hold the committed keys up to commitEnd and
// reports whether it does (true without a window): it reads what lies
// past to on the calling goroutine (a commit's records), or asks
// dedupLoop for a full read when the window does not hold exactly the
// committed keys (to -1) or holds keys past commitEnd; false while that
// read runs.
func (s *Store) dedupUpTo(commitEnd int64) bool {
	if s.dedup.Load() == nil {
		return true
	}
	r := s.group.dedup
	r.mu.Lock()
	defer r.mu.Unlock()
	r.want = commitEnd
	switch {
	case r.reading:
		return false
	case r.to < 0 || r.to > commitEnd:
		r.reading = true
		r.ask = &dedupAsk{gen: r.gen, end: commitEnd}
		r.reads.Add(1)
		select {
		case r.wake <- struct{}{}:
		default:
		}
		return false
	case commitEnd > r.to:
		s.scanDedup(s.dedup.Load(), r.to, commitEnd, false, nil)
		r.to = commitEnd
	}
	return true
}

// dedupLoop runs the full reads of a group member's window (started by
// startGroup, stopped by Close).
func (s *Store) dedupLoop() {
	r := s.group.dedup
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-r.wake:
		}
		r.mu.Lock()
		a := r.ask
		r.ask = nil
		r.mu.Unlock()
		if a == nil {
			continue // dropped before it was taken
		}
		if r.hook != nil {
			r.hook()
		}
		// Logged at its start too: while it runs, this member, elected,
		// answers puts LEADER_NOT_READY.
		s.opts.Logger.Info().Int64("to", a.end).Msg("storage: reading the idempotent-put window from the log, beside the raft loop")
		s.finishDedup(a, s.buildDedup(a.end, false, r.stop))
	}
}

// finishDedup catches w, read below a.end, up with the commits reported
// since and installs it, unless its generation has passed or the store is
// closing. The last stretch is read under the lock, so that no commit
// falls between the read and the install.
func (s *Store) finishDedup(a *dedupAsk, w *dedup.Window[dedupValue]) {
	r := s.group.dedup
	at := a.end
	for round := 0; ; round++ {
		if closed(r.stop) {
			return // w may be partial
		}
		r.mu.Lock()
		if r.gen != a.gen {
			r.mu.Unlock()
			return
		}
		want := max(r.want, at)
		if want-at > dedupCatchUpUnlocked && round < 8 {
			r.mu.Unlock()
			s.scanDedup(w, at, want, false, r.stop)
			at = want
			continue
		}
		s.scanDedup(w, at, want, false, nil)
		s.dedup.Store(w)
		r.to, r.reading = want, false
		r.mu.Unlock()
		// A leader waiting for this read becomes ready now, not at its
		// next tick (after r.mu: BecomeReady takes it under the node's
		// lock).
		s.group.node.RetryReady()
		return
	}
}

// stopDedup stops dedupLoop (Close, after the raft loop stopped).
func (s *Store) stopDedup() {
	close(s.group.dedup.stop)
	<-s.group.dedup.done
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
