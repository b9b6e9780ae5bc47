package storage

// Retention and disk watermarks (RocketMQ CleanCommitLogService,
// CleanConsumeQueueService and the disk checks of DefaultMessageStore).
//
// Every DiskCheckInterval on the store's clock, retention:
//
//  1. reads the usage of the data dir's file system (Options.StatDisk;
//     statfs by default; df(1)'s Use%). Above DiskWarningPercent the store
//     refuses puts — SERVICE_NOT_AVAILABLE with an error wrapping both
//     ErrNotWritable and ErrDiskFull, and Writable reports false — until
//     usage is back at or below DiskCleanPercent (RocketMQ's hysteresis
//     between the two ratios, so writes do not flap at the line).
//  2. during the hours of DeleteWhen, or at once while usage is above
//     DiskCleanPercent, deletes expired commitlog files from the front. A
//     file is expired when its newest message is older than
//     FileReservedTime. Retention never deletes the last file (the one being
//     written), a file reaching past the checkpoint's dispatched offset
//     (recovery would need it to rebuild the consume queues), or a file
//     holding a delayed message whose delivery is not yet persisted. At most
//     deleteBatchMax files go per round, oldest first, and the directory is
//     fsynced after.
//  3. trims the consume queues to match: a queue's min offset moves to its
//     first entry whose message is still in the commitlog (reads below it
//     get a *RangeError: OUT_OF_RANGE), and queue files wholly below it are
//     deleted, a queue's last file excepted.
//
// Like RocketMQ, it deletes by time only, but unlike RocketMQ's forced clean
// it never deletes a file younger than FileReservedTime to make room: when
// the disk fills with recent messages, the warning watermark stops writes
// instead, and nothing that was acknowledged disappears before its time.
//
// A file's newest store time is bounded by the store time of the first
// record of the next file (store times never go backwards along the log),
// so retention reads one record header per file instead of scanning it.
// After an idle gap a file may therefore outlive FileReservedTime by up to
// that gap; it is never deleted early.

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// deleteBatchMax bounds the commitlog files one retention round deletes
// (RocketMQ DELETE_FILES_BATCH_MAX).
const deleteBatchMax = 10

// DiskUsage is what Options.StatDisk reports about the file system holding
// the data dir, in bytes.
type DiskUsage struct {
	Size  uint64 // the file system's size
	Used  uint64 // in use
	Avail uint64 // still available to the store (root-reserved blocks excluded)
}

// UsedPercent is Used / (Used + Avail) * 100: df(1)'s Use%.
func (u DiskUsage) UsedPercent() float64 {
	if u.Used+u.Avail == 0 {
		return 0
	}
	return float64(u.Used) * 100 / float64(u.Used+u.Avail)
}

// StatDisk is the default Options.StatDisk: statfs(2) of dir.
func StatDisk(dir string) (DiskUsage, error) {
	size, used, avail, err := vfs.DiskUsage(dir)
	if err != nil {
		return DiskUsage{}, fmt.Errorf("storage: statfs %s: %w", dir, err)
	}
	return DiskUsage{Size: size, Used: used, Avail: avail}, nil
}

// DiskStats describe the data dir's file system as the last check saw it.
type DiskStats struct {
	DiskUsage
	// UsedPercent is DiskUsage.UsedPercent at the last check.
	UsedPercent float64
	// Full reports that puts are refused: usage went above
	// DiskWarningPercent and has not yet come back to DiskCleanPercent.
	Full bool
	// Err is the last StatDisk error, "" when the check worked. While
	// usage is unknown, Full keeps its last value.
	Err string
}

// RetentionStats count what retention did since Open.
type RetentionStats struct {
	// DeletedFiles and DeletedBytes count commitlog files deleted.
	DeletedFiles, DeletedBytes uint64
	// TrimmedQueueFiles counts consume-queue files deleted.
	TrimmedQueueFiles uint64
	// Rounds counts retention rounds (disk checks).
	Rounds uint64
	// LastError is the last deletion error, "" if none.
	LastError string
}

