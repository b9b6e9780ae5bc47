package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/testenv"
	"github.com/storaged/storaged/storage/retention"
	"github.com/storaged/storaged/storage/vfs"
)

// openRetention opens a store with tiny files on the alarm clock at 01:00
// local, disk usage faked by disk, and the scheduler halted.
func openRetention(t *testing.T, disk *fakeDisk, mod func(*Options)) (*Store, Options, *alarmClock) {
	t.Helper()
	clock := newAlarmClock(schedT0)
	s, o := openTest(t, func(o *Options) {
		o.FileSize, o.MaxMessageSize, o.ConsumeQueueEntries = 4096, 2048, 16
		o.Clock, o.StatDisk, o.CheckpointInterval = clock, disk.stat, time.Hour
		if mod != nil {
			mod(o)
		}
	})
	// The retention goroutine is then the only one waiting on the clock
	// (TestDiskWatermarksStopAndResumeWrites counts on it): the delay
	// scheduler and the timer-message service are halted.
	haltScheduler(s)
	haltTimers(s)
	return s, o, clock
}

// fill puts n messages of about 600 bytes (6 per 4 KiB file) to topic/0.
func fill(t testing.TB, s *Store, topic string, n int) []AppendResult {
	t.Helper()
	var out []AppendResult
	for i := 0; i < n; i++ {
		res, err := s.PutMessage(context.Background(), msg(topic, fmt.Sprintf("%s-%03d-%s", topic, i, strings.Repeat("x", 500))))
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		out = append(out, res.Append)
	}
	return out
}

