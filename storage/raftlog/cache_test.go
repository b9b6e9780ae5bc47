package raftlog

import (
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestEntryCache drives the window through appends, replacements, new
// windows, compactions and the byte limit, and checks which indexes it
// serves (and that each is the entry added last at that index).
func TestEntryCache(t *testing.T) {
	ent := func(i uint64, n int, tag byte) *pb.Entry {
		return &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(uint64(tag)), Data: make([]byte, n)}
	}
	type op struct {
		add     []*pb.Entry
		cutFrom uint64 // when > 0
		drop    uint64 // when > 0
	}
	const o = entryOverhead
	tests := []struct {
		name   string
		limit  int
		ops    []op
		first  uint64 // the window, [first, first+n)
		n      int
		bytes  int
		tagAt3 byte // Term of the entry served at index 3, when served
	}{
		{name: "appends", limit: 1000, ops: []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1), ent(3, 10, 1)}}},
			first: 1, n: 3, bytes: 30 + 3*o, tagAt3: 1},
		{name: "off", limit: 0, ops: []op{{add: []*pb.Entry{ent(1, 10, 1)}}}},
		{name: "the limit drops the oldest", limit: 2*(10+o) + 5, ops: []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1), ent(3, 10, 1)}}},
			first: 2, n: 2, bytes: 20 + 2*o, tagAt3: 1},
		{name: "empty entries count too", limit: 3 * o,
			ops:   []op{{add: []*pb.Entry{ent(1, 0, 1), ent(2, 0, 1), ent(3, 0, 1), ent(4, 0, 1), ent(5, 0, 1)}}},
			first: 3, n: 3, bytes: 3 * o, tagAt3: 1},
		{name: "an entry over the limit is not kept", limit: 1 + o, ops: []op{{add: []*pb.Entry{ent(1, 1, 1), ent(2, 10, 1)}}}},
		{name: "a replacement cuts the rest", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1), ent(3, 10, 1), ent(4, 10, 1)}}, {add: []*pb.Entry{ent(3, 5, 2)}}},
			first: 1, n: 3, bytes: 25 + 3*o, tagAt3: 2},
		{name: "a replacement of the first", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(3, 10, 1), ent(4, 10, 1)}}, {add: []*pb.Entry{ent(3, 7, 2)}}},
			first: 3, n: 1, bytes: 7 + o, tagAt3: 2},
		{name: "a gap starts a new window", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(1, 10, 1)}}, {add: []*pb.Entry{ent(3, 10, 1)}}},
			first: 3, n: 1, bytes: 10 + o, tagAt3: 1},
		{name: "an index below the window starts a new one", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(5, 10, 1), ent(6, 10, 1)}}, {add: []*pb.Entry{ent(3, 10, 2)}}},
			first: 3, n: 1, bytes: 10 + o, tagAt3: 2},
		{name: "cutFrom inside", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1), ent(3, 10, 1)}, cutFrom: 3}},
			first: 1, n: 2, bytes: 20 + 2*o},
		{name: "cutFrom below", limit: 1000,
			ops: []op{{add: []*pb.Entry{ent(2, 10, 1), ent(3, 10, 1)}, cutFrom: 1}}},
		{name: "cutFrom past", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(2, 10, 1), ent(3, 10, 1)}, cutFrom: 9}},
			first: 2, n: 2, bytes: 20 + 2*o, tagAt3: 1},
		{name: "dropBelow", limit: 1000,
			ops:   []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1), ent(3, 10, 1)}, drop: 3}},
			first: 3, n: 1, bytes: 10 + o, tagAt3: 1},
		{name: "dropBelow past the window", limit: 1000,
			ops: []op{{add: []*pb.Entry{ent(1, 10, 1), ent(2, 10, 1)}, drop: 7}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := entryCache{limit: tt.limit}
			for _, o := range tt.ops {
				for _, e := range o.add {
					c.add(e)
				}
				if o.cutFrom > 0 {
					c.cutFrom(o.cutFrom)
				}
				if o.drop > 0 {
					c.dropBelow(o.drop)
				}
			}
			if c.bytes != tt.bytes {
				t.Errorf("bytes %d, want %d", c.bytes, tt.bytes)
			}
			for i := uint64(0); i < 10; i++ {
				e, ok := c.get(i)
				want := tt.n > 0 && i >= tt.first && i < tt.first+uint64(tt.n)
				if ok != want {
					t.Errorf("get(%d) served %v, want %v (window [%d, %d))", i, ok, want, tt.first, tt.first+uint64(tt.n))
					continue
				}
				if ok && e.GetIndex() != i {
					t.Errorf("get(%d) = entry %d", i, e.GetIndex())
				}
				if ok && i == 3 && byte(e.GetTerm()) != tt.tagAt3 {
					t.Errorf("get(3) is the entry of term %d, want %d", e.GetTerm(), tt.tagAt3)
				}
			}
		})
	}
}