// retention deletes expired files and watches the disk.
type retention struct {
	s        *Store
	hours    [24]bool // DeleteWhen
	reserved time.Duration

	mu sync.Mutex // one round at a time

	// readers is held for reading by every reader of a commitlog file's
	// bytes found through the file list (GetMessage), and for writing while
	// retention unmaps files it took off that list.
	readers sync.RWMutex

	full    atomic.Pointer[error] // the put refusal while the disk is above the warning watermark
	disk    atomic.Pointer[DiskStats]
	lastErr atomic.Pointer[string]
	statErr string // last StatDisk error logged; guarded by mu

	deletedFiles, deletedBytes, trimmedFiles, rounds atomic.Uint64

	roundMu   sync.Mutex
	roundDone chan struct{} // closed and replaced after every round; guarded by roundMu

	done     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// newRetention prepares retention and trims the consume queues to the
// commitlog's min offset (an earlier run may have deleted files after its
// last consume-queue trim). The queues must be loaded. It starts nothing.
func newRetention(s *Store) (*retention, error) {
	r := &retention{s: s, reserved: s.opts.FileReservedTime, roundDone: make(chan struct{}), done: make(chan struct{})}
	hours, err := parseDeleteWhen(s.opts.DeleteWhen)
	if err != nil {
		return nil, err
	}
	r.hours = hours
	r.disk.Store(&DiskStats{})
	if err := r.trimQueues(); err != nil {
		return nil, err
	}
	return r, nil
}

// parseDeleteWhen parses "04", "04;16" or "*" (every hour).
func parseDeleteWhen(s string) ([24]bool, error) {
	var hours [24]bool
	if strings.TrimSpace(s) == "*" {
		for h := range hours {
			hours[h] = true
		}
		return hours, nil
	}
	for _, f := range strings.Split(s, ";") {
		h, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || h < 0 || h > 23 {
			return hours, fmt.Errorf("DeleteWhen %q: want hours 00-23 separated by ';', or '*'", s)
		}
		hours[h] = true
	}
	return hours, nil
}

func (r *retention) start() {
	r.wg.Add(1)
	go r.loop()
}

func (r *retention) stop() {
	r.stopOnce.Do(func() {
		close(r.done)
		r.wg.Wait()
	})
}

func (r *retention) loop() {
	defer r.wg.Done()
	for {
		r.round()
		at, release := clockWait(r.s.clock, r.s.clock.Now().Add(r.s.opts.DiskCheckInterval))
		select {
		case <-at:
			release()
		case <-r.done:
			release()
			return
		}
	}
}

// roundSignal returns a channel closed when the next round ends.
func (r *retention) roundSignal() <-chan struct{} {
	r.roundMu.Lock()
	defer r.roundMu.Unlock()
	return r.roundDone
}

// round checks the disk and deletes what is due.
func (r *retention) round() {
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.rounds.Add(1)
		r.roundMu.Lock()
		close(r.roundDone)
		r.roundDone = make(chan struct{})
		r.roundMu.Unlock()
	}()
	pct, known := r.checkDisk()
	if r.reserved < 0 {
		return
	}
	now := r.s.clock.Now()
	forced := known && pct > float64(r.s.opts.DiskCleanPercent)
	if !forced && !r.hours[now.Hour()] {
		return
	}
	n, err := r.deleteExpired(now)
	if err != nil {
		msg := err.Error()
		r.lastErr.Store(&msg)
		r.s.logLimit.Event("storage: retention delete", r.s.opts.Logger.Error()).Err(err).Msg("storage: retention could not delete commitlog files")
	}
	if n > 0 {
		if err := r.trimQueues(); err != nil {
			msg := err.Error()
			r.lastErr.Store(&msg)
			r.s.logLimit.Event("storage: retention trim", r.s.opts.Logger.Error()).Err(err).Msg("storage: retention could not trim consume queues")
		}
		r.checkDisk() // writes may resume at once
	}
}

