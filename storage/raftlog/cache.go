package raftlog

import pb "go.etcd.io/raft/v3/raftpb"

// DefaultCacheBytes is Options.CacheBytes when it is 0: four of raft's
// 1 MiB messages, far more than the entries a replica applies right after
// syncing them (a few Readys), and enough for a follower a little behind.
const DefaultCacheBytes = 4 << 20

// entryCache holds the entries this process appended last, the very
// values Append took, so that raft's reads of them are served from
// memory. Under load raft reads every entry back on every member (a
// member applies the committed entries it synced a Ready or two earlier,
// from the log; a leader reads those it applies early again when its
// Ready hands them over), and a read from the commitlog copies the
// payload out of the mapping: at unary-c64, 1.1 KB allocated and copied
// per put on a follower, 1.8 KB on the leader, 3 % of the group's CPU
// samples (BENCHMARKS.md "Entries from memory").
//
// Sharing the values is safe: raft.Storage forbids raft and the storage to
// mutate an entry they handed each other (etcd's MemoryStorage shares them
// the same way), and the payloads are heap memory (a leader's stamped
// records, a follower's unmarshalled message), not the mapping, so
// retention's unmapping of a file cannot reach them. They need no CRC
// check either: only entries that came from disk get one (Log.hot).
//
// The cache is a window of consecutive indexes ending at the last one
// appended; Append outside it (after a truncation, a snapshot) starts a
// new window. Owned by the Log, under its mutex.
type entryCache struct {
	first uint64      // index of ents[0]
	ents  []*pb.Entry // consecutive indexes
	bytes int         // what the entries held cost (cost)
	limit int         // ≤ 0: off
}

// entryOverhead is what the cache counts for an entry besides its
// payload (the Entry and its fields, the pointer to it), so that a run of
// entries without payload (elections' empty entries) is bounded too.
const entryOverhead = 64

func cost(e *pb.Entry) int { return len(e.GetData()) + entryOverhead }

// add keeps e at the end of the window (in place of the entries from its
// index on, if the window holds it: a truncation), or starts a new window
// with it; then drops the oldest entries past the limit.
func (c *entryCache) add(e *pb.Entry) {
	if c.limit <= 0 {
		return
	}
	i := e.GetIndex()
	switch next := c.first + uint64(len(c.ents)); {
	case len(c.ents) == 0 || i < c.first || i > next:
		c.reset()
		c.first = i
	case i < next: // replaces entries (a truncation)
		c.cutFrom(i)
	}
	c.ents = append(c.ents, e)
	c.bytes += cost(e)
	for c.bytes > c.limit && len(c.ents) > 0 {
		c.bytes -= cost(c.ents[0])
		c.ents[0] = nil // the backing array would keep it alive
		c.ents = c.ents[1:]
		c.first++
	}
}

// get returns entry i if the window holds it.
func (c *entryCache) get(i uint64) (*pb.Entry, bool) {
	if i < c.first || i-c.first >= uint64(len(c.ents)) {
		return nil, false
	}
	return c.ents[i-c.first], true
}

// cutFrom drops the entries at and past k (a truncation).
func (c *entryCache) cutFrom(k uint64) {
	if k <= c.first {
		c.reset()
		return
	}
	for n := uint64(len(c.ents)); n > k-c.first; n-- {
		c.bytes -= cost(c.ents[n-1])
		c.ents[n-1] = nil
		c.ents = c.ents[:n-1]
	}
}

// dropBelow drops the entries below first (a compaction).
func (c *entryCache) dropBelow(first uint64) {
	for len(c.ents) > 0 && c.first < first {
		c.bytes -= cost(c.ents[0])
		c.ents[0] = nil
		c.ents = c.ents[1:]
		c.first++
	}
}

func (c *entryCache) reset() {
	clear(c.ents)
	c.ents, c.bytes = c.ents[:0], 0
}
