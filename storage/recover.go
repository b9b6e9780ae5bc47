package storage

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
)

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
	return fmt.Sprintf("storage: corrupt record at commitlog offset %d in %s (below the flushed checkpoint %d): %s",
		e.Offset, e.File, e.Flushed, e.Reason)
}

// Unwrap implements errors.Unwrap.
func (e *CorruptionError) Unwrap() error { return ErrCorrupt }

// scanResult is what a commitlog scan found.
type scanResult struct {
	end       int64  // offset just past the last valid record (or blank)
	bad       bool   // the scan stopped at bytes that are not a record
	badReason string // why
	records   int64
	lastTS    int64
}

// scanFrom walks records from offset from (a record boundary, never inside
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
func scanFrom(files []*mappedFile, from int64, requireCRC bool) scanResult {
	r := scanResult{end: from}
	// The batch being walked, if any: where it starts and ends, how many
	// records it declares, and what it has counted so far.
	var (
		inBatch              bool
		bStart, bEnd, bCount int64
		bRecords, bTS        int64
	)
	tornBatch := func(at int64, why string) scanResult {
		r.bad = true
		r.badReason = fmt.Sprintf("torn batch at commitlog offset %d (%d records, %d bytes, ending at %d): at %d: %s",
			bStart, bCount, bEnd-bStart, bEnd, at, why)
		return r // r.end is still bStart
	}
	for _, f := range files {
		if f.from+f.size <= from {
			continue
		}
		pos := max(from-f.from, 0)
		if f.from > r.end { // a file after a gap: nothing valid reaches it
			return r
		}
		for pos < f.size {
			b := f.data[pos:]
			if IsBlank(b) && int64(binary.BigEndian.Uint32(b)) == f.size-pos {
				if inBatch {
					return tornBatch(f.from+pos, "end-of-file blank inside the batch")
				}
				pos = f.size
				r.end = f.from + pos
				break
			}
			n, err := checkRecord(b, requireCRC)
			if err == nil && int64(binary.BigEndian.Uint64(b[posPhysOffset:])) != f.from+pos {
				err = corrupt("PHYSICALOFFSET %d, record lies at %d (stale bytes)", binary.BigEndian.Uint64(b[posPhysOffset:]), f.from+pos)
			}
			var count, bytes int64
			var starts bool
			if err == nil {
				count, bytes, starts, err = batchOf(b, n)
			}
			if err == nil && starts && inBatch {
				err = corrupt("a batch starts inside the batch")
			}
			if err != nil {
				if inBatch {
					return tornBatch(f.from+pos, err.Error())
				}
				r.bad, r.badReason = true, err.Error()
				return r
			}
			at := f.from + pos
			if starts {
				if pos+bytes > f.size {
					r.bad, r.badReason = true, fmt.Sprintf("batch at commitlog offset %d declares %d bytes, past the end of its file", at, bytes)
					return r
				}
				inBatch, bStart, bEnd, bCount, bRecords, bTS = true, at, at+bytes, count, 0, 0
			}
			pos += int64(n)
			if !inBatch {
				r.records++
				r.lastTS = max(r.lastTS, storeTimestampOf(b))
				r.end = f.from + pos
				continue
			}
			bRecords++
			bTS = max(bTS, storeTimestampOf(b))
			switch end := f.from + pos; {
			case end > bEnd:
				return tornBatch(at, "record runs past the batch's end")
			case end == bEnd && bRecords != bCount:
				return tornBatch(at, fmt.Sprintf("%d records where the batch declares %d", bRecords, bCount))
			case end == bEnd:
				inBatch = false
				r.records += bRecords
				r.lastTS = max(r.lastTS, bTS)
				r.end = end
			}
		}
		if inBatch { // cannot happen: a batch's extent lies within its file
			return tornBatch(f.from+f.size, "the file ends inside the batch")
		}
	}
	return r
}