func fileNames(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if _, ok := parseFileName(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestRetentionDeletesExpiredFilesAtDeleteHour(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, nil)
	old := fill(t, s, "T", 30) // 5 files at T0
	clock.Advance(10 * time.Hour)
	newer := fill(t, s, "T", 12) // 2 more at T0+10h
	fill(t, s, "U", 3)
	settle(t, s)
	filesBefore := s.Stats().Files

	// 72 h 30 min later, at 01:30: expired, but not the hour.
	clock.Set(schedT0.Add(72*time.Hour + 30*time.Minute))
	s.ret.Round()
	if st := s.Stats(); st.Files != filesBefore || st.Retention.DeletedFiles != 0 {
		t.Fatalf("deleted outside DeleteWhen: %+v", st.Retention)
	}

	// 04:00: the files of the first burst go, but the last one: its newest
	// message is bounded by the next file's first, 10 h younger.
	clock.Set(time.Date(2026, 12, 2, 4, 0, 0, 0, time.Local))
	s.ret.Round()
	lastOld := old[len(old)-1].WroteOffset
	wantMin := lastOld - lastOld%o.FileSize
	st := s.Stats()
	if st.MinOffset != wantMin || st.Retention.DeletedFiles != uint64(wantMin/o.FileSize) || st.Files != filesBefore-int(wantMin/o.FileSize) {
		t.Fatalf("after 04:00: min %d (want %d), %+v, files %d", st.MinOffset, wantMin, st.Retention, st.Files)
	}
	if got := fileNames(t, s.log.Files().Dir()); got[0] != fileName(wantMin) || len(got) < st.Files || len(got) > st.Files+1 { // +1: the allocator's next file
		t.Fatalf("commitlog dir holds %v", got)
	}
	// Reads below the new minimum are OUT_OF_RANGE; the queue min moved to
	// the first message still on disk.
	var rerr *RangeError
	if _, err := s.GetMessage(0); !errors.As(err, &rerr) || !errors.Is(err, ErrOutOfRange) || rerr.Min != wantMin {
		t.Fatalf("GetMessage(0): %v", err)
	}
	firstKept := int64(0)
	for firstKept < int64(len(old)) && old[firstKept].WroteOffset < wantMin {
		firstKept++
	}
	lo, hi, _ := s.QueueInfo("T", 0)
	if lo != firstKept || hi != int64(len(old)+len(newer)) {
		t.Fatalf("queue T/0 is [%d, %d), want [%d, %d)", lo, hi, firstKept, len(old)+len(newer))
	}
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", Offset: 0}); !errors.As(err, &rerr) || rerr.Min != firstKept {
		t.Fatalf("pull below min: %v", err)
	}
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", Offset: lo, MaxMessages: 1})
	if err != nil || len(res.Messages) != 1 || res.Messages[0].PhysicalOffset != old[firstKept].WroteOffset {
		t.Fatalf("pull at min: %v %v", res, err)
	}
	// Consume-queue files wholly below the min are gone (16 entries each).
	if cq := fileNames(t, cqDir(o.Dir, "T", 0)); len(cq) != int(len(old)+len(newer)+15)/16-int(firstKept/16) {
		t.Fatalf("consume queue files %v with min %d", cq, firstKept)
	}

	// A restart finds the same bounds.
	s.Close()
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	haltScheduler(s2)
	if lo2, hi2, _ := s2.QueueInfo("T", 0); lo2 != lo || hi2 != hi || s2.log.MinOffset() != wantMin {
		t.Fatalf("after reopen: [%d, %d) min %d", lo2, hi2, s2.log.MinOffset())
	}

	// A day later everything has expired: all files go but the one being
	// written.
	clock.Set(time.Date(2026, 12, 3, 4, 0, 0, 0, time.Local))
	for i := 0; i < 3; i++ {
		s2.ret.Round()
	}
	st = s2.Stats()
	last := s2.log.Files().Last()
	if st.Files != 1 || st.MinOffset != last.From() || len(fileNames(t, s2.log.Files().Dir())) > 2 {
		t.Fatalf("everything expired: %d files, min %d, last file %d", st.Files, st.MinOffset, last.From())
	}
	if _, err := s2.PutMessage(context.Background(), msg("T", "still writable")); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionForcedAboveCleanWatermark(t *testing.T) {
	disk := &fakeDisk{pct: 80}
	s, o, clock := openRetention(t, disk, nil)
	fill(t, s, "T", 30)
	clock.Advance(100 * time.Hour) // 05:00, past the hour
	fresh := fill(t, s, "T", 18)
	settle(t, s)
	files := s.Stats().Files
	s.ret.Round()
	if s.Stats().Retention.DeletedFiles != 0 {
		t.Fatal("deleted outside DeleteWhen below the clean watermark")
	}
	disk.set(86)
	s.ret.Round()
	st := s.Stats()
	// The old burst goes; the fresh one stays even though the disk is
	// still above the watermark: retention deletes by age only.
	if st.Retention.DeletedFiles == 0 || st.MinOffset > fresh[0].WroteOffset-fresh[0].WroteOffset%o.FileSize {
		t.Fatalf("forced clean: %+v, min %d", st.Retention, st.MinOffset)
	}
	s.ret.Round()
	if st2 := s.Stats(); st2.Retention.DeletedFiles != st.Retention.DeletedFiles || st2.Files < files-int(st.Retention.DeletedFiles) {
		t.Fatalf("unexpired files deleted: %+v", st2.Retention)
	}
}

func TestRetentionKeepsUndeliveredDelayedMessages(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, func(o *Options) { o.DelayLevels = "1s 4d"; o.DeleteWhen = "*" })
	fill(t, s, "T", 6) // file 0
	delayed := putDelayed(t, s, "Real", 0, 2, "four days")
	fill(t, s, "T", 30)
	settle(t, s)
	protect := delayed.WroteOffset - delayed.WroteOffset%o.FileSize

	clock.Advance(80 * time.Hour)
	s.ret.Round()
	if got := s.log.MinOffset(); got != protect {
		t.Fatalf("min offset %d, want %d: the file with the undelivered message must stay", got, protect)
	}
	// Delivered but not persisted: still kept (a restart would deliver it
	// again from there).
	clock.Set(time.UnixMilli(delayed.StoreTimestamp).Add(96 * time.Hour))
	runRounds(s)
	if s.sched.Delivered(1) != 1 {
		t.Fatal("not delivered")
	}
	s.ret.Round()
	if got := s.log.MinOffset(); got != protect {
		t.Fatalf("min offset %d: deleted before the delivery was persisted", got)
	}
	if err := s.sched.Persist(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		s.ret.Round()
	}
	if got, last := s.log.MinOffset(), s.log.Files().Last().From(); got <= protect || got > last {
		t.Fatalf("min offset %d after the persisted delivery (protected %d, last %d)", got, protect, last)
	}
}

