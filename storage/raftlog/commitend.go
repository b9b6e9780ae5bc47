package raftlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// CommitEnd reads, before anything is recovered, the commitlog offset past
// the last DATA entry at or below HardState.Commit in the raft directory
// dir (0 when there is none yet). The store passes max(checkpoint flushed,
// CommitEnd) to commitlog.Recover as the flushed offset, so a damaged
// record of a committed entry is a CorruptionError there and is never cut
// as a torn tail (design §3.4: a replica never truncates acknowledged
// entries). A damaged unit at or below the commit index is a
// *CorruptionError too. indexUnits is Options.IndexUnits (0: the default).
func CommitEnd(fsys vfs.FS, dir string, indexUnits int) (int64, error) {
	if indexUnits <= 0 {
		indexUnits = DefaultIndexUnits
	}
	b, err := fsys.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // not bootstrapped
	}
	if err != nil {
		return 0, fmt.Errorf("raftlog: read meta: %w", err)
	}
	body, ok := base.Unseal(b)
	var meta Meta
	if !ok || json.Unmarshal(body, &meta) != nil {
		return 0, &base.CorruptionError{File: "raft/meta", Reason: "raft/meta is damaged"}
	}
	hsb, err := fsys.ReadFile(filepath.Join(dir, "hardstate"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("raftlog: read hardstate: %w", err)
	}
	hs, _ := decodeHardState(hsb)
	if hs.Commit == 0 {
		return meta.LogBase, nil
	}
	x, err := loadIndex(fsys, filepath.Join(dir, "index"), uint64(indexUnits))
	if err != nil {
		return 0, err
	}
	defer x.close()
	for i := hs.Commit; i >= 1; i-- {
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
	return meta.LogBase, nil
}
