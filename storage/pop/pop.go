// Package pop is the state of POP consumption (RocketMQ 5's SimpleConsumer
// model): for every (consumer group, topic, queue) the next queue offset
// to pop, and for every message popped and not yet acknowledged its
// invisible deadline and generation. It also has the codec of the records
// that carry every change of that state in the commitlog's system topic
// (storage.PopTopic), and of the receipt handles given to clients.
//
// The table is in memory only; the commitlog is its durable state, as
// RocketMQ 5 keeps its POP checkpoints and acks in the REVIVE system topic
// and storaged its consumer offsets (storage/offsets). The store rebuilds
// the table at Open by replaying the records in log order (Apply), after
// restoring the state a snapshot of it holds (snapshot.go), and
// writes the live state again (Below) before retention deletes the file
// that holds it.
//
// Every message in flight costs one map entry and one heap slot; pops,
// acks and renewals are O(log n) in the group's in-flight messages (the
// deadline heap), never a scan. The table bounds the messages in flight in
// total and per group, and the queue cursors (New's limits).
//
// The package owns its state and lock and knows nothing of records, files
// or gRPC.
package pop

import (
	"container/heap"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"sync"

	"github.com/storaged/storaged/storage/internal/base"
)

// QueueKey names one queue as a consumer group pops it.
type QueueKey struct {
	Group string
	Topic string // the topic popped: a subscribed topic or the group's retry topic
	Queue int32
}

// Key names one message in flight: a queue offset of a group's queue.
type Key struct {
	QueueKey
	Offset int64
}

// Item is one message of an Op.
type Item struct {
	Offset int64
	// Deadline is when the message becomes visible again, in Unix
	// milliseconds (zero in a Drop).
	Deadline int64
	// Gen names this incarnation of the message in flight: each pop and
	// each renewal gives a new one, and a receipt handle is good only
	// for the generation it names.
	Gen uint64
	// Redelivered counts the deliveries of the message in place before
	// this one (a FIFO group's redelivery: the message is not copied to
	// the retry topic, which would let the next one of its queue pass
	// it). Zero otherwise; a record holding none is written as version 1.
	Redelivered uint32
}

// Kind is what an Op does.
type Kind uint8

const (
	// Set records the queue's cursor (unless Cursor is NoCursor) and puts
	// every item in flight, replacing the entry of its offset: a pop, a
	// change of invisible duration, or a rewrite before retention.
	Set Kind = 1
	// Drop takes every item out of flight when it is still there with the
	// item's generation: an ack, or a message moved to the retry or
	// dead-letter topic.
	Drop Kind = 2
)

// NoCursor in a Set leaves the queue's cursor as it is.
const NoCursor = -1

// Op is one change of the state, as a record carries it.
type Op struct {
	Kind   Kind
	Key    QueueKey
	Cursor int64 // Set: the next offset to pop, or NoCursor
	Items  []Item
}

// Errors of the table.
var (
	// ErrTooManyInflight: the group, or the store, has as many messages in
	// flight as it may.
	ErrTooManyInflight = errors.New("storage: too many POP messages in flight")
	// ErrTooManyCursors: a pop would add a queue cursor beyond the bound.
	ErrTooManyCursors = errors.New("storage: too many POP queue cursors")
)

// Limits are the table's bounds.
type Limits struct {
	Inflight         int // messages in flight, all groups
	InflightPerGroup int // messages in flight of one group
	Cursors          int // (group, topic, queue) cursors
}

// Table is the POP state. Mu serializes the store's appends of pop
// records with the changes they make (Lock, append, Apply, Unlock), so that
// the log order of the records is the order of the changes and a replay
// rebuilds exactly this table. Every method requires Mu, but Stats.
type Table struct {
	Mu     sync.Mutex
	limits Limits

	cursors  map[QueueKey]cursor
	inflight map[Key]*entry
	queued   map[QueueKey]map[int64]*entry // messages in flight per queue (Progress, QueueInflight)
	groups   map[string]*group
	total    int
	gen      uint64 // the last generation handed out
	last     int64  // commitlog offset of the record of the last Apply; -1 none since New or Reset
	applied  uint64 // Apply calls since New

	stats sync.Mutex // guards inflightN for Stats
	statN int
}

type cursor struct {
	next int64
	at   int64 // commitlog offset of the record that last wrote it; -1: none
}

