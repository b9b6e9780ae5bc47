package storage

import (
	"fmt"
	"path/filepath"
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
	if err != nil {
		return CheckReport{}, err
	}
	files := q.snapshot()
	rep := CheckReport{Files: len(files), Flushed: cp.Flushed}
	if len(files) == 0 {
		return rep, nil
	}
	r := scanFrom(files, files[0].from, !opts.DisablePropCRC)
	rep.Records, rep.End = r.records, r.end
	if r.bad {
		f := q.findByOffset(r.end)
		// Bytes that are zero to the end of the log are its end, not damage.
		if f != nil && !(allZero(f.data[r.end-f.from:]) && f == files[len(files)-1]) {
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
	if !isBoundary(files, truncateAt) {
		return fmt.Errorf("storage: repair: offset %d is not a record boundary", truncateAt)
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
	if err := opts.FS.RemoveAll(filepath.Join(opts.Dir, "consumequeue")); err != nil {
		return fmt.Errorf("storage: repair: drop consume queues: %w", err)
	}
	return writeCheckpoint(opts.FS, opts.Dir, checkpoint{Flushed: truncateAt, Dispatched: 0, Queues: map[string]int64{}})
}

// isBoundary reports whether off is where a record starts (or the end of
// the last file) when walking the log's files from their starts.
func isBoundary(files []*mappedFile, off int64) bool {
	for _, f := range files {
		if off < f.from || off >= f.from+f.size {
			continue
		}
		for pos := int64(0); pos < f.size; {
			if f.from+pos == off {
				return true
			}
			b := f.data[pos:]
			if IsBlank(b) {
				return false
			}
			n, err := checkRecord(b, false)
			if err != nil {
				return false
			}
			pos += int64(n)
		}
		return false
	}
	last := files[len(files)-1]
	return off == last.from+last.size
}
