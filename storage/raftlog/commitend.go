package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// CommitEnd reads, before anything is recovered, the commitlog offset past
// the last DATA entry at or below HardState.Commit in the raft directory
// dir (0 when there is none yet). The store passes max(checkpoint flushed,
// CommitEnd) to commitlog.Recover as the flushed offset, so a damaged
// record of a committed entry is a CorruptionError there and is never cut
// as a torn tail (design §3.4: a replica never truncates acknowledged
// entries). A damaged unit at or below the commit index is a
// *CorruptionError too. indexUnits is Options.IndexUnits (0: read from the first index file).
func CommitEnd(fsys vfs.FS, dir string, indexUnits int) (int64, error) {
	if indexUnits <= 0 {
		indexUnits = detectUnits(fsys, dir)
	}
	b, err := fsys.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, fs.ErrNotExist) {
		// Not bootstrapped, or raft/meta lost: Open tells them apart.
		if held, err := holdsEntries(fsys, dir, indexUnits); err != nil {
			return 0, err
		} else if held {
			return 0, lostMeta("is missing")
		}
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(b)
	var meta Meta
	if !ok || json.Unmarshal(body, &meta) != nil {
		return 0, lostMeta("is damaged")
	}
	hs, found, err := readHardState(fsys, dir)
	if err != nil {
		return 0, err
	}
	lb, err := readBase(fsys, dir, meta)
	if err != nil {
		return 0, err
	}
	if !found {
		if held, err := holdsEntries(fsys, dir, indexUnits); err != nil {
			return 0, err
		} else if held {
			_, serr := fsys.Size(filepath.Join(dir, hardStateName))
			return 0, lostHardState(errors.Is(serr, fs.ErrNotExist))
		}
	}
	if hs.Commit <= lb.Index {
		return lb.DataEnd, nil
	}
	x, err := loadIndex(fsys, filepath.Join(dir, "index"), uint64(indexUnits), lb.Index+1)
	if err != nil {
		return 0, err
	}
	defer x.close()
	for i := hs.Commit; i > lb.Index; i-- {
		b := x.slot(i)
		if b == nil {
			return 0, &base.CorruptionError{File: "raft/index", Reason: fmt.Sprintf("no index file holds committed entry %d (commit %d)", i, hs.Commit)}
		}
		u, err := DecodeUnit(b)
		if err != nil {
			return 0, &base.CorruptionError{File: "raft/index/" + indexName(i-i%x.units),
				Reason: fmt.Sprintf("unit of committed raft entry %d (commit %d): %v", i, hs.Commit, err)}
		}
		if u.Kind == KindData {
			return u.Pos + int64(u.Len), nil
		}
	}
	return lb.DataEnd, nil
}

// SyncedData reads, before anything is recovered, the commitlog extents
// of the DATA entries past HardState.Commit whose units hold, up to the
// first zero unit (a damaged unit is skipped, not an end: recover calls
// it corruption when units that hold follow it). Their bytes were copied
// into the commitlog before their unit was written, so a kill -9 never
// leaves them half copied; commitlog.RecoverGroup cuts damage in them only
// when it is torn by a power cut (an all-zero sector). The extents are
// as many as the uncommitted entries (bounded by raft's
// MaxUncommittedEntriesSize). The 8 B END_OF_FILE blank a synced entry's
// roll wrote counts as synced too.
func SyncedData(fsys vfs.FS, dir string, indexUnits int) (commitlog.Synced, error) {
	if indexUnits <= 0 {
		indexUnits = detectUnits(fsys, dir)
	}
	mb, err := fsys.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(mb)
	var meta Meta
	if !ok || json.Unmarshal(body, &meta) != nil {
		return nil, lostMeta("is damaged")
	}
	lb, err := readBase(fsys, dir, meta)
	if err != nil {
		return nil, err
	}
	dEnd, err := CommitEnd(fsys, dir, indexUnits)
	if err != nil {
		return nil, err
	}
	hsb, err := fsys.ReadFile(filepath.Join(dir, "hardstate"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("raftlog: read hardstate: %w", err)
	}
	hs, _ := decodeHardState(hsb)
	x, err := loadIndex(fsys, filepath.Join(dir, "index"), uint64(indexUnits), lb.Index+1)
	if err != nil {
		return nil, err
	}
	defer x.close()
	type extent struct{ lo, hi int64 }
	var ext []extent
	for i := hs.Commit + 1; ; i++ {
		b := x.slot(i)
		if b == nil {
			break
		}
		u, err := DecodeUnit(b)
		if errors.Is(err, ErrUnitZero) {
			break
		}
		if err != nil || u.Kind != KindData || u.Len == 0 {
			continue
		}
		if u.Flags&FlagBlank != 0 && u.Pos > dEnd {
			// The END_OF_FILE blank before it was written with it.
			ext = append(ext, extent{dEnd, min(dEnd+record.BlankLen, u.Pos)})
		}
		ext = append(ext, extent{u.Pos, u.Pos + int64(u.Len)})
		dEnd = u.Pos + int64(u.Len)
	}
	return func(off int64) (int64, bool) {
		for _, e := range ext {
			if off >= e.lo && off < e.hi {
				return e.hi, true
			}
		}
		return 0, false
	}, nil
}

// detectUnits is the units per index file of the raft dir dir, from the
// size of its first index file (the offline tools do not know the
// IndexUnits the member ran with); DefaultIndexUnits when there is none.
func detectUnits(fsys vfs.FS, dir string) int {
	n, err := fsys.Size(filepath.Join(dir, "index", indexName(0)))
	if err != nil || n <= 0 || n%UnitSize != 0 {
		return DefaultIndexUnits
	}
	return int(n / UnitSize)
}