type entry struct {
	key      Key
	deadline int64
	gen      uint64
	redeliv  uint32
	at       int64 // commitlog offset of the record that put it in flight
	index    int   // in its group's heap
}

type group struct {
	due dueHeap
}

// New returns an empty table.
func New(l Limits) *Table {
	return &Table{limits: l, cursors: map[QueueKey]cursor{}, inflight: map[Key]*entry{}, queued: map[QueueKey]map[int64]*entry{},
		groups: map[string]*group{}, last: -1}
}

// Cursor returns the next offset to pop of k.
func (t *Table) Cursor(k QueueKey) (int64, bool) {
	c, ok := t.cursors[k]
	return c.next, ok
}

// AdmitCursor reports whether k may get a cursor.
func (t *Table) AdmitCursor(k QueueKey) error {
	if _, ok := t.cursors[k]; ok || len(t.cursors) < t.limits.Cursors {
		return nil
	}
	return fmt.Errorf("%w: the store holds %d, its limit", ErrTooManyCursors, t.limits.Cursors)
}

// Advance moves k's cursor to next in memory only (a scan that popped
// nothing, its tag filter having skipped what it read): a restart may
// scan those entries again, which pops nothing either.
func (t *Table) Advance(k QueueKey, next int64) {
	c, ok := t.cursors[k]
	if !ok {
		c.at = -1
	}
	c.next = next
	t.cursors[k] = c
}

// Room is how many more messages group may have in flight.
func (t *Table) Room(groupName string) int {
	n := 0
	if g := t.groups[groupName]; g != nil {
		n = len(g.due)
	}
	return max(0, min(t.limits.InflightPerGroup-n, t.limits.Inflight-t.total))
}

// NextGen hands out a generation never handed out before by this table
// (nor by the records it was rebuilt from).
func (t *Table) NextGen() uint64 {
	t.gen++
	return t.gen
}

// SeedGen makes every generation handed out from now on above g. The
// store seeds it at Open with its clock (Unix ms << 20), so that a
// generation named only by records retention deleted is not handed out
// again after a restart.
func (t *Table) SeedGen(g uint64) { t.gen = max(t.gen, g) }

// Get returns the deadline and generation of the message k in flight.
func (t *Table) Get(k Key) (deadline int64, gen uint64, ok bool) {
	e := t.inflight[k]
	if e == nil {
		return 0, 0, false
	}
	return e.deadline, e.gen, true
}

// Item returns the message k in flight as an Item (deadline, generation,
// deliveries in place).
func (t *Table) Item(k Key) (Item, bool) {
	e := t.inflight[k]
	if e == nil {
		return Item{}, false
	}
	return Item{Offset: k.Offset, Deadline: e.deadline, Gen: e.gen, Redelivered: e.redeliv}, true
}

