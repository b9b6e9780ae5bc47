package timers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/rs/zerolog"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

const (
	// progressName is the standalone progress file, in the config dir.
	progressName = "timerProgress.json"
	// roundBatch bounds the deliveries of one pass, so that a backlog
	// does not hold the lock (and recalls) for long.
	roundBatch = 256
	// pollInterval is how often (on the store's clock) the service looks
	// for newly dispatched timer records.
	pollInterval = 100 * time.Millisecond
	// retryInterval is how long (on the store's clock) it waits after the
	// store refused a re-put before trying again.
	retryInterval = time.Second
	// DefaultMaxPending is the default bound of the due index.
	DefaultMaxPending = 1 << 20
)

var (
	// ErrNotPending: no pending timer message matches a recall (delivered
	// already, recalled already, or never stored).
	ErrNotPending = errors.New("storage: no pending timer message matches")
	// ErrUndeliverable marks a re-put the store refuses for good
	// (validation, a deleted topic, the topic limit): the message is
	// skipped.
	ErrUndeliverable = errors.New("storage: timer message cannot be delivered")
	// ErrNotDelivering: this store does not deliver timer messages now (a
	// slave, a follower, a leader not ready): a recall goes to the one
	// that does.
	ErrNotDelivering = errors.New("storage: this store does not deliver timer messages now")
)

// Progress is what a restart or a new leader resumes from (doc.go).
type Progress struct {
	// Low: every entry of the timer queue below this queue offset is
	// resolved; a rebuild scans from here.
	Low int64 `json:"low"`
	// Ingested, DueMS, Phys: every entry below queue offset Ingested whose
	// (delivery time, commitlog offset) is below (DueMS, Phys) is
	// resolved.
	Ingested int64 `json:"ingested"`
	DueMS    int64 `json:"dueMs"`
	Phys     int64 `json:"phys"`
}

// resolved reports whether the entry at queue offset off, due at due,
// record at phys, is resolved by p.
func (p Progress) resolved(off, due, phys int64) bool {
	return off < p.Ingested && (due < p.DueMS || due == p.DueMS && phys < p.Phys)
}

// Check reports why p cannot be resumed from, nil when it can.
func (p Progress) Check() error {
	if p.Low < 0 || p.Ingested < p.Low || p.Phys < 0 {
		return fmt.Errorf("timer progress low %d, ingested %d, phys %d", p.Low, p.Ingested, p.Phys)
	}
	return nil
}

// Host is what the service needs from the store.
type Host interface {
	// Queue is the timer queue (record.TimerTopic, queue 0), or nil.
	Queue() *consumequeue.Queue
	// Dispatched is the commitlog offset below which records are indexed.
	Dispatched() int64
	// ReadRecord reads and checks the record at commitlog offset phys.
	ReadRecord(phys int64) (*record.Record, error)
	// Redeliver puts m (the message due, for its real topic) and returns
	// the commitlog offset just past it. An error wrapping
	// ErrUndeliverable means it can never be put (it is skipped);
	// base.ErrClosed stops the service; any other error is a passing
	// refusal (retried).
	Redeliver(m *record.Message) (end int64, err error)
	// PutRecall appends a recall record (spec complete but for the hosts,
	// CRCs and stamping) and returns once it is durable (committed in a
	// group), with the commitlog offset past it; an error means it may not
	// be stored.
	PutRecall(ctx context.Context, spec record.Spec) (end int64, err error)
	// DurableTo returns once every commitlog byte below off is durable.
	DurableTo(off int64) error
	// Delivering reports whether this store delivers now.
	Delivering() bool
	// Epoch names the current leadership in a replicated group (0 when
	// not the ready leader, always 0 standalone).
	Epoch() uint64
	// Replicated is the progress replicated in the group's log; ok is
	// false standalone.
	Replicated() (p Progress, ok bool)
	// ProposeProgress proposes p on the leader of epoch only; standalone
	// it does nothing. Called after the re-puts it covers committed.
	ProposeProgress(epoch uint64, p Progress) error
}

