package storage

import (
	"errors"
	"fmt"
	"time"
)

// Topic configuration in group mode (design replication.md §3.5's CMD
// entries; delaycmd.go's cmdTopic): a create or a raise of a topic's
// queue count is proposed on the ready leader as a command, applied by
// every replica in log order (max of the current count and the command's,
// so racing changes commute) and answered once the leader applied it.
// A put to an unknown topic auto-creates it the same way before it is
// proposed itself, so the create precedes the put in the log. The table
// on disk (config/topics.json) records the raft index of the last command
// it holds; Open replays the committed commands after it (raft never
// hands back entries at or below the commit index). Deletes are
// replicated commands too (replicateDelete, applyTopicDelete below); a
// delete clears the topic's consumer state as it applies (topicclear.go).

// ErrTopicChangeTimeout: a topic create or raise was proposed to the
// group but not seen applied within GroupOptions.ReplicationTimeout: it
// may still apply; a retry is safe (creates and raises are idempotent).
// It is wrapped with ErrTopicConfig, so a put that needed the topic is
// refused as when the table cannot be persisted (nothing stored).
var ErrTopicChangeTimeout = errors.New("storage: topic change proposed to the group, not seen applied in time; outcome unknown")

// replicateTopic proposes a create or raise of name to queues and waits
// until this replica applied it: a *NotLeaderError (not the ready leader,
// nothing proposed), ErrTopicChangeTimeout (with ErrTopicConfig), or
// ErrClosed.
func (s *Store) replicateTopic(name string, queues int32) error {
	g := s.group
	if err := g.node.Refusal(); err != nil {
		return err
	}
	epoch := g.node.ReadyTerm()
	if err := g.node.ProposeCmd(epoch, encodeTopicCmd(name, queues)); err != nil {
		return err
	}
	timer := time.NewTimer(g.opts.ReplicationTimeout)
	defer timer.Stop()
	for {
		ch := g.waitChan()
		if n, ok := s.topics.get(name); ok && n >= queues {
			return nil
		}
		if s.closed.Load() {
			return ErrClosed // Close signals the wait
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%w: %w: topic %s (%d queues)", ErrTopicConfig, ErrTopicChangeTimeout, name, queues)
		}
	}
}

// applyTopicCmd applies a committed topic command (groupHost.ApplyCmd,
// the raft goroutine) and wakes the proposer's wait.
func (s *Store) applyTopicCmd(index uint64, data []byte) {
	name, queues, err := decodeTopicCmd(data)
	if err != nil {
		s.opts.Logger.Error().Err(err).Uint64("raft_index", index).Msg("storage: bad topic command skipped")
		return
	}
	if err := s.topics.applyReplicated(name, queues, index); err != nil {
		s.opts.Logger.Warn().Err(err).Uint64("raft_index", index).
			Msg("storage: a replicated topic change applied but not persisted; the next start replays it from the raft log")
	}
	s.group.signal()
}

// replayTopicCmds applies, at Open, the committed topic commands (creates,
// raises, deletes) after the one the table on disk holds (up to commit,
// the commit index), in log order, before the consume queues are loaded.
// The commands are collected first: a delete reads the raft log (its
// data end), which Cmds holds locked while it calls back.
func (s *Store) replayTopicCmds(commit uint64) error {
	type cmd struct {
		index uint64
		b     []byte
	}
	var cmds []cmd
	if err := s.group.rlog.Cmds(s.topics.raftIndex+1, commit, isTopicChangeCmd, func(i uint64, b []byte) error {
		cmds = append(cmds, cmd{i, b})
		return nil
	}); err != nil {
		return err
	}
	for _, c := range cmds {
		if isTopicDeleteCmd(c.b) {
			if err := s.applyTopicDelete(c.index, c.b); err != nil {
				return err
			}
			continue
		}
		name, queues, err := decodeTopicCmd(c.b)
		if err != nil {
			return fmt.Errorf("storage: the topic command at raft index %d: %w", c.index, err)
		}
		if err := s.topics.applyReplicated(name, queues, c.index); err != nil {
			s.opts.Logger.Warn().Err(err).Uint64("raft_index", c.index).Msg("storage: a replayed topic change not persisted")
		}
	}
	return nil
}

