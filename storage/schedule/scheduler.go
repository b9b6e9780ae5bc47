package schedule

// The delay scheduler: RocketMQ's ScheduleMessageService.
//
// A message put with DELAY = n > 0 is stored on SCHEDULE_TOPIC_XXXX, queue
// n-1, with REAL_TOPIC and REAL_QID (see divert), and the dispatcher writes
// its consume-queue entry with the delivery time, store time + the level's
// delay, as the tags code. The scheduler follows each level's queue from its
// progress: once the head entry's delivery time has come on the store's
// clock, it reads the record and puts it again to REAL_TOPIC/REAL_QID with
// the delay properties removed, WAIT=false and a fresh store time, then
// moves on. Within a level delivery times never decrease (store times never
// go backwards and the delay is the same), so only the head of each level
// is watched, and order within a level is kept.
//
// A clock set back: store times stay at the last one stamped until the
// clock catches up, so a delay counted from them would add the whole jump.
// The dispatcher counts from the clock instead when the store time is ahead
// of it (consumequeue's deliverAt), and messages stamped while the clock was
// ahead wait at most their level's delay from when the scheduler first
// sees one of them at the head: the whole backlog together (capLocked). Either way a message is never delivered before its delay
// has passed on the clock as read at its put (or later); only order
// within a level may then differ from the due times.
//
// Progress is persisted in config/delayOffset.json (temp file, fsync,
// rename, directory fsync) at most every CheckpointInterval and on Close,
// and only once the re-puts it covers are durable: through the group commit
// in sync mode (the sync is shared with producers), by an explicit sync in
// async mode. A restart resumes from the persisted progress, so a message is
// delivered at least once (the ones delivered after the last persist once
// more), never before its time, and never lost. Retention keeps every
// commitlog file from the first undelivered message of the persisted
// progress on.

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

const (
	// delayOffsetName is the progress file, in the config dir.
	delayOffsetName = "delayOffset.json"
	// scheduleBatch bounds the deliveries of one level per pass, so a level
	// with a backlog does not hold the others back.
	scheduleBatch = 256
	// schedulePoll is how often (on the store's clock) the scheduler looks
	// for messages on levels that had none pending. RocketMQ polls each
	// level every 100 ms too. A level with something pending only needs
	// its head's time, since what comes after it is due later. The poll
	// is far below the shortest delay a table can hold (1 s), so polling
	// never makes a delivery late; waking on every dispatch instead cost
	// the put path a goroutine wake-up per dispatch round.
	schedulePoll = 100 * time.Millisecond
	// scheduleRetry is how long (on the store's clock) the scheduler waits
	// after the store refused a re-put (not writable, busy) before trying
	// again.
	scheduleRetry = time.Second
)

// Timer-message properties the re-put drops with DELAY (RocketMQ
// MessageConst), so a delivered message is not diverted again.
const (
	propertyTimerDeliverMS = "TIMER_DELIVER_MS"
	propertyTimerDelaySec  = "TIMER_DELAY_SEC"
	propertyTimerDelayMS   = "TIMER_DELAY_MS"
)

// LevelStats describe one delay level of the scheduler.
type LevelStats struct {
	// Level is the delay level (1-based); its queue id is Level-1.
	Level int
	// Delay is the level's delay.
	Delay time.Duration
	// Pending is the number of messages of the level not yet delivered,
	// due or not.
	Pending int64
	// Lag is how long the oldest undelivered message of the level has been
	// due: 0 when none is due.
	Lag time.Duration
	// Delivered counts the messages delivered since Open.
	Delivered uint64
	// Offset is the next queue offset to deliver; Persisted is the one a
	// restart would resume from (≤ Offset).
	Offset, Persisted int64
}

// Stats describe the delay scheduler.
type Stats struct {
	// Levels has one entry per delay level.
	Levels []LevelStats
	// Skipped counts messages that can never be delivered and were passed
	// over: record gone or damaged, no valid REAL_TOPIC/REAL_QID, or refused
	// by validation or by the topic config (REAL_TOPIC deleted with
	// auto-creation off, REAL_QID beyond its queues, the topic limit
	// reached), logged at error level each time.
	Skipped uint64
	// Refused counts re-puts the store refused for a passing reason (not
	// writable, busy); they are retried.
	Refused uint64
}