// Options configure a Service.
type Options struct {
	FS  vfs.FS
	Dir string // the config dir holding timerProgress.json
	// MaxPending bounds the due index (DefaultMaxPending when 0).
	MaxPending int
	// PersistEvery is how often the progress is persisted (real time).
	PersistEvery time.Duration
	Clock        base.Clock
	Logger       *zerolog.Logger
	Throttle     *logthrottle.Throttle
	Faults       *fault.Set
	// Group: progress comes from Host.Replicated when this replica
	// becomes the leader, not from the file.
	Group bool
}

// entry is one pending timer message.
type entry struct {
	due  int64 // delivery time, Unix ms
	phys int64 // commitlog offset of its timer record
	off  int64 // queue offset in the timer queue
}

func byDue(a, b entry) bool {
	if a.due != b.due {
		return a.due < b.due
	}
	return a.phys < b.phys
}

func byOff(a, b int64) bool { return a < b }

// Service delivers timer messages when they are due and recalls them.
type Service struct {
	opts Options
	host Host
	max  int

	mu       sync.Mutex // rounds, recalls, rebuilds, persists
	due      *btree.BTreeG[entry]
	offs     *btree.BTreeG[int64]
	ingested int64 // next queue offset to read into the index; guarded by mu
	built    bool  // the index was rebuilt for the current epoch; guarded by mu
	epoch    uint64
	// unproposed: progress moved in this epoch and was not proposed yet.
	unproposed bool
	need       int64 // commitlog end of the re-puts since the last persist; guarded by mu
	// readEnd is the commitlog end of the last entry read into the index:
	// a persisted progress must not count an entry a power cut could take
	// back (its queue offset would go to another record). Guarded by mu.
	readEnd int64
	dirty   bool // guarded by mu
	// replay is the progress of the last rebuild while ingestion has not
	// passed its Ingested yet (the index filled up first): entries it
	// resolves are not read in again. Nil otherwise; guarded by mu.
	replay       *Progress
	lastPersist  time.Time // real time; guarded by mu
	retryPersist time.Time // guarded by mu

	pending   atomic.Int64 // due.Len(), for admission and stats
	readTo    atomic.Int64 // ingested, for admission and stats
	persisted atomic.Pointer[Progress]
	delivered atomic.Uint64
	recalled  atomic.Uint64
	skipped   atomic.Uint64
	refused   atomic.Uint64

	rounds *base.Rounds
}

// New loads the persisted progress (standalone) and builds the index from
// the timer queue, which must be loaded and rebuilt already. In a group
// the index is built when the replica becomes the ready leader. It starts
// nothing: Start runs the delivery goroutine, Stop ends it.
func New(host Host, opts Options) (*Service, error) {
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	sv := &Service{opts: opts, host: host, max: opts.MaxPending, lastPersist: time.Now(), rounds: base.NewRounds()}
	sv.due = btree.NewG(32, byDue)
	sv.offs = btree.NewG(32, byOff)
	sv.persisted.Store(&Progress{})
	if opts.Group {
		return sv, nil
	}
	p, err := readProgress(opts.FS, opts.Dir)
	if err != nil {
		return nil, err
	}
	sv.persisted.Store(&p)
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if err := sv.rebuildLocked(p); err != nil {
		return nil, err
	}
	return sv, nil
}

// Start runs the delivery goroutine.
func (sv *Service) Start() {
	sv.rounds.Start(sv.opts.Clock, pollInterval, retryInterval, sv.round)
}

// Stop ends the goroutine and persists the progress (the re-puts made
// durable first). Calling it twice is safe.
func (sv *Service) Stop() {
	sv.rounds.Stop(func() {
		sv.mu.Lock()
		defer sv.mu.Unlock()
		if err := sv.persistLocked(); err != nil {
			sv.opts.Logger.Warn().Err(err).Msg("storage: timer progress not persisted at close; messages delivered since the last persist will be delivered again")
		}
	})
}

