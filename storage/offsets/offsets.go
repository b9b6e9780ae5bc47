// Package offsets is the consumer-group offset table: the committed queue
// offset of every (group, topic, queue), and the codec of the records that
// carry commits in the commitlog's system topic (storage.OffsetTopic).
//
// The table is in memory only; the commitlog is its durable state (as
// Kafka's __consumer_offsets and RocketMQ 5's POP checkpoints live in
// topics), so whatever carries the log (a restart's recovery, replication)
// carries the offsets too. The table changes only by Apply, record by
// record in log order, as the store indexes them (a committed record in a
// replication group, a durable one in sync mode): Open replays the topic
// with the same Apply, so the table a replica builds live equals the one
// it rebuilds from its log, and every replica of a group holds the same
// table at the same log position. The latest value of every key outlives
// retention by a rewrite (Below, then a record of version 2) before the
// file holding its record is deleted.
//
// The package owns its state and lock and knows nothing of records,
// files or gRPC.
package offsets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/storaged/storaged/storage/internal/base"
)

// Key names one committed offset.
type Key struct {
	Group string
	Topic string
	Queue int32
}

// Entry is one committed offset and where its latest record lies.
type Entry struct {
	Key    Key
	Offset int64
	// At is the commitlog offset of the record that last wrote this value
	// (a commit or a rewrite before retention).
	At int64
	// Rewrite marks an entry of a rewrite record (version 2): it copies
	// the value the record at commitlog offset From wrote, and applies
	// only if no newer record wrote the key since (Apply).
	Rewrite bool
	From    int64
}

// ErrTooMany: a commit would add a key beyond the table's bound.
var ErrTooMany = errors.New("storage: too many consumer offsets")

// Table is the offset table. Readers take no store lock; the store's
// indexing applies records (Apply) one at a time, in log order.
type Table struct {
	max int

	mu      sync.RWMutex
	m       map[Key]entry
	pending map[Key]int // new keys reserved by commits under way (Reserve)
	last    int64       // commitlog offset of the last record applied; -1 none since New or Reset
	applied uint64      // records applied since New
}

type entry struct {
	offset int64
	at     int64
}

// New returns an empty table holding at most max keys.
func New(max int) *Table {
	return &Table{max: max, m: map[Key]entry{}, pending: map[Key]int{}, last: -1}
}

// Reserve admits a commit of k before its record is written: k exists, or
// there is room for one more key counting the new keys of the commits
// under way (so concurrent commits of new keys cannot overshoot the
// bound). The caller calls release once the commit's outcome is known,
// whatever it is; by then an applied commit holds its key in the table.
// Apply itself never refuses a key: every replica must apply what its
// log holds.
func (t *Table) Reserve(k Key) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[k]; ok {
		return func() {}, nil
	}
	if t.pending[k] == 0 && len(t.m)+len(t.pending) >= t.max {
		return nil, fmt.Errorf("%w: the store holds %d (group, topic, queue) offsets, its limit", ErrTooMany, t.max)
	}
	t.pending[k]++
	return func() {
		t.mu.Lock()
		if t.pending[k]--; t.pending[k] <= 0 {
			delete(t.pending, k)
		}
		t.mu.Unlock()
	}, nil
}

// Apply applies the entries of the offset record at commitlog offset at,
// in order, and returns how many changed the table. A commit's entry
// (Rewrite false) sets its key. A rewrite's entry sets its key only if
// the key's value was written at or before the rewrite's source (From),
// or the key is absent (its record's file is gone, at a replay): a commit
// that reached the log between the rewrite's reading of the table and the
// rewrite's record is never overwritten with the older value. The rule
// depends only on the log, so every replica and every replay agree.
func (t *Table) Apply(es []Entry, at int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last = at
	t.applied++
	n := 0
	for _, e := range es {
		if cur, ok := t.m[e.Key]; e.Rewrite && ok && cur.at > e.From {
			continue
		}
		t.m[e.Key] = entry{offset: e.Offset, at: at}
		n++
	}
	return n
}

