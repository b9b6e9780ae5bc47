package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/retention"
	"github.com/storaged/storaged/storage/schedule"
)

// The store's parts reach it only through the small interfaces they
// declare (schedule.Host, retention.Host). These adapter types implement
// them over the store without adding those methods to Store's own API.

// scheduleHost is the store as the delay scheduler sees it.
type scheduleHost Store

var _ schedule.Host = (*scheduleHost)(nil)

func (h *scheduleHost) Queue(topic string, qid int32) *consumequeue.Queue {
	return h.index.Queue(topic, qid)
}
func (h *scheduleHost) Keys() []consumequeue.Key { return h.index.Keys() }
func (h *scheduleHost) Dispatched() int64        { return h.index.Dispatched() }
func (h *scheduleHost) ReadRecord(phys int64) (*record.Record, error) {
	return (*Store)(h).readRecord(phys)
}
func (h *scheduleHost) DurableTo(off int64) error { return (*Store)(h).durableTo(off) }
func (h *scheduleHost) Delivering() bool {
	return (*Store)(h).Role() == RoleMaster && (*Store)(h).groupDelivering()
}
func (h *scheduleHost) Epoch() uint64                     { return (*Store)(h).groupEpoch() }
func (h *scheduleHost) Replicated() (map[int]int64, bool) { return (*Store)(h).groupDelayProgress() }
func (h *scheduleHost) ProposeProgress(e uint64, n []int64) error {
	return (*Store)(h).groupProposeProgress(e, n)
}

// Redeliver puts a due message back through the put path; refusals by
// validation or by the topic config can never pass and are marked
// schedule.ErrUndeliverable.
func (h *scheduleHost) Redeliver(m *record.Message) (int64, error) {
	res, err := (*Store)(h).PutMessage(context.Background(), m)
	if res.Appended() {
		return res.Append.NextOffset(), nil
	}
	var verr *ValidationError
	if errors.As(err, &verr) || errors.Is(err, ErrTopicNotFound) || errors.Is(err, ErrTooManyTopics) {
		return 0, errors.Join(schedule.ErrUndeliverable, err)
	}
	return 0, err
}

// retentionHost is the store as retention sees it.
type retentionHost Store

var _ retention.Host = (*retentionHost)(nil)

func (h *retentionHost) LastStoreTime() int64 { return (*Store)(h).lastStoreTime() }

func (h *retentionHost) TrimQueues(minPhys int64) (int, error) { return h.index.TrimBelow(minPhys) }

// DeletableEnd is the commitlog offset no deleted file may reach past: the
// checkpoint's dispatched offset (recovery re-dispatches from there), the
// durable offset, and, on a master, the first delayed message whose
// delivery is not yet persisted (a slave does not deliver, so it deletes by
// time only, as RocketMQ does). When the checkpoint is short of want, it is
// brought up to date first. A failed commitlog sync there is sticky and
// returned; any other failure of the checkpoint (ENOSPC writing it on a
// full disk, above all) is a transient fault the dispatcher retries, and
// the files below the last checkpoint written may still go: a store that
// refuses puts for a full disk must be able to free it without writing.
func (h *retentionHost) DeletableEnd(want int64) (int64, error) {
	s := (*Store)(h)
	cpEnd := s.index.LastCheckpoint().Dispatched
	if cpEnd < want && s.index.Dispatched() > cpEnd {
		if err := s.index.Checkpoint(); err != nil {
			if errors.Is(err, ErrWriteFailed) {
				return 0, err // the checkpoint called fail
			}
			s.faults.Failed(fault.Checkpoint, err)
		}
		cpEnd = s.index.LastCheckpoint().Dispatched
	}
	limit := min(cpEnd, s.log.Flushed())
	// Consumer offsets whose latest record lies in a file about to go are
	// written again first (consumer_offsets.go); what cannot be stays.
	limit = min(limit, s.rewriteOffsets(min(want, limit)))
	limit = min(limit, s.rewritePop(min(want, limit))) // POP state likewise (pop.go)
	limit = min(limit, s.txnProtectedFrom())           // pending half messages (transactions.go)
	if s.sched != nil && s.Role() == RoleMaster {
		limit = min(limit, s.schedProtectedFrom(), s.timerProtectedFrom())
	}
	if s.group != nil {
		if s.group.pins.Load() > 0 {
			limit = min(limit, s.log.MinOffset()) // a snapshot being sent names every file
		}
		limit = min(limit, s.groupKeepFrom())
	}
	return limit, nil
}

// BeforeDelete compacts a replica's raft log past the entries whose data
// lies in the files about to go (design §3.5): raft then never asks for
// them (Entries would find their bytes gone), and a follower that still
// needs them gets a snapshot. Standalone, nothing refers to the files.
func (h *retentionHost) BeforeDelete(end int64) error {
	s := (*Store)(h)
	if s.group == nil {
		return nil
	}
	if s.group.node == nil {
		return fmt.Errorf("storage: the raft node is not running")
	}
	// The delivery progress commands go with the compacted entries: the
	// progress they set is written down first (group_progress.go).
	applied := s.group.node.Info().Applied
	if err := s.persistProgress(applied, 0); err != nil {
		return err
	}
	return s.group.rlog.CompactBelow(end, applied)
}

// groupKeepFrom is the commitlog offset retention keeps from in group
// mode, whatever FileReservedTime says: on the leader, the data its
// slowest follower still needs from the raft log (the data end at its
// match index), but no more than CatchUpWindow bytes below the commit end
// (a follower further behind gets a snapshot); on any other replica the
// commit end, so nothing more than time-based retention (a follower that
// becomes leader sends snapshots to what it no longer holds).
func (s *Store) groupKeepFrom() int64 {
	g := s.group
	ce := g.commitEnd.Load()
	if g.node == nil {
		return ce
	}
	info := g.node.Info()
	if info.Role != "leader" {
		return ce
	}
	first, _ := g.rlog.FirstIndex()
	need := ce
	for _, p := range info.Peers {
		if p.ID == g.opts.ID || p.Match+1 < first {
			continue // itself, or a follower that needs a snapshot already
		}
		if end, err := g.rlog.DataEndAt(p.Match); err == nil {
			need = min(need, end)
		}
	}
	return max(need, ce-g.opts.CatchUpWindow)
}

// schedProtectedFrom is where retention must stop for the delay
// scheduler: the oldest schedule-topic record whose delivery the
// persisted progress does not cover; in a group, the replicated progress,
// on every replica (any may lead next and resume from it; a follower's
// own scheduler never delivers, so its persisted progress would keep the
// files of every delayed message forever).
func (s *Store) schedProtectedFrom() int64 {
	if p, ok := s.groupDelayProgress(); ok {
		return s.sched.ProtectedFromProgress(func(level int) int64 { return p[level] })
	}
	return s.sched.ProtectedFrom()
}
