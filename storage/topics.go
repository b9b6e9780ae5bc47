package storage

// Topic configuration: RocketMQ's TopicConfigManager.
//
// Every topic has a queue count; a put names a queue id in [0, queues). A
// put to an unknown topic creates it with Options.DefaultQueues unless
// Options.NoAutoCreateTopics; at most Options.MaxTopics topics exist. The
// schedule topic is the store's own: it is not in the table, and its queue
// count is the delay level count.
//
// The table is persisted in Options.Dir/config/topics.json: one line of
// JSON, a line with its CRC-32C, replaced atomically (temp file, fsync,
// rename, directory fsync) like the checkpoint, so after any crash it is
// the old or the new table. A change is published only after it is on
// disk: a failed persist changes nothing, returns an error wrapping
// ErrTopicConfig, and the next call tries again.
//
// Reads take no lock: the table is an immutable snapshot behind an atomic
// pointer, replaced whole by every change (changes are rare: creates,
// updates, deletes, each also an fsync).
//
// A delete leaves a tombstone: the commitlog offset the delete happened at.
// The topic's records below it stay in the commitlog until retention
// removes their files, but the dispatcher never indexes them again, so a
// consume-queue rebuild neither resurrects the deleted topic nor collides
// with the queue offsets of a topic re-created under the same name (which
// start at 0 again). A tombstone is dropped once retention has removed
// every commitlog file below it.

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// Topic table limits and defaults.
const (
	// DefaultQueues is the queue count of an auto-created topic (RocketMQ
	// defaultTopicQueueNums).
	DefaultQueues = 8
	// DefaultMaxTopics bounds the number of topics.
	DefaultMaxTopics = 10000
	// MaxQueues bounds a topic's queue count, whatever a request, a flag
	// or a file on disk asks for: nothing in the store is sized by a queue
	// id, but each queue written costs a consume queue (files, a mapping),
	// and RocketMQ brokers run with 8-16 queues per topic. A queue id at or
	// above it found on disk (data written before topic configuration
	// existed) is logged once and its messages stay readable, but puts to it
	// are refused.
	MaxQueues = 1024
	// topicsName is the table's file, in Options.Dir/config.
	topicsName = "topics.json"
)

var (
	// ErrTopicNotFound: the topic does not exist (a put with auto-creation
	// off, or an admin call on an unknown topic). RocketMQ TOPIC_NOT_EXIST.
	ErrTopicNotFound = errors.New("storage: topic does not exist")
	// ErrTopicExists: CreateTopic on a topic that exists.
	ErrTopicExists = errors.New("storage: topic already exists")
	// ErrTooManyTopics: creating the topic would exceed Options.MaxTopics.
	// Nothing was stored; it clears once topics are deleted (or the limit
	// raised).
	ErrTooManyTopics = errors.New("storage: too many topics")
	// ErrTopicConfig: the topic table could not be persisted (a full disk,
	// no file descriptors). Nothing changed and nothing was stored; the next
	// call tries again. Not sticky.
	ErrTopicConfig = errors.New("storage: topic config not persisted")
	// ErrQueuesLowered: UpdateTopic asked for fewer queues than the topic
	// has. Queues are never taken away: their messages and consumer offsets
	// would be orphaned.
	ErrQueuesLowered = errors.New("storage: a topic's queue count cannot be lowered")
)

// TopicConfig is one topic's configuration.
type TopicConfig struct {
	Name   string
	Queues int32
}

// topicSnapshot is one immutable version of the table.
type topicSnapshot struct {
	topics  map[string]int32 // name → queue count
	deleted map[string]int64 // name → commitlog offset of its last delete
}

