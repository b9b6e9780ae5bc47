package storage

import (
	"fmt"
	"sort"

	"github.com/storaged/storaged/storage/offsets"
)

// Consumer groups seen from the broker (issue 17, point 5): which groups
// have committed offsets, and how far behind each one is (RocketMQ's
// mqadmin consumerProgress). A group exists here once it has committed an
// offset; its lag on a queue is the queue's max offset (the offset the
// next message gets) minus the group's committed offset, never below 0,
// RocketMQ's diff. Everything is computed from the offset table and the
// consume queues on each call: no state of its own, O(keys) a call,
// bounded by MaxConsumerOffsets.

// Bounds of the consumer-group listing calls.
const (
	// MaxListConsumerGroups bounds ConsumerGroups' page.
	MaxListConsumerGroups = 100
	// MaxListConsumerQueues bounds ConsumerGroup's page of queues.
	MaxListConsumerQueues = 1000
)

// ConsumerGroupInfo is one consumer group's summary.
type ConsumerGroupInfo struct {
	Name   string
	Queues int   // (topic, queue) pairs with a committed offset
	Lag    int64 // the sum of the queues' lags
}

// ConsumerQueue is one group's progress on one queue.
type ConsumerQueue struct {
	Topic     string
	QueueID   int32
	Committed int64 // the group's committed offset
	Min, Max  int64 // the queue's readable offsets [Min, Max)
	Lag       int64 // max(0, Max - Committed)
}

// ConsumerQueueKey names a queue within a group: the page token of
// ConsumerGroup.
type ConsumerQueueKey struct {
	Topic   string
	QueueID int32
}

func (s *Store) consumerQueue(e offsets.Entry) ConsumerQueue {
	lo, hi := s.queueBounds(e.Key.Topic, e.Key.Queue)
	return ConsumerQueue{Topic: e.Key.Topic, QueueID: e.Key.Queue, Committed: e.Offset, Min: lo, Max: hi,
		Lag: max(0, hi-e.Offset)}
}

// ConsumerGroups returns the consumer groups named after after, in name
// order, at most limit (0 or more than MaxListConsumerGroups:
// MaxListConsumerGroups) of them, and whether more follow.
func (s *Store) ConsumerGroups(after string, limit int) ([]ConsumerGroupInfo, bool, error) {
	if s.closed.Load() {
		return nil, false, ErrClosed
	}
	if limit <= 0 || limit > MaxListConsumerGroups {
		limit = MaxListConsumerGroups
	}
	var out []ConsumerGroupInfo
	for _, e := range s.offsets.Entries() { // sorted by group first
		if e.Key.Group <= after {
			continue
		}
		if n := len(out); n == 0 || out[n-1].Name != e.Key.Group {
			if n == limit {
				return out, true, nil
			}
			out = append(out, ConsumerGroupInfo{Name: e.Key.Group})
		}
		g := &out[len(out)-1]
		g.Queues++
		g.Lag += s.consumerQueue(e).Lag
	}
	return out, false, nil
}

// ConsumerGroup returns group's summary and its queues after after (zero:
// from the first), in (topic, queue) order, at most limit (0 or more than
// MaxListConsumerQueues: MaxListConsumerQueues), and whether more follow.
// Errors: *ValidationError (the name), ErrConsumerGroupNotFound (no
// offset committed by that group), ErrClosed.
func (s *Store) ConsumerGroup(group string, after ConsumerQueueKey, limit int) (ConsumerGroupInfo, []ConsumerQueue, bool, error) {
	if s.closed.Load() {
		return ConsumerGroupInfo{}, nil, false, ErrClosed
	}
	if p := GroupProblem(group); p != "" {
		return ConsumerGroupInfo{}, nil, false, illegal("consumer_group", p)
	}
	if limit <= 0 || limit > MaxListConsumerQueues {
		limit = MaxListConsumerQueues
	}
	info := ConsumerGroupInfo{Name: group}
	var qs []ConsumerQueue
	more := false
	for _, e := range s.offsets.Entries() {
		if e.Key.Group != group {
			continue
		}
		q := s.consumerQueue(e)
		info.Queues++
		info.Lag += q.Lag
		if e.Key.Topic < after.Topic || (e.Key.Topic == after.Topic && e.Key.Queue <= after.QueueID) {
			continue
		}
		if len(qs) == limit {
			more = true
			continue // keep summing the group's totals
		}
		qs = append(qs, q)
	}
	if info.Queues == 0 {
		return ConsumerGroupInfo{}, nil, false, fmt.Errorf("%w: %s", ErrConsumerGroupNotFound, group)
	}
	return info, qs, more, nil
}

// ConsumerLag returns every consumer group's summary, the largest lag
// first (then by name): what the lag metrics export.
func (s *Store) ConsumerLag() []ConsumerGroupInfo {
	var out []ConsumerGroupInfo
	for _, e := range s.offsets.Entries() {
		if n := len(out); n == 0 || out[n-1].Name != e.Key.Group {
			out = append(out, ConsumerGroupInfo{Name: e.Key.Group})
		}
		g := &out[len(out)-1]
		g.Queues++
		g.Lag += s.consumerQueue(e).Lag
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Lag > out[j].Lag })
	return out
}