// checkDisk reads the disk usage and turns the put refusal on above the
// warning watermark, off at or below the clean one. REQUIRES: r.mu held.
func (r *retention) checkDisk() (pct float64, known bool) {
	o := r.s.opts
	u, err := o.StatDisk(o.Dir)
	st := *r.disk.Load()
	if err != nil {
		if msg := err.Error(); msg != r.statErr {
			r.statErr = msg
			o.Logger.Warn().Err(err).Msg("storage: cannot read disk usage; the watermarks are not enforced until it can")
		}
		st.Err = err.Error()
		r.disk.Store(&st)
		return 0, false
	}
	r.statErr = ""
	pct = u.UsedPercent()
	switch {
	case pct > float64(o.DiskWarningPercent) && r.full.Load() == nil:
		err := fmt.Errorf("%w: %w: the data dir's file system is %.1f%% full, above the warning watermark of %d%%; "+
			"writes resume at %d%%", ErrNotWritable, ErrDiskFull, pct, o.DiskWarningPercent, o.DiskCleanPercent)
		r.full.Store(&err)
		o.Logger.Error().Float64("used_percent", pct).Int("warning_percent", o.DiskWarningPercent).
			Msg("storage: disk above the warning watermark; refusing writes")
	case pct <= float64(o.DiskCleanPercent) && r.full.Load() != nil:
		r.full.Store(nil)
		o.Logger.Info().Float64("used_percent", pct).Int("clean_percent", o.DiskCleanPercent).
			Msg("storage: disk back below the clean watermark; taking writes again")
	}
	r.disk.Store(&DiskStats{DiskUsage: u, UsedPercent: pct, Full: r.full.Load() != nil})
	return pct, true
}

// writeErr is the put refusal while the disk is full, or nil.
func (r *retention) writeErr() error {
	if p := r.full.Load(); p != nil {
		return *p
	}
	return nil
}

// deleteExpired deletes expired commitlog files from the front and returns
// how many. REQUIRES: r.mu held.
func (r *retention) deleteExpired(now time.Time) (int, error) {
	s := r.s
	files := s.queue.snapshot()
	cutoff := now.Add(-r.reserved).UnixMilli()
	n := 0
	for n < len(files)-1 && n < deleteBatchMax && r.newestBound(files, n) < cutoff {
		n++
	}
	if n == 0 {
		return 0, nil
	}
	limit, err := r.deletableEnd(files[n-1].from + files[n-1].size)
	if err != nil {
		return 0, err
	}
	for n > 0 && files[n-1].from+files[n-1].size > limit {
		n--
	}
	if n == 0 {
		return 0, nil
	}
	gone := s.queue.removeFirst(n)
	if len(gone) != n || gone[0] != files[0] {
		return 0, fmt.Errorf("storage: retention: the commitlog's first files changed under it")
	}
	var errs []error
	r.readers.Lock() // no reader is inside these mappings after this
	for _, m := range gone {
		if err := m.close(); err != nil {
			errs = append(errs, err)
		}
	}
	r.readers.Unlock()
	// Delete oldest first and stop at the first failure, so the files left
	// on disk stay contiguous (Open refuses a gap).
	deleted := 0
	for _, m := range gone {
		if err := s.opts.FS.Remove(m.path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("storage: delete commitlog file %s: %w", fileName(m.from), err))
			break
		}
		deleted++
		r.deletedFiles.Add(1)
		r.deletedBytes.Add(uint64(m.size))
	}
	if deleted > 0 {
		if err := syncDir(s.opts.FS, s.dir); err != nil {
			errs = append(errs, fmt.Errorf("storage: retention: %w", err))
		}
		s.opts.Logger.Info().Int("files", deleted).Int64("min_offset", s.queue.minOffset()).
			Msg("storage: retention deleted expired commitlog files")
	}
	return n, errors.Join(errs...)
}

