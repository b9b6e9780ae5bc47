package commitlog

import (
	"encoding/binary"
	"fmt"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
)

// ScanResult is what a commitlog scan found.
type ScanResult struct {
	From      int64  // where the scan started: every record from here to End was checked in full
	End       int64  // offset just past the last valid record (or blank)
	Bad       bool   // the scan stopped at bytes that are not a record
	BadReason string // why
	Records   int64
	LastTS    int64 // the newest store time seen
}

// Scan walks records from offset from (a record boundary, never inside
// a batch: see checkpoint) across the given files, checking each one
// completely, and stops at the first bytes that are not a valid record or
// blank.
//
// A batch counts only whole: from a record that carries PropertyBatch to
// the batch's declared end, every record must be valid and none may start
// another batch, the last must end exactly there and their number must be
// the declared count. Otherwise the batch is torn (a crash stopped its
// copy into the page cache, or a power cut kept only some of its
// sectors): the scan stops at the batch's first record, and what follows
// is handled as any torn tail.
func Scan(files []*segment.File, from int64, requireCRC bool) ScanResult {
	r := ScanResult{From: from, End: from}
	// The batch being walked, if any: where it starts and ends, how many
	// records it declares, and what it has counted so far.
	var (
		inBatch              bool
		bStart, bEnd, bCount int64
		bRecords, bTS        int64
	)
	tornBatch := func(at int64, why string) ScanResult {
		r.Bad = true
		r.BadReason = fmt.Sprintf("torn batch at commitlog offset %d (%d records, %d bytes, ending at %d): at %d: %s",
			bStart, bCount, bEnd-bStart, bEnd, at, why)
		return r // r.End is still bStart
	}
	for _, f := range files {
		if f.End() <= from {
			continue
		}
		pos := max(from-f.From(), 0)
		if f.From() > r.End { // a file after a gap: nothing valid reaches it
			return r
		}
		for pos < f.Size() {
			b := f.Data()[pos:]
			if record.IsBlank(b) && int64(binary.BigEndian.Uint32(b)) == f.Size()-pos {
				if inBatch {
					return tornBatch(f.From()+pos, "end-of-file blank inside the batch")
				}
				pos = f.Size()
				r.End = f.From() + pos
				break
			}
			h, err := record.CheckFrame(b, requireCRC) // Check's checks, reading only what the scan needs
			if err == nil && h.PhysOffset != f.From()+pos {
				err = record.Corrupt("PHYSICALOFFSET %d, record lies at %d (stale bytes)", h.PhysOffset, f.From()+pos)
			}
			var count, bytes int64
			var starts bool
			if err == nil {
				count, bytes, starts, err = h.Batch()
			}
			if err == nil && starts && inBatch {
				err = record.Corrupt("a batch starts inside the batch")
			}
			n := int(h.Total)
			if err != nil {
				if inBatch {
					return tornBatch(f.From()+pos, err.Error())
				}
				r.Bad, r.BadReason = true, err.Error()
				return r
			}
			at := f.From() + pos
			if starts {
				if pos+bytes > f.Size() {
					r.Bad, r.BadReason = true, fmt.Sprintf("batch at commitlog offset %d declares %d bytes, past the end of its file", at, bytes)
					return r
				}
				inBatch, bStart, bEnd, bCount, bRecords, bTS = true, at, at+bytes, count, 0, 0
			}
			pos += int64(n)
			if !inBatch {
				r.Records++
				r.LastTS = max(r.LastTS, h.StoreTS)
				r.End = f.From() + pos
				continue
			}
			bRecords++
			bTS = max(bTS, h.StoreTS)
			switch end := f.From() + pos; {
			case end > bEnd:
				return tornBatch(at, "record runs past the batch's end")
			case end == bEnd && bRecords != bCount:
				return tornBatch(at, fmt.Sprintf("%d records where the batch declares %d", bRecords, bCount))
			case end == bEnd:
				inBatch = false
				r.Records += bRecords
				r.LastTS = max(r.LastTS, bTS)
				r.End = end
			}
		}
		if inBatch { // cannot happen: a batch's extent lies within its file
			return tornBatch(f.End(), "the file ends inside the batch")
		}
	}
	return r
}

