package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"time"
)

// CheckReport is what Check found in a data dir.
type CheckReport struct {
	Files   int
	Records int64
	// End is the offset just past the last valid record.
	End int64
	// Flushed is the checkpoint's flushed offset (0 without a checkpoint).
	Flushed int64
	// Damage describes the first bad bytes, if any, at DamageOffset.
	Damage       string
	DamageOffset int64
	// BelowCheckpoint reports whether the damage lies below Flushed:
	// acknowledged data, which Open refuses to truncate on its own.
	BelowCheckpoint bool
	// CheckpointDamage says why the checkpoint file cannot be trusted
	// (empty when it is fine or absent); CheckpointFile is its path.
	// Flushed is then 0 and BelowCheckpoint false: the flushed offset is
	// unknown. Open refuses such a dir (*CheckpointError);
	// RebuildCheckpoint, or Repair, writes a new checkpoint.
	CheckpointDamage string
	CheckpointFile   string
}

// Check verifies every record of the commitlog in opts.Dir, offline (it
// takes the data dir lock). It never modifies anything.
func Check(opts Options) (CheckReport, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return CheckReport{}, err
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return CheckReport{}, err
	}
	defer lf.Close()
	q := newMappedFileQueue(opts.FS, filepath.Join(opts.Dir, "commitlog"), opts.FileSize, nil)
	defer q.close()
	if err := q.load(); err != nil {
		return CheckReport{}, err
	}
	cp, _, err := readCheckpoint(opts.FS, opts.Dir)
	var cperr *CheckpointError
	switch {
	case errors.As(err, &cperr):
		cp = checkpoint{} // the commitlog is still worth checking
	case err != nil:
		return CheckReport{}, err
	}
	files := q.snapshot()
	rep := CheckReport{Files: len(files), Flushed: cp.Flushed}
	if cperr != nil {
		rep.CheckpointDamage, rep.CheckpointFile = cperr.Reason, cperr.File
	}
	if len(files) == 0 {
		return rep, nil
	}
	r := scanFrom(files, files[0].from, !opts.DisablePropCRC)
	rep.Records, rep.End = r.records, r.end
	if r.bad {
		// Bytes that are zero to the end of the log are its end, not
		// damage: the rest of this file and every later one (the next
		// file is created ahead of need, so a killed server leaves it).
		zero := true
		for _, f := range files {
			if f.from+f.size > r.end {
				zero = zero && allZero(f.data[max(r.end-f.from, 0):])
			}
		}
		if !zero {
			rep.Damage, rep.DamageOffset = r.badReason, r.end
		}
	}
	if rep.End < cp.Flushed {
		rep.BelowCheckpoint = true
		if rep.Damage == "" {
			rep.Damage, rep.DamageOffset = "the log ends before the flushed checkpoint", rep.End
		}
	}
	return rep, nil
}

// Repair truncates the commitlog at truncateAt, offline: the bytes from
// there on are kept in commitlog/<offset>.broken, zeroed, later files are
// deleted, the consume queues are dropped (the next Open rebuilds them from
// the commitlog) and the checkpoint is rewritten to the new end. It is the
// explicit way past a CorruptionError; it refuses an offset that is not a
// record boundary of the valid log.
func Repair(opts Options, truncateAt int64) error {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return err
	}
	rep, err := Check(opts)
	if err != nil {
		return err
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return err
	}
	defer lf.Close()
	s := &Store{opts: opts, dir: filepath.Join(opts.Dir, "commitlog")}
	s.queue = newMappedFileQueue(opts.FS, s.dir, opts.FileSize, nil)
	defer s.queue.close()
	if err := s.queue.load(); err != nil {
		return err
	}
	files := s.queue.snapshot()
	if len(files) == 0 {
		return fmt.Errorf("storage: repair: no commitlog files")
	}
	if truncateAt > rep.End || truncateAt < files[0].from {
		return fmt.Errorf("storage: repair: offset %d is outside the valid log [%d, %d]", truncateAt, files[0].from, rep.End)
	}
	ok, batchStart := isBoundary(files, truncateAt)
	switch {
	case !ok:
		return fmt.Errorf("storage: repair: offset %d is not a record boundary", truncateAt)
	case batchStart >= 0: // cutting there would leave part of a batch
		return fmt.Errorf("storage: repair: offset %d is inside the batch that starts at %d: cut at %d to drop the whole batch",
			truncateAt, batchStart, batchStart)
	}
	for _, f := range files {
		switch {
		case f.from+f.size <= truncateAt:
		case f.from <= truncateAt:
			if err := s.cutTail(f, truncateAt-f.from); err != nil {
				return err
			}
		default:
			if !allZero(f.data) {
				if err := s.saveBroken(f, 0); err != nil {
					return err
				}
			}
			if err := f.remove(); err != nil {
				return err
			}
		}
	}
	if err := syncDir(opts.FS, s.dir); err != nil {
		return err
	}
	if rep.CheckpointDamage != "" {
		if _, err := setAsideCheckpoint(opts, "corrupt"); err != nil {
			return err
		}
	}
	if err := opts.FS.RemoveAll(filepath.Join(opts.Dir, "consumequeue")); err != nil {
		return fmt.Errorf("storage: repair: drop consume queues: %w", err)
	}
	return writeCheckpoint(opts.FS, opts.Dir, checkpoint{Flushed: truncateAt, Dispatched: 0, Queues: map[string]int64{}})
}