// TestRetentionKeepsPendingTimerMessages: the file holding a timer
// message due in four days outlives the retention time while the message
// is pending, and while its delivery is not persisted; then it goes.
func TestRetentionKeepsPendingTimerMessages(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, func(o *Options) { o.DeleteWhen = "*"; o.TimerMaxDelay = 5 * 24 * time.Hour })
	haltTimers(s)
	fill(t, s, "T", 7) // file 0 and the start of file 1
	due := clock.Now().Add(96 * time.Hour)
	timer := putTimer(t, s, "Real", 0, "four days", due)
	fill(t, s, "T", 30)
	settle(t, s)
	protect := timer.WroteOffset - timer.WroteOffset%o.FileSize
	if protect == 0 {
		t.Fatal("the timer message is in the first file: nothing to tell apart")
	}
	clock.Advance(80 * time.Hour)
	s.ret.Round()
	if got := s.log.MinOffset(); got != protect {
		t.Fatalf("min offset %d, want %d: the file with the pending timer message must stay", got, protect)
	}
	clock.Set(due)
	timerRounds(s)
	if s.timers.Stats().Delivered != 1 {
		t.Fatal("not delivered")
	}
	s.ret.Round()
	if got := s.log.MinOffset(); got != protect {
		t.Fatalf("min offset %d: deleted before the delivery was persisted", got)
	}
	if err := s.timers.Persist(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		s.ret.Round()
	}
	if got, last := s.log.MinOffset(), s.log.Files().Last().From(); got <= protect || got > last {
		t.Fatalf("min offset %d after the persisted delivery (protected %d, last %d)", got, protect, last)
	}
}

func TestDiskWatermarksStopAndResumeWrites(t *testing.T) {
	disk := &fakeDisk{pct: 50}
	s, _, clock := openRetention(t, disk, nil)
	put := func() (PutResult, error) { return s.PutMessage(context.Background(), msg("T", "x")) }
	s.ret.Round()
	if !s.Writable() {
		t.Fatal("not writable at 50%")
	}
	disk.set(90.5)
	s.ret.Round()
	res, err := put()
	if s.Writable() || res.Status != ServiceNotAvailable || !errors.Is(err, ErrNotWritable) || !errors.Is(err, ErrDiskFull) {
		t.Fatalf("above the warning watermark: writable %v, %v %v", s.Writable(), res.Status, err)
	}
	if d := s.Stats().Disk; !d.Full || d.UsedPercent < 90 || d.Err != "" {
		t.Fatalf("disk stats %+v", d)
	}
	disk.set(88) // between the watermarks: still refused (hysteresis)
	s.ret.Round()
	if _, err := put(); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("at 88%% after full: %v", err)
	}
	disk.set(85)
	s.ret.Round()
	if _, err := put(); err != nil || !s.Writable() {
		t.Fatalf("at 85%%: %v", err)
	}
	// An unreadable disk changes nothing and says why.
	disk.mu.Lock()
	disk.err = errors.New("statfs: input/output error")
	disk.mu.Unlock()
	s.ret.Round()
	if d := s.Stats().Disk; !s.Writable() || !strings.Contains(d.Err, "input/output") {
		t.Fatalf("stat error: writable %v, %+v", s.Writable(), d)
	}

	// The goroutine does the same on its own, on the clock. Each step
	// moves the clock until the goroutine has run a round, again each time
	// a wait is added: another goroutine's wait could be the pending one
	// when the retention goroutine has not re-armed yet, and a single
	// Advance would then be missed (about 1 run in 170 under -race did).
	disk.set(99)
	for s.Writable() {
		clock.AdvanceUntil(t, s.opts.DiskCheckInterval, s.ret.RoundSignal(), "the retention goroutine seeing the disk fill up")
	}
	disk.set(10)
	for !s.Writable() {
		clock.AdvanceUntil(t, s.opts.DiskCheckInterval, s.ret.RoundSignal(), "the retention goroutine seeing the disk free up")
	}
}

