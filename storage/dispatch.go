package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// dispatcher follows the commitlog and writes consume-queue entries
// (RocketMQ ReputMessageService). It dispatches only up to the visible end:
// the durable offset in sync mode, so that a consumer never reads a message
// that a power cut could take back (RocketMQ #8239), and the written offset
// in async mode. It also writes the checkpoint.
type dispatcher struct {
	s    *Store
	root string

	mu     sync.RWMutex // guards queues
	queues map[queueKey]*consumeQueue

	// runMu is held by every dispatch round and checkpoint, so a test can
	// pause the store at a consistent point (see Store.pause).
	runMu      sync.Mutex
	next       int64        // next commitlog offset to dispatch; guarded by runMu
	dispatched atomic.Int64 // published after the entries are written

	arriveMu sync.Mutex
	arrive   chan struct{} // closed and replaced on every progress

	lastCP checkpoint // last checkpoint written; dispatcher goroutine only

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

func newDispatcher(s *Store) *dispatcher {
	return &dispatcher{s: s, root: s.opts.Dir, queues: map[queueKey]*consumeQueue{},
		arrive: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// loadQueues maps every consume queue on disk, cutting entries that point
// at or past commitlogEnd.
func (d *dispatcher) loadQueues(commitlogEnd int64) error {
	fs := d.s.opts.FS
	topics, err := fs.ReadDir(filepath.Join(d.root, "consumequeue"))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: read consume queues: %w", err)
	}
	for _, t := range topics {
		if !t.IsDir || !validTopic(t.Name) {
			continue
		}
		ids, err := fs.ReadDir(filepath.Join(d.root, "consumequeue", t.Name))
		if err != nil {
			return fmt.Errorf("storage: read consume queues of %s: %w", t.Name, err)
		}
		for _, id := range ids {
			topic, qid, ok := splitQueueName(t.Name + "/" + id.Name)
			if !ok || !id.IsDir {
				continue
			}
			q, err := loadConsumeQueue(fs, d.root, topic, qid, d.s.opts.ConsumeQueueEntries, commitlogEnd)
			if err != nil {
				return err
			}
			d.queues[queueKey{topic, qid}] = q
		}
	}
	return nil
}

func (d *dispatcher) start() {
	d.wg.Add(1)
	go d.loop()
}

// dispatchPause is how long the dispatcher lets records accumulate after a
// round that found work, before it answers the next wake. A round per put
// costs the writers: waking the dispatcher is a futex call when it is
// parked, and a dispatcher right behind the writer reads the cache line
// the writer is still filling, so the line bounces between cores. On the
// project's 2-core VM a round per put added ~300 ns to a 1 KiB async put
// (BENCHMARKS.md). RocketMQ's ReputMessageService waits 1 ms between
// rounds; the same here bounds what the pause adds to a message's
// visibility under load, and a put after an idle spell is still dispatched
// at once.
const dispatchPause = time.Millisecond

func (d *dispatcher) loop() {
	defer d.wg.Done()
	t := time.NewTicker(d.s.opts.CheckpointInterval)
	defer t.Stop()
	pause := time.NewTimer(dispatchPause)
	pause.Stop()
	for {
		select {
		case <-d.kick:
			if !d.run(d.s.visibleEnd()) {
				continue
			}
			pause.Reset(dispatchPause)
			select {
			case <-pause.C:
			case <-d.done:
				return
			}
		case <-t.C:
			d.run(d.s.visibleEnd())
			d.runMu.Lock()
			err := d.checkpoint()
			d.runMu.Unlock()
			if err != nil {
				d.s.fail(err)
			}
		case <-d.done:
			return
		}
	}
}

// wake asks for a dispatch round without blocking.
func (d *dispatcher) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run dispatches every record in [next, end) and publishes the progress.
// It reports whether there was anything to dispatch.
func (d *dispatcher) run(end int64) bool {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	if d.next >= end {
		return false
	}
	if err := d.dispatchTo(end); err != nil {
		d.s.fail(err)
		return true
	}
	d.dispatched.Store(d.next)
	d.arriveMu.Lock()
	close(d.arrive)
	d.arrive = make(chan struct{})
	d.arriveMu.Unlock()
	return true
}

// arrival returns a channel closed at the next dispatch progress.
func (d *dispatcher) arrival() <-chan struct{} {
	d.arriveMu.Lock()
	defer d.arriveMu.Unlock()
	return d.arrive
}

func (d *dispatcher) dispatchTo(end int64) error {
	var lastTopic string
	// Deleted topics: their records below the delete are never indexed
	// again (topics.go). Tombstones change only under runMu, which the
	// caller holds.
	tombs := d.s.topics.tombstones()
	skipBelow := tombs[""]
	for d.next < end {
		f := d.s.queue.findByOffset(d.next)
		if f == nil {
			return fmt.Errorf("storage: dispatch: no commitlog file holds offset %d", d.next)
		}
		rel := d.next - f.from
		b := f.data[rel:]
		if len(b) < BlankLen || IsBlank(b) {
			d.next = f.from + f.size
			continue
		}
		m := parseMeta(b)
		if m.total <= 0 || rel+int64(m.total) > f.size {
			return fmt.Errorf("%w: dispatch: bad record at commitlog offset %d", ErrCorrupt, d.next)
		}
		if m.tx == TransactionNotType || m.tx == TransactionCommitType {
			topic := lastTopic
			if string(m.topic) != lastTopic {
				topic = string(m.topic)
				lastTopic = topic
				skipBelow = tombs[topic]
			}
			if d.next < skipBelow {
				d.next += int64(m.total)
				continue
			}
			q, err := d.queueFor(topic, m.queueID)
			if err != nil {
				return err
			}
			tags := tagsCodeBytes(m.tags)
			if topic == ScheduleTopic {
				tags = m.storeTS + d.s.delayOf(int(m.queueID)+1).Milliseconds()
			}
			if err := q.put(m.queueOffset, d.next, m.total, tags); err != nil {
				return err
			}
		}
		d.next += int64(m.total)
	}
	return nil
}

func (d *dispatcher) queueFor(topic string, qid int32) (*consumeQueue, error) {
	k := queueKey{topic, qid}
	d.mu.RLock()
	q := d.queues[k]
	d.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	q = &consumeQueue{fs: d.s.opts.FS, topic: topic, queueID: qid, dir: cqDir(d.root, topic, qid),
		fileSize: int64(d.s.opts.ConsumeQueueEntries) * cqEntrySize}
	d.mu.Lock()
	d.queues[k] = q
	d.mu.Unlock()
	return q, nil
}

// queue returns the consume queue of topic/qid, or nil.
func (d *dispatcher) queue(topic string, qid int32) *consumeQueue {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.queues[queueKey{topic, qid}]
}

// checkpoint makes the consume queues and the commitlog durable up to the
// dispatched offset and records both. REQUIRES: runMu held, or the store
// closed with the goroutine stopped.
func (d *dispatcher) checkpoint() error {
	dispatched := d.next
	counts := map[string]int64{}
	d.mu.RLock()
	queues := make([]*consumeQueue, 0, len(d.queues))
	for _, q := range d.queues {
		queues = append(queues, q)
	}
	d.mu.RUnlock()
	sort.Slice(queues, func(i, j int) bool {
		return queueName(queues[i].topic, queues[i].queueID) < queueName(queues[j].topic, queues[j].queueID)
	})
	for _, q := range queues {
		if err := q.flush(); err != nil {
			return err
		}
		counts[queueName(q.topic, q.queueID)] = q.count.Load()
	}
	// Everything dispatched must be durable before the checkpoint says so.
	flushed, err := d.s.queue.Sync(0)
	if err != nil {
		return fmt.Errorf("storage: sync before checkpoint: %w", err)
	}
	if dispatched > flushed { // cannot happen: dispatched ≤ written ≤ flushed after Sync(0)
		dispatched = flushed
	}
	cp := checkpoint{Flushed: flushed, Dispatched: dispatched, Queues: counts, StoreTime: d.s.lastStoreTime()}
	if cp.Flushed == d.lastCP.Flushed && cp.Dispatched == d.lastCP.Dispatched && len(cp.Queues) == len(d.lastCP.Queues) {
		return nil
	}
	if err := writeCheckpoint(d.s.opts.FS, d.root, cp); err != nil {
		return err
	}
	d.lastCP = cp
	return nil
}

// stop ends the goroutine.
func (d *dispatcher) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	close(d.done)
	d.wg.Wait()
}

func (d *dispatcher) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, q := range d.queues {
		errs = append(errs, q.close())
	}
	return errors.Join(errs...)
}