// Host is what the scheduler needs from the store: the schedule queues,
// the records they point at, and a way to put a due message back.
type Host interface {
	// Queue is the consume queue of topic/qid, or nil.
	Queue(topic string, qid int32) *consumequeue.Queue
	// Keys lists the consume queues.
	Keys() []consumequeue.Key
	// Dispatched is the commitlog offset below which records are indexed.
	Dispatched() int64
	// ReadRecord reads and checks the record at commitlog offset phys.
	ReadRecord(phys int64) (*record.Record, error)
	// Redeliver puts m (the message due, for its real topic) and returns the
	// commitlog offset just past it. An error wrapping ErrUndeliverable
	// means it can never be put (it is skipped); base.ErrClosed stops the
	// scheduler; any other error is a passing refusal (retried).
	Redeliver(m *record.Message) (end int64, err error)
	// DurableTo returns once every commitlog byte below off is durable.
	DurableTo(off int64) error
	// Delivering reports whether this store delivers now (a master; a
	// slave or a follower does not: its re-puts would be refused).
	Delivering() bool
	// Epoch names the current leadership in a replicated group (the term
	// in which this replica became the ready leader; 0 when it is not, and
	// always 0 standalone). When it changes, the scheduler resumes from
	// Replicated before it delivers: its own progress may count re-puts a
	// later leader cut.
	Epoch() uint64
	// Replicated is the progress replicated in the group's log (level →
	// next queue offset, from the last committed progress command; absent
	// levels are at 0); ok is false standalone.
	Replicated() (progress map[int]int64, ok bool)
	// ProposeProgress proposes next (per level, 1-based by index+1) as the
	// replicated progress, on the leader of epoch only; standalone it does
	// nothing. Called after a round's re-puts were committed, so the
	// command follows them in the log.
	ProposeProgress(epoch uint64, next []int64) error
}

// ErrUndeliverable marks a re-put the store refuses for good (validation,
// a deleted topic, the topic limit): the message is skipped.
var ErrUndeliverable = errors.New("storage: delayed message cannot be delivered")

// Options configure a Scheduler.
type Options struct {
	FS     vfs.FS
	Dir    string          // the config dir holding delayOffset.json
	Levels []time.Duration // the delay table: level i (1-based) is Levels[i-1]
	// PersistEvery is how often the progress is persisted (real time).
	PersistEvery time.Duration
	Clock        base.Clock
	Logger       *zerolog.Logger
	Throttle     *logthrottle.Throttle
	Faults       *fault.Set
}

// Scheduler delivers delay-level messages when their time comes.
type Scheduler struct {
	opts   Options
	host   Host
	dir    string // Options.Dir
	levels int    // schedule queues served: the delay table's levels, never more

	mu           sync.Mutex    // one round or persist at a time
	need         int64         // commitlog offset the re-puts since the last persist end at; guarded by mu
	dirty        bool          // progress moved since the last persist; guarded by mu
	lastPersist  time.Time     // real time of the last persist; guarded by mu
	persistEvery time.Duration // guarded by mu
	// retryPersist is when (real time) to try again after writing the
	// progress failed (a transient fault, faults.go); zero when the last
	// write succeeded. Guarded by mu.
	retryPersist time.Time

	// epoch is the host's Epoch the progress belongs to (0: standalone,
	// or not yet a group leader); unproposed: progress moved in this epoch
	// and the host has not taken a ProposeProgress for it yet. Guarded by
	// mu.
	epoch      uint64
	unproposed bool

	next      []atomic.Int64 // per queue id: next queue offset to deliver; written under mu
	capped    []cappedHead   // per queue id: guarded by mu
	persisted []atomic.Int64 // per queue id: the progress on disk
	delivered []atomic.Uint64
	skipped   atomic.Uint64
	refused   atomic.Uint64

	rounds *base.Rounds
}

