// Package offsets is the consumer-group offset table: the committed queue
// offset of every (group, topic, queue), and the codec of the records that
// carry commits in the commitlog's system topic (storage.OffsetTopic).
//
// The table is in memory only; the commitlog is its durable state (as
// Kafka's __consumer_offsets and RocketMQ 5's POP checkpoints live in
// topics), so whatever carries the log (a restart's recovery, replication)
// carries the offsets too. The store rebuilds the table at Open by
// replaying the records of that topic in log order (Apply), and keeps the
// latest value of every key alive across retention by writing it again
// (Below) before the file holding its record is deleted.
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
}

// ErrTooMany: a commit would add a key beyond the table's bound.
var ErrTooMany = errors.New("storage: too many consumer offsets")

// Table is the offset table. Mu serializes the store's appends of offset
// records with the table changes they make (Lock, then append, then Set,
// then Unlock): the log order of offset records is the order of the
// changes, so a replay of the log rebuilds exactly this table, and a
// rewrite never puts an older value after a newer one.
type Table struct {
	Mu  sync.Mutex
	max int

	rmu sync.RWMutex // guards m for readers that do not hold Mu
	m   map[Key]entry
}

type entry struct {
	offset int64
	at     int64
}

// New returns an empty table holding at most max keys.
func New(max int) *Table { return &Table{max: max, m: map[Key]entry{}} }

// Admit reports whether k may be set: it exists, or there is room for one
// more key. The caller holds Mu.
func (t *Table) Admit(k Key) error {
	t.rmu.RLock()
	defer t.rmu.RUnlock()
	if _, ok := t.m[k]; ok || len(t.m) < t.max {
		return nil
	}
	return fmt.Errorf("%w: the store holds %d (group, topic, queue) offsets, its limit", ErrTooMany, t.max)
}

// Set records offset for k, written by the record at commitlog offset at.
// The caller holds Mu (or is the only user, at Open).
func (t *Table) Set(k Key, offset, at int64) {
	t.rmu.Lock()
	t.m[k] = entry{offset: offset, at: at}
	t.rmu.Unlock()
}

// Delete forgets k (a rewrite found its topic deleted). The caller holds Mu.
func (t *Table) Delete(k Key) {
	t.rmu.Lock()
	delete(t.m, k)
	t.rmu.Unlock()
}

// Get returns the offset committed for k.
func (t *Table) Get(k Key) (int64, bool) {
	t.rmu.RLock()
	e, ok := t.m[k]
	t.rmu.RUnlock()
	return e.offset, ok
}

// Len is the number of keys.
func (t *Table) Len() int {
	t.rmu.RLock()
	defer t.rmu.RUnlock()
	return len(t.m)
}

// Below returns the entries whose latest record lies below commitlog
// offset end, sorted by key (a deterministic rewrite order).
func (t *Table) Below(end int64) []Entry {
	t.rmu.RLock()
	var out []Entry
	for k, e := range t.m {
		if e.at < end {
			out = append(out, Entry{Key: k, Offset: e.offset, At: e.at})
		}
	}
	t.rmu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return less(out[i].Key, out[j].Key) })
	return out
}

// Entries returns every key's committed offset, sorted by key (group,
// then topic, then queue): what the admin calls and the lag metrics read.
// It copies the table, O(keys log keys); the table is bounded (New's max).
func (t *Table) Entries() []Entry {
	t.rmu.RLock()
	out := make([]Entry, 0, len(t.m))
	for k, e := range t.m {
		out = append(out, Entry{Key: k, Offset: e.offset, At: e.at})
	}
	t.rmu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return less(out[i].Key, out[j].Key) })
	return out
}

// OldestAt is the lowest commitlog offset holding a latest value, and
// false when the table is empty.
func (t *Table) OldestAt() (int64, bool) {
	t.rmu.RLock()
	defer t.rmu.RUnlock()
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
//	u8  version (1)
//	u16 count   entries, at least 1
//	count × { u8 group length, group, u8 topic length, topic, i32 queue, i64 offset }
//
// A commit is one entry; a rewrite before retention carries many. Entries
// apply in order, each replacing its key's value.
const (
	version = 1
	// MaxEntries bounds one record's entries.
	MaxEntries = 1024
	// MaxNameLen bounds a group or topic name in a record (u8 length).
	MaxNameLen = 255
	entryFixed = 1 + 1 + 4 + 8
)

// ErrDecode: an offset record's body is malformed.
var ErrDecode = errors.New("storage: malformed consumer offset record")

// EncodedLen is the body length of a record holding es.
func EncodedLen(es []Entry) int {
	n := 3
	for _, e := range es {
		n += entryFixed + len(e.Key.Group) + len(e.Key.Topic)
	}
	return n
}

// Encode returns the body of a record holding es (1 to MaxEntries
// entries, names at most MaxNameLen bytes: the caller validated them).
func Encode(es []Entry) []byte {
	b := make([]byte, 0, EncodedLen(es))
	b = append(b, version)
	b = binary.BigEndian.AppendUint16(b, uint16(len(es)))
	for _, e := range es {
		b = append(b, byte(len(e.Key.Group)))
		b = append(b, e.Key.Group...)
		b = append(b, byte(len(e.Key.Topic)))
		b = append(b, e.Key.Topic...)
		b = binary.BigEndian.AppendUint32(b, uint32(e.Key.Queue))
		b = binary.BigEndian.AppendUint64(b, uint64(e.Offset))
	}
	return b
}

// Decode parses a record body; every length is checked against the body,
// so no input panics or allocates more than its own size.
func Decode(b []byte) ([]Entry, error) {
	if len(b) < 3 {
		return nil, fmt.Errorf("%w: %d bytes", ErrDecode, len(b))
	}
	if b[0] != version {
		return nil, fmt.Errorf("%w: version %d", ErrDecode, b[0])
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if n == 0 || n > MaxEntries || n*(entryFixed+2) > len(b) {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", ErrDecode, n, len(b))
	}
	out := make([]Entry, 0, n)
	p := 3
	name := func() (string, bool) {
		if p >= len(b) {
			return "", false
		}
		l := int(b[p])
		p++
		if l == 0 || p+l > len(b) {
			return "", false
		}
		s := string(b[p : p+l])
		p += l
		return s, true
	}
	for i := 0; i < n; i++ {
		g, ok := name()
		if !ok {
			return nil, fmt.Errorf("%w: entry %d: group", ErrDecode, i)
		}
		t, ok := name()
		if !ok || p+12 > len(b) {
			return nil, fmt.Errorf("%w: entry %d: topic", ErrDecode, i)
		}
		q := int32(binary.BigEndian.Uint32(b[p:]))
		off := int64(binary.BigEndian.Uint64(b[p+4:]))
		p += 12
		if q < 0 || off < 0 {
			return nil, fmt.Errorf("%w: entry %d: queue %d, offset %d", ErrDecode, i, q, off)
		}
		out = append(out, Entry{Key: Key{Group: g, Topic: t, Queue: q}, Offset: off})
	}
	if p != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the entries", ErrDecode, len(b)-p)
	}
	return out, nil
}