// allZero reports whether b holds only zero bytes.
func AllZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Recover finds the end of the valid log, from the checkpoint on, cuts
// what lies past it, and returns what the scan found (End, LastTS).
//
// The scan starts at the checkpoint's dispatched offset or the start of the
// file holding its flushed offset, whichever is lower, and checks every
// record in full (magic, sizes, body CRC, whole-record CRC, PHYSICALOFFSET
// equal to where it lies, so stale bytes from an earlier truncation never
// pass). Where it stops:
//
//   - below the flushed offset, the damaged bytes were acknowledged durable:
//     Open fails with a *CorruptionError naming file and offset;
//   - at or past it, it is a torn tail: the bytes from there to the last
//     non-zero byte of the file are kept in commitlog/<offset>.broken, the
//     rest of the file is zeroed (stale bytes must never look valid
//     again), and files after it are deleted.
//
// A batch that is not whole (scanFrom) stops the scan at its first record,
// so a torn batch is cut as one torn tail: none of it is served, its
// consume-queue entries (all at or past the new end) are dropped by
// loadQueues and rebuildQueues, and the next put reuses its queue offsets.
// A torn batch starting below the flushed offset is a CorruptionError like
// any damaged acknowledged record: the flushed offset never splits a batch
// (see checkpoint), so such a batch was wholly durable once.
//
// What survived is synced, so it counts as durable from now on.
func (l *Log) Recover(flushed, dispatched int64) (ScanResult, error) {
	return l.recover(flushed, dispatched, nil)
}

// SectorSize is the unit of atomic writes the torn-write rule assumes
// (etcd's wal minSectorSize): a power cut leaves each 512 B sector of a
// page either old or new.
const SectorSize = 512

// Synced says whether commitlog offset off lies inside bytes a replica
// wrote and vouched for (a raft index unit that holds: its entry's bytes
// were copied before the unit was written), and where those bytes end.
type Synced func(off int64) (end int64, ok bool)

// RecoverGroup is Recover for a replica of a raft group (design
// replication.md §3.4): past the flushed offset too, a bad record is cut
// as a torn tail only if it is torn. It is corruption, a
// *CorruptionError, when synced vouches for the bytes at the scan's stop
// (a raft unit that holds was written after them, so a kill -9 did not
// interrupt their copy) and no 512 B sector of them, from there to the
// end synced gives, is all zero (a power cut leaves unwritten sectors
// zero: the log's files are zero before they are written, and truncation
// zeroes and syncs). A replica that cut such bytes could forget an entry
// it acknowledged and vote for a leader lacking it.
func (l *Log) RecoverGroup(flushed, dispatched int64, synced Synced) (ScanResult, error) {
	return l.recover(flushed, dispatched, synced)
}

// HasZeroSector reports whether b, which starts at file offset off, has a
// sector-aligned chunk (or the partial chunk at either end) of only zero
// bytes: etcd's isTornEntry rule.
func HasZeroSector(b []byte, off int64) bool {
	for len(b) > 0 {
		n := min(int64(len(b)), SectorSize-off%SectorSize)
		if AllZero(b[:n]) {
			return true
		}
		b, off = b[n:], off+n
	}
	return false
}

func (l *Log) recover(flushed, dispatched int64, synced Synced) (ScanResult, error) {
	files := l.list.Snapshot()
	if len(files) == 0 {
		if flushed > 0 {
			return ScanResult{}, &base.CorruptionError{File: "commitlog", Offset: 0, Flushed: flushed, Reason: "commitlog files are missing"}
		}
		return ScanResult{}, nil
	}
	first := files[0].From()
	start := flushed - flushed%l.opts.FileSize
	start = min(start, dispatched)
	if start < first {
		start = first
	}
	// The start must be a record boundary: the dispatched offset is one;
	// a file start is one.
	r := Scan(files, start, l.opts.RequireCRC)
	end := r.End
	if end < flushed {
		reason := r.BadReason
		if reason == "" {
			reason = "the log ends before the flushed offset"
		}
		name := "commitlog"
		if f := l.list.Find(end); f != nil {
			name = "commitlog/" + f.Name()
		}
		return r, &base.CorruptionError{File: name, Offset: end, Flushed: flushed, Reason: reason}
	}
	if r.Bad && synced != nil {
		if err := l.checkTorn(r, synced, flushed); err != nil {
			return r, err
		}
	}
	keep, err := l.cutAfter(files, end, l.opts.ClosedCleanly)
	if err != nil {
		return r, err
	}
	// A process crash leaves unsynced bytes in the page cache; make what
	// survived durable before anything builds on it.
	for _, f := range keep {
		if f.End() <= flushed {
			continue // durable already
		}
		if err := f.Sync(0, min(f.Size(), max(end-f.From(), 0))); err != nil {
			return r, fmt.Errorf("storage: sync recovered file: %w", err)
		}
	}
	l.list.Replace(keep, end)
	l.opts.Logger.Info().Int64("from", start).Int64("end", end).Int64("records_checked", r.Records).
		Int("files", len(keep)).Bool("tail_trusted", l.tailTrusted.Load()).Msg("storage: commitlog recovered")
	return r, nil
}