// QueueInflight returns the messages of queue k in flight, by offset:
// O(the queue's messages in flight).
func (t *Table) QueueInflight(k QueueKey) []Item {
	q := t.queued[k]
	out := make([]Item, 0, len(q))
	for off, e := range q {
		out = append(out, Item{Offset: off, Deadline: e.deadline, Gen: e.gen, Redelivered: e.redeliv})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	return out
}

// Due returns up to limit messages of group whose deadline is at or
// before now, earliest first (they stay in flight until dropped).
func (t *Table) Due(groupName string, now int64, limit int) []Key {
	g := t.groups[groupName]
	if g == nil {
		return nil
	}
	var out []Key
	// The heap's order is partial: walk it as a tree, pruning subtrees
	// whose root is not due.
	var walk func(i int)
	walk = func(i int) {
		if i >= len(g.due) || len(out) >= limit || g.due[i].deadline > now {
			return
		}
		out = append(out, g.due[i].key)
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
	return out
}

// NextDeadline is the earliest deadline of group's messages in flight.
func (t *Table) NextDeadline(groupName string) (int64, bool) {
	g := t.groups[groupName]
	if g == nil || len(g.due) == 0 {
		return 0, false
	}
	return g.due[0].deadline, true
}

// Inflight is the number of messages in flight, of group or ("") of all.
func (t *Table) Inflight(groupName string) int {
	if groupName == "" {
		return t.total
	}
	if g := t.groups[groupName]; g != nil {
		return len(g.due)
	}
	return 0
}

// Stats returns the messages in flight, without Mu (metrics).
func (t *Table) Stats() int {
	t.stats.Lock()
	defer t.stats.Unlock()
	return t.statN
}

// Apply makes the changes of op, carried by the record at commitlog
// offset at.
func (t *Table) Apply(op Op, at int64) {
	t.last = at
	t.applied++
	switch op.Kind {
	case Set:
		if op.Cursor != NoCursor {
			t.cursors[op.Key] = cursor{next: op.Cursor, at: at}
		}
		for _, it := range op.Items {
			k := Key{QueueKey: op.Key, Offset: it.Offset}
			t.gen = max(t.gen, it.Gen)
			if e := t.inflight[k]; e != nil {
				e.deadline, e.gen, e.at, e.redeliv = it.Deadline, it.Gen, at, it.Redelivered
				heap.Fix(&t.groups[k.Group].due, e.index)
				continue
			}
			t.add(&entry{key: k, deadline: it.Deadline, gen: it.Gen, at: at, redeliv: it.Redelivered})
		}
	case Drop:
		for _, it := range op.Items {
			k := Key{QueueKey: op.Key, Offset: it.Offset}
			t.gen = max(t.gen, it.Gen)
			e := t.inflight[k]
			if e == nil || e.gen != it.Gen {
				continue
			}
			t.forget(k, e)
		}
	}
	t.stats.Lock()
	t.statN = t.total
	t.stats.Unlock()
}

// add puts the message in flight e (not in the table) into every index
// of the table: by key, its group's due heap, its queue's set, the total.
func (t *Table) add(e *entry) {
	k := e.key
	t.inflight[k] = e
	g := t.groups[k.Group]
	if g == nil {
		g = &group{}
		t.groups[k.Group] = g
	}
	heap.Push(&g.due, e)
	q := t.queued[k.QueueKey]
	if q == nil {
		q = map[int64]*entry{}
		t.queued[k.QueueKey] = q
	}
	q[k.Offset] = e
	t.total++
}

// forget removes the message in flight e (at k) from every index of the
// table: by key, its group's due heap, its queue's set, the total.
func (t *Table) forget(k Key, e *entry) {
	delete(t.inflight, k)
	g := t.groups[k.Group]
	heap.Remove(&g.due, e.index)
	if len(g.due) == 0 {
		delete(t.groups, k.Group)
	}
	if q := t.queued[k.QueueKey]; len(q) == 1 {
		delete(t.queued, k.QueueKey)
	} else {
		delete(q, k.Offset)
	}
	t.total--
}

// Reset empties the table (a snapshot installed over a gap in the log:
// the state is rebuilt from the snapshot's records). The generation is
// kept: none handed out before is handed out again.
func (t *Table) Reset() {
	t.cursors, t.inflight, t.groups, t.total = map[QueueKey]cursor{}, map[Key]*entry{}, map[string]*group{}, 0
	t.queued = map[QueueKey]map[int64]*entry{}
	t.last = -1
	t.stats.Lock()
	t.statN = 0
	t.stats.Unlock()
}

// DropTopic forgets, for every consumer group, the cursors and the
// messages in flight of topic's queues whose latest record lies below
// commitlog offset before (the topic was deleted there), and cursors
// with no record (Advance); it returns the cursors and the messages
// dropped. O(cursors + messages in flight): deletes are rare.
func (t *Table) DropTopic(topic string, before int64) (cursors, inflight int) {
	for k, c := range t.cursors {
		if k.Topic == topic && c.at < before {
			delete(t.cursors, k)
			cursors++
		}
	}
	for k, e := range t.inflight {
		if k.Topic != topic || e.at >= before {
			continue
		}
		t.forget(k, e)
		inflight++
	}
	t.stats.Lock()
	t.statN = t.total
	t.stats.Unlock()
	return cursors, inflight
}

// DropCursor forgets k's cursor (its topic was deleted).
func (t *Table) DropCursor(k QueueKey) { delete(t.cursors, k) }

// Below returns Set ops restating every cursor and message in flight whose
// latest record lies below commitlog offset end, at most MaxItems items an
// op, in a deterministic order: what a rewrite before retention appends.
// Cursors without a record (Advance) are restated too.
func (t *Table) Below(end int64) []Op {
	byQueue := map[QueueKey]*Op{}
	get := func(k QueueKey) *Op {
		op := byQueue[k]
		if op == nil {
			op = &Op{Kind: Set, Key: k, Cursor: NoCursor}
			byQueue[k] = op
		}
		return op
	}
	for k, c := range t.cursors {
		if c.at < end {
			get(k).Cursor = c.next
		}
	}
	for k, e := range t.inflight {
		if e.at < end {
			op := get(k.QueueKey)
			op.Items = append(op.Items, Item{Offset: k.Offset, Deadline: e.deadline, Gen: e.gen, Redelivered: e.redeliv})
		}
	}
	keys := make([]QueueKey, 0, len(byQueue))
	for k := range byQueue {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return lessQueue(keys[i], keys[j]) })
	var out []Op
	for _, k := range keys {
		op := byQueue[k]
		sort.Slice(op.Items, func(i, j int) bool { return op.Items[i].Offset < op.Items[j].Offset })
		for first := true; first || len(op.Items) > 0; first = false {
			n := min(len(op.Items), MaxItems)
			part := Op{Kind: Set, Key: k, Cursor: NoCursor, Items: op.Items[:n]}
			if first {
				part.Cursor = op.Cursor
			}
			op.Items = op.Items[n:]
			if part.Cursor == NoCursor && len(part.Items) == 0 {
				continue
			}
			out = append(out, part)
		}
	}
	return out
}

// OldestAt is the lowest commitlog offset holding live state, false when
// there is none.
func (t *Table) OldestAt() (int64, bool) {
	first, found := int64(0), false
	for _, c := range t.cursors {
		if c.at >= 0 && (!found || c.at < first) {
			first, found = c.at, true
		}
	}
	for _, e := range t.inflight {
		if !found || e.at < first {
			first, found = e.at, true
		}
	}
	return first, found
}

// QueueProgress is a group's POP progress on one queue.
type QueueProgress struct {
	Key QueueKey
	// Next is the cursor, the next offset to pop; HasNext is false when
	// the queue has messages in flight but no cursor (its topic was
	// deleted: DropCursor).
	Next    int64
	HasNext bool
	// Inflight is how many of the queue's messages are in flight.
	Inflight int
}

// Progress returns every queue with a cursor or messages in flight,
// sorted by key: O(queues), not a walk of the messages in flight (the
// admin listing and the lag metrics call it at each request and scrape).
func (t *Table) Progress() []QueueProgress {
	out := make([]QueueProgress, 0, len(t.cursors))
	for k, c := range t.cursors {
		out = append(out, QueueProgress{Key: k, Next: c.next, HasNext: true, Inflight: len(t.queued[k])})
	}
	for k, q := range t.queued {
		if _, ok := t.cursors[k]; !ok {
			out = append(out, QueueProgress{Key: k, Inflight: len(q)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return lessQueue(out[i].Key, out[j].Key) })
	return out
}

// Cursors lists the queue keys with a cursor, sorted.
func (t *Table) Cursors() []QueueKey {
	out := make([]QueueKey, 0, len(t.cursors))
	for k := range t.cursors {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return lessQueue(out[i], out[j]) })
	return out
}

func lessQueue(a, b QueueKey) bool {
	if a.Group != b.Group {
		return a.Group < b.Group
	}
	if a.Topic != b.Topic {
		return a.Topic < b.Topic
	}
	return a.Queue < b.Queue
}

// dueHeap orders a group's messages in flight by deadline.
type dueHeap []*entry

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if h[i].deadline != h[j].deadline {
		return h[i].deadline < h[j].deadline
	}
	return h[i].gen < h[j].gen
}
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// Record body layout (big-endian), the wire format of pop records in the
// commitlog: it must not change incompatibly.
//
//	u8  version (1; 2 when an item was redelivered in place)
//	u16 ops     at least 1, at most MaxOps
//	ops × {
//	    u8  kind (1 Set, 2 Drop)
//	    u8  group length, group
//	    u8  topic length, topic
//	    i32 queue
//	    i64 cursor (NoCursor: unchanged; always NoCursor in a Drop)
//	    u16 items, at most MaxItems
//	    items × { i64 offset, i64 deadline (Unix ms), u64 generation,
//	              version 2 only: u32 deliveries in place before (Redelivered) }
//	}
//
// Ops apply in order. A record with no item redelivered in place is
// written as version 1, byte for byte what versions before FIFO
// consumption wrote; only a FIFO group's redelivery writes version 2,
// which those versions refuse (Open reports the record as corrupt).
const (
	version   = 1
	versionV2 = 2
	// MaxOps bounds one record's ops.
	MaxOps = 256
	// MaxItems bounds one op's items.
	MaxItems = 1024
	// MaxNameLen bounds a group or topic name in a record (u8 length).
	MaxNameLen = 255
	itemLen    = 24
	itemLenV2  = 28
	opFixed    = 1 + 1 + 1 + 4 + 8 + 2
)

// ErrDecode: a pop record's body is malformed.
var ErrDecode = errors.New("storage: malformed POP state record")

// EncodedLen is the body length of a record holding ops.
func EncodedLen(ops []Op) int {
	n, il := 3, itemLenOf(ops)
	for _, op := range ops {
		n += opFixed + len(op.Key.Group) + len(op.Key.Topic) + il*len(op.Items)
	}
	return n
}

// itemLenOf is the item length of a record holding ops: version 2's when
// an item was redelivered in place.
func itemLenOf(ops []Op) int {
	for _, op := range ops {
		for _, it := range op.Items {
			if it.Redelivered > 0 {
				return itemLenV2
			}
		}
	}
	return itemLen
}

// Encode returns the body of a record holding ops (1 to MaxOps ops of at
// most MaxItems items, names 1 to MaxNameLen bytes: the caller made them).
func Encode(ops []Op) []byte {
	b := make([]byte, 0, EncodedLen(ops))
	v2 := itemLenOf(ops) == itemLenV2
	if v2 {
		b = append(b, versionV2)
	} else {
		b = append(b, version)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(ops)))
	for _, op := range ops {
		b = append(b, byte(op.Kind))
		b = appendQueueKey(b, op.Key)
		b = binary.BigEndian.AppendUint64(b, uint64(op.Cursor))
		b = binary.BigEndian.AppendUint16(b, uint16(len(op.Items)))
		for _, it := range op.Items {
			b = binary.BigEndian.AppendUint64(b, uint64(it.Offset))
			b = binary.BigEndian.AppendUint64(b, uint64(it.Deadline))
			b = binary.BigEndian.AppendUint64(b, it.Gen)
			if v2 {
				b = binary.BigEndian.AppendUint32(b, it.Redelivered)
			}
		}
	}
	return b
}

