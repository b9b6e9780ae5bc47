package retention

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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
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

// Stats count what retention did since Open.
type Stats struct {
	// DeletedFiles and DeletedBytes count commitlog files deleted.
	DeletedFiles, DeletedBytes uint64
	// TrimmedQueueFiles counts consume-queue files deleted.
	TrimmedQueueFiles uint64
	// Rounds counts retention rounds (disk checks).
	Rounds uint64
	// LastError is the last deletion error, "" if none.
	LastError string
}

// Host is what retention needs from the store besides the file list.
type Host interface {
	// DeletableEnd is the commitlog offset no deleted file may reach past
	// (the checkpoint's dispatched offset, brought up to want if it can be;
	// the durable end; the first delayed message not yet delivered).
	DeletableEnd(want int64) (int64, error)
	// BeforeDelete is told that the commitlog files below end are about to
	// be deleted: what still refers to their bytes lets go of them first
	// (a replica's raft log compacts its entries away). An error keeps the
	// files.
	BeforeDelete(end int64) error
	// TrimQueues drops the consume-queue entries below commitlog offset
	// minPhys and returns the queue files deleted.
	TrimQueues(minPhys int64) (int, error)
	// LastStoreTime is the newest store time stamped.
	LastStoreTime() int64
}

// Options configure retention. Every field is required.
type Options struct {
	FS    vfs.FS
	Dir   string        // the data dir (its file system is the one watched)
	Files *segment.List // the commitlog's files: retention removes from the front
	// FileReservedTime, DiskCleanPercent, DiskWarningPercent,
	// DiskCheckInterval and StatDisk as storage.Options documents them;
	// Hours is its DeleteWhen, parsed (ParseDeleteWhen).
	FileReservedTime   time.Duration
	Hours              [24]bool
	DiskCleanPercent   int
	DiskWarningPercent int
	DiskCheckInterval  time.Duration
	StatDisk           func(dir string) (DiskUsage, error)
	Clock              base.Clock
	Logger             *zerolog.Logger
	Throttle           *logthrottle.Throttle
}