// replicateDelete is DeleteTopic in group mode (see above): it returns
// the tombstone's commitlog offset once the delete applied here; a
// *NotLeaderError (nothing proposed), ErrTopicNotFound,
// ErrTopicChangeTimeout (with ErrTopicConfig: proposed, not seen applied
// in time; puts to the topic stay refused until it applies or another
// leadership begins), or ErrClosed.
func (s *Store) replicateDelete(name string) (int64, error) {
	g := s.group
	if err := g.node.Refusal(); err != nil {
		return 0, err
	}
	if _, ok := s.topics.get(name); !ok {
		return 0, fmt.Errorf("%w: %s", ErrTopicNotFound, name)
	}
	epoch, applied := g.node.ReadyTerm(), g.node.Info().Applied
	// Blocked before the proposal: a put stamped after it in the log would
	// continue the deleted queues (a stamp in progress holds the node's
	// lock, so it is proposed before the delete). Offset commits and POP
	// changes under way finish first (they hold the fences shared until
	// their record applied), and those after see the block
	// (topicclear.go).
	s.deleteFence.Lock()
	s.popRewrite.Lock()
	s.topics.setBlocked(name, true)
	err := g.node.ProposeCmd(epoch, encodeTopicDeleteCmd(name))
	if err != nil {
		s.topics.setBlocked(name, false)
	}
	s.popRewrite.Unlock()
	s.deleteFence.Unlock()
	if err != nil {
		return 0, err
	}
	timer := time.NewTimer(g.opts.ReplicationTimeout)
	defer timer.Stop()
	for {
		ch := g.waitChan()
		if s.topics.deletedSince(name, applied) {
			return s.topics.tombstones()[name], nil
		}
		if s.closed.Load() {
			return 0, ErrClosed
		}
		select {
		case <-ch:
		case <-timer.C:
			return 0, fmt.Errorf("%w: %w: delete of topic %s", ErrTopicConfig, ErrTopicChangeTimeout, name)
		}
	}
}

// applyTopicDelete applies a committed topic delete at raft index index:
// the raft goroutine (groupHost.ApplyCmd, the node's lock held: the
// stamping table is the node's), or Open's replay before the consume
// queues exist (the rebuild drops a tombstoned topic's queues then). An
// error is a delete that cannot be applied: the replica stops.
func (s *Store) applyTopicDelete(index uint64, data []byte) error {
	name, err := decodeTopicDeleteCmd(data)
	if err != nil {
		// Every replica refuses the same bytes alike: skipped everywhere.
		s.opts.Logger.Error().Err(err).Uint64("raft_index", index).Msg("storage: bad topic delete command skipped")
		return nil
	}
	at, err := s.group.rlog.DataEndAt(index)
	if err != nil {
		return fmt.Errorf("storage: the topic delete at raft index %d: %w", index, err)
	}
	var publish func(*topicSnapshot)
	var dropErr error
	if s.index != nil {
		publish = func(next *topicSnapshot) {
			// The dispatcher has indexed nothing past at (the commit end of
			// this batch is not published yet): paused, it resumes with the
			// tombstone in place and the queues gone. The table changes
			// last: whoever sees the topic gone or its tombstone finds its
			// queues and consumer state gone too (the removal of the queue
			// files may take a while on a busy disk).
			s.index.Paused(func() {
				dropErr = s.index.DropTopicPaused(name)
				s.dropConsumerState(name, at)
				s.topics.cur.Store(next)
			})
		}
	}
	applied, perr := s.topics.applyDelete(name, at, index, publish)
	if !applied {
		return nil
	}
	if s.index != nil {
		s.seq.take(name)
	}
	if perr != nil {
		s.opts.Logger.Warn().Err(perr).Uint64("raft_index", index).
			Msg("storage: a replicated topic delete applied but not persisted; the next start replays it from the raft log")
	}
	if dropErr != nil {
		s.opts.Logger.Warn().Err(dropErr).Str("topic", name).Msg("storage: removing a deleted topic's consume queues failed (a restart drops them)")
	}
	if s.group != nil {
		s.group.signal()
	}
	return nil
}