// New loads the persisted progress. The consume queues must be loaded and
// rebuilt already. It starts nothing: Start runs the delivery goroutine,
// Stop ends it.
func New(host Host, opts Options) (*Scheduler, error) {
	sc := &Scheduler{opts: opts, host: host, dir: opts.Dir, levels: len(opts.Levels),
		persistEvery: opts.PersistEvery, lastPersist: time.Now(), rounds: base.NewRounds()}
	// Only the levels of the delay table are served: memory is never sized
	// by a queue id found on disk (one record on queue 2^31-1 once made
	// every start allocate 16 GiB). A schedule queue beyond the table (data
	// from a store run with a longer table, or written by a client before
	// the schedule topic was reserved) is logged once; its messages are not
	// delivered, and stay readable on SCHEDULE_TOPIC_XXXX until retention
	// removes their files.
	beyond, example := 0, int32(0)
	for _, id := range host.Keys() {
		if id.Topic == record.ScheduleTopic && int(id.Queue) >= sc.levels {
			beyond++
			example = max(example, id.Queue)
		}
	}
	if beyond > 0 {
		opts.Logger.Warn().Int("queues", beyond).Int32("max_queue_id", example).Int("levels", sc.levels).
			Msg("storage: schedule queues beyond the delay level table; their messages are not delivered (still readable on the schedule topic until retention)")
	}
	sc.next = make([]atomic.Int64, sc.levels)
	sc.capped = make([]cappedHead, sc.levels)
	sc.persisted = make([]atomic.Int64, sc.levels)
	sc.delivered = make([]atomic.Uint64, sc.levels)
	offsets, err := readDelayOffsets(opts.FS, sc.dir)
	if err != nil {
		return nil, err
	}
	for qid := range sc.levels {
		off := offsets[qid+1]
		lo, hi := int64(0), int64(0)
		if q := host.Queue(record.ScheduleTopic, int32(qid)); q != nil {
			lo, hi = q.Min(), q.Count()
		}
		if off > hi {
			opts.Logger.Warn().Int("level", qid+1).Int64("persisted", off).Int64("queue_max", hi).
				Msg("storage: delay progress is past the end of its schedule queue; resuming at the end")
			off = hi
		}
		if off < lo {
			opts.Logger.Warn().Int("level", qid+1).Int64("persisted", off).Int64("queue_min", lo).
				Msg("storage: delayed messages below the schedule queue's min offset are gone; resuming at the min")
			sc.skipped.Add(uint64(lo - off))
			off = lo
		}
		sc.next[qid].Store(off)
		sc.persisted[qid].Store(off)
	}
	for level := range offsets {
		if level < 1 || level > sc.levels {
			opts.Logger.Warn().Int("level", level).Msg("storage: delay progress for a level that has no schedule queue; ignored")
		}
	}
	return sc, nil
}

// Start runs the delivery goroutine. It delivers only while the host says
// Delivering (a slave's or follower's re-puts would be refused; the master
// it follows delivers).
func (sc *Scheduler) Start() {
	sc.rounds.Start(sc.opts.Clock, schedulePoll, scheduleRetry, sc.round)
}

// Stop ends the goroutine and persists the progress (the re-puts made
// durable first). The flush policy must still be running. Calling it twice
// is safe.
func (sc *Scheduler) Stop() {
	sc.rounds.Stop(func() {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		if err := sc.persistLocked(); err != nil {
			sc.opts.Logger.Warn().Err(err).Msg("storage: delay progress not persisted at close; messages delivered since the last persist will be delivered again")
		}
	})
}

// round delivers every due message, level by level, at most scheduleBatch
// per level per pass, and persists the progress when it is time.
func (sc *Scheduler) round() base.Round {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var res base.Round
	if !sc.host.Delivering() {
		// A slave (or, replicated, a follower): nothing to deliver; look
		// again at the next poll, in case the role changed.
		res.At = sc.opts.Clock.Now()
		return res
	}
	if e := sc.host.Epoch(); e != sc.epoch {
		// A new leadership (replicated group): resume from the progress
		// the group committed, never from this replica's own.
		if p, ok := sc.host.Replicated(); ok {
			sc.resumeLocked(p)
		}
		sc.epoch, sc.unproposed = e, false
	}
	defer sc.proposeLocked()
	for {
		res.At = sc.opts.Clock.Now()
		nowMS := res.At.UnixMilli()
		earliest, moved := int64(math.MaxInt64), 0
		var err error
		for qid := range sc.levels {
			n, due, lerr := sc.deliverLevelLocked(qid, nowMS)
			moved += n
			earliest = min(earliest, due)
			if lerr != nil {
				err = lerr
				break
			}
		}
		sc.maybePersistLocked()
		if err != nil {
			res.Retry = !errors.Is(err, base.ErrClosed)
			break
		}
		if moved == 0 || sc.rounds.Stopping() {
			if earliest != math.MaxInt64 {
				res.Wake = time.UnixMilli(earliest)
			}
			break
		}
	}
	if sc.dirty {
		res.PersistIn = max(sc.persistEvery-time.Since(sc.lastPersist), time.Millisecond)
		if !sc.retryPersist.IsZero() {
			res.PersistIn = max(time.Until(sc.retryPersist), time.Millisecond)
		}
	}
	return res
}