// Delete forgets k (a rewrite found its topic deleted; standalone only).
func (t *Table) Delete(k Key) {
	t.mu.Lock()
	delete(t.m, k)
	t.mu.Unlock()
}

// DropTopic forgets every key of topic whose latest record lies below
// commitlog offset before (the topic was deleted there: those values
// are queue offsets of the deleted queues) and returns how many.
// O(keys): deletes are rare and the table is bounded.
func (t *Table) DropTopic(topic string, before int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, e := range t.m {
		if k.Topic == topic && e.at < before {
			delete(t.m, k)
			n++
		}
	}
	return n
}

// Reset empties the table (a snapshot installed over a gap in the log:
// the table is rebuilt from the snapshot's records). Reservations of
// commits under way stay.
func (t *Table) Reset() {
	t.mu.Lock()
	t.m = map[Key]entry{}
	t.last = -1
	t.mu.Unlock()
}

// Applied is the count of records applied since New.
func (t *Table) Applied() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.applied
}

// Cut returns every key's entry (At set, sorted by key) together with the
// commitlog offset of the last record applied (-1 when none was since
// New or Reset) and the count of records applied since New: a snapshot
// of the table exactly as that record left it (Snapshot).
func (t *Table) Cut() (es []Entry, last int64, applied uint64) {
	t.mu.RLock()
	es = make([]Entry, 0, len(t.m))
	for k, e := range t.m {
		es = append(es, Entry{Key: k, Offset: e.offset, At: e.at})
	}
	last, applied = t.last, t.applied
	t.mu.RUnlock()
	sort.Slice(es, func(i, j int) bool { return less(es[i].Key, es[j].Key) })
	return es, last, applied
}

// Restore replaces the table's keys with es (each with its At), as the
// record at commitlog offset last left them: Open, from a snapshot, before
// it applies the records after last. Reservations stay.
func (t *Table) Restore(es []Entry, last int64) {
	t.mu.Lock()
	t.m = make(map[Key]entry, len(es))
	for _, e := range es {
		t.m[e.Key] = entry{offset: e.Offset, at: e.At}
	}
	t.last = last
	t.mu.Unlock()
}

// Get returns the offset committed for k.
func (t *Table) Get(k Key) (int64, bool) {
	t.mu.RLock()
	e, ok := t.m[k]
	t.mu.RUnlock()
	return e.offset, ok
}

// Len is the number of keys.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.m)
}

// Below returns the entries whose latest record lies below commitlog
// offset end, sorted by key (a deterministic rewrite order).
func (t *Table) Below(end int64) []Entry {
	t.mu.RLock()
	var out []Entry
	for k, e := range t.m {
		if e.at < end {
			out = append(out, Entry{Key: k, Offset: e.offset, At: e.at})
		}
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return less(out[i].Key, out[j].Key) })
	return out
}

// Entries returns every key's committed offset, sorted by key (group,
// then topic, then queue): what the admin calls and the lag metrics read.
// It copies the table, O(keys log keys); the table is bounded (New's max).
func (t *Table) Entries() []Entry {
	t.mu.RLock()
	out := make([]Entry, 0, len(t.m))
	for k, e := range t.m {
		out = append(out, Entry{Key: k, Offset: e.offset, At: e.at})
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return less(out[i].Key, out[j].Key) })
	return out
}

// OldestAt is the lowest commitlog offset holding a latest value, and
// false when the table is empty.
func (t *Table) OldestAt() (int64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	first, found := int64(0), false
	for _, e := range t.m {
		if !found || e.at < first {
			first, found = e.at, true
		}
	}
	return first, found
}

func less(a, b Key) bool {
	if a.Group != b.Group {
		return a.Group < b.Group
	}
	if a.Topic != b.Topic {
		return a.Topic < b.Topic
	}
	return a.Queue < b.Queue
}