// RebuildCheckpoint replaces the checkpoint, offline: the explicit way
// past a *CheckpointError. It checks every record of the commitlog (Check)
// and refuses when any is damaged (the error wraps ErrCorrupt and names the
// offset: Repair there instead, which rewrites the checkpoint too, since
// without a trusted flushed offset a torn tail and damaged acknowledged
// records look the same). Otherwise it renames the old checkpoint to
// checkpoint.corrupt-<UTC time> (checkpoint.replaced-<time> if it was
// fine; kept for post-mortem, never read again), syncs the
// commitlog, drops the consume queues and writes a checkpoint whose
// flushed offset is the end of the valid log and whose dispatched offset
// is 0. It returns the name the old checkpoint was set aside as ("" when
// there was none).
//
// The cost is a full scan: this one, then the next Open's recovery, which
// starts at the first commitlog file, checks every record's CRCs again and
// writes every consume-queue entry anew (20 bytes a message); both read
// the whole commitlog once.
func RebuildCheckpoint(opts Options) (string, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return "", err
	}
	rep, err := Check(opts)
	if err != nil {
		return "", err
	}
	if rep.Damage != "" {
		return "", fmt.Errorf("%w: repair: the commitlog is damaged at offset %d (%s): a rebuilt checkpoint would "+
			"cut the log there; truncate at that offset instead (that rewrites the checkpoint too)",
			ErrCorrupt, rep.DamageOffset, rep.Damage)
	}
	lf, err := lockDir(opts.FS, opts.Dir)
	if err != nil {
		return "", err
	}
	defer lf.Close()
	q := newMappedFileQueue(opts.FS, filepath.Join(opts.Dir, "commitlog"), opts.FileSize, nil)
	defer q.close()
	if err := q.load(); err != nil {
		return "", err
	}
	// What the new checkpoint calls flushed must be durable: after a
	// kill -9 the page cache may hold bytes never synced.
	for _, f := range q.snapshot() {
		if err := f.sync(0, f.size); err != nil {
			return "", fmt.Errorf("storage: repair: %w", err)
		}
	}
	why := "replaced" // an operator may rebuild a checkpoint that is fine
	if rep.CheckpointDamage != "" {
		why = "corrupt"
	}
	aside, err := setAsideCheckpoint(opts, why)
	if err != nil {
		return "", err
	}
	if err := opts.FS.RemoveAll(filepath.Join(opts.Dir, "consumequeue")); err != nil {
		return "", fmt.Errorf("storage: repair: drop consume queues: %w", err)
	}
	if err := writeCheckpoint(opts.FS, opts.Dir, checkpoint{Flushed: rep.End, Queues: map[string]int64{}}); err != nil {
		return "", err
	}
	return aside, nil
}

// setAsideCheckpoint renames the checkpoint to checkpoint.<why>-<UTC
// time> and returns that name, or "" when there is no checkpoint.
func setAsideCheckpoint(opts Options, why string) (string, error) {
	from := filepath.Join(opts.Dir, checkpointName)
	if _, err := opts.FS.Size(from); errors.Is(err, iofs.ErrNotExist) {
		return "", nil
	}
	name := checkpointName + "." + why + "-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := opts.FS.Rename(from, filepath.Join(opts.Dir, name)); err != nil {
		return "", fmt.Errorf("storage: repair: set the checkpoint aside: %w", err)
	}
	if err := syncDir(opts.FS, opts.Dir); err != nil {
		return "", fmt.Errorf("storage: repair: %w", err)
	}
	return name, nil
}

// isBoundary reports whether off is where a record starts (or the end of
// the last file) when walking the log's files from their starts, and, if
// that record is inside a batch but not its first, where the batch starts
// (else -1).
func isBoundary(files []*mappedFile, off int64) (bool, int64) {
	for _, f := range files {
		if off < f.from || off >= f.from+f.size {
			continue
		}
		batchStart, batchEnd := int64(-1), int64(-1)
		for pos := int64(0); pos < f.size; {
			if f.from+pos == off {
				if f.from+pos < batchEnd {
					return true, batchStart
				}
				return true, -1
			}
			b := f.data[pos:]
			if IsBlank(b) {
				return false, -1
			}
			n, err := checkRecord(b, false)
			if err != nil {
				return false, -1
			}
			if _, bytes, starts, err := batchOf(b, n); err == nil && starts {
				batchStart, batchEnd = f.from+pos, f.from+pos+bytes
			}
			pos += int64(n)
		}
		return false, -1
	}
	last := files[len(files)-1]
	return off == last.from+last.size, -1
}