// deliverLevelLocked delivers up to scheduleBatch due messages of queue
// qid. It returns how many moved the progress, the delivery time of the
// first message left waiting (MaxInt64 if none is visible), and the error
// of a re-put the store refused (the progress stays before that message).
// REQUIRES: sc.mu held.
func (sc *Scheduler) deliverLevelLocked(qid int, nowMS int64) (moved int, nextDue int64, err error) {
	nextDue = math.MaxInt64
	q := sc.host.Queue(record.ScheduleTopic, int32(qid))
	if q == nil {
		return 0, nextDue, nil
	}
	off := sc.next[qid].Load()
	if lo := q.Min(); off < lo {
		// Cannot happen while retention honours the persisted progress;
		// say so loudly if it does.
		sc.opts.Logger.Error().Int("level", qid+1).Int64("from", off).Int64("to", lo).
			Msg("storage: delayed messages below the schedule queue's min offset are gone; skipping them")
		sc.skipped.Add(uint64(lo - off))
		off = lo
		sc.next[qid].Store(off)
		sc.dirty = true
	}
	for moved < scheduleBatch && off < q.Count() {
		phys, _, due, ok := q.Get(off)
		if !ok || phys >= sc.host.Dispatched() {
			break // trimmed meanwhile, or not yet readable: the next dispatch wakes us
		}
		if due > nowMS {
			due = sc.capLocked(qid, off, q.Count(), due, nowMS)
		}
		if due > nowMS {
			return moved, due, nil
		}
		if err := sc.deliverLocked(qid, off, phys); err != nil {
			return moved, nextDue, err
		}
		off++
		sc.next[qid].Store(off)
		sc.dirty, sc.unproposed = true, true
		moved++
	}
	return moved, nextDue, nil
}

// cappedHead is the cap on the delivery times of a level (see capLocked):
// every entry below queue offset end is delivered at the clock's at (Unix
// ms) at the latest.
// resumeLocked sets the progress to p (level → next queue offset, absent
// levels at 0), clamped to each schedule queue's [min, max] as New does.
// REQUIRES: sc.mu.
func (sc *Scheduler) resumeLocked(p map[int]int64) {
	for qid := range sc.levels {
		off := p[qid+1]
		lo, hi := int64(0), int64(0)
		if q := sc.host.Queue(record.ScheduleTopic, int32(qid)); q != nil {
			lo, hi = q.Min(), q.Count()
		}
		off = max(min(off, hi), lo)
		if off != sc.next[qid].Load() {
			sc.opts.Logger.Info().Int("level", qid+1).Int64("from", sc.next[qid].Load()).Int64("to", off).
				Msg("storage: delay progress resumed from the group's replicated progress")
		}
		sc.next[qid].Store(off)
		sc.capped[qid] = cappedHead{}
	}
	sc.dirty = true
}

// proposeLocked hands the progress to the host for replication when it
// moved in this epoch (a group leader; standalone the epoch is 0 and it
// does nothing). A refused proposal is tried again after the next round.
// REQUIRES: sc.mu.
func (sc *Scheduler) proposeLocked() {
	if sc.epoch == 0 || !sc.unproposed {
		return
	}
	next := make([]int64, sc.levels)
	for qid := range next {
		next[qid] = sc.next[qid].Load()
	}
	if err := sc.host.ProposeProgress(sc.epoch, next); err != nil {
		sc.opts.Throttle.Event("storage: delay progress proposal", sc.opts.Logger.Debug()).Err(err).
			Msg("storage: delay progress not proposed; tried again after the next round")
		return
	}
	sc.unproposed = false
}

type cappedHead struct {
	end, at int64
	set     bool
}

