package storage

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// The abort marker exists while a store is open: created at Open before
// recovery, removed on a clean close (after its final sync and
// checkpoint). Present at Open means the last run did not close cleanly,
// or did not finish opening: the commitlog's tail past its end may hold
// anything, and recovery reads all of it (commitlog.Options.ClosedCleanly).
const abortName = "abort"

func createAbort(fs vfs.FS, dir string) error {
	if err := fs.WriteFile(filepath.Join(dir, abortName), fmt.Appendf(nil, "%d\n", os.Getpid())); err != nil {
		return fmt.Errorf("storage: create abort marker: %w", err)
	}
	return base.SyncDir(fs, dir)
}

func removeAbort(fs vfs.FS, dir string) error {
	if err := fs.Remove(filepath.Join(dir, abortName)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("storage: remove abort marker: %w", err)
	}
	return base.SyncDir(fs, dir)
}

// abortExists reports whether the marker is there; a marker that cannot
// be looked at counts as there.
func abortExists(fs vfs.FS, dir string) bool {
	_, err := fs.Size(filepath.Join(dir, abortName))
	return !errors.Is(err, iofs.ErrNotExist)
}
