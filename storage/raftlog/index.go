package raftlog

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// indexFile is one raft/index/<first index> file: preallocated, mapped,
// units for indexes [first, first+units).
type indexFile struct {
	first uint64
	seg   vfs.Segment
}

// index is the run of index files from the one holding FirstIndex on
// (the first file starts at index 0, whose unit stays zero, until Compact
// moves FirstIndex and drops the files below it).
type index struct {
	fs    vfs.FS
	dir   string
	units uint64 // units per file
	files []*indexFile
	stale []uint64 // files below FirstIndex's that loadIndex skipped
}

// removeStale deletes the files loadIndex skipped below FirstIndex's.
func (x *index) removeStale() error {
	for _, first := range x.stale {
		if err := x.fs.Remove(filepath.Join(x.dir, indexName(first))); err != nil {
			return fmt.Errorf("raftlog: remove a compacted index file: %w", err)
		}
	}
	x.stale = nil
	return nil
}

func indexName(first uint64) string { return fmt.Sprintf("%020d", first) }

// loadIndex maps the contiguous run of index files from the one holding
// index from (FirstIndex) on. Files wholly below it are left over from a
// Compact that a crash stopped before it deleted them: they are skipped
// (stale), and Open deletes them (removeStale); the read-only tools leave
// them.
func loadIndex(fs vfs.FS, dir string, units uint64, from uint64) (*index, error) {
	x := &index{fs: fs, dir: dir, units: units}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	ents, err := fs.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	var firsts []uint64
	for _, e := range ents {
		if e.IsDir || len(e.Name) != 20 {
			continue // .broken copies and the like
		}
		n, err := strconv.ParseUint(e.Name, 10, 64)
		if err != nil {
			continue
		}
		firsts = append(firsts, n)
	}
	slices.Sort(firsts)
	start := from - from%units
	for len(firsts) > 0 && firsts[0] < start {
		x.stale = append(x.stale, firsts[0])
		firsts = firsts[1:]
	}
	for i, first := range firsts {
		if first != start+uint64(i)*units {
			// A file after a gap (or of another unit count) can hold
			// nothing the run before it reaches: leave it, recovery ends
			// the log before the gap.
			break
		}
		seg, err := fs.OpenSegment(filepath.Join(dir, indexName(first)), int64(units*UnitSize))
		if err != nil {
			x.close()
			return nil, fmt.Errorf("raftlog: open index file: %w", err)
		}
		x.files = append(x.files, &indexFile{first: first, seg: seg})
	}
	return x, nil
}

// slot returns the unit bytes of index i, or nil when no file holds it.
func (x *index) slot(i uint64) []byte {
	if len(x.files) == 0 || i < x.files[0].first {
		return nil
	}
	n := (i - x.files[0].first) / x.units
	if n >= uint64(len(x.files)) {
		return nil
	}
	off := (i - x.files[n].first) * UnitSize
	return x.files[n].seg.Bytes()[off : off+UnitSize]
}

// ensure creates files until one holds index i.
func (x *index) ensure(i uint64) ([]byte, error) {
	for x.slot(i) == nil {
		first := i - i%x.units // the first file of a compacted log
		if n := len(x.files); n > 0 {
			if i < x.files[0].first {
				return nil, fmt.Errorf("raftlog: entry %d is below the first index file %d", i, x.files[0].first)
			}
			first = x.files[n-1].first + x.units
		}
		seg, err := x.fs.CreateSegment(filepath.Join(x.dir, indexName(first)), int64(x.units*UnitSize))
		if err != nil {
			return nil, fmt.Errorf("raftlog: create index file: %w", err)
		}
		if err := base.SyncDir(x.fs, x.dir); err != nil {
			seg.Close()
			return nil, fmt.Errorf("raftlog: %w", err)
		}
		x.files = append(x.files, &indexFile{first: first, seg: seg})
	}
	return x.slot(i), nil
}

// sync makes the units of indexes [lo, hi] durable.
func (x *index) sync(lo, hi uint64) error {
	for _, r := range x.syncRanges(lo, hi) {
		if err := r.seg.Sync(r.lo, r.hi); err != nil {
			return fmt.Errorf("raftlog: sync index: %w", err)
		}
	}
	return nil
}