// Decode parses a record body. Every count and length is checked against
// the body before anything is allocated, so no input panics or allocates
// more than a small multiple of its own size.
func Decode(b []byte) ([]Op, error) {
	if len(b) < 3 {
		return nil, fmt.Errorf("%w: %d bytes", ErrDecode, len(b))
	}
	il := itemLen
	switch b[0] {
	case version:
	case versionV2:
		il = itemLenV2
	default:
		return nil, fmt.Errorf("%w: version %d", ErrDecode, b[0])
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if n == 0 || n > MaxOps || n*(opFixed+2) > len(b)-3 {
		return nil, fmt.Errorf("%w: %d ops in %d bytes", ErrDecode, n, len(b))
	}
	out := make([]Op, 0, n)
	p := 3
	for i := 0; i < n; i++ {
		if p >= len(b) {
			return nil, fmt.Errorf("%w: op %d: truncated", ErrDecode, i)
		}
		kind := Kind(b[p])
		p++
		if kind != Set && kind != Drop {
			return nil, fmt.Errorf("%w: op %d: kind %d", ErrDecode, i, kind)
		}
		g, ok := base.ReadName(b, &p)
		if !ok {
			return nil, fmt.Errorf("%w: op %d: group", ErrDecode, i)
		}
		topic, ok := base.ReadName(b, &p)
		if !ok || p+14 > len(b) {
			return nil, fmt.Errorf("%w: op %d: topic", ErrDecode, i)
		}
		q := int32(binary.BigEndian.Uint32(b[p:]))
		cur := int64(binary.BigEndian.Uint64(b[p+4:]))
		m := int(binary.BigEndian.Uint16(b[p+12:]))
		p += 14
		switch {
		case q < 0:
			return nil, fmt.Errorf("%w: op %d: queue %d", ErrDecode, i, q)
		case cur < NoCursor || (kind == Drop && cur != NoCursor):
			return nil, fmt.Errorf("%w: op %d: cursor %d", ErrDecode, i, cur)
		case m > MaxItems || p+m*il > len(b):
			return nil, fmt.Errorf("%w: op %d: %d items", ErrDecode, i, m)
		case kind == Set && m == 0 && cur == NoCursor, kind == Drop && m == 0:
			return nil, fmt.Errorf("%w: op %d changes nothing", ErrDecode, i)
		}
		op := Op{Kind: kind, Key: QueueKey{Group: g, Topic: topic, Queue: q}, Cursor: cur, Items: make([]Item, m)}
		for j := range op.Items {
			it := Item{
				Offset:   int64(binary.BigEndian.Uint64(b[p:])),
				Deadline: int64(binary.BigEndian.Uint64(b[p+8:])),
				Gen:      binary.BigEndian.Uint64(b[p+16:]),
			}
			if il == itemLenV2 {
				it.Redelivered = binary.BigEndian.Uint32(b[p+24:])
			}
			p += il
			if it.Offset < 0 || it.Deadline < 0 || it.Gen == 0 {
				return nil, fmt.Errorf("%w: op %d item %d: offset %d, deadline %d, generation %d", ErrDecode, i, j, it.Offset, it.Deadline, it.Gen)
			}
			op.Items[j] = it
		}
		out = append(out, op)
	}
	if p != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the ops", ErrDecode, len(b)-p)
	}
	if il == itemLenV2 && itemLenOf(out) != itemLenV2 {
		return nil, fmt.Errorf("%w: version 2 without an item redelivered in place (Encode writes version 1)", ErrDecode)
	}
	return out, nil
}

