package raftlog

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// indexFile is one raft/index/<first index> file: preallocated, mapped,
// units for indexes [first, first+units).
type indexFile struct {
	first uint64
	seg   vfs.Segment
}

// index is the run of index files. The first file starts at index 0,
// whose unit stays zero: the base (FirstIndex-1, term 0) until snapshots
// move FirstIndex.
type index struct {
	fs    vfs.FS
	dir   string
	units uint64 // units per file
	files []*indexFile
}

func indexName(first uint64) string { return fmt.Sprintf("%020d", first) }

func loadIndex(fs vfs.FS, dir string, units uint64) (*index, error) {
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
	for i, first := range firsts {
		if first != uint64(i)*units {
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
	n := i / x.units
	if n >= uint64(len(x.files)) {
		return nil
	}
	off := (i - x.files[n].first) * UnitSize
	return x.files[n].seg.Bytes()[off : off+UnitSize]
}

// ensure creates files until one holds index i.
func (x *index) ensure(i uint64) ([]byte, error) {
	for uint64(len(x.files)) <= i/x.units {
		first := uint64(len(x.files)) * x.units
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
	for _, f := range x.files {
		end := f.first + x.units - 1
		if end < lo || f.first > hi {
			continue
		}
		a, b := max(lo, f.first)-f.first, min(hi, end)-f.first+1
		if err := f.seg.Sync(int64(a*UnitSize), int64(b*UnitSize)); err != nil {
			return fmt.Errorf("raftlog: sync index: %w", err)
		}
	}
	return nil
}

// zeroFrom clears every unit from index k on, in every file, and syncs
// what it changed. It reports whether any unit was not zero.
func (x *index) zeroFrom(k uint64) (bool, error) {
	changed := false
	for _, f := range x.files {
		if f.first+x.units <= k {
			continue
		}
		b := f.seg.Bytes()[(max(k, f.first)-f.first)*UnitSize:]
		if allZero(b) {
			continue
		}
		changed = true
		clear(b)
		if err := f.seg.Sync(int64(len(f.seg.Bytes())-len(b)), int64(len(f.seg.Bytes()))); err != nil {
			return changed, fmt.Errorf("raftlog: sync zeroed index units: %w", err)
		}
	}
	return changed, nil
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

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