// segRange is a byte range of a mapped file to sync.
type segRange struct {
	seg    vfs.Segment
	lo, hi int64
}

// syncRanges is what sync(lo, hi) msyncs: the units of indexes lo..hi,
// per file.
func (x *index) syncRanges(lo, hi uint64) []segRange {
	var out []segRange
	for _, f := range x.files {
		end := f.first + x.units - 1
		if end < lo || f.first > hi {
			continue
		}
		a, b := max(lo, f.first)-f.first, min(hi, end)-f.first+1
		out = append(out, segRange{f.seg, int64(a * UnitSize), int64(b * UnitSize)})
	}
	return out
}

// zeroFrom clears every unit from index k on, in every file, and syncs
// what it changed. It reports whether any unit was not zero. It reads
// every file's tail whole: recovery and the offline repair use it, where
// anything may lie past the last unit that holds.
func (x *index) zeroFrom(k uint64) (bool, error) {
	return x.zeroRange(k, math.MaxUint64)
}

// zeroRange clears the units from index k to last (inclusive) and syncs
// what it changed; it reports whether any was not zero. A live log's
// truncation passes its last index: units past it are zero already
// (recovery zeroed them, appends write at last+1, a truncation zeroes
// what it drops), and clearing them too would dirty every page of the
// file's unused tail, fault them in and write them back under the Log's
// lock (a follower's truncation held raft's Steps for up to 3.6 s).
func (x *index) zeroRange(k, last uint64) (bool, error) {
	changed := false
	for _, f := range x.files {
		if f.first+x.units <= k || f.first > last {
			continue
		}
		lo := (max(k, f.first) - f.first) * UnitSize
		hi := uint64(len(f.seg.Bytes()))
		if last < f.first+x.units-1 {
			hi = (last - f.first + 1) * UnitSize
		}
		b := f.seg.Bytes()[lo:hi]
		if commitlog.AllZero(b) {
			continue
		}
		changed = true
		clear(b)
		if err := f.seg.Sync(int64(lo), int64(hi)); err != nil {
			return changed, fmt.Errorf("raftlog: sync zeroed index units: %w", err)
		}
	}
	return changed, nil
}

// dropBelow unmaps and deletes the index files wholly below index first
// (Compact), then syncs the directory.
func (x *index) dropBelow(first uint64) error {
	n := 0
	for n < len(x.files) && x.files[n].first+x.units <= first {
		n++
	}
	if n == 0 {
		return nil
	}
	for _, f := range x.files[:n] {
		if err := f.seg.Close(); err != nil {
			return fmt.Errorf("raftlog: close a compacted index file: %w", err)
		}
		if err := x.fs.Remove(filepath.Join(x.dir, indexName(f.first))); err != nil {
			return fmt.Errorf("raftlog: remove a compacted index file: %w", err)
		}
	}
	x.files = append([]*indexFile(nil), x.files[n:]...)
	return base.SyncDir(x.fs, x.dir)
}

func (x *index) close() error {
	var first error
	for _, f := range x.files {
		if err := f.seg.Close(); err != nil && first == nil {
			first = err
		}
	}
	x.files = nil
	return first
}

// lastNonZero is the last unit from index k on that is not all zero,
// if any. It reads each file's range whole first, so a zero tail (what
// every start finds) costs one word-at-a-time pass and no copy.
func (x *index) lastNonZero(k uint64) (uint64, bool) {
	for i := len(x.files) - 1; i >= 0; i-- {
		f := x.files[i]
		if f.first+x.units <= k {
			break
		}
		from := max(k, f.first) - f.first
		b := f.seg.Bytes()[from*UnitSize:]
		if commitlog.AllZero(b) {
			continue
		}
		for u := uint64(len(b)/UnitSize) - 1; ; u-- {
			if !commitlog.AllZero(b[u*UnitSize : (u+1)*UnitSize]) {
				return f.first + from + u, true
			}
		}
	}
	return 0, false
}