// topicTable is the topic configuration. The store reaches it through
// topicRules; it knows nothing of the store.
type topicTable struct {
	fs            vfs.FS
	dir           string // Options.Dir/config
	log           *zerolog.Logger
	defaultQueues int32
	autoCreate    bool
	maxTopics     int
	// minOffset is the commitlog's first offset: tombstones at or below it
	// cover nothing any more (retention removed the files) and are dropped
	// when the table is next persisted. Nil keeps them.
	minOffset func() int64
	// onWriteError, if set, is told of each failed write of the table (the
	// store counts it as a transient fault of the topic config; the call
	// that needed the write is refused and the next one tries again).
	onWriteError func(error)
	// replicate, set in group mode, replaces the local persist of a create
	// or a raise: it proposes the change through the raft log and returns
	// once this replica applied it (applyReplicated), or why not.
	replicate func(name string, queues int32) error
	// raftIndex is the raft index of the last topic command applied
	// (group mode), persisted with the table: Open replays the commands
	// after it. Guarded by wmu.
	raftIndex uint64
	// blocked (group mode, on the leader) names the topics whose delete
	// is proposed and not yet applied here: has and admit refuse them, so
	// no put to the topic is stamped between the delete's proposal and its
	// apply (it would continue the deleted queue's offsets after the
	// delete in the log). Nil when empty; replaced whole under cmu.
	blocked atomic.Pointer[map[string]bool]
	// deletedAt is the raft index of the last delete of each topic applied
	// here since Open (group mode): a leader's DeleteTopic waits for it.
	// Guarded by cmu.
	deletedAt map[string]uint64

	// wmu is held by whoever writes the file and publishes a change:
	// the leader of a round of creates, an update, a delete, the adoption.
	wmu sync.Mutex
	cur atomic.Pointer[topicSnapshot]

	// Creates are group-committed: concurrent creates (auto-creating puts
	// to many new topics at once) share one persist, as producers share
	// one sync in the group commit. cmu guards what follows; a published
	// change of the topic count happens under it too, so the limit check
	// sees every topic, pending or not.
	cmu      sync.Mutex
	pending  map[string]int32 // creates waiting for the next round
	next     *createRound     // the round pending creates join
	inflight map[string]int32 // creates the current round is writing
	current  *createRound     // the round being written
	leading  bool             // a goroutine is writing rounds
}

// createRound is one persist shared by the creates it carries.
type createRound struct {
	done chan struct{} // closed when err is set
	err  error
}

// topicRules is what the put path and the dispatcher need from the table.
type topicRules interface {
	// admit checks that a client may put to topic/queueID, creating the
	// topic when it is unknown and auto-creation is on. The error is a
	// *ValidationError (reserved topic, queue id out of range),
	// ErrTopicNotFound, ErrTooManyTopics or ErrTopicConfig.
	admit(topic string, queueID int32) error
	// has reports whether topic exists with queueID in range (no lock, no
	// allocation: it runs under the put lock).
	has(topic string, queueID int32) bool
	// tombstones is the deleted topics and the commitlog offsets of their
	// deletes: records of a topic below its offset are not indexed. The map
	// is read-only.
	tombstones() map[string]int64
}

var _ topicRules = (*topicTable)(nil)

func newTopicTable(opts Options) *topicTable {
	t := &topicTable{fs: opts.FS, dir: filepath.Join(opts.Dir, "config"), log: opts.Logger,
		defaultQueues: int32(opts.DefaultQueues), autoCreate: !opts.NoAutoCreateTopics, maxTopics: opts.MaxTopics}
	t.cur.Store(&topicSnapshot{topics: map[string]int32{}, deleted: map[string]int64{}})
	return t
}