// readyLocked makes the index current for this store's role: nothing to
// do (false) when it does not deliver; rebuilt from the group's progress
// at a new leadership; then the records dispatched since the last look
// read in. REQUIRES: sv.mu.
func (sv *Service) readyLocked() (bool, error) {
	if !sv.host.Delivering() {
		if sv.opts.Group && sv.built {
			// A replica that stopped leading forgets its index: the next
			// leadership rebuilds it from the group's progress.
			sv.resetLocked()
			sv.built = false
		}
		sv.epoch = 0
		return false, nil
	}
	if e := sv.host.Epoch(); e != sv.epoch || !sv.built {
		if sv.opts.Group {
			p, _ := sv.host.Replicated()
			if err := sv.rebuildLocked(p); err != nil {
				return false, err
			}
		}
		sv.built, sv.epoch, sv.unproposed = true, e, false
	}
	if err := sv.ingestLocked(); err != nil {
		return false, err
	}
	return true, nil
}

// round delivers every due message, at most roundBatch per pass, and
// persists or proposes the progress when it is time.
func (sv *Service) round() base.Round {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	var res base.Round
	res.At = sv.opts.Clock.Now()
	ok, err := sv.readyLocked()
	if err != nil {
		sv.opts.Throttle.Event("storage: timer index", sv.opts.Logger.Error()).Err(err).
			Msg("storage: timer index could not be read from the timer queue; retrying")
		res.Retry = true
		return res
	}
	if !ok {
		return res
	}
	defer sv.proposeLocked()
	for {
		res.At = sv.opts.Clock.Now()
		moved, err := sv.deliverDueLocked(res.At.UnixMilli())
		sv.maybePersistLocked()
		if err != nil {
			res.Retry = !errors.Is(err, base.ErrClosed)
			break
		}
		if moved < roundBatch || sv.rounds.Stopping() {
			break
		}
		if err := sv.ingestLocked(); err != nil {
			break
		}
	}
	if e, ok := sv.due.Min(); ok {
		res.Wake = time.UnixMilli(e.due)
	}
	if sv.dirty && !sv.opts.Group {
		res.PersistIn = max(sv.opts.PersistEvery-time.Since(sv.lastPersist), time.Millisecond)
		if !sv.retryPersist.IsZero() {
			res.PersistIn = max(time.Until(sv.retryPersist), time.Millisecond)
		}
	}
	return res
}

// deliverDueLocked delivers up to roundBatch due messages, earliest first.
// REQUIRES: sv.mu.
func (sv *Service) deliverDueLocked(nowMS int64) (moved int, err error) {
	for moved < roundBatch {
		e, ok := sv.due.Min()
		if !ok || e.due > nowMS {
			return moved, nil
		}
		if err := sv.deliverLocked(e); err != nil {
			return moved, err
		}
		sv.removeLocked(e)
		moved++
	}
	return moved, nil
}

// deliverLocked puts the timer message e to its real topic. A message
// that can never be delivered is skipped (nil); a refusal that may pass
// is returned. REQUIRES: sv.mu.
func (sv *Service) deliverLocked(e entry) error {
	rec, err := sv.host.ReadRecord(e.phys)
	if err != nil {
		if errors.Is(err, base.ErrClosed) {
			return err
		}
		sv.skip(e, err)
		return nil
	}
	m, err := RealMessage(rec)
	if err != nil {
		sv.skip(e, err)
		return nil
	}
	end, err := sv.host.Redeliver(m)
	if end > 0 {
		sv.need = max(sv.need, end)
		sv.delivered.Add(1)
		return nil
	}
	if errors.Is(err, ErrUndeliverable) {
		sv.skip(e, err)
		return nil
	}
	if !errors.Is(err, base.ErrClosed) {
		sv.refused.Add(1)
	}
	return err
}

func (sv *Service) skip(e entry, err error) {
	sv.skipped.Add(1)
	sv.opts.Throttle.Event("storage: timer skip", sv.opts.Logger.Error()).Err(err).Int64("queue_offset", e.off).
		Int64("commitlog_offset", e.phys).Msg("storage: timer message cannot be delivered; skipped")
}

