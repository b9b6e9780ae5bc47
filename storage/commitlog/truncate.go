package commitlog

import (
	"fmt"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
)

// TruncateAfter removes every byte of the log from commitlog offset off on,
// durably: the file holding off is zeroed from there to its written end
// (and synced; past that end it is zero already), later
// files are deleted (and the directory synced), and the written and durable
// ends move back to off. Appends after it continue at off. It is how a
// replica drops an uncommitted suffix that its leader's log does not have
// (design §2.3); the consume queues and sequencing built on the removed
// records are the caller's to roll back.
//
// off must be a record boundary at or above MinOffset and at or below
// MaxOffset (REQUIRES: the caller knows the boundaries, as a Raft side
// index does); the log does not walk the file to prove it. It waits for
// the append in progress and holds off new ones while it runs; readers of
// the removed range must be stopped by the caller (it never unmaps a file
// a reader holds: later files are unmapped under the read guard).
func (l *Log) TruncateAfter(off int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return base.ErrClosed
	}
	lo, hi := l.list.MinOffset(), l.list.MaxOffset()
	if off < lo || off > hi {
		return fmt.Errorf("storage: truncate at %d: outside the log [%d, %d]", off, lo, hi)
	}
	if off == hi {
		return nil
	}
	files := l.list.Snapshot()
	var keep, gone []*segment.File
	for _, f := range files {
		switch {
		case f.End() <= off:
			keep = append(keep, f)
		case f.From() <= off || len(keep) == 0:
			pos := off - f.From()
			// Only the written bytes are cleared: past Wrote the file is
			// zero (recovery proved or made its tail zero, appends write
			// at Wrote, a truncation zeroes what it drops). Clearing the
			// whole rest of a 1 GiB file dirtied every page of it, and
			// its sync wrote them all back with the append lock held
			// (BENCHMARKS.md "A truncation that wrote a file of zeros").
			wrote := max(f.Wrote(), pos)
			// Unpublish first, so no reader of the written end starts on
			// bytes about to be zeroed.
			f.SetPositions(pos, min(f.Flushed(), pos))
			clear(f.Data()[pos:wrote])
			if err := f.Sync(pos, wrote); err != nil {
				return fmt.Errorf("storage: truncate: sync zeroed tail: %w", err)
			}
			keep = append(keep, f)
		default:
			gone = append(gone, f)
		}
	}
	flushed := min(l.list.Flushed(), off)
	l.list.Replace(keep, flushed)
	l.file = nil
	// A file the allocator prepared past the new end must go too (and
	// durably): left on disk it would sit past a gap once the end moved
	// back, and Load refuses a gap.
	next := int64(0)
	if last := l.list.Last(); last != nil {
		next = last.End()
	}
	discarded, err := l.list.DiscardPrepared(next)
	if err != nil {
		return fmt.Errorf("storage: truncate: discard the prepared file: %w", err)
	}
	if len(gone) > 0 || discarded {
		if err := l.list.Unmap(gone); err != nil {
			return fmt.Errorf("storage: truncate: %w", err)
		}
		for _, f := range gone {
			if err := l.opts.FS.Remove(f.Path()); err != nil {
				return fmt.Errorf("storage: truncate: remove %s: %w", f.Name(), err)
			}
		}
		if err := base.SyncDir(l.opts.FS, l.opts.Dir); err != nil {
			return fmt.Errorf("storage: truncate: %w", err)
		}
	}
	if last := l.list.Last(); last != nil {
		l.prepareNext(last, 0)
	}
	return nil
}

// Rewrite copies b over the bytes at off, inside one file, and syncs
// them: offline repair of a replica (raftlog.Repair) puts back the bytes
// of damaged entries fetched from a peer, byte-identical by raft's Log
// Matching. Nothing else may use the log meanwhile.
func (l *Log) Rewrite(off int64, b []byte) error {
	f := l.list.Find(off)
	if f == nil {
		return fmt.Errorf("storage: rewrite at %d: no commitlog file holds it", off)
	}
	pos := off - f.From()
	if pos+int64(len(b)) > f.Size() {
		return fmt.Errorf("storage: rewrite %d bytes at %d: past the end of %s", len(b), off, f.Name())
	}
	copy(f.Data()[pos:], b)
	if err := f.Sync(pos, pos+int64(len(b))); err != nil {
		return fmt.Errorf("storage: rewrite at %d: %w", off, err)
	}
	return nil
}

// Install replaces the whole log with a snapshot's files (design
// replication.md §3.5): swap moves them into the directory and deletes
// every other commitlog file, durably; end is the snapshot's commit end,
// where the next append goes (its bytes were synced before the swap).
// Appends wait meanwhile, no reader is inside a file while the files
// change (segment.List.Reload), and a file the allocator prepared for the
// old end is discarded first. An error leaves the log unusable: the
// caller must stop, and a restart finishes the install.
func (l *Log) Install(swap func() error, end int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return base.ErrClosed
	}
	if _, err := l.list.DiscardPrepared(-1); err != nil {
		return fmt.Errorf("storage: install: discard the prepared file: %w", err)
	}
	l.file = nil
	if err := l.list.Reload(swap, end); err != nil {
		return fmt.Errorf("storage: install the snapshot's files: %w", err)
	}
	last := l.list.Last()
	if !last.Full() {
		l.list.Adopt(last)
	}
	l.prepareNext(last, 0)
	return nil
}