func storeTimestampOf(b []byte) int64 {
	sys := int32(binary.BigEndian.Uint32(b[posSysFlag:]))
	p := posBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	return int64(binary.BigEndian.Uint64(b[p:]))
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
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

// recover finds the end of the valid log, from the checkpoint on.
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
func (s *Store) recover(cp checkpoint) error {
	files := s.queue.snapshot()
	if len(files) == 0 {
		if cp.Flushed > 0 {
			return &CorruptionError{File: "commitlog", Offset: 0, Flushed: cp.Flushed, Reason: "commitlog files are missing"}
		}
		return nil
	}
	first := files[0].from
	start := cp.Flushed - cp.Flushed%s.opts.FileSize
	start = min(start, cp.Dispatched)
	if start < first {
		start = first
	}
	// The start must be a record boundary: the dispatched offset is one;
	// a file start is one.
	r := scanFrom(files, start, !s.opts.DisablePropCRC)
	end := r.end
	if r.bad || end < cp.Flushed {
		if end < cp.Flushed {
			reason := r.badReason
			if reason == "" {
				reason = "the log ends before the flushed offset"
			}
			f := s.queue.findByOffset(end)
			name := "commitlog"
			if f != nil {
				name = "commitlog/" + fileName(f.from)
			}
			return &CorruptionError{File: name, Offset: end, Flushed: cp.Flushed, Reason: reason}
		}
	}
	s.put.lastStoreTS = max(r.lastTS, cp.StoreTime)

	// Cut everything after end.
	var keep []*mappedFile
	for _, f := range files {
		switch {
		case f.from+f.size <= end:
			keep = append(keep, f) // full
		case f.from <= end || len(keep) == 0:
			pos := end - f.from
			if err := s.cutTail(f, pos); err != nil {
				return err
			}
			f.wrote.Store(pos)
			f.flushed.Store(pos)
			keep = append(keep, f)
		default:
			if !allZero(f.data) {
				if err := s.saveBroken(f, 0); err != nil {
					return err
				}
			}
			if err := f.remove(); err != nil {
				return fmt.Errorf("storage: remove commitlog file past the end: %w", err)
			}
		}
	}
	if len(keep) < len(files) {
		if err := syncDir(s.opts.FS, s.dir); err != nil {
			return fmt.Errorf("storage: %w", err)
		}
	}
	s.queue.mu.Lock()
	s.queue.files = keep
	s.queue.mu.Unlock()

	// A process crash leaves unsynced bytes in the page cache; make what
	// survived durable before anything builds on it.
	for _, f := range keep {
		if f.from+f.size <= cp.Flushed {
			continue // durable already
		}
		if err := f.sync(0, min(f.size, max(end-f.from, 0))); err != nil {
			return fmt.Errorf("storage: sync recovered file: %w", err)
		}
	}
	s.queue.flushedWhere.Store(end)
	s.opts.Logger.Info().Int64("from", start).Int64("end", end).Int64("records_checked", r.records).
		Int("files", len(keep)).Msg("storage: commitlog recovered")
	return nil
}

// cutTail handles the bytes of f from pos on: a torn tail if any is
// non-zero (saved, counted, zeroed) or nothing to do.
func (s *Store) cutTail(f *mappedFile, pos int64) error {
	if pos >= f.size || allZero(f.data[pos:]) {
		return nil
	}
	if err := s.saveBroken(f, pos); err != nil {
		return err
	}
	clear(f.data[pos:])
	if err := f.sync(pos, f.size); err != nil {
		return fmt.Errorf("storage: sync zeroed tail: %w", err)
	}
	return nil
}

// saveBroken copies f's bytes from pos to its last non-zero byte into
// commitlog/<offset>.broken for post-mortem, and counts the torn tail.
func (s *Store) saveBroken(f *mappedFile, pos int64) error {
	last := f.size
	for last > pos && f.data[last-1] == 0 {
		last--
	}
	name := fileName(f.from+pos) + ".broken"
	if err := s.opts.FS.WriteFile(filepath.Join(s.dir, name), f.data[pos:last]); err != nil {
		return fmt.Errorf("storage: save torn tail: %w", err)
	}
	s.stats.tornTails.Add(1)
	s.stats.tornBytes.Add(uint64(last - pos))
	s.opts.Logger.Warn().Int64("offset", f.from+pos).Int64("bytes", last-pos).Str("saved_as", "commitlog/"+name).
		Msg("storage: torn tail past the flushed checkpoint cut and zeroed")
	return nil
}