// capLocked returns the time the head of level qid (at queue offset off,
// due at due; the level's queue holds end entries) may be delivered, for a
// head due later than nowMS: due itself, unless due is further away than
// the level's delay, which only a clock set back after the message was
// stored can cause (the store time it was stamped with, and so its due
// time, is ahead of the clock). Then every entry already in the level's
// queue (below end) waits at most the level's delay on the clock from now:
// each was stored before now, so its delay has passed by then, and a
// backlog stamped while the clock was ahead is released together, not one
// level's delay after the other. The cap is kept across rounds, so the
// wait does not move. Messages put after the clock went back are not
// affected: the dispatcher counts their delay from the clock
// (consumequeue's deliverAt). REQUIRES: sc.mu held.
func (sc *Scheduler) capLocked(qid int, off, end, due, nowMS int64) int64 {
	limit := nowMS + sc.delayOf(qid+1).Milliseconds()
	c := &sc.capped[qid]
	if c.set && off < c.end {
		return min(due, c.at)
	}
	if due <= limit {
		return due
	}
	*c = cappedHead{end: end, at: limit, set: true}
	sc.opts.Throttle.Event("storage: delay clock back", sc.opts.Logger.Warn()).Int("level", qid+1).
		Int64("queue_offset", off).Stringer("ahead_by", time.Duration(due-limit)*time.Millisecond).
		Msg("storage: a delayed message is due further ahead than its level's delay (the clock was set back); " +
			"delivering it after the level's delay on the clock")
	return limit
}

// deliverLocked puts the schedule-queue message at commitlog offset phys to
// its real topic. A message that can never be delivered is skipped (nil);
// a refusal that may pass is returned. REQUIRES: sc.mu held.
func (sc *Scheduler) deliverLocked(qid int, off, phys int64) error {
	rec, err := sc.host.ReadRecord(phys) // from the schedule queue
	if err != nil {
		if errors.Is(err, base.ErrClosed) {
			return err
		}
		sc.skip(qid, off, phys, err)
		return nil
	}
	m, err := realMessage(rec)
	if err != nil {
		sc.skip(qid, off, phys, err)
		return nil
	}
	end, err := sc.host.Redeliver(m)
	if end > 0 {
		// In the log. If its durability is unknown (a failed sync), the
		// persist below fails and a restart delivers it again.
		sc.need = max(sc.need, end)
		sc.delivered[qid].Add(1)
		return nil
	}
	if errors.Is(err, ErrUndeliverable) {
		// Refused by validation or by the topic config (topic deleted with
		// auto-creation off, queue id beyond its queues, topic limit).
		sc.skip(qid, off, phys, err)
		return nil
	}
	if !errors.Is(err, base.ErrClosed) {
		sc.refused.Add(1)
	}
	return err
}

func (sc *Scheduler) skip(qid int, off, phys int64, err error) {
	sc.skipped.Add(1)
	sc.opts.Throttle.Event("storage: delay skip", sc.opts.Logger.Error()).Err(err).Int("level", qid+1).Int64("queue_offset", off).Int64("commitlog_offset", phys).
		Msg("storage: delayed message cannot be delivered; skipped")
}

// realMessage builds the message to deliver from a schedule-topic record:
// topic and queue from REAL_TOPIC/REAL_QID; DELAY, REAL_TOPIC, REAL_QID, the
// timer properties and the store's CRC property removed; WAIT=false so a
// sync-mode put does not wait for the flush (RocketMQ messageTimeup).
func realMessage(rec *record.Record) (*record.Message, error) {
	topic, ok := rec.Property(record.PropertyRealTopic)
	if !ok || topic == "" {
		return nil, errors.New("storage: delayed message has no REAL_TOPIC")
	}
	v, _ := rec.Property(record.PropertyRealQueueID)
	qid, err := strconv.ParseInt(v, 10, 32)
	if err != nil || qid < 0 {
		return nil, fmt.Errorf("storage: delayed message has a bad REAL_QID %q", v)
	}
	props := make([]record.Property, 0, len(rec.Properties))
	for _, p := range rec.Properties {
		switch p.Key {
		case record.PropertyDelayLevel, record.PropertyRealTopic, record.PropertyRealQueueID, record.PropertyCRC32, record.PropertyWaitStoreOK,
			propertyTimerDeliverMS, propertyTimerDelaySec, propertyTimerDelayMS:
			continue
		}
		props = append(props, p)
	}
	props = append(props, record.Property{Key: record.PropertyWaitStoreOK, Value: "false"})
	return &record.Message{
		Topic: topic, QueueID: int32(qid), Flag: rec.Flag, Body: rec.Body, Properties: props,
		SysFlag: rec.SysFlag &^ record.StoreOwnedSysFlags, BornTimestamp: rec.BornTimestamp, BornHost: rec.BornHost,
		ReconsumeTimes: rec.ReconsumeTimes, PreparedTxOffset: rec.PreparedTxOffset,
	}, nil
}