func (t *topicTable) admit(topic string, queueID int32) error {
	if b := t.blocked.Load(); b != nil && (*b)[topic] {
		return fmt.Errorf("%w: %s is being deleted", ErrTopicNotFound, topic)
	}
	if n, ok := t.cur.Load().topics[topic]; ok && queueID >= 0 && queueID < n {
		return nil // the fast path: two atomic loads, one map lookup
	}
	if p := SendTopicProblem(topic); p != "" {
		return illegal("topic", p)
	}
	n, ok := t.cur.Load().topics[topic]
	if !ok {
		if !t.autoCreate {
			return fmt.Errorf("%w: %s (topic auto-creation is off: create it through the admin service)", ErrTopicNotFound, topic)
		}
		if _, err := t.create(topic, t.defaultQueues, true); err != nil {
			return err
		}
		if n, ok = t.get(topic); !ok { // deleted meanwhile
			return fmt.Errorf("%w: %s was deleted", ErrTopicNotFound, topic)
		}
	}
	if queueID < 0 || queueID >= n {
		return illegal("queue_id", fmt.Sprintf("queue id %d is out of range: topic %s has %d queues (ids 0-%d)", queueID, topic, n, n-1))
	}
	return nil
}

func (t *topicTable) has(topic string, queueID int32) bool {
	if b := t.blocked.Load(); b != nil && (*b)[topic] {
		return false
	}
	n, ok := t.cur.Load().topics[topic]
	return ok && queueID >= 0 && queueID < n
}

func (t *topicTable) tombstones() map[string]int64 { return t.cur.Load().deleted }

// deleting reports whether a delete of topic is proposed and not yet
// applied here (group mode, on the leader: see blocked).
func (t *topicTable) deleting(topic string) bool {
	b := t.blocked.Load()
	return b != nil && (*b)[topic]
}

// get returns the queue count of topic.
func (t *topicTable) get(topic string) (int32, bool) {
	n, ok := t.cur.Load().topics[topic]
	return n, ok
}

