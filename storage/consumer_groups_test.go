package storage

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestConsumerGroups: the groups' listing, each group's queues and the lag
// on each, against what the test itself put and committed, across pages
// and a restart.
func TestConsumerGroups(t *testing.T) {
	s, o := openTest(t, nil)
	ctx := context.Background()
	// Puts per queue: A/0 10, A/1 3, B/0 7; A/2 never written.
	puts := map[ConsumerQueueKey]int64{{"A", 0}: 10, {"A", 1}: 3, {"B", 0}: 7}
	for k, n := range puts {
		for i := range n {
			m := msg(k.Topic, fmt.Sprint(i))
			m.QueueID = k.QueueID
			if _, err := s.PutMessage(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	type commit struct {
		group string
		k     ConsumerQueueKey
		off   int64
	}
	commits := []commit{
		{"g2", ConsumerQueueKey{"A", 0}, 4},
		{"g1", ConsumerQueueKey{"B", 0}, 7}, // caught up
		{"g1", ConsumerQueueKey{"A", 1}, 1},
		{"g1", ConsumerQueueKey{"A", 0}, 2},
		{"g1", ConsumerQueueKey{"A", 0}, 6}, // a later commit replaces the first
		{"g1", ConsumerQueueKey{"A", 2}, 0}, // a queue never written
		{"g3", ConsumerQueueKey{"B", 0}, 0},
	}
	for _, c := range commits {
		mustCommit(t, s, c.group, c.k.Topic, c.k.QueueID, c.off)
	}
	// The expected view, from the test's own bookkeeping.
	last := map[string]map[ConsumerQueueKey]int64{}
	for _, c := range commits {
		if last[c.group] == nil {
			last[c.group] = map[ConsumerQueueKey]int64{}
		}
		last[c.group][c.k] = c.off
	}
	wantLag := func(group string) (queues int, lag int64) {
		for k, off := range last[group] {
			queues++
			lag += max(0, puts[k]-off)
		}
		return queues, lag
	}

	check := func(t *testing.T, s *Store) {
		t.Helper()
		// One group per page: three pages, in name order.
		var names []string
		after := ""
		for page := 0; ; page++ {
			gs, more, err := s.ConsumerGroups(after, 1)
			if err != nil || len(gs) != 1 {
				t.Fatalf("page %d after %q: %v, %v", page, after, gs, err)
			}
			g := gs[0]
			q, lag := wantLag(g.Name)
			if g.Queues != q || g.Lag != lag {
				t.Errorf("group %s: %d queues, lag %d; want %d, %d", g.Name, g.Queues, g.Lag, q, lag)
			}
			names = append(names, g.Name)
			after = g.Name
			if !more {
				break
			}
		}
		if fmt.Sprint(names) != "[g1 g2 g3]" {
			t.Errorf("groups %v, want [g1 g2 g3]", names)
		}
		if gs, more, err := s.ConsumerGroups("", 0); err != nil || more || len(gs) != 3 {
			t.Errorf("one page of all: %v %v %v", gs, more, err)
		}

		// g1's queues, two per page, in (topic, queue) order.
		var got []ConsumerQueue
		var key ConsumerQueueKey
		for {
			info, qs, more, err := s.ConsumerGroup("g1", key, 2)
			if err != nil {
				t.Fatal(err)
			}
			if q, lag := wantLag("g1"); info.Queues != q || info.Lag != lag {
				t.Errorf("g1 summary %+v; want %d queues, lag %d", info, q, lag)
			}
			got = append(got, qs...)
			if !more {
				break
			}
			key = ConsumerQueueKey{qs[len(qs)-1].Topic, qs[len(qs)-1].QueueID}
		}
		want := []ConsumerQueueKey{{"A", 0}, {"A", 1}, {"A", 2}, {"B", 0}}
		if len(got) != len(want) {
			t.Fatalf("g1 queues %+v; want %v", got, want)
		}
		for i, q := range got {
			k := want[i]
			if q.Topic != k.Topic || q.QueueID != k.QueueID || q.Committed != last["g1"][k] ||
				q.Max != puts[k] || q.Min != 0 || q.Lag != max(0, puts[k]-last["g1"][k]) {
				t.Errorf("g1 queue %d: %+v; want %v committed %d max %d", i, q, k, last["g1"][k], puts[k])
			}
		}

		// The metrics' view: every group, the largest lag first.
		lags := s.ConsumerLag()
		if len(lags) != 3 {
			t.Fatalf("ConsumerLag %+v", lags)
		}
		for i := 1; i < len(lags); i++ {
			if lags[i-1].Lag < lags[i].Lag {
				t.Errorf("ConsumerLag not by lag: %+v", lags)
			}
		}
		for _, g := range lags {
			if q, lag := wantLag(g.Name); g.Queues != q || g.Lag != lag {
				t.Errorf("ConsumerLag %s: %+v; want %d queues, lag %d", g.Name, g, q, lag)
			}
		}

		if _, _, _, err := s.ConsumerGroup("nobody", ConsumerQueueKey{}, 0); !errors.Is(err, ErrConsumerGroupNotFound) {
			t.Errorf("unknown group: %v", err)
		}
		var ve *ValidationError
		if _, _, _, err := s.ConsumerGroup("bad/name", ConsumerQueueKey{}, 0); !errors.As(err, &ve) {
			t.Errorf("bad group name: %v", err)
		}
	}
	t.Run("live", func(t *testing.T) { check(t, s) })

	// New messages raise the lag of every group behind on that queue.
	for i := range 5 {
		if _, err := s.PutMessage(ctx, msg("B", fmt.Sprint("more", i))); err != nil {
			t.Fatal(err)
		}
	}
	puts[ConsumerQueueKey{"B", 0}] += 5
	t.Run("after more puts", func(t *testing.T) { check(t, s) })

	// The table is rebuilt from the log at Open: the same view.
	s.Close()
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	t.Run("after a restart", func(t *testing.T) { check(t, s2) })
	s2.Close()
	if _, _, err := s2.ConsumerGroups("", 0); !errors.Is(err, ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}
