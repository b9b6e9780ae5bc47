package commitlog

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/flush"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/hist"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

var _ flush.Syncer = (*Log)(nil)

// Options configure a Log. Every field is required unless it says
// otherwise; the storage facade fills them from its own Options.
type Options struct {
	FS       vfs.FS
	Dir      string // the commitlog directory (Dir/commitlog of the store)
	FileSize int64
	// RequireCRC: every record carries the whole-record CRC, so one without
	// it is corrupt (the store writes it unless DisablePropCRC).
	RequireCRC bool
	// PopulateChunk is the allocator's population chunk (0: the default).
	PopulateChunk int64
	// PopulateAhead is the allocator's population window past the
	// writer (segment.Options.PopulateAhead; 0: the default).
	PopulateAhead int64
	// PopulateNear is how much of that window PopulateWrite makes
	// writable (segment.Options.PopulateNear; 0: the default).
	PopulateNear int64
	// Populate is how the allocator faults files in (segment.Options.Populate).
	Populate vfs.PopulateMode
	// ClosedCleanly says the last run closed this log cleanly (the store's
	// abort marker was gone at Open): it synced everything it wrote and
	// wrote nothing past its end, so Recover need not read the last
	// file's tail past the end to prove it zero. That read is up to a
	// whole file (1 GiB by default) through the mapping, from the disk
	// after a reboot; after a crash it is needed, since a dead run's
	// writeback can leave any bytes there (recover's cutTail).
	ClosedCleanly bool
	// Room, if set, says whether the disk has room to preallocate the
	// next file ahead of need (segment.Options.Room).
	Room   func(size int64) bool
	Clock  base.Clock
	Logger *zerolog.Logger
	// Throttle rate-limits the repeating error lines (roll failures).
	Throttle *logthrottle.Throttle
}

// Log is the commitlog: appends under its lock into the last file, with a
// roll to a new file after an END_OF_FILE blank when the records do not
// fit; reads of the files under the list's guard; syncs (flush.Syncer).
// It knows the record layout only as far as placing bytes needs (blanks,
// the scan at recovery); what the records say is its callers' business.
type Log struct {
	opts Options
	list *segment.List

	// mu serialises appends: choosing or rolling the file and copying the
	// bytes (RocketMQ putMessageLock). The callbacks of Append run under it.
	mu sync.Mutex
	// file is the file appends go to, cached so an append does not take
	// the file list's read lock (whose shared counter every reader on
	// every core bumps). Only rolls change the last file, and they run
	// under mu; retention never deletes the last file. nil: not looked up
	// yet. Guarded by mu.
	file   *segment.File
	closed bool // guarded by mu
	// beginTimeInLock is the clock time (Unix ns) the current holder took
	// mu, 0 when free: the OS_PAGE_CACHE_BUSY watchdog.
	beginTimeInLock atomic.Int64
	realClock       bool

	appendLatency hist.Histogram // time in the lock per append
	syncLatency   hist.Histogram // each msync round
	maxLockHold   atomic.Int64
	rolls         atomic.Uint64
	tornTails     atomic.Uint64
	// tailTrusted: Recover left the last file's tail unread after a
	// clean close (cutTail).
	tailTrusted atomic.Bool
	tornBytes   atomic.Uint64
}

// Open maps the commitlog files in opts.Dir, which must exist (the
// offline tools never create anything), and starts the allocator. The log
// is not usable for appends before Recover.
func Open(opts Options) (*Log, error) {
	l := &Log{opts: opts, realClock: base.IsSystemClock(opts.Clock)}
	l.list = segment.NewList(opts.FS, opts.Dir, opts.FileSize, segment.Options{
		PopulateChunk: opts.PopulateChunk, PopulateAhead: opts.PopulateAhead, PopulateNear: opts.PopulateNear, Populate: opts.Populate, ObserveSync: l.syncLatency.Observe, Room: opts.Room})
	if err := l.list.Load(); err != nil {
		l.list.Close()
		return nil, err
	}
	return l, nil
}

// Start has the allocator prepare the first file of an empty log, and
// fault in the rest of the file appends go to, so no append waits for a
// file to be created and faulted in. The file after it is prepared once
// appends are half way through it (prepareNext).
func (l *Log) Start() {
	if f := l.list.Last(); f == nil {
		l.list.Prepare(0)
	} else {
		if !f.Full() {
			l.list.Adopt(f)
		}
		l.prepareNext(f, 0)
	}
}

