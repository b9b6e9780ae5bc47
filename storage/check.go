package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"time"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/raftlog"
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
	l, err := openOffline(opts)
	if err != nil {
		return CheckReport{}, err
	}
	defer l.Close()
	cp, _, err := consumequeue.ReadCheckpoint(opts.FS, opts.Dir)
	var cperr *CheckpointError
	switch {
	case errors.As(err, &cperr):
		cp = consumequeue.Checkpoint{} // the commitlog is still worth checking
	case err != nil:
		return CheckReport{}, err
	}
	files := l.Files().Snapshot()
	rep := CheckReport{Files: len(files), Flushed: cp.Flushed}
	if cperr != nil {
		rep.CheckpointDamage, rep.CheckpointFile = cperr.Reason, cperr.File
	}
	if len(files) == 0 {
		return rep, nil
	}
	r := commitlog.Scan(files, files[0].From(), !opts.DisablePropCRC)
	rep.Records, rep.End = r.Records, r.End
	if r.Bad {
		// Bytes that are zero to the end of the log are its end, not
		// damage: the rest of this file and every later one (the next
		// file is created ahead of need, so a killed server leaves it).
		zero := true
		for _, f := range files {
			if f.End() > r.End {
				zero = zero && commitlog.AllZero(f.Data()[max(r.End-f.From(), 0):])
			}
		}
		if !zero {
			rep.Damage, rep.DamageOffset = r.BadReason, r.End
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
	if IsReplicaDir(opts) {
		return fmt.Errorf("%w: repair: the data dir belongs to a member of a replication group (it has raft/meta): cutting "+
			"its log would drop entries it may have acknowledged, and the group could lose them; fetch the damaged entries "+
			"from another member instead (storaged replica repair --from ID=HOST:PORT)", ErrGroupUnsupported)
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
	l, err := openOffline(opts)
	if err != nil {
		return err
	}
	defer l.Close()
	files := l.Files().Snapshot()
	if len(files) == 0 {
		return fmt.Errorf("storage: repair: no commitlog files")
	}
	if truncateAt > rep.End || truncateAt < files[0].From() {
		return fmt.Errorf("storage: repair: offset %d is outside the valid log [%d, %d]", truncateAt, files[0].From(), rep.End)
	}
	ok, batchStart := commitlog.IsBoundary(files, truncateAt)
	switch {
	case !ok:
		return fmt.Errorf("storage: repair: offset %d is not a record boundary", truncateAt)
	case batchStart >= 0: // cutting there would leave part of a batch
		return fmt.Errorf("storage: repair: offset %d is inside the batch that starts at %d: cut at %d to drop the whole batch",
			truncateAt, batchStart, batchStart)
	}
	if err := l.Cut(truncateAt); err != nil {
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
	return consumequeue.WriteCheckpoint(opts.FS, opts.Dir, consumequeue.Checkpoint{Flushed: truncateAt, Dispatched: 0, Queues: map[string]int64{}})
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
	l, err := openOffline(opts)
	if err != nil {
		return "", err
	}
	defer l.Close()
	// What the new checkpoint calls flushed must be durable: after a
	// kill -9 the page cache may hold bytes never synced.
	if err := l.SyncAll(); err != nil {
		return "", fmt.Errorf("storage: repair: %w", err)
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
	// A group member's checkpoint must never call flushed what a new leader
	// may still truncate (design §3.6): its flushed offset is the commit
	// end of its raft log, not the end of the valid commitlog.
	flushed := rep.End
	if IsReplicaDir(opts) {
		ce, err := raftlog.CommitEnd(opts.FS, filepath.Join(opts.Dir, "raft"), 0)
		if err != nil {
			return "", err
		}
		flushed = min(flushed, ce)
	}
	if err := consumequeue.WriteCheckpoint(opts.FS, opts.Dir, consumequeue.Checkpoint{Flushed: flushed, Queues: map[string]int64{}}); err != nil {
		return "", err
	}
	return aside, nil
}

// setAsideCheckpoint renames the checkpoint to checkpoint.<why>-<UTC
// time> and returns that name, or "" when there is no checkpoint.
func setAsideCheckpoint(opts Options, why string) (string, error) {
	from := filepath.Join(opts.Dir, consumequeue.CheckpointName)
	if _, err := opts.FS.Size(from); errors.Is(err, iofs.ErrNotExist) {
		return "", nil
	}
	name := consumequeue.CheckpointName + "." + why + "-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := opts.FS.Rename(from, filepath.Join(opts.Dir, name)); err != nil {
		return "", fmt.Errorf("storage: repair: set the checkpoint aside: %w", err)
	}
	if err := base.SyncDir(opts.FS, opts.Dir); err != nil {
		return "", fmt.Errorf("storage: repair: %w", err)
	}
	return name, nil
}

// openOffline maps the commitlog of opts.Dir for the offline tools; the
// caller holds the data dir lock.
func openOffline(opts Options) (*commitlog.Log, error) {
	// A group member stopped in the middle of a snapshot install: its
	// commitlog is half old, half the snapshot's until a start finishes it.
	if _, err := opts.FS.Size(filepath.Join(opts.Dir, installJournal)); err == nil {
		return nil, fmt.Errorf("%w (%s in %s)", ErrInstallPending, installJournal, opts.Dir)
	}
	return commitlog.Open(commitlog.Options{FS: opts.FS, Dir: filepath.Join(opts.Dir, "commitlog"), FileSize: opts.FileSize,
		RequireCRC: !opts.DisablePropCRC, Clock: opts.Clock, Logger: opts.Logger,
		Throttle: logthrottle.New(logthrottle.DefaultInterval, nil)})
}

// IsReplicaDir reports whether the data dir in opts.Dir belongs to a
// replication group member: it has raft/meta, whatever its state, or a
// raft directory at all (a member whose raft/meta was lost is still one,
// and `storaged replica repair` rebuilds it).
func IsReplicaDir(opts Options) bool {
	opts = opts.withDefaults()
	if _, err := opts.FS.Size(filepath.Join(opts.Dir, "raft", "meta")); err == nil {
		return true
	}
	_, err := opts.FS.ReadDir(filepath.Join(opts.Dir, "raft"))
	return err == nil
}