// Record body layout (big-endian), the wire format of offset records in
// the commitlog: it must not change incompatibly.
//
//	u8  version (1: commits, 2: a rewrite)
//	u16 count   entries, at least 1
//	count × { u8 group length, group, u8 topic length, topic, i32 queue, i64 offset
//	          [version 2: i64 from, the commitlog offset of the record whose value it copies] }
//
// A commit is one entry of version 1; a rewrite before retention carries
// many, of version 2. Entries apply in order (Table.Apply). A version
// this code does not know is ErrDecode: a replica refuses to guess.
const (
	versionCommit  = 1
	versionRewrite = 2
	// MaxEntries bounds one record's entries.
	MaxEntries = 1024
	// MaxNameLen bounds a group or topic name in a record (u8 length).
	MaxNameLen = 255
	entryFixed = 1 + 1 + 4 + 8
)

// ErrDecode: an offset record's body is malformed.
var ErrDecode = errors.New("storage: malformed consumer offset record")

// EncodedLen is the body length of the record Encode makes of es.
func EncodedLen(es []Entry) int {
	n, fixed := 3, entryFixed
	if len(es) > 0 && es[0].Rewrite {
		fixed += 8
	}
	for _, e := range es {
		n += fixed + len(e.Key.Group) + len(e.Key.Topic)
	}
	return n
}

// Encode returns the body of an offset record holding es (1 to MaxEntries
// entries, names at most MaxNameLen bytes: the caller validated them): a
// commit (version 1), or a rewrite (version 2, each entry copying the
// value of the record at its From) when es[0].Rewrite; all entries of a
// record are of one kind.
func Encode(es []Entry) []byte {
	rewrite := len(es) > 0 && es[0].Rewrite
	b := make([]byte, 0, EncodedLen(es))
	if rewrite {
		b = append(b, versionRewrite)
	} else {
		b = append(b, versionCommit)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(es)))
	for _, e := range es {
		b = appendKey(b, e.Key)
		b = binary.BigEndian.AppendUint64(b, uint64(e.Offset))
		if rewrite {
			b = binary.BigEndian.AppendUint64(b, uint64(e.From))
		}
	}
	return b
}

// appendKey appends k as both codecs lay it out: group and topic behind
// their lengths, then the queue.
func appendKey(b []byte, k Key) []byte {
	b = base.AppendName(b, k.Group)
	b = base.AppendName(b, k.Topic)
	return binary.BigEndian.AppendUint32(b, uint32(k.Queue))
}

// Decode parses a record body; every length is checked against the body,
// so no input panics or allocates more than its own size. Entries of a
// rewrite have Rewrite set and From their source.
func Decode(b []byte) ([]Entry, error) {
	if len(b) < 3 {
		return nil, fmt.Errorf("%w: %d bytes", ErrDecode, len(b))
	}
	version := b[0]
	fixed := entryFixed
	switch version {
	case versionCommit:
	case versionRewrite:
		fixed += 8
	default:
		return nil, fmt.Errorf("%w: version %d", ErrDecode, b[0])
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if n == 0 || n > MaxEntries || n*(fixed+2) > len(b) {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", ErrDecode, n, len(b))
	}
	out := make([]Entry, 0, n)
	p := 3
	tail := fixed - 2 // queue, offset [, from]
	for i := 0; i < n; i++ {
		g, ok := base.ReadName(b, &p)
		if !ok {
			return nil, fmt.Errorf("%w: entry %d: group", ErrDecode, i)
		}
		t, ok := base.ReadName(b, &p)
		if !ok || p+tail > len(b) {
			return nil, fmt.Errorf("%w: entry %d: topic", ErrDecode, i)
		}
		e := Entry{Key: Key{Group: g, Topic: t, Queue: int32(binary.BigEndian.Uint32(b[p:]))},
			Offset: int64(binary.BigEndian.Uint64(b[p+4:]))}
		if version == versionRewrite {
			e.Rewrite, e.From = true, int64(binary.BigEndian.Uint64(b[p+12:]))
		}
		p += tail
		if e.Key.Queue < 0 || e.Offset < 0 || e.From < 0 {
			return nil, fmt.Errorf("%w: entry %d: queue %d, offset %d, from %d", ErrDecode, i, e.Key.Queue, e.Offset, e.From)
		}
		out = append(out, e)
	}
	if p != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the entries", ErrDecode, len(b)-p)
	}
	return out, nil
}