// cutAfter cuts files at end: files wholly below it are kept, the one
// holding it is cut there (its torn tail saved and zeroed), later ones are
// saved if not zero and deleted. It returns the files kept. trust: the
// last run closed cleanly (cutTail).
func (l *Log) cutAfter(files []*segment.File, end int64, trust bool) ([]*segment.File, error) {
	var keep []*segment.File
	for _, f := range files {
		switch {
		case f.End() <= end:
			keep = append(keep, f) // full
		case f.From() <= end || len(keep) == 0:
			pos := end - f.From()
			if err := l.cutTail(f, pos, trust); err != nil {
				return nil, err
			}
			f.SetPositions(pos, pos)
			keep = append(keep, f)
		default:
			if zero, end := zeroFrom(f, 0); !zero {
				if _, err := l.saveBroken(f, 0, end); err != nil {
					return nil, err
				}
			}
			if err := f.Remove(); err != nil {
				return nil, fmt.Errorf("storage: remove commitlog file past the end: %w", err)
			}
		}
	}
	if len(keep) < len(files) {
		if err := base.SyncDir(l.opts.FS, l.opts.Dir); err != nil {
			return nil, fmt.Errorf("storage: %w", err)
		}
	}
	return keep, nil
}

// cutTail handles the bytes of f from pos on: a torn tail if any is
// non-zero (saved, counted, zeroed up to its last non-zero byte: the rest
// is zero) or nothing to do. Either way the check read the tail's data
// through the mapping (zeroFrom), and the kernel's readahead left it in
// large folios; they are evicted, so that the
// allocator populates the tail page by page and a put's sync writes its
// own pages, not megabytes around them (vfs.Segment.Evict).
//
// After a clean close (trust: Options.ClosedCleanly, at Recover) only
// the rest of the page holding pos is read, which the scan that found
// pos has just faulted in: zero there, the tail is trusted without
// reading it; anything else there is not what a clean close leaves, and
// the whole tail is checked as after a crash.
func (l *Log) cutTail(f *segment.File, pos int64, trust bool) error {
	if pos >= f.Size() {
		return nil
	}
	if trust && AllZero(f.Data()[pos:min(pos-pos%segment.PageSize+segment.PageSize, f.Size())]) {
		l.tailTrusted.Store(true)
		return nil
	}
	defer f.Evict(pos, f.Size())
	zero, end := zeroFrom(f, pos)
	if zero {
		return nil
	}
	last, err := l.saveBroken(f, pos, end)
	if err != nil {
		return err
	}
	clear(f.Data()[pos:last])
	if err := f.Sync(pos, last); err != nil {
		return fmt.Errorf("storage: sync zeroed tail: %w", err)
	}
	return nil
}

// zeroFrom reports whether f holds only zeros from pos on. It reads only
// the ranges the file system says may hold data (segment.File.DataRanges):
// past the end, most of a file was never written (the allocator populates
// 128 MiB ahead of the writer), and reading all of a 1 GiB file's tail
// through the mapping took 1.8-2.5 s of every restart after a crash
// (BENCHMARKS.md "Recovery reads only what was written"). end is where
// the last of those ranges ends (pos if there is none): nothing past it
// can be other than zero.
func zeroFrom(f *segment.File, pos int64) (zero bool, end int64) {
	rs := f.DataRanges(pos, f.Size())
	end = pos
	if len(rs) > 0 {
		end = rs[len(rs)-1].Hi
	}
	for _, r := range rs {
		if !AllZero(f.Data()[r.Lo:r.Hi]) {
			return false, end
		}
	}
	return true, end
}