// list returns up to limit topics after the name after, in name order, and
// whether more follow.
func (t *topicTable) list(after string, limit int) ([]TopicConfig, bool) {
	snap := t.cur.Load()
	names := make([]string, 0, len(snap.topics))
	for name := range snap.topics {
		if name > after {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	out := make([]TopicConfig, len(names))
	for i, name := range names {
		out[i] = TopicConfig{Name: name, Queues: snap.topics[name]}
	}
	return out, more
}

// checkQueues refuses a queue count outside [1, MaxQueues].
func checkQueues(queues int32) *ValidationError {
	if queues < 1 || queues > MaxQueues {
		return illegal("queues", fmt.Sprintf("queue count %d out of range [1, %d]", queues, MaxQueues))
	}
	return nil
}

// create adds topic with queues, or, when exist is true and it exists
// already (a concurrent auto-create won), returns its queue count. It
// returns once the table holding the topic is on disk; concurrent creates
// share that persist.
func (t *topicTable) create(topic string, queues int32, exist bool) (int32, error) {
	t.cmu.Lock()
	cur := t.cur.Load()
	var join *createRound // a round already carrying topic
	n, ok := cur.topics[topic]
	switch {
	case ok:
	case t.pending[topic] != 0:
		n, join = t.pending[topic], t.next
	case t.inflight[topic] != 0:
		n, join = t.inflight[topic], t.current
	}
	if ok || join != nil {
		t.cmu.Unlock()
		if join != nil {
			<-join.done
			if join.err != nil {
				return 0, join.err
			}
		}
		if exist {
			return n, nil
		}
		return n, fmt.Errorf("%w: %s has %d queues", ErrTopicExists, topic, n)
	}
	if total := len(cur.topics) + len(t.pending) + len(t.inflight); total >= t.maxTopics {
		t.cmu.Unlock()
		return 0, fmt.Errorf("%w: the store holds %d topics, the limit (--max-topics)", ErrTooManyTopics, total)
	}
	if t.replicate != nil {
		t.cmu.Unlock()
		return t.createReplicated(topic, queues, exist)
	}
	if t.pending == nil {
		t.pending = map[string]int32{}
	}
	t.pending[topic] = queues
	if t.next == nil {
		t.next = &createRound{done: make(chan struct{})}
	}
	r := t.next
	lead := !t.leading
	t.leading = true
	t.cmu.Unlock()
	if lead {
		t.writeRounds()
	}
	<-r.done
	if r.err != nil {
		return 0, r.err
	}
	return queues, nil
}

// createReplicated is create in group mode: the create goes through the
// raft log and is applied on every replica (applyReplicated); creates of
// one topic racing each other end with the highest count.
func (t *topicTable) createReplicated(topic string, queues int32, exist bool) (int32, error) {
	if err := t.replicate(topic, queues); err != nil {
		return 0, err
	}
	n, ok := t.get(topic)
	switch {
	case !ok: // cannot happen: replicate returns once it is applied, and a group deletes no topic
		return 0, fmt.Errorf("%w: %s not in the table after its create applied", ErrTopicConfig, topic)
	case !exist && n != queues:
		return n, fmt.Errorf("%w: %s has %d queues", ErrTopicExists, topic, n)
	}
	return n, nil
}

// applyReplicated applies a committed topic command (group mode), in log
// order, on every replica: the topic gets max(its count, queues) queues.
// The table is persisted with the command's raft index; a failed persist
// is reported (onWriteError) but the change is published all the same (a
// replica must apply what committed), and the next Open replays the
// commands after the index on disk.
func (t *topicTable) applyReplicated(name string, queues int32, index uint64) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.cmu.Lock()
	defer t.cmu.Unlock() // a published change of the topic count happens under cmu (see there)
	cur := t.cur.Load()
	if index <= t.raftIndex {
		return nil // replayed at Open already
	}
	t.raftIndex = index
	next := cur.clone()
	was := next.topics[name]
	next.topics[name] = max(was, queues)
	err := t.persistLocked(next)
	t.cur.Store(next)
	if was < queues {
		t.log.Info().Str("topic", name).Int32("queues", queues).Int32("was", was).Uint64("raft_index", index).
			Msg("storage: topic created or raised (replicated)")
	}
	return err
}

// applySnapshot takes a snapshot's topic table at raft index index (a
// group replica installing it, design §3.5): the table becomes the
// snapshot's (a topic this replica has and the snapshot lacks was
// deleted), its tombstones are added (the later offset wins), and the
// table records index, the last topic command the snapshot's table
// reflects, so that neither Open's replay nor the raft loop applies a
// command at or below it again (a delete applied twice would drop the
// queue of a topic re-created after it). It returns the tombstones this
// replica had before. The table is persisted, or it is an error: the
// commands it stands for are no longer in the raft log.
func (t *topicTable) applySnapshot(topics map[string]int32, deleted map[string]int64, index uint64) (map[string]int64, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.cmu.Lock()
	defer t.cmu.Unlock()
	cur := t.cur.Load()
	next := &topicSnapshot{topics: make(map[string]int32, len(topics)), deleted: make(map[string]int64, len(cur.deleted)+len(deleted))}
	for name, n := range topics {
		next.topics[name] = n
	}
	for name, at := range cur.deleted {
		next.deleted[name] = at
	}
	for name, at := range deleted {
		next.deleted[name] = max(next.deleted[name], at)
	}
	raftIndex := t.raftIndex
	t.raftIndex = max(t.raftIndex, index)
	if err := t.persistLocked(next); err != nil {
		t.raftIndex = raftIndex
		return nil, err
	}
	t.cur.Store(next)
	return cur.deleted, nil
}

// applyDelete applies a committed topic delete at raft index index (group
// mode, every replica, in log order; Open's replay too): the topic leaves
// the table and is tombstoned at at, the commitlog offset past the last
// DATA entry before the command. publish, if set, publishes the new table
// (the store's: inside the dispatcher's pause, with the queues dropped);
// otherwise it is stored directly. It reports whether the command was
// new here (not replayed at Open already), and the persist error if the
// table could not be written (the change is published all the same: a
// replica applies what committed; the next Open replays it).
func (t *topicTable) applyDelete(name string, at int64, index uint64, publish func(*topicSnapshot)) (bool, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.cmu.Lock()
	defer t.cmu.Unlock()
	if index <= t.raftIndex {
		return false, nil
	}
	t.raftIndex = index
	next := t.cur.Load().clone()
	_, existed := next.topics[name]
	delete(next.topics, name)
	next.deleted[name] = max(next.deleted[name], at)
	err := t.persistLocked(next)
	if publish != nil {
		publish(next)
	} else {
		t.cur.Store(next)
	}
	if t.deletedAt == nil {
		t.deletedAt = map[string]uint64{}
	}
	t.deletedAt[name] = index
	t.setBlockedLocked(name, false)
	t.log.Info().Str("topic", name).Bool("existed", existed).Int64("commitlog_offset", at).Uint64("raft_index", index).
		Msg("storage: topic deleted (replicated)")
	return true, err
}

// deletedSince reports whether a delete of name applied here at a raft
// index above after.
func (t *topicTable) deletedSince(name string, after uint64) bool {
	t.cmu.Lock()
	defer t.cmu.Unlock()
	return t.deletedAt[name] > after
}

// setBlocked blocks or unblocks puts to name (see blocked).
func (t *topicTable) setBlocked(name string, on bool) {
	t.cmu.Lock()
	defer t.cmu.Unlock()
	t.setBlockedLocked(name, on)
}

// clearBlocked unblocks every topic (a new leadership: a delete proposed
// in an earlier one has applied or was cut from the log).
func (t *topicTable) clearBlocked() {
	t.cmu.Lock()
	defer t.cmu.Unlock()
	t.blocked.Store(nil)
}

// REQUIRES: t.cmu.
func (t *topicTable) setBlockedLocked(name string, on bool) {
	m := map[string]bool{}
	if b := t.blocked.Load(); b != nil {
		if (*b)[name] == on {
			return
		}
		for k := range *b {
			m[k] = true
		}
	} else if !on {
		return
	}
	if on {
		m[name] = true
	} else {
		delete(m, name)
	}
	if len(m) == 0 {
		t.blocked.Store(nil)
		return
	}
	t.blocked.Store(&m)
}

// state returns the table, its tombstones and the raft index of the last
// topic command it holds, read together (a snapshot's manifest).
func (t *topicTable) state() (map[string]int32, map[string]int64, uint64) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	cur := t.cur.Load()
	return cur.topics, cur.deleted, t.raftIndex
}