// TestRetentionDeletionSurvivesPowerCut: deletions sync the directory, so
// a power cut right after a round leaves the files deleted, and the store
// opens on the image with the same bounds.
func TestRetentionDeletionSurvivesPowerCut(t *testing.T) {
	fs := vfs.NewMem()
	// Every commitlog file removal must be followed by a sync of the
	// commitlog directory.
	var removed, unsynced atomic.Int64
	fs.SetInjector(func(op vfs.Op, path string) error {
		switch {
		case op == vfs.OpRemove && filepath.Base(filepath.Dir(path)) == "commitlog":
			removed.Add(1)
			unsynced.Store(1)
		case op == vfs.OpSyncDir && filepath.Base(path) == "commitlog":
			unsynced.Store(0)
		}
		return nil
	})
	disk := &fakeDisk{pct: 10}
	clock := newAlarmClock(schedT0)
	o := Options{Dir: "/data", FS: fs, FileSize: 4096, MaxMessageSize: 2048, ConsumeQueueEntries: 16, Clock: clock,
		StatDisk: disk.stat, CheckpointInterval: time.Hour, DeleteWhen: "*", FlushMode: FlushSync}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	haltScheduler(s)
	fill(t, s, "T", 30)
	clock.Advance(80 * time.Hour)
	fill(t, s, "T", 12)
	settle(t, s)
	s.ret.Round() // (the goroutine may have run one too)
	if st := s.Stats().Retention; st.DeletedFiles == 0 || removed.Load() != int64(st.DeletedFiles) || unsynced.Load() != 0 {
		t.Fatalf("deleted %d files, %d removals, directory synced after: %v", st.DeletedFiles, removed.Load(), unsynced.Load() == 0)
	}
	min0 := s.log.MinOffset()
	lo, hi, _ := s.QueueInfo("T", 0)
	resume := s.pause()
	img := fs.Crash(rand.New(rand.NewPCG(1, 2)))
	resume()
	o.FS = img
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	haltScheduler(s2)
	lo2, hi2, _ := s2.QueueInfo("T", 0)
	if s2.log.MinOffset() != min0 || lo2 != lo || hi2 != hi {
		t.Fatalf("after the power cut: min %d [%d, %d), before %d [%d, %d)", s2.log.MinOffset(), lo2, hi2, min0, lo, hi)
	}
}

// TestRetentionSoak runs many puts on tiny files with retention on and a
// clock that moves a minute per batch, with a reader pulling from each
// queue's min all along: the file count stays within what FileReservedTime
// needs, every delayed message is delivered, and no read ever fails except
// with OUT_OF_RANGE.
func TestRetentionSoak(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	const (
		perBatch = 40 // about 1.4 files of 8 KiB
		reserved = 20 * time.Minute
	)
	batches := 300
	if testing.Short() {
		batches = 60
	}
	s, o, clock := openRetention(t, disk, func(o *Options) {
		o.FileReservedTime, o.DeleteWhen, o.FileSize, o.MaxMessageSize = reserved, "*", 8192, 4096
	})
	var (
		wg       sync.WaitGroup
		stop     = make(chan struct{})
		reads    atomic.Int64
		outRange atomic.Int64
		readErr  atomic.Pointer[error]
	)
	wg.Add(1)
	go func() { // a consumer that always starts from the min
		defer wg.Done()
		for {
			arrived, release := s.index.NextRelease()
			select { // one pull per dispatch round
			case <-stop:
				release()
				return
			case <-arrived:
			}
			release()
			lo, _, err := s.QueueInfo("T", 0)
			if err != nil {
				continue
			}
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", Offset: lo, MaxMessages: 64})
			switch {
			case errors.Is(err, ErrOutOfRange):
				outRange.Add(1)
			case err != nil:
				readErr.Store(&err)
				return
			default:
				reads.Add(int64(len(res.Messages)))
			}
		}
	}()
	maxFiles, maxCQ, delayed := 0, 0, 0
	start := time.Now()
	for b := 0; b < batches; b++ {
		for i := 0; i < perBatch; i++ {
			if _, err := s.PutMessage(context.Background(), msg("T", strconv.Itoa(b*perBatch+i)+strings.Repeat("s", 150))); err != nil {
				t.Fatal(err)
			}
		}
		if b%10 == 0 {
			putDelayed(t, s, "Real", 0, 5, strconv.Itoa(delayed)) // one minute
			delayed++
		}
		clock.Advance(time.Minute)
		settle(t, s)
		runRounds(s)
		if err := s.sched.Persist(); err != nil { // every CheckpointInterval in production
			t.Fatal(err)
		}
		s.ret.Round()
		maxFiles = max(maxFiles, s.Stats().Files)
		maxCQ = max(maxCQ, len(fileNames(t, cqDir(o.Dir, "T", 0))))
	}
	close(stop)
	wg.Wait()
	if p := readErr.Load(); p != nil {
		t.Fatalf("reader failed: %v", *p)
	}
	st := s.Stats()
	bytesPerBatch := float64(st.MaxOffset) / float64(batches)
	// After a round: the files of the last reserved/1min batches, plus the
	// batch whose file straddles the cutoff (the conservative bound), plus
	// the file being written and the one its first record may have ended.
	budget := int(math.Ceil(bytesPerBatch*float64(reserved/time.Minute+1)/float64(o.FileSize))) + 2
	t.Logf("%d puts (%d MiB) in %v: max %d commitlog files (budget %d), max %d consume-queue files, %d files deleted, %d messages read, %d reads out of range",
		batches*perBatch, st.MaxOffset>>20, time.Since(start).Round(time.Millisecond), maxFiles, budget, maxCQ,
		st.Retention.DeletedFiles, reads.Load(), outRange.Load())
	if maxFiles > budget {
		t.Fatalf("up to %d commitlog files, budget %d", maxFiles, budget)
	}
	entriesPerCQ := int64(o.ConsumeQueueEntries)
	if cqBudget := int(int64(perBatch)*int64(reserved/time.Minute)/entriesPerCQ) + 3; maxCQ > cqBudget {
		t.Fatalf("up to %d consume-queue files, budget %d", maxCQ, cqBudget)
	}
	if got := st.Schedule.Levels[4].Delivered; got != uint64(delayed) {
		t.Fatalf("%d of %d delayed messages delivered", got, delayed)
	}
}

