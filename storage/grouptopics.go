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
// hands back entries at or below the commit index). Deletes are not
// replicated (DeleteTopic is refused in a group).

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

// replayTopicCmds applies, at Open, the committed topic commands after
// the one the table on disk holds (up to commit, the commit index).
func (s *Store) replayTopicCmds(commit uint64) error {
	return s.group.rlog.Cmds(s.topics.raftIndex+1, commit, isTopicCmd, func(i uint64, b []byte) error {
		name, queues, err := decodeTopicCmd(b)
		if err != nil {
			return fmt.Errorf("storage: the topic command at raft index %d: %w", i, err)
		}
		if err := s.topics.applyReplicated(name, queues, i); err != nil {
			s.opts.Logger.Warn().Err(err).Uint64("raft_index", i).Msg("storage: a replayed topic change not persisted")
		}
		return nil
	})
}