// prepareNext asks the allocator for the file after f when f's end moved
// from wrote to f.Wrote() across half the file: once per file, as appends
// pass where they began; Start and a truncation pass 0, so a file already
// half written gets its successor then.
//
// Not at the roll into f: a prepared file is deleted at Close and, with
// write population, is a whole file of dirty zeros, so preparing at the
// roll created and populated a full next file at every start, for a
// writer that may need it only hours later (1 GiB written back per
// restart of a group member, in the syncs' way: BENCHMARKS.md,
// "Population at a restart"). Half a file ahead still leaves the
// allocator the time of writing half a file: 512 MiB take 2.5 s at the
// fastest rate measured here, population of a whole file 0.1–2.2 s, and
// a put never waits for population (the allocator skips what the writer
// passed). A roll that finds nothing prepared creates the file itself.
func (l *Log) prepareNext(f *segment.File, wrote int64) {
	if half := f.Size() / 2; wrote < half && f.Wrote() >= half {
		l.list.Prepare(f.End())
	}
}

// AppendFunc and AdmitFunc are Append's callbacks; see Append.
type (
	AdmitFunc  func(now time.Time) error
	EncodeFunc func(dst []byte, at int64)
)

// Placed is where an Append put its bytes and how long it held the lock.
type Placed struct {
	// At is the commitlog offset of the first byte.
	At int64
	// LockedAt is when the append took the lock and LockHeld how long it
	// held it: the append latency histogram's observation, handed out so a
	// caller can time the append (a trace span) without a clock read.
	LockedAt time.Time
	LockHeld time.Duration
}

// Append places total bytes of records at the end of the log, all in one
// file, under the append lock. admit runs first, with the store clock's
// time read once inside the lock (the store time of the records): an
// error from it appends nothing and rolls nothing. Then the log finds
// room, filling the rest of the last file with an END_OF_FILE blank and
// rolling to a new one when the records do not fit, and encode writes
// exactly total bytes into dst, which lies at commitlog offset at. The
// bytes are published (visible to readers of the written end) only after
// encode returns. Append returns where (Placed), or an error when nothing
// was appended (ErrClosed, a failed roll wrapping ErrCreateFile).
//
// Sequencing (queue offsets, store time) is the callbacks' business, so
// a replicated leader can stamp them where it proposes; placement is the
// log's. Both callbacks must not block: they run under the lock every
// append waits for.
func (l *Log) Append(total int, admit AdmitFunc, encode EncodeFunc) (p Placed, err error) {
	l.mu.Lock()
	// One clock read inside the lock serves the store time, the busy
	// watchdog and the lock-hold statistics, and one monotonic read at the
	// end (clock reads are not free on every machine: a time.Now is two
	// vDSO reads, ~55 ns on this project's VM, a third of a put's CPU
	// before this was cut down). An injected clock stamps the store time;
	// the statistics always use real time.
	lockStart := time.Now()
	inLock := lockStart
	if !l.realClock {
		inLock = l.opts.Clock.Now()
	}
	l.beginTimeInLock.Store(inLock.UnixNano())
	defer func() {
		l.beginTimeInLock.Store(0)
		held := time.Since(lockStart)
		l.mu.Unlock()
		l.appendLatency.Observe(held)
		if err == nil {
			p.LockedAt, p.LockHeld = lockStart, held
		}
		for {
			old := l.maxLockHold.Load()
			if int64(held) <= old || l.maxLockHold.CompareAndSwap(old, int64(held)) {
				break
			}
		}
	}()
	if l.closed {
		return Placed{}, base.ErrClosed
	}
	if admit != nil {
		if err := admit(inLock); err != nil {
			return Placed{}, err
		}
	}
	f := l.file
	if f == nil {
		f = l.list.Last()
		l.file = f
	}
	if f == nil || f.Full() {
		var err error
		if f, err = l.rollLocked(); err != nil {
			return Placed{}, err
		}
	}
	pos := f.Wrote()
	if int64(total)+record.BlankLen > f.Size()-pos {
		// Not enough room: fill the rest with the blank record, mark the
		// file full, and append into a new one.
		record.PutBlank(f.Data()[pos:], int(f.Size()-pos))
		f.Publish(f.Size())
		var err error
		if f, err = l.rollLocked(); err != nil {
			return Placed{}, err
		}
		pos = f.Wrote()
		if int64(total)+record.BlankLen > f.Size()-pos { // cannot happen: callers check against FileSize
			return Placed{}, fmt.Errorf("storage: %d bytes do not fit an empty file", total)
		}
	}
	at := f.From() + pos
	encode(f.Data()[pos:pos+int64(total)], at)
	f.Publish(pos + int64(total)) // publish only after every byte is copied
	l.prepareNext(f, pos)
	return Placed{At: at}, nil
}