// removeLocked takes e out of the index (delivered, skipped or recalled).
// REQUIRES: sv.mu.
func (sv *Service) removeLocked(e entry) {
	if _, ok := sv.due.Delete(e); ok {
		sv.offs.Delete(e.off)
		sv.pending.Store(int64(sv.due.Len()))
		sv.dirty, sv.unproposed = true, true
	}
}

func (sv *Service) resetLocked() {
	sv.due.Clear(false)
	sv.offs.Clear(false)
	sv.ingested, sv.readEnd = 0, 0
	sv.replay = nil
	sv.pending.Store(0)
	sv.readTo.Store(0)
}

// rebuildLocked builds the index from p: the timer queue's entries from
// p.Low on, less those p resolves, with the recall records applied.
// REQUIRES: sv.mu.
func (sv *Service) rebuildLocked(p Progress) error {
	sv.resetLocked()
	if err := p.Check(); err != nil {
		sv.opts.Logger.Error().Err(err).Msg("storage: timer progress unusable; rebuilding the timer index from the start of the timer queue")
		p = Progress{}
	}
	q := sv.host.Queue()
	if q == nil {
		return nil
	}
	if n := q.Count(); p.Low > n || p.Ingested > n {
		// Only damage repaired by cutting the log can shorten the queue
		// below a progress written after its entries were durable: take
		// the progress back to the end, delivering again rather than
		// skipping what now has those offsets.
		sv.opts.Logger.Error().Int64("low", p.Low).Int64("ingested", p.Ingested).Int64("queue_count", n).
			Msg("storage: timer progress is past the end of the timer queue; resuming at the end")
		p.Low, p.Ingested = min(p.Low, n), min(p.Ingested, n)
	}
	from := p.Low
	if lo := q.Min(); from < lo {
		// Retention keeps every file from the oldest pending timer record
		// on (ProtectedFrom); below the queue's min nothing is left.
		sv.opts.Logger.Error().Int64("from", from).Int64("queue_min", lo).
			Msg("storage: timer messages below the timer queue's min offset are gone")
		from = lo
	}
	sv.ingested = from
	sv.replay = &p
	if err := sv.ingestLocked(); err != nil {
		return err
	}
	sv.dirty = true
	return nil
}

// ingestLocked reads the timer queue's entries from sv.ingested to what is
// dispatched into the index: timer entries added (unless the progress
// of the last rebuild resolves them), recall records applied. It stops at
// MaxPending entries. REQUIRES: sv.mu.
func (sv *Service) ingestLocked() error {
	p := sv.replay
	q := sv.host.Queue()
	if q == nil {
		return nil
	}
	dispatched := sv.host.Dispatched()
	end := q.Count()
	for ; sv.ingested < end; sv.ingested++ {
		phys, size, tags, ok, err := q.Lookup(sv.ingested)
		if err != nil {
			return err
		}
		if !ok || phys >= dispatched {
			break
		}
		end := phys + int64(size)
		if tags == record.TimerRecallTags {
			sv.readEnd = max(sv.readEnd, end)
			sv.applyRecallLocked(phys)
			continue
		}
		if p != nil && p.resolved(sv.ingested, tags, phys) {
			continue
		}
		if sv.due.Len() >= sv.max {
			sv.opts.Throttle.Event("storage: timer full", sv.opts.Logger.Warn()).Int("max_pending", sv.max).
				Msg("storage: the timer index is full; later timer messages wait in the timer queue until it drains")
			break
		}
		sv.due.ReplaceOrInsert(entry{due: tags, phys: phys, off: sv.ingested})
		sv.offs.ReplaceOrInsert(sv.ingested)
		sv.readEnd = max(sv.readEnd, end)
	}
	if p != nil && sv.ingested >= p.Ingested {
		sv.replay = nil
	}
	sv.pending.Store(int64(sv.due.Len()))
	sv.readTo.Store(sv.ingested)
	return nil
}