// maybePersistLocked persists the progress when it is time: every
// persistEvery, or after a failed write once its backoff has passed. A
// failed write is a transient fault (logged and counted by persistLocked).
// REQUIRES: sc.mu held.
func (sc *Scheduler) maybePersistLocked() {
	if !sc.dirty {
		return
	}
	if sc.retryPersist.IsZero() {
		if time.Since(sc.lastPersist) < sc.persistEvery {
			return
		}
	} else if time.Now().Before(sc.retryPersist) {
		return
	}
	if err := sc.persistLocked(); err != nil && !errors.Is(err, errDelayProgressWrite) {
		sc.opts.Throttle.Event("storage: delay progress", sc.opts.Logger.Warn()).Err(err).
			Msg("storage: delay progress not persisted; will retry")
	}
}

// errDelayProgressWrite marks a failed write of the progress file, which
// persistLocked records as a transient fault (logged there).
var errDelayProgressWrite = errors.New("storage: write delay progress")

// Persist makes the re-puts durable and writes the progress.
func (sc *Scheduler) Persist() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.persistLocked()
}

// persistLocked writes the progress once every re-put it covers is
// durable. REQUIRES: sc.mu held.
func (sc *Scheduler) persistLocked() error {
	if !sc.dirty {
		return nil
	}
	if err := sc.host.DurableTo(sc.need); err != nil {
		return fmt.Errorf("storage: delay progress: delivered messages not yet durable: %w", err)
	}
	offsets := make(map[int]int64, sc.levels)
	for qid := range sc.levels {
		offsets[qid+1] = sc.next[qid].Load()
	}
	if err := writeDelayOffsets(sc.opts.FS, sc.dir, offsets); err != nil {
		// ENOSPC, EMFILE, EIO on config/: transient. The progress is in
		// memory and nothing is lost meanwhile; retry after the backoff.
		sc.retryPersist = time.Now().Add(sc.opts.Faults.Failed(fault.DelayProgress, err))
		return fmt.Errorf("%w: %w", errDelayProgressWrite, err)
	}
	sc.opts.Faults.Cleared(fault.DelayProgress)
	sc.retryPersist = time.Time{}
	for qid := range sc.levels {
		sc.persisted[qid].Store(offsets[qid+1])
	}
	sc.dirty = false
	sc.lastPersist = time.Now()
	return nil
}

// ProtectedFrom is the commitlog offset of the first delayed message the
// persisted progress has not delivered: retention keeps every file from
// there on. MaxInt64 when nothing is pending.
func (sc *Scheduler) ProtectedFrom() int64 {
	from := int64(math.MaxInt64)
	for qid := range sc.levels {
		q := sc.host.Queue(record.ScheduleTopic, int32(qid))
		if q == nil {
			continue
		}
		if phys, _, _, ok := q.Get(sc.persisted[qid].Load()); ok {
			from = min(from, phys)
		}
	}
	return from
}

// ProtectedFromProgress is ProtectedFrom by another progress than the
// persisted one: next(level) is the next queue offset of level's schedule
// queue (1-based) whose delivery is not known done; a replication group
// protects by its replicated progress, which any member resumes from
// when it leads.
func (sc *Scheduler) ProtectedFromProgress(next func(level int) int64) int64 {
	from := int64(math.MaxInt64)
	for qid := range sc.levels {
		q := sc.host.Queue(record.ScheduleTopic, int32(qid))
		if q == nil {
			continue
		}
		if phys, _, _, ok := q.Get(max(next(qid+1), q.Min())); ok {
			from = min(from, phys)
		}
	}
	return from
}