// writeRounds persists rounds of pending creates until none is left.
func (t *topicTable) writeRounds() {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.cmu.Lock()
	for t.next != nil {
		r, batch := t.next, t.pending
		t.current, t.inflight = r, batch
		t.next, t.pending = nil, nil
		t.cmu.Unlock()

		next := t.cur.Load().clone()
		for name, n := range batch {
			if _, ok := next.topics[name]; !ok { // an undone delete may have brought it back
				next.topics[name] = n
			}
		}
		err := t.persistLocked(next)

		t.cmu.Lock()
		if err == nil {
			t.cur.Store(next)
		}
		t.current, t.inflight = nil, nil
		r.err = err
		close(r.done)
		if err == nil {
			for name, n := range batch {
				t.log.Info().Str("topic", name).Int32("queues", n).Msg("storage: topic created")
			}
		}
	}
	t.leading = false
	t.cmu.Unlock()
}

// update raises topic's queue count.
func (t *topicTable) update(topic string, queues int32) error {
	t.wmu.Lock()
	old := t.cur.Load()
	n, ok := old.topics[topic]
	switch {
	case !ok:
		t.wmu.Unlock()
		return fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
	case queues < n:
		t.wmu.Unlock()
		return fmt.Errorf("%w: %s has %d queues, asked for %d", ErrQueuesLowered, topic, n, queues)
	case queues == n:
		t.wmu.Unlock()
		return nil
	case t.replicate != nil:
		t.wmu.Unlock() // applyReplicated takes it
		return t.replicate(topic, queues)
	}
	defer t.wmu.Unlock()
	next := old.clone()
	next.topics[topic] = queues
	if err := t.persistLocked(next); err != nil {
		return err
	}
	t.cur.Store(next)
	t.log.Info().Str("topic", topic).Int32("queues", queues).Int32("was", n).Msg("storage: topic queue count raised")
	return nil
}