// applyRecallLocked applies the recall record at phys: the timer message
// it names leaves the index if it is there. REQUIRES: sv.mu.
func (sv *Service) applyRecallLocked(phys int64) {
	rec, err := sv.host.ReadRecord(phys)
	if err != nil {
		sv.opts.Throttle.Event("storage: timer recall", sv.opts.Logger.Error()).Err(err).Int64("commitlog_offset", phys).
			Msg("storage: a timer recall record cannot be read; the message it recalls stays pending")
		return
	}
	e, ok := recallTarget(rec)
	if !ok {
		return
	}
	if got, ok := sv.due.Get(e); ok {
		sv.removeLocked(got)
		sv.recalled.Add(1)
	}
}

// recallTarget is the index key a recall record names.
func recallTarget(rec *record.Record) (entry, bool) {
	v, _ := rec.Property(record.PropertyTimerDelUniqKey)
	phys, err1 := strconv.ParseInt(v, 10, 64)
	d, _ := rec.Property(record.PropertyTimerOutMS)
	due, err2 := strconv.ParseInt(d, 10, 64)
	if err1 != nil || err2 != nil || phys < 0 {
		return entry{}, false
	}
	return entry{due: due, phys: phys}, true
}

// Recall withdraws the pending timer message of topic due at dueMS whose
// timer record is at commitlog offset phys: it appends a recall record and,
// once that is durable, takes the message out of the index. Errors:
// ErrNotPending (delivered, recalled, or no such message),
// ErrNotDelivering (ask the store that delivers), or the put's error (the
// recall record may or may not be stored; the message stays pending here
// until a restart reads the record, if it was).
func (sv *Service) Recall(ctx context.Context, topic string, dueMS, phys int64) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	ok, err := sv.readyLocked()
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotDelivering
	}
	e, ok := sv.due.Get(entry{due: dueMS, phys: phys})
	if !ok {
		return ErrNotPending
	}
	rec, err := sv.host.ReadRecord(phys)
	if err != nil {
		return err
	}
	if rt, _ := rec.Property(record.PropertyRealTopic); rt != topic {
		return ErrNotPending // a handle for another topic's message
	}
	spec := record.Spec{
		Topic: record.TimerTopic, QueueID: 0, Body: []byte("0"), BornTS: sv.opts.Clock.Now().UnixMilli(),
		Props: []record.Property{
			{Key: record.PropertyTimerDelUniqKey, Value: strconv.FormatInt(phys, 10)},
			{Key: record.PropertyTimerOutMS, Value: strconv.FormatInt(dueMS, 10)},
			{Key: record.PropertyRealTopic, Value: topic},
		},
	}
	end, err := sv.host.PutRecall(ctx, spec)
	if err != nil {
		return err
	}
	sv.need = max(sv.need, end)
	sv.removeLocked(e)
	sv.recalled.Add(1)
	return nil
}

// proposeLocked hands the progress to the host for replication when it
// moved in this epoch (a group leader). A refused proposal is tried again
// after the next round. REQUIRES: sv.mu.
func (sv *Service) proposeLocked() {
	if !sv.opts.Group || sv.epoch == 0 || !sv.unproposed {
		return
	}
	// The re-puts went through the propose path and committed before
	// their Redeliver returned, so the command follows them in the log.
	p := sv.progressLocked()
	if err := sv.host.ProposeProgress(sv.epoch, p); err != nil {
		sv.opts.Throttle.Event("storage: timer progress proposal", sv.opts.Logger.Debug()).Err(err).
			Msg("storage: timer progress not proposed; tried again after the next round")
		return
	}
	sv.unproposed = false
	sv.persisted.Store(&p)
}

// progressLocked is the progress of the index as it is. REQUIRES: sv.mu.
func (sv *Service) progressLocked() Progress {
	p := Progress{Low: sv.ingested, Ingested: sv.ingested, DueMS: math.MaxInt64, Phys: 0}
	if off, ok := sv.offs.Min(); ok {
		p.Low = off
	}
	if e, ok := sv.due.Min(); ok {
		p.DueMS, p.Phys = e.due, e.phys
	}
	return p
}