// Handle is what a receipt handle names: one incarnation of a message in
// flight of the group and topic the request carrying it names.
type Handle struct {
	// Retry: the message was popped from the group's retry topic, not
	// from the topic the request names.
	Retry  bool
	Queue  int32
	Offset int64
	Gen    uint64
}

// Receipt handle layout: base64url (no padding) of 26 bytes, big-endian:
//
//	u8  handleVersion (1)
//	u8  flags (bit 0: retry; the others zero)
//	i32 queue
//	i64 queue offset
//	u64 generation
//	u32 CRC-32C of the 22 bytes before it
//
// The check catches a handle damaged or cut on its way; the generation,
// matched against the state, refuses a handle of an earlier delivery.
const (
	handleVersion = 1
	handleBytes   = 26
	// HandleLen is the length of an encoded receipt handle.
	HandleLen = (handleBytes*8 + 5) / 6
	flagRetry = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadHandle: a receipt handle is not one this store gives out.
var ErrBadHandle = errors.New("storage: malformed receipt handle")

// EncodeHandle returns h as a receipt handle.
func EncodeHandle(h Handle) string {
	var b [handleBytes]byte
	b[0] = handleVersion
	if h.Retry {
		b[1] = flagRetry
	}
	binary.BigEndian.PutUint32(b[2:], uint32(h.Queue))
	binary.BigEndian.PutUint64(b[6:], uint64(h.Offset))
	binary.BigEndian.PutUint64(b[14:], h.Gen)
	binary.BigEndian.PutUint32(b[22:], crc32.Checksum(b[:22], castagnoli))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// DecodeHandle parses a receipt handle. It refuses anything EncodeHandle
// would not have produced, so what it accepts re-encodes to s.
func DecodeHandle(s string) (Handle, error) {
	if len(s) != HandleLen {
		return Handle{}, fmt.Errorf("%w: %d characters, want %d", ErrBadHandle, len(s), HandleLen)
	}
	var b [handleBytes]byte
	n, err := base64.RawURLEncoding.Strict().Decode(b[:], []byte(s))
	if err != nil || n != handleBytes {
		return Handle{}, fmt.Errorf("%w: not base64url", ErrBadHandle)
	}
	if b[0] != handleVersion {
		return Handle{}, fmt.Errorf("%w: version %d", ErrBadHandle, b[0])
	}
	if b[1]&^flagRetry != 0 {
		return Handle{}, fmt.Errorf("%w: flags %#x", ErrBadHandle, b[1])
	}
	if got, want := binary.BigEndian.Uint32(b[22:]), crc32.Checksum(b[:22], castagnoli); got != want {
		return Handle{}, fmt.Errorf("%w: check %#08x, want %#08x", ErrBadHandle, got, want)
	}
	h := Handle{Retry: b[1]&flagRetry != 0, Queue: int32(binary.BigEndian.Uint32(b[2:])),
		Offset: int64(binary.BigEndian.Uint64(b[6:])), Gen: binary.BigEndian.Uint64(b[14:])}
	if h.Queue < 0 || h.Offset < 0 || h.Gen == 0 {
		return Handle{}, fmt.Errorf("%w: queue %d, offset %d, generation %d", ErrBadHandle, h.Queue, h.Offset, h.Gen)
	}
	return h, nil
}
