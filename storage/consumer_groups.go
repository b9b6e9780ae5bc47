package storage

import (
	"cmp"
	"fmt"
	"sort"
	"strings"

	"github.com/storaged/storaged/storage/offsets"
	"github.com/storaged/storaged/storage/pop"
)

// Consumer groups seen from the broker (issue 17, point 5): which groups
// have made progress, and how far behind each one is (RocketMQ's mqadmin
// consumerProgress). A group exists here once it has committed an offset
// or received a message by POP (pop.go), on the queues it did so.
//
// On a queue with committed offsets only, the lag is the queue's max
// offset (the offset the next message gets) minus the committed offset,
// never below 0: RocketMQ's diff. On a queue the group consumes by POP
// (it has a POP cursor there, or messages in flight), the POP progress is
// what counts, whatever offset it committed before: the lag is the
// messages not yet acknowledged, those not yet received (max offset minus
// the cursor, from the queue's first retained message) plus those
// received and in flight. The group's retry topic (%RETRY%<group>) is one
// of its queues: retries waiting and in flight.
//
// Everything is computed from the offset table, the POP table and the
// consume queues on each call: no state of its own, O(keys) a call,
// bounded by MaxConsumerOffsets (committed keys) plus the POP cursors
// (also at most MaxConsumerOffsets).

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
	Queues int   // (topic, queue) pairs with progress: a committed offset or a POP cursor
	Lag    int64 // the sum of the queues' lags
	// Inflight is the POP messages received and not yet acknowledged (in
	// Lag too).
	Inflight int64
}

// ConsumerQueue is one group's progress on one queue.
type ConsumerQueue struct {
	Topic   string
	QueueID int32
	// Committed is the group's committed offset; for a POP queue the POP
	// cursor (the next offset a receive hands out).
	Committed int64
	Min, Max  int64 // the queue's readable offsets [Min, Max)
	// Lag is max(0, Max - Committed); for a POP queue the messages not
	// yet acknowledged: max(0, Max - max(Committed, Min)) + Inflight.
	Lag int64
	// Pop: the group consumes the queue by POP; Inflight its messages
	// received and not yet acknowledged.
	Pop      bool
	Inflight int64
}

// ConsumerQueueKey names a queue within a group: the page token of
// ConsumerGroup.
type ConsumerQueueKey struct {
	Topic   string
	QueueID int32
}

// groupQueue is one group's progress on one queue.
type groupQueue struct {
	group string
	q     ConsumerQueue
}

// consumerProgress returns every group's progress on every queue, sorted
// by (group, topic, queue), the committed offsets and the POP progress
// merged (see the top of this file).
func (s *Store) consumerProgress() []groupQueue {
	es := s.offsets.Entries() // sorted by group, topic, queue
	var ps []pop.QueueProgress
	if t := s.pop; t != nil {
		t.Mu.Lock()
		ps = t.Progress() // sorted alike
		t.Mu.Unlock()
	}
	out := make([]groupQueue, 0, len(es)+len(ps))
	less := func(e offsets.Key, p pop.QueueKey) int {
		switch {
		case e.Group != p.Group:
			return strings.Compare(e.Group, p.Group)
		case e.Topic != p.Topic:
			return strings.Compare(e.Topic, p.Topic)
		}
		return cmp.Compare(e.Queue, p.Queue)
	}
	for len(es) > 0 || len(ps) > 0 {
		c := -1
		switch {
		case len(es) == 0:
			c = 1
		case len(ps) > 0:
			c = less(es[0].Key, ps[0].Key)
		}
		if c < 0 { // committed offsets only
			e := es[0]
			es = es[1:]
			lo, hi := s.queueBounds(e.Key.Topic, e.Key.Queue)
			out = append(out, groupQueue{e.Key.Group, ConsumerQueue{Topic: e.Key.Topic, QueueID: e.Key.Queue,
				Committed: e.Offset, Min: lo, Max: hi, Lag: max(0, hi-e.Offset)}})
			continue
		}
		if c == 0 {
			es = es[1:] // POP progress wins on the queue
		}
		p := ps[0]
		ps = ps[1:]
		lo, hi := s.queueBounds(p.Key.Topic, p.Key.Queue)
		next := hi // no cursor: only what is in flight is left
		if p.HasNext {
			next = p.Next
		}
		n := int64(p.Inflight)
		out = append(out, groupQueue{p.Key.Group, ConsumerQueue{Topic: p.Key.Topic, QueueID: p.Key.Queue,
			Committed: next, Min: lo, Max: hi, Lag: max(0, hi-max(next, lo)) + n, Pop: true, Inflight: n}})
	}
	return out
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
	for _, gq := range s.consumerProgress() {
		if gq.group <= after {
			continue
		}
		if n := len(out); n == 0 || out[n-1].Name != gq.group {
			if n == limit {
				return out, true, nil
			}
			out = append(out, ConsumerGroupInfo{Name: gq.group})
		}
		out[len(out)-1].add(gq.q)
	}
	return out, false, nil
}

func (g *ConsumerGroupInfo) add(q ConsumerQueue) {
	g.Queues++
	g.Lag += q.Lag
	g.Inflight += q.Inflight
}

// ConsumerGroup returns group's summary and its queues after after (zero:
// from the first), in (topic, queue) order, at most limit (0 or more than
// MaxListConsumerQueues: MaxListConsumerQueues), and whether more follow.
// Errors: *ValidationError (the name), ErrConsumerGroupNotFound (the
// group neither committed an offset nor received by POP), ErrClosed.
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
	for _, gq := range s.consumerProgress() {
		if gq.group != group {
			continue
		}
		q := gq.q
		info.add(q)
		if q.Topic < after.Topic || (q.Topic == after.Topic && q.QueueID <= after.QueueID) {
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
	for _, gq := range s.consumerProgress() {
		if n := len(out); n == 0 || out[n-1].Name != gq.group {
			out = append(out, ConsumerGroupInfo{Name: gq.group})
		}
		out[len(out)-1].add(gq.q)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Lag > out[j].Lag })
	return out
}