// maybePersistLocked persists the progress when it is time (standalone).
// REQUIRES: sv.mu.
func (sv *Service) maybePersistLocked() {
	if !sv.dirty || sv.opts.Group {
		return
	}
	if sv.retryPersist.IsZero() {
		if time.Since(sv.lastPersist) < sv.opts.PersistEvery {
			return
		}
	} else if time.Now().Before(sv.retryPersist) {
		return
	}
	if err := sv.persistLocked(); err != nil && !errors.Is(err, errProgressWrite) {
		sv.opts.Throttle.Event("storage: timer progress", sv.opts.Logger.Warn()).Err(err).
			Msg("storage: timer progress not persisted; will retry")
	}
}

var errProgressWrite = errors.New("storage: write timer progress")

// Persist makes the re-puts durable and writes the progress (standalone).
func (sv *Service) Persist() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.persistLocked()
}

// persistLocked writes the progress once every re-put it covers is
// durable. REQUIRES: sv.mu.
func (sv *Service) persistLocked() error {
	if !sv.dirty || sv.opts.Group {
		return nil
	}
	if err := sv.host.DurableTo(max(sv.need, sv.readEnd)); err != nil {
		return fmt.Errorf("storage: timer progress: delivered messages not yet durable: %w", err)
	}
	p := sv.progressLocked()
	if err := writeProgress(sv.opts.FS, sv.opts.Dir, p); err != nil {
		sv.retryPersist = time.Now().Add(sv.opts.Faults.Failed(fault.TimerProgress, err))
		return fmt.Errorf("%w: %w", errProgressWrite, err)
	}
	sv.opts.Faults.Cleared(fault.TimerProgress)
	sv.retryPersist = time.Time{}
	sv.persisted.Store(&p)
	sv.dirty = false
	sv.lastPersist = time.Now()
	return nil
}

// Pending is the number of timer messages waiting: in the index, plus the
// entries of the timer queue not read into it yet (recall records among
// them count too, and in a group, before a new leader's first round, the
// whole queue: it errs on the side of refusing). The store's admission
// bound reads it on every timer put.
func (sv *Service) Pending() int64 { return sv.pending.Load() + sv.notRead() }

// notRead is the number of timer-queue entries not read into the index.
func (sv *Service) notRead() int64 {
	q := sv.host.Queue()
	if q == nil {
		return 0
	}
	return max(q.Count()-sv.readTo.Load(), 0)
}

// Max is the bound of the due index.
func (sv *Service) Max() int { return sv.max }

// ProtectedFrom is the commitlog offset of the oldest timer record the
// persisted progress has not resolved: retention keeps every file from
// there on. MaxInt64 when none.
func (sv *Service) ProtectedFrom() int64 { return sv.ProtectedFromLow(sv.persisted.Load().Low) }

// ProtectedFromLow is ProtectedFrom for a progress whose Low is low (in a
// group, the replicated progress: every replica keeps what a new leader
// would rebuild its index from).
func (sv *Service) ProtectedFromLow(low int64) int64 {
	q := sv.host.Queue()
	if q == nil {
		return math.MaxInt64
	}
	if phys, _, _, ok := q.Get(max(low, q.Min())); ok {
		return phys
	}
	return math.MaxInt64
}

// Stats describe the timer service.
type Stats struct {
	// Pending is the number of timer messages in the due index.
	Pending int64
	// NotRead is the number of timer-queue entries not read into the index
	// yet (the index full, or not looked at since they were dispatched).
	NotRead int64
	// Max is the index's bound.
	Max int
	// Lag is how long the earliest pending message has been due (0 when
	// none is).
	Lag time.Duration
	// Delivered, Recalled, Skipped, Refused count since Open: messages put
	// back to their topics, recalled, passed over (never deliverable), and
	// re-puts the store refused for a passing reason (retried).
	Delivered, Recalled, Skipped, Refused uint64
	// Persisted is the progress a restart would resume from.
	Persisted Progress
}