// deletableEnd is the commitlog offset no deleted file may reach past: the
// checkpoint's dispatched offset (recovery re-dispatches from there), the
// durable offset, and, on a master, the first delayed message whose
// delivery is not yet persisted (a slave does not deliver, so it deletes by
// time only, as RocketMQ does). When the checkpoint is short of want, it is
// brought up to date first (a failure there is handled as in the
// dispatcher: sticky for the commitlog sync, transient otherwise).
func (r *retention) deletableEnd(want int64) (int64, error) {
	s, d := r.s, r.s.dispatch
	cpEnd := d.lastCheckpoint().Dispatched
	if cpEnd < want && d.dispatched.Load() > cpEnd {
		if err := d.checkpoint(); err != nil {
			// A failed commitlog sync is already sticky (checkpoint called
			// Store.fail); any other failure is a transient fault of the
			// checkpoint, which the dispatcher retries.
			if !errors.Is(err, ErrWriteFailed) {
				s.faults.failed(faultCheckpoint, err)
			}
			return 0, err
		}
		cpEnd = d.lastCheckpoint().Dispatched
	}
	limit := min(cpEnd, s.queue.flushedWhere.Load())
	if s.sched != nil && s.opts.Role == RoleMaster {
		limit = min(limit, s.sched.protectedFrom())
	}
	return limit, nil
}

// newestBound is an upper bound of the newest store time in files[i]: the
// store time of the first record of files[i+1], or the newest store time of
// the log when that file is empty.
func (r *retention) newestBound(files []*mappedFile, i int) int64 {
	next := files[i+1]
	if next.wrote.Load() >= minRecordLen {
		return storeTimestampOf(next.data)
	}
	return r.s.lastStoreTime()
}

// trimQueues moves every consume queue's min offset to its first entry
// whose message is still in the commitlog and deletes the queue files
// wholly below it (never a queue's last file).
func (r *retention) trimQueues() error {
	minPhys := r.s.queue.minOffset()
	d := r.s.dispatch
	d.mu.RLock()
	queues := make([]*consumeQueue, 0, len(d.queues))
	for _, q := range d.queues {
		queues = append(queues, q)
	}
	d.mu.RUnlock()
	var errs []error
	for _, q := range queues {
		if err := r.trimQueue(q, minPhys); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *retention) trimQueue(q *consumeQueue, minPhys int64) error {
	lo, hi := q.min.Load(), q.count.Load()
	if lo == q.trimmedAt && q.trimmedPhys >= minPhys || lo >= hi {
		return nil // its first entry is still in the commitlog, as last round
	}
	if phys, _, _, ok := q.get(lo); ok && phys >= minPhys {
		q.trimmedAt, q.trimmedPhys = lo, phys
		return nil
	}
	// Entries are in commitlog order: find the first one at or past minPhys.
	i := sort.Search(int(hi-lo), func(i int) bool {
		phys, _, _, ok := q.get(lo + int64(i))
		return !ok || phys >= minPhys
	})
	newMin := lo + int64(i)
	if newMin <= lo {
		return nil
	}
	q.min.Store(newMin)
	gone := q.dropFilesBelow(newMin)
	var errs []error
	for _, cf := range gone {
		if err := cf.remove(); err != nil {
			errs = append(errs, fmt.Errorf("storage: delete consume queue file %s/%d/%s: %w", q.topic, q.queueID, fileName(cf.first*cqEntrySize), err))
			continue
		}
		r.trimmedFiles.Add(1)
	}
	if len(gone) > 0 {
		if err := syncDir(r.s.opts.FS, q.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *retention) stats() (RetentionStats, DiskStats) {
	rs := RetentionStats{DeletedFiles: r.deletedFiles.Load(), DeletedBytes: r.deletedBytes.Load(),
		TrimmedQueueFiles: r.trimmedFiles.Load(), Rounds: r.rounds.Load()}
	if p := r.lastErr.Load(); p != nil {
		rs.LastError = *p
	}
	return rs, *r.disk.Load()
}