// saveBroken copies f's bytes from pos to its last non-zero byte into
// commitlog/<offset>.broken for post-mortem, and counts the torn tail. It
// returns the offset in f past that byte; the search for it starts at end,
// past which f is zero (zeroFrom's).
func (l *Log) saveBroken(f *segment.File, pos, end int64) (int64, error) {
	data := f.Data()
	last := end
	for last > pos && data[last-1] == 0 {
		last--
	}
	name := segment.FileName(f.From()+pos) + ".broken"
	if err := l.opts.FS.WriteFile(filepath.Join(l.opts.Dir, name), data[pos:last]); err != nil {
		return 0, fmt.Errorf("storage: save torn tail: %w", err)
	}
	l.tornTails.Add(1)
	l.tornBytes.Add(uint64(last - pos))
	l.opts.Logger.Warn().Int64("offset", f.From()+pos).Int64("bytes", last-pos).Str("saved_as", "commitlog/"+name).
		Msg("storage: torn tail past the flushed checkpoint cut and zeroed")
	return last, nil
}

// Cut removes everything from commitlog offset off on, offline (storaged
// repair --truncate-at): the bytes there are kept in
// commitlog/<offset>.broken, zeroed, and later files are deleted. off must
// be a record boundary (IsBoundary).
func (l *Log) Cut(off int64) error {
	keep, err := l.cutAfter(l.list.Snapshot(), off, false)
	if err != nil {
		return err
	}
	l.list.Replace(keep, min(l.list.Flushed(), off))
	return base.SyncDir(l.opts.FS, l.opts.Dir)
}

// SyncAll makes every byte of every file durable (offline repair: after a
// kill -9 the page cache may hold bytes never synced).
func (l *Log) SyncAll() error {
	for _, f := range l.list.Snapshot() {
		if err := f.Sync(0, f.Size()); err != nil {
			return err
		}
	}
	return nil
}

// IsBoundary reports whether off is where a record starts (or the end of
// the last file) when walking the log's files from their starts, and, if
// that record is inside a batch but not its first, where the batch starts
// (else -1).
func IsBoundary(files []*segment.File, off int64) (bool, int64) {
	for _, f := range files {
		if off < f.From() || off >= f.End() {
			continue
		}
		batchStart, batchEnd := int64(-1), int64(-1)
		data := f.Data()
		for pos := int64(0); pos < f.Size(); {
			if f.From()+pos == off {
				if f.From()+pos < batchEnd {
					return true, batchStart
				}
				return true, -1
			}
			b := data[pos:]
			if record.IsBlank(b) {
				return false, -1
			}
			h, err := record.CheckFrame(b, false)
			if err != nil {
				return false, -1
			}
			if _, bytes, starts, err := h.Batch(); err == nil && starts {
				batchStart, batchEnd = f.From()+pos, f.From()+pos+bytes
			}
			pos += int64(h.Total)
		}
		return false, -1
	}
	last := files[len(files)-1]
	return off == last.End(), -1
}

// checkTorn refuses to cut the bad bytes at r.End when they are synced
// and not torn (RecoverGroup).
func (l *Log) checkTorn(r ScanResult, synced Synced, flushed int64) error {
	hi, ok := synced(r.End)
	if !ok {
		return nil // no unit vouches for them: their copy may have been cut short
	}
	f := l.list.Find(r.End)
	if f == nil {
		return nil
	}
	pos := r.End - f.From()
	n := min(hi-r.End, f.Size()-pos)
	if n <= 0 || HasZeroSector(f.Data()[pos:pos+n], pos) {
		return nil
	}
	return &base.CorruptionError{File: "commitlog/" + f.Name(), Offset: r.End, Flushed: flushed,
		Reason: fmt.Sprintf("%s; past the commit point, but a raft index unit vouches for the %d bytes from here and "+
			"no 512 B sector of them is zero, so this is damage to synced data, not a torn write: a replica must not cut "+
			"entries it may have acknowledged (storaged replica repair --from PEER fetches them)", r.BadReason, n)}
}