// Stats describes the scheduler.
func (sc *Scheduler) Stats() Stats {
	st := Stats{Levels: make([]LevelStats, sc.levels), Skipped: sc.skipped.Load(), Refused: sc.refused.Load()}
	nowMS := sc.opts.Clock.Now().UnixMilli()
	for qid := range st.Levels {
		l := LevelStats{Level: qid + 1, Delay: sc.delayOf(qid + 1), Offset: sc.next[qid].Load(),
			Persisted: sc.persisted[qid].Load(), Delivered: sc.delivered[qid].Load()}
		if q := sc.host.Queue(record.ScheduleTopic, int32(qid)); q != nil {
			l.Pending = max(q.Count()-max(l.Offset, q.Min()), 0)
			if _, _, due, ok := q.Get(l.Offset); ok && due <= nowMS {
				l.Lag = time.Duration(nowMS-due) * time.Millisecond
			}
		}
		st.Levels[qid] = l
	}
	return st
}

// delayOffsets is the progress file: the next queue offset to deliver per
// delay level, keyed by the level as a decimal string (RocketMQ's
// offsetTable; RocketMQ writes fastjson with bare integer keys, we write
// standard JSON). A second line holds the CRC-32C of the first.
type delayOffsets struct {
	Version     int              `json:"version"`
	OffsetTable map[string]int64 `json:"offsetTable"`
}

// readDelayOffsets returns level → next queue offset; empty when there is
// no file; an error wrapping ErrCorrupt when the file fails its CRC.
func readDelayOffsets(fs vfs.FS, dir string) (map[int]int64, error) {
	b, err := fs.ReadFile(filepath.Join(dir, delayOffsetName))
	if errors.Is(err, iofs.ErrNotExist) {
		return map[int]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: read delay progress: %w", err)
	}
	body, ok := base.Unseal(b)
	if !ok {
		return nil, fmt.Errorf("%w: config/%s fails its CRC (delete it to deliver every retained delayed message again)", base.ErrCorrupt, delayOffsetName)
	}
	var d delayOffsets
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("%w: config/%s: %w", base.ErrCorrupt, delayOffsetName, err)
	}
	out := make(map[int]int64, len(d.OffsetTable))
	for k, v := range d.OffsetTable {
		level, err := strconv.Atoi(k)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%w: config/%s: bad entry %q: %d", base.ErrCorrupt, delayOffsetName, k, v)
		}
		out[level] = v
	}
	return out, nil
}

// writeDelayOffsets replaces the progress file atomically and durably.
func writeDelayOffsets(fs vfs.FS, dir string, offsets map[int]int64) error {
	d := delayOffsets{Version: 1, OffsetTable: make(map[string]int64, len(offsets))}
	for level, off := range offsets {
		d.OffsetTable[strconv.Itoa(level)] = off
	}
	body, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("storage: encode delay progress: %w", err)
	}
	if err := base.WriteAtomic(fs, dir, delayOffsetName, base.Seal(body)); err != nil {
		return fmt.Errorf("storage: delay progress: %w", err)
	}
	return nil
}

// delayOf returns the delay of level (1-based), 1 s for an unknown level
// (RocketMQ computeDeliverTimestamp).
func (sc *Scheduler) delayOf(level int) time.Duration { return DelayOf(sc.opts.Levels, level) }

// DelayOf returns the delay of level (1-based) in levels, 1 s for an
// unknown level (RocketMQ computeDeliverTimestamp).
func DelayOf(levels []time.Duration, level int) time.Duration {
	if level >= 1 && level <= len(levels) {
		return levels[level-1]
	}
	return time.Second
}

// ParseDelayLevels parses a delay level table such as
// "1s 5s 10s 30s 1m 2m … 2h". Level i (from 1) is element i-1.
func ParseDelayLevels(s string) ([]time.Duration, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, errors.New("delay levels: empty table")
	}
	out := make([]time.Duration, 0, len(fields))
	for _, f := range fields {
		if len(f) < 2 {
			return nil, fmt.Errorf("delay levels: bad entry %q", f)
		}
		var unit time.Duration
		switch f[len(f)-1] {
		case 's':
			unit = time.Second
		case 'm':
			unit = time.Minute
		case 'h':
			unit = time.Hour
		case 'd':
			unit = 24 * time.Hour
		default:
			return nil, fmt.Errorf("delay levels: bad unit in %q (want s, m, h or d)", f)
		}
		n, err := strconv.ParseInt(f[:len(f)-1], 10, 32)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("delay levels: bad number in %q", f)
		}
		out = append(out, time.Duration(n)*unit)
	}
	return out, nil
}
