// Package base holds the vocabulary the storage parts share: the error
// values more than one of them returns or matches, and the clock. It
// exists so that the parts (segment, commitlog, consumequeue, schedule,
// retention) and the storage facade agree on error identity without
// importing each other; the facade re-exports every value under the same
// name (storage.ErrClosed is base.ErrClosed), so callers match them with
// errors.Is as before. It must never grow behaviour: a value belongs here
// only when two parts need it.
package base

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// Errors shared by the parts. The facade documents each (storage/errors.go).
var (
	ErrClosed        = errors.New("storage: store is closed")
	ErrNotWritable   = errors.New("storage: store is not writable")
	ErrWriteRetrying = errors.New("storage: a background write is failing and being retried")
	ErrWriteFailed   = errors.New("storage: write or sync failed; store is read-only")
	ErrCreateFile    = errors.New("storage: create mapped file failed")
	ErrDiskFull      = errors.New("storage: no space left on device")
	ErrCorrupt       = record.ErrCorrupt
)

// WrapNoSpace adds ErrDiskFull to an error that wraps vfs.ErrNoSpace or
// ENOSPC, so the server answers it as a full disk; the original stays
// wrapped.
func WrapNoSpace(err error) error {
	if IsNoSpace(err) && !errors.Is(err, ErrDiskFull) {
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}

// IsNoSpace reports whether err is a full disk: ENOSPC from a write, or
// vfs.ErrNoSpace from a preallocation.
func IsNoSpace(err error) bool {
	return errors.Is(err, vfs.ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrDiskFull)
}

// Clock gives the store its time. Tests inject a fake one; the store never
// calls time.Now directly for what it stamps or schedules.
type Clock interface {
	Now() time.Time
}

// TimerClock is a Clock that can also wake a waiter when it reaches a
// point in its time. The store's background work that waits on the clock
// (the delay scheduler until the next delivery time, the retention and
// disk checks) uses At when the clock implements TimerClock, so a test
// clock fires those waits the moment the test moves it: no real sleeping.
// With any other clock, the system clock included, the store waits on real
// timers and reads the clock again at least every clockPoll, so a
// wall-clock jump delays a wake-up by at most that.
type TimerClock interface {
	Clock
	// At returns a channel that is closed once Now() is at or after t (at
	// once if it already is).
	At(t time.Time) <-chan struct{}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock is the wall clock.
var SystemClock Clock = systemClock{}

// IsSystemClock reports whether c is SystemClock (the put path then reads
// time.Now once for both the store time and its own statistics).
func IsSystemClock(c Clock) bool {
	_, ok := c.(systemClock)
	return ok
}

// clockPoll bounds a real-timer wait on a clock that is not a TimerClock.
const clockPoll = time.Second

// ClockWait returns a channel that is closed when clock c reaches t, and a
// func that releases the wait. For a clock that is not a TimerClock the
// channel may close early (after at most clockPoll): the caller re-reads
// the clock and decides again.
func ClockWait(c Clock, t time.Time) (<-chan struct{}, func()) {
	if tc, ok := c.(TimerClock); ok {
		return tc.At(t), func() {}
	}
	d := min(max(t.Sub(c.Now()), 0), clockPoll)
	ch := make(chan struct{})
	tm := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { tm.Stop() }
}

// Round is what one round of a delivery loop leaves to wait for.
type Round struct {
	At        time.Time     // the clock reading the round used
	Wake      time.Time     // delivery time of the earliest pending message; zero if none
	Retry     bool          // the store refused a re-put: look again after the loop's retry interval
	PersistIn time.Duration // progress is dirty: persist after this (real time); 0 if clean
}

// Rounds is the goroutine of a delivery loop (the delay scheduler's, the
// timer service's), one shape for both: Start runs rounds, each followed
// by a wait on the store's clock for the earliest delivery, the next poll
// (new messages) or the retry, whichever is first, or for the next
// persist, or for Stop. The zero value is not usable: NewRounds.
type Rounds struct {
	done     chan struct{}
	wg       sync.WaitGroup
	haltOnce sync.Once
	stopOnce sync.Once
}

// NewRounds returns a loop not yet started.
func NewRounds() *Rounds { return &Rounds{done: make(chan struct{})} }

// Start runs round on clock c until Stop, polling every poll and, after
// a round that says Retry, looking again after retry.
func (l *Rounds) Start(c Clock, poll, retry time.Duration, round func() Round) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			r := round()
			// Wait from the time the round looked at, not a fresh
			// reading: a clock that moved during the round must end the
			// wait at once rather than push it past a delivery that
			// became due meanwhile.
			next := r.At.Add(poll)
			switch {
			case r.Retry:
				next = r.At.Add(retry)
			case !r.Wake.IsZero() && r.Wake.Before(next):
				next = r.Wake
			}
			waitRound(c, next, r.PersistIn, l.done)
			if l.Stopping() {
				return
			}
		}
	}()
}

