package vfs

import "golang.org/x/sys/unix"

// DiskUsage reports the file system holding dir as statfs(2) sees it, in
// bytes: size (f_blocks), used (f_blocks - f_bfree) and avail, what an
// unprivileged writer may still use (f_bavail). Blocks reserved for root
// count neither as used nor as available, as in df(1).
func DiskUsage(dir string) (size, used, avail uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, 0, err
	}
	bs := uint64(st.Bsize)
	return st.Blocks * bs, (st.Blocks - st.Bfree) * bs, st.Bavail * bs, nil
}