// Retention deletes expired files and watches the disk.
type Retention struct {
	opts     Options
	host     Host
	hours    [24]bool // DeleteWhen
	reserved time.Duration

	mu sync.Mutex // one round at a time

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

// New prepares retention and trims the consume queues to the commitlog's
// min offset (an earlier run may have deleted files after its last
// consume-queue trim). The queues must be loaded. It starts nothing: Start
// runs the goroutine, Stop ends it.
func New(host Host, opts Options) (*Retention, error) {
	r := &Retention{opts: opts, host: host, reserved: opts.FileReservedTime, roundDone: make(chan struct{}), done: make(chan struct{})}
	r.hours = opts.Hours
	r.disk.Store(&DiskStats{})
	if err := r.trimQueues(); err != nil {
		return nil, err
	}
	return r, nil
}

// ParseDeleteWhen parses "04", "04;16" or "*" (every hour).
func ParseDeleteWhen(s string) ([24]bool, error) {
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

// Start runs the retention goroutine.
func (r *Retention) Start() {
	r.wg.Add(1)
	go r.loop()
}

// Stop ends the goroutine. Calling it twice is safe.
func (r *Retention) Stop() {
	r.stopOnce.Do(func() {
		close(r.done)
		r.wg.Wait()
	})
}

func (r *Retention) loop() {
	defer r.wg.Done()
	for {
		r.Round()
		at, release := base.ClockWait(r.opts.Clock, r.opts.Clock.Now().Add(r.opts.DiskCheckInterval))
		select {
		case <-at:
			release()
		case <-r.done:
			release()
			return
		}
	}
}

// RoundSignal returns a channel closed when the next round ends.
func (r *Retention) RoundSignal() <-chan struct{} {
	r.roundMu.Lock()
	defer r.roundMu.Unlock()
	return r.roundDone
}

// Round checks the disk and deletes what is due (the goroutine runs one
// every DiskCheckInterval; tests call it).
func (r *Retention) Round() {
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
	now := r.opts.Clock.Now()
	forced := known && pct > float64(r.opts.DiskCleanPercent)
	if !forced && !r.hours[now.Hour()] {
		return
	}
	n, err := r.deleteExpired(now)
	if err != nil {
		msg := err.Error()
		r.lastErr.Store(&msg)
		r.opts.Throttle.Event("storage: retention delete", r.opts.Logger.Error()).Err(err).Msg("storage: retention could not delete commitlog files")
	}
	if n > 0 {
		if err := r.trimQueues(); err != nil {
			msg := err.Error()
			r.lastErr.Store(&msg)
			r.opts.Throttle.Event("storage: retention trim", r.opts.Logger.Error()).Err(err).Msg("storage: retention could not trim consume queues")
		}
		r.checkDisk() // writes may resume at once
	}
}

// Exclusive runs fn with no round running (a snapshot install replaces
// the files retention deletes from) and returns its error.
func (r *Retention) Exclusive(fn func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fn()
}

// CheckDisk reads the disk usage and turns the put refusal on above the
// warning watermark, off at or below the clean one.
func (r *Retention) CheckDisk() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkDisk()
}

// checkDisk is CheckDisk. REQUIRES: r.mu held.
func (r *Retention) checkDisk() (pct float64, known bool) {
	o := r.opts
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
			"writes resume at %d%%", base.ErrNotWritable, base.ErrDiskFull, pct, o.DiskWarningPercent, o.DiskCleanPercent)
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

// WriteErr is the put refusal while the disk is full, or nil.
func (r *Retention) WriteErr() error {
	if p := r.full.Load(); p != nil {
		return *p
	}
	return nil
}

// deleteExpired deletes expired commitlog files from the front and returns
// how many. REQUIRES: r.mu held.
func (r *Retention) deleteExpired(now time.Time) (int, error) {
	files := r.opts.Files.Snapshot()
	cutoff := now.Add(-r.reserved).UnixMilli()
	n := 0
	for n < len(files)-1 && n < deleteBatchMax && r.newestBound(files, n) < cutoff {
		n++
	}
	if n == 0 {
		return 0, nil
	}
	limit, err := r.host.DeletableEnd(files[n-1].End())
	if err != nil {
		return 0, err
	}
	for n > 0 && files[n-1].End() > limit {
		n--
	}
	if n == 0 {
		return 0, nil
	}
	if err := r.host.BeforeDelete(files[n-1].End()); err != nil {
		return 0, err
	}
	gone := r.opts.Files.RemoveFirst(n)
	if len(gone) != n || gone[0] != files[0] {
		return 0, fmt.Errorf("storage: retention: the commitlog's first files changed under it")
	}
	var errs []error
	if err := r.opts.Files.Unmap(gone); err != nil { // no reader is inside these mappings after this
		errs = append(errs, err)
	}
	// Delete oldest first and stop at the first failure, so the files left
	// on disk stay contiguous (Open refuses a gap).
	deleted := 0
	for _, m := range gone {
		if err := r.opts.FS.Remove(m.Path()); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("storage: delete commitlog file %s: %w", m.Name(), err))
			break
		}
		deleted++
		r.deletedFiles.Add(1)
		r.deletedBytes.Add(uint64(m.Size()))
	}
	if deleted > 0 {
		if err := base.SyncDir(r.opts.FS, r.opts.Files.Dir()); err != nil {
			errs = append(errs, fmt.Errorf("storage: retention: %w", err))
		}
		r.opts.Logger.Info().Int("files", deleted).Int64("min_offset", r.opts.Files.MinOffset()).
			Msg("storage: retention deleted expired commitlog files")
	}
	return n, errors.Join(errs...)
}

// newestBound is an upper bound of the newest store time in files[i]: the
// store time of the first record of files[i+1], or the newest store time of
// the log when that file is empty.
func (r *Retention) newestBound(files []*segment.File, i int) int64 {
	next := files[i+1]
	if next.Wrote() >= record.MinLen {
		return record.StoreTimestamp(next.Data())
	}
	return r.host.LastStoreTime()
}

// trimQueues moves every consume queue's min offset to its first entry
// whose message is still in the commitlog and deletes the queue files
// wholly below it (never a queue's last file).
func (r *Retention) trimQueues() error {
	n, err := r.host.TrimQueues(r.opts.Files.MinOffset())
	r.trimmedFiles.Add(uint64(n))
	return err
}

// TrimQueues is trimQueues, for Open (an earlier run may have deleted files
// after its last consume-queue trim).
func (r *Retention) TrimQueues() error { return r.trimQueues() }

// Stats returns the counters and the disk as the last check saw it.
func (r *Retention) Stats() (Stats, DiskStats) {
	rs := Stats{DeletedFiles: r.deletedFiles.Load(), DeletedBytes: r.deletedBytes.Load(),
		TrimmedQueueFiles: r.trimmedFiles.Load(), Rounds: r.rounds.Load()}
	if p := r.lastErr.Load(); p != nil {
		rs.LastError = *p
	}
	return rs, *r.disk.Load()
}