// Stopping reports whether Stop was called: a round checks it between
// batches, so that Stop does not wait out a long backlog.
func (l *Rounds) Stopping() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Halt ends the goroutine (a test then drives rounds itself).
func (l *Rounds) Halt() {
	l.haltOnce.Do(func() { close(l.done) })
	l.wg.Wait()
}

// Stop ends the goroutine, then runs final (the last persist) once,
// after the last round. Calling it twice, after Halt, or without Start,
// is safe.
func (l *Rounds) Stop(final func()) {
	l.Halt()
	l.stopOnce.Do(final)
}

// waitRound is the wait between two rounds of a delivery loop: until
// clock c reaches next, or persistIn of real time has passed (0: no
// persist is due), or done is closed, whichever comes first.
func waitRound(c Clock, next time.Time, persistIn time.Duration, done <-chan struct{}) {
	at, release := ClockWait(c, next)
	defer release()
	var persist <-chan time.Time
	if persistIn > 0 {
		pt := time.NewTimer(persistIn)
		defer pt.Stop()
		persist = pt.C
	}
	select {
	case <-at:
	case <-persist:
	case <-done:
	}
}

// AppendName appends name (1-255 bytes: the caller validated it) behind
// its one-byte length, as ReadName reads it.
func AppendName(b []byte, name string) []byte {
	b = append(b, byte(len(name)))
	return append(b, name...)
}

// ReadName reads, at *p in b, a name of 1-255 bytes behind its one-byte
// length (the record codecs of consumer offsets and POP state), and moves
// *p past it. It reports false, with *p undefined, when b ends first or
// the length is 0.
func ReadName(b []byte, p *int) (string, bool) {
	if *p >= len(b) {
		return "", false
	}
	l := int(b[*p])
	*p++
	if l == 0 || *p+l > len(b) {
		return "", false
	}
	s := string(b[*p : *p+l])
	*p += l
	return s, true
}

// SyncDir fsyncs dir, naming it in the error.
func SyncDir(fs vfs.FS, dir string) error {
	if err := fs.SyncDir(dir); err != nil {
		return fmt.Errorf("sync dir %s: %w", filepath.Base(dir), err)
	}
	return nil
}

// WriteAtomic replaces dir/name with data: temp file (synced), rename,
// directory fsync. After a crash the file is the old or the new one. The
// checkpoint, the topic table and the delay progress are written so.
func WriteAtomic(fs vfs.FS, dir, name string, data []byte) error {
	if err := fs.MkdirAll(dir); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(dir), err)
	}
	tmp := filepath.Join(dir, name+".tmp")
	if err := fs.WriteFile(tmp, data); err != nil {
		fs.Remove(tmp) // a short write on a full disk holds space; the error is err
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := fs.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("rename %s: %w", name, err)
	}
	return SyncDir(fs, dir)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SnapshotHead begins every snapshot file of a system-record table
// (storage/offsets, storage/pop): the record the snapshot reflects, by
// commitlog offset, queue offset in its topic and body CRC.
type SnapshotHead struct {
	At          int64
	QueueOffset int64
	BodyCRC     uint32
}