func (s *topicSnapshot) clone() *topicSnapshot {
	c := &topicSnapshot{topics: make(map[string]int32, len(s.topics)+1), deleted: make(map[string]int64, len(s.deleted)+1)}
	for k, v := range s.topics {
		c.topics[k] = v
	}
	for k, v := range s.deleted {
		c.deleted[k] = v
	}
	return c
}

// topicsFile is the table on disk.
type topicsFile struct {
	Version int `json:"version"`
	// Topics maps a name to its queue count.
	Topics map[string]int32 `json:"topics"`
	// Deleted maps a deleted topic's name to the commitlog offset its
	// delete happened at.
	Deleted map[string]int64 `json:"deleted,omitempty"`
	// RaftIndex (group mode) is the raft index of the last topic command
	// the table holds.
	RaftIndex uint64 `json:"raft_index,omitempty"`
}

// persistLocked writes snap atomically and durably. REQUIRES: t.wmu held.
func (t *topicTable) persistLocked(snap *topicSnapshot) error {
	if t.minOffset != nil {
		lo := t.minOffset()
		for name, off := range snap.deleted {
			if off <= lo {
				delete(snap.deleted, name) // snap is not published yet
			}
		}
	}
	body, err := json.Marshal(topicsFile{Version: 1, Topics: snap.topics, Deleted: snap.deleted, RaftIndex: t.raftIndex})
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrTopicConfig, err)
	}
	if err := base.WriteAtomic(t.fs, t.dir, topicsName, base.Seal(body)); err != nil {
		// Not logged here: the caller's call log has it, once per call.
		if t.onWriteError != nil {
			t.onWriteError(err)
		}
		return fmt.Errorf("%w: %w", ErrTopicConfig, err)
	}
	return nil
}

// load reads the table from disk. It reports whether there was a file. A
// file that fails its CRC is an error wrapping ErrCorrupt. Queue counts
// above MaxQueues (a hand-edited file) are lowered to it, and bad names
// dropped, with one log line.
func (t *topicTable) load() (bool, error) {
	path := filepath.Join(t.dir, topicsName)
	b, err := t.fs.ReadFile(path)
	if errors.Is(err, iofs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("storage: read topic config: %w", err)
	}
	body, ok := base.Unseal(b)
	if !ok {
		return false, fmt.Errorf("%w: config/%s fails its CRC (move it away to adopt the topics found in the consume queues, "+
			"with at least the default queue count each)", ErrCorrupt, topicsName)
	}
	var f topicsFile
	if err := json.Unmarshal(body, &f); err != nil {
		return false, fmt.Errorf("%w: config/%s: %w", ErrCorrupt, topicsName, err)
	}
	snap := &topicSnapshot{topics: make(map[string]int32, len(f.Topics)), deleted: make(map[string]int64, len(f.Deleted))}
	var bad []string
	for name, n := range f.Topics {
		switch {
		case TopicNameProblem(name) != "" || NotAllowedSendTopic(name):
			bad = append(bad, name)
			continue
		case n < 1:
			bad = append(bad, name)
			continue
		case n > MaxQueues:
			bad = append(bad, name)
			n = MaxQueues
		}
		snap.topics[name] = n
	}
	for name, off := range f.Deleted {
		if off > 0 {
			snap.deleted[name] = off
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.log.Warn().Int("entries", len(bad)).Str("first", bad[0]).Int("max_queues", MaxQueues).
			Msg("storage: topic config has bad entries (name, or queue count outside [1, max_queues]); dropped or lowered")
	}
	t.raftIndex = f.RaftIndex
	t.cur.Store(snap)
	return true, nil
}