// rollLocked takes the next file. REQUIRES: l.mu held.
func (l *Log) rollLocked() (*segment.File, error) {
	f, err := l.list.Roll()
	if err != nil {
		l.opts.Throttle.Event("storage: roll", l.opts.Logger.Error()).Err(err).Msg("storage: cannot create the next commitlog file")
		return nil, err
	}
	l.rolls.Add(1)
	l.file = f
	return f, nil
}

// Busy reports whether some append has held the lock longer than limit at
// now (RocketMQ isOSPageCacheBusy). It reads nothing but one atomic when
// the lock is free.
func (l *Log) Busy(limit time.Duration) bool {
	begin := l.beginTimeInLock.Load()
	return begin != 0 && l.opts.Clock.Now().UnixNano()-begin > int64(limit)
}

// Drain waits for the append in progress, if any, and refuses every later
// one with ErrClosed.
func (l *Log) Drain() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

// At returns the mapped bytes from commitlog offset off to the end of the
// file holding it, or nil when no file holds it. The caller must hold the
// read guard (ReadLock) unless it reads only at or above an offset
// retention never deletes (the dispatcher, below the checkpoint).
func (l *Log) At(off int64) []byte {
	f := l.list.Find(off)
	if f == nil {
		return nil
	}
	return f.Data()[off-f.From():]
}

// WillNeed asks the kernel to read commitlog bytes [lo, hi) into the page
// cache ahead of a reader (segment.File.WillNeed), clipped to the files on
// disk and to the written end. It returns the bytes it asked for. It takes
// the read guard, so retention cannot unmap a file under it.
func (l *Log) WillNeed(lo, hi int64) int64 {
	l.ReadLock()
	defer l.ReadUnlock()
	lo = max(lo, l.list.MinOffset())
	hi = min(hi, l.list.MaxOffset())
	var asked int64
	for lo < hi {
		f := l.list.Find(lo)
		if f == nil {
			break
		}
		end := min(hi, f.End())
		f.WillNeed(lo-f.From(), end-f.From())
		asked += end - lo
		lo = end
	}
	return asked
}

// ReadLock keeps every file mapped until ReadUnlock (see segment.List).
func (l *Log) ReadLock() { l.list.ReadLock() }

// ReadUnlock releases ReadLock.
func (l *Log) ReadUnlock() { l.list.ReadUnlock() }

// FileSize is the size of every commitlog file.
func (l *Log) FileSize() int64 { return l.opts.FileSize }

// FileStart is the commitlog offset of the start of the file holding off.
func (l *Log) FileStart(off int64) int64 { return off - off%l.opts.FileSize }

// MinOffset is the first commitlog offset still on disk.
func (l *Log) MinOffset() int64 { return l.list.MinOffset() }

// MaxOffset is the commitlog offset the next append goes to: the written
// end.
func (l *Log) MaxOffset() int64 { return l.list.MaxOffset() }

// Flushed is the durable end: every byte below it has been synced.
func (l *Log) Flushed() int64 { return l.list.Flushed() }

// Sync implements flush.Syncer (segment.List.Sync).
func (l *Log) Sync(minPages int) (int64, error) { return l.list.Sync(minPages) }

// Files is the list of files, for retention (it removes from the front,
// never the last file) and statistics.
func (l *Log) Files() *segment.List { return l.list }

// WaitPopulated waits until the allocator has faulted in the files it
// prepared (benchmarks).
func (l *Log) WaitPopulated() { l.list.WaitPopulated() }

// Stats are the log's counters.
type Stats struct {
	AppendLatency, SyncLatency hist.Snapshot
	MaxLockHold                time.Duration
	Rolls                      uint64
	TornTails, TornBytes       uint64
	Files                      int
	MinOffset, MaxOffset       int64
	FlushedOffset              int64
}

// Stats returns a snapshot of the counters.
func (l *Log) Stats() Stats {
	return Stats{
		AppendLatency: l.appendLatency.Snapshot(), SyncLatency: l.syncLatency.Snapshot(),
		MaxLockHold: time.Duration(l.maxLockHold.Load()), Rolls: l.rolls.Load(),
		TornTails: l.tornTails.Load(), TornBytes: l.tornBytes.Load(),
		Files: len(l.list.Snapshot()), MinOffset: l.list.MinOffset(), MaxOffset: l.list.MaxOffset(),
		FlushedOffset: l.list.Flushed(),
	}
}

// Close unmaps every file and stops the allocator. It does not sync (the
// flush policy's Close does).
func (l *Log) Close() error {
	l.Drain()
	return errors.Join(l.list.Close())
}

// Locked runs fn under the append lock with the written end: no append is
// in progress while fn runs, and every record appended before it lies
// below end (a topic delete stops puts to the topic so).
func (l *Log) Locked(fn func(end int64)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l.list.MaxOffset())
}
