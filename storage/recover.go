package storage

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// recover finds the end of the valid log and rebuilds the in-memory state
// from it: write and flush positions, the topic-queue table and the last
// store time. Each record is checked (magic, sizes, body CRC, whole-record
// CRC, and that its PHYSICALOFFSET is where it lies, so stale bytes from an
// earlier truncation can never pass: RocketMQ #10017). Bytes after the end
// are zeroed so they can never look valid again, files that start after it
// are deleted, and the recovered data is synced so it counts as durable.
func (s *Store) recover() error {
	files := s.queue.snapshot()
	if len(files) == 0 {
		return nil
	}
	end := files[0].from
	keep := len(files) // files[keep:] start after the end and are deleted
scan:
	for i, f := range files {
		pos := int64(0)
		for pos < f.size {
			b := f.data[pos:]
			if IsBlank(b) && int64(binary.BigEndian.Uint32(b)) == f.size-pos {
				pos = f.size
				end = f.from + pos
				continue
			}
			n, err := checkRecord(b, !s.opts.DisablePropCRC)
			if err != nil || int64(binary.BigEndian.Uint64(b[posPhysOffset:])) != f.from+pos {
				keep = i + 1
				break scan
			}
			s.applyRecovered(b[:n])
			pos += int64(n)
			end = f.from + pos
		}
		keep = i + 1
	}
	// A file that starts exactly at the end (the previous one is full) is
	// kept as the empty last file; later ones go.
	for keep < len(files) && files[keep].from <= end && end < files[keep].from+files[keep].size {
		keep++
	}
	for _, f := range files[keep:] {
		if err := f.remove(); err != nil {
			return fmt.Errorf("storage: remove commitlog file past the end: %w", err)
		}
	}
	if keep < len(files) {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("storage: %w", err)
		}
	}
	s.queue.mu.Lock()
	s.queue.files = files[:keep:keep]
	s.queue.mu.Unlock()

	for _, f := range files[:keep] {
		pos := end - f.from
		if pos >= f.size {
			continue // full
		}
		if pos < 0 {
			pos = 0
		}
		if err := zeroTail(f, pos); err != nil {
			return err
		}
		f.wrote.Store(pos)
		f.flushed.Store(pos)
	}
	// Whatever survived may still sit only in the page cache (a process
	// crash keeps it there); make it durable before anything builds on it.
	for _, f := range files[:keep] {
		if err := unix.Msync(f.data, unix.MS_SYNC); err != nil {
			return fmt.Errorf("storage: sync recovered file %s: %w", fileName(f.from), err)
		}
	}
	s.queue.flushedWhere.Store(end)
	s.opts.Logger.Info().Int64("end", end).Int("files", keep).Msg("storage: commitlog recovered")
	return nil
}

// applyRecovered folds one valid record into the topic-queue table and the
// last store time.
func (s *Store) applyRecovered(b []byte) {
	be := binary.BigEndian
	sys := int32(be.Uint32(b[posSysFlag:]))
	p := posBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	storeTS := int64(be.Uint64(b[p:]))
	if storeTS > s.put.lastStoreTS {
		s.put.lastStoreTS = storeTS
	}
	tx := sys & transactionMask
	if tx != TransactionNotType && tx != TransactionCommitType {
		return
	}
	p += 8 + 8 + 4 + 8
	if sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	p += int(be.Uint32(b[p:])) + 4 // body
	var topicLen int
	if be.Uint32(b[posMagic:]) == MagicV2 {
		topicLen = int(be.Uint16(b[p:]))
		p += 2
	} else {
		topicLen = int(b[p])
		p++
	}
	key := queueKey{string(b[p : p+topicLen]), int32(be.Uint32(b[posQueueID:]))}
	next := int64(be.Uint64(b[posQueueOffset:])) + 1
	if next > s.put.topicQueue[key] {
		s.put.topicQueue[key] = next
	}
}

// zeroTail zeroes f from pos to its end, touching only pages that are not
// already zero, so a long-preallocated file costs a read, not a write.
func zeroTail(f *mappedFile, pos int64) error {
	dirty := false
	for p := pos; p < f.size; {
		next := (p/pageSize + 1) * pageSize
		if next > f.size {
			next = f.size
		}
		page := f.data[p:next]
		for _, c := range page {
			if c != 0 {
				clear(page)
				dirty = true
				break
			}
		}
		p = next
	}
	if !dirty {
		return nil
	}
	start := pos &^ (pageSize - 1)
	if err := unix.Msync(f.data[start:], unix.MS_SYNC); err != nil {
		return fmt.Errorf("storage: sync zeroed tail of %s: %w", fileName(f.from), err)
	}
	return nil
}