// Stats describes the service.
func (sv *Service) Stats() Stats {
	st := Stats{Pending: sv.pending.Load(), NotRead: sv.notRead(), Max: sv.max, Delivered: sv.delivered.Load(),
		Recalled: sv.recalled.Load(), Skipped: sv.skipped.Load(), Refused: sv.refused.Load(), Persisted: *sv.persisted.Load()}
	if sv.mu.TryLock() {
		if e, ok := sv.due.Min(); ok {
			if now := sv.opts.Clock.Now().UnixMilli(); e.due <= now {
				st.Lag = time.Duration(now-e.due) * time.Millisecond
			}
		}
		sv.mu.Unlock()
	}
	return st
}

// RealMessage builds the message to deliver from a timer record: topic
// and queue from REAL_TOPIC/REAL_QID; REAL_TOPIC, REAL_QID, the timer
// triggers (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, so it is
// not diverted again), WAIT and the store's CRC property removed;
// TIMER_OUT_MS kept (RocketMQ's proxy answers it as the delivery
// timestamp); WAIT=false (RocketMQ TimerMessageStore re-puts so).
func RealMessage(rec *record.Record) (*record.Message, error) {
	topic, ok := rec.Property(record.PropertyRealTopic)
	if !ok || topic == "" {
		return nil, errors.New("storage: timer message has no REAL_TOPIC")
	}
	v, _ := rec.Property(record.PropertyRealQueueID)
	qid, err := strconv.ParseInt(v, 10, 32)
	if err != nil || qid < 0 {
		return nil, fmt.Errorf("storage: timer message has a bad REAL_QID %q", v)
	}
	if _, recall := rec.Property(record.PropertyTimerDelUniqKey); recall {
		return nil, errors.New("storage: a timer recall record is not a message")
	}
	props := make([]record.Property, 0, len(rec.Properties))
	for _, p := range rec.Properties {
		switch p.Key {
		case record.PropertyRealTopic, record.PropertyRealQueueID, record.PropertyCRC32, record.PropertyWaitStoreOK,
			record.PropertyTimerDeliverMS, record.PropertyTimerDelaySec, record.PropertyTimerDelayMS:
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

// readProgress reads the progress file; zero when there is none; an error
// wrapping base.ErrCorrupt when it fails its CRC.
func readProgress(fs vfs.FS, dir string) (Progress, error) {
	b, err := fs.ReadFile(filepath.Join(dir, progressName))
	if errors.Is(err, iofs.ErrNotExist) {
		return Progress{}, nil
	}
	if err != nil {
		return Progress{}, fmt.Errorf("storage: read timer progress: %w", err)
	}
	body, ok := base.Unseal(b)
	if !ok {
		return Progress{}, fmt.Errorf("%w: config/%s fails its CRC (delete it to deliver every retained timer message again)", base.ErrCorrupt, progressName)
	}
	var f progressFile
	if err := json.Unmarshal(body, &f); err != nil {
		return Progress{}, fmt.Errorf("%w: config/%s: %w", base.ErrCorrupt, progressName, err)
	}
	if f.Version != 1 {
		return Progress{}, fmt.Errorf("%w: config/%s: version %d (this build reads 1)", base.ErrCorrupt, progressName, f.Version)
	}
	if err := f.Progress.Check(); err != nil {
		return Progress{}, fmt.Errorf("%w: config/%s: %w", base.ErrCorrupt, progressName, err)
	}
	return f.Progress, nil
}

type progressFile struct {
	Version  int      `json:"version"`
	Progress Progress `json:"progress"`
}

func writeProgress(fs vfs.FS, dir string, p Progress) error {
	body, err := json.Marshal(progressFile{Version: 1, Progress: p})
	if err != nil {
		return fmt.Errorf("storage: encode timer progress: %w", err)
	}
	if err := base.WriteAtomic(fs, dir, progressName, base.Seal(body)); err != nil {
		return fmt.Errorf("storage: timer progress: %w", err)
	}
	return nil
}
