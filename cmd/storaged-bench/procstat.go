package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// procsCPU is the CPU time of several processes together.
func procsCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// procCPU returns the CPU time (user + system) process pid has used: utime
// + stime of /proc/PID/stat, read by prometheus/procfs (in clock ticks of
// 10 ms: USER_HZ, 100 on Linux).
func procCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(math.Round(st.CPUTime() * float64(time.Second))), nil
}

// loadAverage returns the 1-minute load average of the host, 0 if
// /proc/loadavg cannot be read.
func loadAverage() float64 {
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	l, err := pfs.LoadAvg()
	if err != nil {
		return 0
	}
	return l.Load1
}

// dirtyBytes is the host's page cache waiting for writeback or being
// written (Dirty + Writeback of /proc/meminfo), 0 if it cannot be read.
func dirtyBytes() uint64 {
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	m, err := pfs.Meminfo()
	if err != nil || m.DirtyBytes == nil || m.WritebackBytes == nil {
		return 0
	}
	return *m.DirtyBytes + *m.WritebackBytes
}

// procSample is what /proc tells of a server process at one moment: the
// figures of issue 11's restart and pull-memory benchmarks.
type procSample struct {
	RSSBytes   uint64 `json:"rss_bytes"`   // VmRSS = RssAnon + RssFile + RssShmem
	AnonBytes  uint64 `json:"anon_bytes"`  // RssAnon: the heap, stacks, copies; not the mapped files
	HWMBytes   uint64 `json:"hwm_bytes"`   // VmHWM: peak RSS since the process started
	WriteBytes uint64 `json:"write_bytes"` // /proc/PID/io write_bytes: bytes sent to the storage layer (page cache writeback included)
	FDs        int    `json:"fds"`         // entries of /proc/PID/fd
	// CommitLogRSSBytes is the resident part of the process's mappings of
	// files in a "commitlog" directory (/proc/PID/smaps): the populated
	// commitlog segment, whose size is --file-size whatever the store
	// holds. QueueRSSBytes is that of files in a "consumequeue" directory.
	CommitLogRSSBytes uint64 `json:"commitlog_rss_bytes"`
	QueueRSSBytes     uint64 `json:"consumequeue_rss_bytes"`
}

// sampleProc reads the procSample of process pid (prometheus/procfs).
func sampleProc(pid int) (procSample, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procSample{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	io, err := p.IO()
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/io: %w", pid, err)
	}
	fds, err := p.FileDescriptorsLen()
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/fd: %w", pid, err)
	}
	byDir, err := mappedRSS(pid, "commitlog", "consumequeue")
	if err != nil {
		return procSample{}, err
	}
	return procSample{RSSBytes: st.VmRSS, AnonBytes: st.RssAnon, HWMBytes: st.VmHWM, WriteBytes: io.WriteBytes, FDs: fds,
		CommitLogRSSBytes: byDir["commitlog"], QueueRSSBytes: byDir["consumequeue"]}, nil
}

// mappedRSS sums, from /proc/PID/smaps, the Rss of the mappings of files
// that have one of dirs as a path element, by that element.
// prometheus/procfs (v0.22.0) reads only smaps_rollup, the sum over all
// mappings, so the per-mapping lines are split here.
func mappedRSS(pid int, dirs ...string) (map[string]uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(dirs))
	cur := "" // the dir of the current mapping, "" if none of dirs
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			// A mapping's header: range perms offset dev inode [path].
			cur = ""
			if len(f) >= 6 {
				for _, d := range dirs {
					if strings.Contains(f[5], "/"+d+"/") {
						cur = d
					}
				}
			}
		case len(f) == 3 && f[0] == "Rss:" && cur != "":
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/smaps: %q: %w", pid, line, err)
			}
			out[cur] += kb << 10
		}
	}
	return out, nil
}

// dirUsage is the disk use of a directory tree.
type dirUsage struct {
	Files          int   `json:"files"`
	Dirs           int   `json:"dirs"`
	ApparentBytes  int64 `json:"apparent_bytes"`  // sum of file sizes
	AllocatedBytes int64 `json:"allocated_bytes"` // sum of st_blocks × 512, as du counts (directories included)
	// FileAllocatedBytes is AllocatedBytes without the directories' own
	// blocks (4 KiB each on ext4, two per consume queue: topic and queue).
	FileAllocatedBytes int64 `json:"file_allocated_bytes"`
}

// diskUsage walks root and sums what du(1) would; a missing root is zero.
func diskUsage(root string) (dirUsage, error) {
	var u dirUsage
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path == root {
				return fs.SkipAll
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var blocks int64
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			blocks = st.Blocks * 512
		}
		u.AllocatedBytes += blocks
		if d.IsDir() {
			u.Dirs++
		} else {
			u.Files++
			u.ApparentBytes += fi.Size()
			u.FileAllocatedBytes += blocks
		}
		return nil
	})
	return u, err
}