// TestDiskWatermarkOnTmpfs fills a real 8 MiB tmpfs past the warning
// watermark, checks writes stop, lets retention free it and checks they
// resume.
func TestDiskWatermarkOnTmpfs(t *testing.T) {
	for _, offsets := range []bool{false, true} {
		t.Run(fmt.Sprintf("consumer-offsets=%v", offsets), func(t *testing.T) { diskWatermarkOnTmpfs(t, offsets) })
	}
}

// diskWatermarkOnTmpfs fills a real 8 MiB tmpfs until puts are refused,
// lets everything expire and checks that retention frees the disk. With
// offsets, a consumer offset committed first lies in the oldest file, so
// retention must rewrite it (into the nearly full disk) before it deletes.
func diskWatermarkOnTmpfs(t *testing.T, offsets bool) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Need(t, false, fmt.Sprintf("cannot mount a tmpfs (needs root and mount(8); .ci/run runs as root): %v: %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	clock := newAlarmClock(schedT0)
	o := Options{Dir: dir, FileSize: 512 << 10, MaxMessageSize: 64 << 10, ConsumeQueueEntries: 1024, Clock: clock,
		CheckpointInterval: time.Hour}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() // before the umount
	haltScheduler(s)
	body := strings.Repeat("t", 32<<10)
	if offsets {
		if _, err := s.PutMessage(context.Background(), msg("T", "first")); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitOffset(context.Background(), "G", "T", 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	puts := 0
	var refused error
	for puts < 1000 {
		_, err := s.PutMessage(context.Background(), msg("T", body))
		if err != nil {
			refused = err
			break
		}
		puts++
		s.ret.Round()
	}
	d := s.Stats().Disk
	t.Logf("tmpfs: %d puts of 32 KiB accepted, then %v; disk %.1f%% used (%d of %d bytes)", puts, refused, d.UsedPercent, d.Used, d.Size)
	if !errors.Is(refused, ErrDiskFull) || !errors.Is(refused, ErrNotWritable) || s.Writable() || d.UsedPercent <= 90 {
		t.Fatalf("want writes refused above 90%%: %v, writable %v, %+v", refused, s.Writable(), d)
	}
	clock.Advance(73 * time.Hour) // everything written has expired; above 85% retention runs at once
	for i := 0; i < 5 && !s.Writable(); i++ {
		s.ret.Round()
	}
	d = s.Stats().Disk
	if !s.Writable() || d.UsedPercent > 85 {
		t.Fatalf("after retention: writable %v, %+v, %+v", s.Writable(), d, s.Stats().Retention)
	}
	if _, err := s.PutMessage(context.Background(), msg("T", body)); err != nil {
		t.Fatalf("put after space was freed: %v", err)
	}
	if offsets {
		if got, err := s.GetOffset("G", "T", 0); err != nil || got != 1 {
			t.Fatalf("the committed offset after retention freed its file: %d, %v", got, err)
		}
	}
	t.Logf("tmpfs: retention deleted %d files; disk %.1f%% used; writes resumed", s.Stats().Retention.DeletedFiles, d.UsedPercent)
}

// TestRetentionDeletesBelowTheLastCheckpointOnAFullDisk: retention brings
// the checkpoint up to date before it deletes, but on a full disk writing
// the checkpoint fails (ENOSPC). It then still deletes the expired files
// below the last checkpoint written, which recovery never needs: a store
// that refuses puts for a full disk must free it without writing anything.
// The failed checkpoint is a transient fault, and once it clears the rest
// goes too; a restart afterwards recovers everything kept.
func TestRetentionDeletesBelowTheLastCheckpointOnAFullDisk(t *testing.T) {
	fs := vfs.NewMem()
	disk := &fakeDisk{pct: 10}
	clock := newAlarmClock(schedT0)
	o := Options{Dir: "/d", FS: fs, FileSize: 4096, MaxMessageSize: 2048, ConsumeQueueEntries: 16, Clock: clock,
		StatDisk: disk.stat, CheckpointInterval: time.Hour}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	haltScheduler(s)
	fill(t, s, "T", 30) // 5 files
	settle(t, s)
	if err := s.index.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	cp := s.index.LastCheckpoint().Dispatched
	last := fill(t, s, "T", 30)
	settle(t, s)

	fs.SetInjector(failWhere(vfs.OpWriteFile, "checkpoint", fmt.Errorf("%w: %w", vfs.ErrNoSpace, syscall.ENOSPC)))
	disk.set(99)
	clock.Advance(73 * time.Hour) // everything has expired
	s.ret.Round()
	if f := faultOf(t, s, "checkpoint"); !f.Failing || !strings.Contains(f.Error, "no space") {
		t.Fatalf("the checkpoint did not fail: %+v", f)
	}
	min := s.log.MinOffset()
	if min == 0 || min > cp {
		t.Fatalf("with the checkpoint failing: first offset %d, want files deleted up to the last checkpoint %d", min, cp)
	}
	if s.WriteErr() != nil {
		t.Fatalf("a failed checkpoint write turned sticky: %v", s.WriteErr())
	}

	fs.SetInjector(nil)
	s.ret.Round()
	if got := s.log.MinOffset(); got <= cp {
		t.Fatalf("after the checkpoint recovered: first offset %d, want past %d", got, cp)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(o); err != nil {
		t.Fatalf("reopen after deleting on a full disk: %v", err)
	}
	haltScheduler(s)
	tail := last[len(last)-1]
	if got, err := s.GetMessage(tail.WroteOffset); err != nil || got.QueueOffset != tail.QueueOffset {
		t.Fatalf("the newest message after reopening: %+v, %v", got, err)
	}
}

func TestRetentionOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Dir: "x", DeleteWhen: "4am"}, "DeleteWhen"},
		{Options{Dir: "x", DeleteWhen: "04;24"}, "DeleteWhen"},
		{Options{Dir: "x", DiskCleanPercent: 95}, "watermarks"},
		{Options{Dir: "x", DiskWarningPercent: 101}, "watermarks"},
		{Options{Dir: "x", DiskCheckInterval: -1}, "DiskCheckInterval"},
		{Options{Dir: "x", DeleteWhen: "04;16", DiskCleanPercent: 70, DiskWarningPercent: 80}, ""},
		{Options{Dir: "x", DeleteWhen: "*", FileReservedTime: -1}, ""},
	} {
		err := c.o.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
	d := Options{Dir: "x"}.withDefaults()
	if d.FileReservedTime != 72*time.Hour || d.DeleteWhen != "04" || d.DiskCleanPercent != 85 || d.DiskWarningPercent != 90 ||
		d.DiskCheckInterval != time.Second || d.StatDisk == nil {
		t.Fatalf("defaults: %+v", d)
	}
	hours, _ := retention.ParseDeleteWhen("04;16")
	if !hours[4] || !hours[16] || hours[5] {
		t.Fatal("DeleteWhen 04;16")
	}
	u, err := StatDisk(t.TempDir())
	if err != nil || u.Size == 0 || u.UsedPercent() <= 0 || u.UsedPercent() > 100 {
		t.Fatalf("statfs: %+v %v", u, err)
	}
}

// TestSlaveDeletesByTimeOnly: a slave delivers no delayed messages, so its
// retention does not wait for them (it would keep files forever).
func TestSlaveDeletesByTimeOnly(t *testing.T) {
	disk := &fakeDisk{pct: 10}
	s, o, clock := openRetention(t, disk, func(o *Options) { o.DelayLevels = "1s 4d"; o.DeleteWhen = "*" })
	putDelayed(t, s, "Real", 0, 2, "four days")
	fill(t, s, "T", 30)
	s.Close()
	o.Role = RoleSlave
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	clock.Advance(80 * time.Hour)
	s2.ret.Round()
	if s2.log.MinOffset() == 0 || s2.Stats().Schedule.Levels[1].Pending != 0 {
		t.Fatalf("slave: min %d, %+v", s2.log.MinOffset(), s2.Stats().Schedule.Levels[1])
	}
}