// SnapshotHeadLen is the bytes of a snapshot file before the table's own
// fields: version and head.
const SnapshotHeadLen = 1 + 8 + 8 + 4

// AppendSnapshotHead begins a snapshot file of version v.
func AppendSnapshotHead(b []byte, v byte, h SnapshotHead) []byte {
	b = append(b, v)
	b = binary.BigEndian.AppendUint64(b, uint64(h.At))
	b = binary.BigEndian.AppendUint64(b, uint64(h.QueueOffset))
	return binary.BigEndian.AppendUint32(b, h.BodyCRC)
}

// SealSnapshot ends a snapshot file: the CRC-32C of everything before.
func SealSnapshot(b []byte) []byte {
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// OpenSnapshot checks a snapshot file of version v (its CRC, then its
// version and head) and returns the head and the file without its CRC,
// the table's fields from SnapshotHeadLen on. The caller wraps the error
// in its own decode error.
func OpenSnapshot(b []byte, v byte) (SnapshotHead, []byte, error) {
	if len(b) < SnapshotHeadLen+4 {
		return SnapshotHead{}, nil, fmt.Errorf("snapshot of %d bytes", len(b))
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.BigEndian.Uint32(b[len(b)-4:]); got != want {
		return SnapshotHead{}, nil, fmt.Errorf("snapshot CRC %08x, want %08x", got, want)
	}
	if body[0] != v {
		return SnapshotHead{}, nil, fmt.Errorf("snapshot version %d", body[0])
	}
	h := SnapshotHead{At: int64(binary.BigEndian.Uint64(body[1:])), QueueOffset: int64(binary.BigEndian.Uint64(body[9:])),
		BodyCRC: binary.BigEndian.Uint32(body[17:])}
	if h.At < 0 || h.QueueOffset < 0 {
		return SnapshotHead{}, nil, fmt.Errorf("snapshot at %d, queue offset %d", h.At, h.QueueOffset)
	}
	return h, body, nil
}

// Seal returns body (one line of JSON) followed by a line with its
// CRC-32C: the small files the store keeps (checkpoint, topic table, delay
// progress) are written so, so that a damaged one is told from a good one.
func Seal(body []byte) []byte {
	return fmt.Appendf(nil, "%s\n%d\n", body, crc32.Checksum(body, castagnoli))
}

// Unseal returns the body of a sealed file, or ok false when it fails its
// CRC or is not two lines.
func Unseal(b []byte) (body []byte, ok bool) {
	first, sum, found := strings.Cut(strings.TrimSuffix(string(b), "\n"), "\n")
	want, err := strconv.ParseUint(sum, 10, 32)
	if !found || err != nil || crc32.Checksum([]byte(first), castagnoli) != uint32(want) {
		return nil, false
	}
	return []byte(first), true
}

// CorruptionError reports damage to data that was acknowledged as durable:
// a record below the checkpoint's flushed offset fails its checks. Open
// refuses to start rather than silently dropping the rest of the log
// (RocketMQ truncateDirtyFiles, #10017); `storaged check` and `storaged
// repair --truncate-at` are the explicit, offline ways forward.
type CorruptionError struct {
	File    string // relative to the data dir, e.g. commitlog/00000000000000000000
	Offset  int64  // commitlog offset of the bad record
	Flushed int64  // the checkpoint's flushed offset
	Reason  string
}

func (e *CorruptionError) Error() string {
	if e.Offset >= e.Flushed && e.Flushed > 0 {
		// A replica's synced damage past the checkpoint (design §3.4).
		return fmt.Sprintf("storage: corrupt record at commitlog offset %d in %s (past the flushed checkpoint %d): %s",
			e.Offset, e.File, e.Flushed, e.Reason)
	}
	return fmt.Sprintf("storage: corrupt record at commitlog offset %d in %s (below the flushed checkpoint %d): %s",
		e.Offset, e.File, e.Flushed, e.Reason)
}

// Unwrap implements errors.Unwrap.
func (e *CorruptionError) Unwrap() error { return ErrCorrupt }
