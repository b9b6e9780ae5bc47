//go:build unix

package server

import "golang.org/x/sys/unix"

// diskSpace returns the bytes available to an unprivileged user and the
// size of the file system holding dir.
//
// TODO(storage): this is the only system call outside storage/; it belongs
// in storage.Stats (a DiskFree field) so that server/ needs no x/sys.
func diskSpace(dir string) (free, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bsize := uint64(st.Bsize)
	return st.Bavail * bsize, st.Blocks * bsize, nil
}