// recordMeta is what dispatch needs from a record header.
type recordMeta struct {
	total       int32
	queueID     int32
	queueOffset int64
	tx          int32
	storeTS     int64
	topic       []byte
	tags        []byte
}

// parseMeta reads the dispatch fields of a record already validated by
// recovery or written by this process. It does not check CRCs.
func parseMeta(b []byte) recordMeta {
	be := binary.BigEndian
	total := int32(be.Uint32(b))
	if total < minRecordLen || int(total) > len(b) {
		return recordMeta{}
	}
	b = b[:total]
	m := recordMeta{total: total, queueID: int32(be.Uint32(b[posQueueID:])),
		queueOffset: int64(be.Uint64(b[posQueueOffset:]))}
	sys := int32(be.Uint32(b[posSysFlag:]))
	m.tx = sys & transactionMask
	p := posBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	m.storeTS = int64(be.Uint64(b[p:]))
	p += 8 + 8 + 4 + 8
	if sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	p += 4 + int(be.Uint32(b[p:]))
	var tl int
	if be.Uint32(b[posMagic:]) == MagicV2 {
		tl = int(be.Uint16(b[p:]))
		p += 2
	} else {
		tl = int(b[p])
		p++
	}
	if p+tl+2 > len(b) {
		return recordMeta{}
	}
	m.topic = b[p : p+tl]
	p += tl
	pl := int(be.Uint16(b[p:]))
	p += 2
	if p+pl <= len(b) {
		m.tags = propertyIn(b[p:p+pl], PropertyTags)
	}
	return m
}

// propertyIn finds key in an encoded properties string; the value aliases
// props (no allocation).
func propertyIn(props []byte, key string) []byte {
	for len(props) > 0 {
		end := bytes.IndexByte(props, propertySeparator)
		if end < 0 {
			end = len(props)
		}
		item := props[:end]
		if len(item) > len(key) && item[len(key)] == nameValueSeparator && string(item[:len(key)]) == key {
			return item[len(key)+1:]
		}
		if end == len(props) {
			break
		}
		props = props[end+1:]
	}
	return nil
}
