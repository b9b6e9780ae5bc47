package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/storaged/storaged/storage/vfs"
)

// The syncprim subcommand measures the sync primitive under the commitlog
// on this disk (issue 16): how long it takes to make one appended range
// durable, by primitive and by how the file was prepared, at several
// sizes. A group commit pays one such sync per round, so these figures
// bound what sync mode can do: N writers with one message in flight each
// cannot be answered faster than N per sync.
//
// Primitives (each appends size bytes at the file's next offset, then makes
// them durable):
//
//	msync       copy into a MAP_SHARED mapping, msync(MS_SYNC) of the
//	            range (what storaged does)
//	fdatasync   copy into the mapping, fdatasync of the file
//	pwrite      pwrite of the range, fdatasync (RocketMQ's transient
//	            store pool path; etcd's WAL)
//
// File preparations:
//
//	fallocated  fallocate + fsync: unwritten extents, so every sync of a
//	            block not synced before also converts its extent (with a
//	            metadata write and its wait); the copy takes the page
//	            faults, through readahead, so the page cache holds large
//	            folios and a sync writes them whole (storaged's
//	            --populate off)
//	populated   fallocated, then populated for writing through the
//	            store's own vfs.Segment.Populate, page by page: what
//	            storaged's allocator does (unwritten extents, single pages)
//	prewritten  zeros written and fsynced first, evicted from the page
//	            cache, then populated as above: written extents, so a
//	            sync writes the data pages and nothing else
//	grown       nothing: every append extends the file, so a sync also
//	            commits the new size (Redis's AOF, NATS's message blocks);
//	            pwrite only, since a mapping cannot grow with the file
//
// The mapped primitives go through vfs.Default's Segment (OpenSegment,
// Sync): the mapping and msync storaged itself uses.
//
// Every case has its own file; the cases take turns, one append each, so
// that noise from other jobs falls on all of them alike.

var (
	syncPrimitives = []string{"msync", "fdatasync", "pwrite"}
	syncFileKinds  = []string{"fallocated", "populated", "prewritten", "grown"}
)

type syncPrimOptions struct {
	dir        string
	sizes      []int64
	iterations int
	primitives []string
	kinds      []string
	out        string
}

// SyncPrimResult is the JSON the syncprim subcommand writes.
type SyncPrimResult struct {
	Date       string          `json:"date"`
	Machine    MachineInfo     `json:"machine"`
	Command    string          `json:"command"`
	Dir        string          `json:"dir"`
	Filesystem string          `json:"filesystem,omitempty"`
	Iterations int             `json:"iterations"`
	Cases      []*syncPrimCase `json:"cases"`
}

type syncPrimCase struct {
	Primitive string  `json:"primitive"`
	File      string  `json:"file"`
	Size      int64   `json:"size_bytes"`
	P50Us     float64 `json:"p50_us"`
	P99Us     float64 `json:"p99_us"`
	MeanUs    float64 `json:"mean_us"`
	MaxUs     float64 `json:"max_us"`
	// The write before the sync, in ns: the copy into the mapping (with
	// the page fault a page cleaned by the last sync takes when written
	// again) or the pwrite.
	WriteP50Ns  float64 `json:"write_p50_ns"`
	WriteP99Ns  float64 `json:"write_p99_ns"`
	WriteMeanNs float64 `json:"write_mean_ns"`

	hist, writeHist *hdrhistogram.Histogram
	f               *os.File
	seg             vfs.Segment // the mapping, for msync and fdatasync
	pos             int64
}

func parseSyncPrimOptions(args []string, stderr io.Writer) (syncPrimOptions, error) {
	o := syncPrimOptions{iterations: 200}
	fs := flag.NewFlagSet("storaged-bench syncprim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dir, "dir", os.TempDir(), "`directory` for the test files (on the disk to measure)")
	sizes := fs.String("sizes", "4Ki,16Ki,64Ki,256Ki,1Mi", "comma-separated append `sizes` (Ki, Mi suffixes)")
	fs.IntVar(&o.iterations, "iterations", o.iterations, "appends + syncs per case")
	prims := fs.String("primitives", strings.Join(syncPrimitives, ","), "comma-separated `primitives`: msync, fdatasync, pwrite")
	kinds := fs.String("files", strings.Join(syncFileKinds, ","), "comma-separated file `preparations`: fallocated, populated, prewritten, grown (pwrite only)")
	fs.StringVar(&o.out, "out", "", "results JSON `file` (default: none)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	fail := func(err error) (syncPrimOptions, error) {
		fmt.Fprintln(stderr, "storaged-bench syncprim:", err)
		return o, usageError{err}
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if o.iterations <= 0 || o.iterations > 100000 {
		return fail(errors.New("--iterations must be in 1..100000"))
	}
	for _, s := range strings.Split(*sizes, ",") {
		q, err := resource.ParseQuantity(strings.TrimSpace(s))
		if err != nil {
			return fail(fmt.Errorf("--sizes %q: %w", s, err))
		}
		n := q.Value()
		if n <= 0 || n > 64<<20 || n%512 != 0 {
			return fail(fmt.Errorf("--sizes %q: want a multiple of 512 B up to 64 MiB", s))
		}
		o.sizes = append(o.sizes, n)
	}
	pick := func(flagName, list string, known []string) ([]string, error) {
		var out []string
		for _, v := range strings.Split(list, ",") {
			v = strings.TrimSpace(v)
			if !slices.Contains(known, v) {
				return nil, fmt.Errorf("--%s: unknown %q (want %s)", flagName, v, strings.Join(known, ", "))
			}
			out = append(out, v)
		}
		return out, nil
	}
	var err error
	if o.primitives, err = pick("primitives", *prims, syncPrimitives); err != nil {
		return fail(err)
	}
	if o.kinds, err = pick("files", *kinds, syncFileKinds); err != nil {
		return fail(err)
	}
	return o, nil
}

// runSyncPrimCommand is the syncprim subcommand.
func runSyncPrimCommand(args []string, stdout, stderr io.Writer) error {
	o, err := parseSyncPrimOptions(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(o.dir, "storaged-syncprim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	res := &SyncPrimResult{Date: time.Now().UTC().Format(time.RFC3339), Machine: machineInfo(),
		Command: "storaged-bench syncprim " + strings.Join(args, " "), Dir: o.dir,
		Filesystem: filesystemOf(o.dir), Iterations: o.iterations}
	defer func() {
		for _, c := range res.Cases {
			c.close()
		}
	}()
	for _, size := range o.sizes {
		for _, kind := range o.kinds {
			for _, prim := range o.primitives {
				if kind == "grown" && prim != "pwrite" {
					continue
				}
				c := &syncPrimCase{Primitive: prim, File: kind, Size: size, hist: hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3),
					writeHist: hdrhistogram.New(1, int64(10*time.Second), 3)}
				path := filepath.Join(dir, fmt.Sprintf("%s-%s-%d", kind, prim, size))
				if err := c.open(path, size*int64(o.iterations)); err != nil {
					return fmt.Errorf("%s %s %d: %w", kind, prim, size, err)
				}
				res.Cases = append(res.Cases, c)
			}
		}
	}
	fmt.Fprintf(stderr, "syncprim: %d cases x %d appends in %s (%s)\n", len(res.Cases), o.iterations, o.dir, res.Filesystem)
	buf := make([]byte, o.sizes[len(o.sizes)-1])
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for range o.iterations {
		for _, c := range res.Cases {
			w, d, err := c.appendSync(buf[:c.Size])
			if err != nil {
				return fmt.Errorf("%s %s %d: %w", c.File, c.Primitive, c.Size, err)
			}
			c.hist.RecordValue(max(1, d.Microseconds()))
			c.writeHist.RecordValue(max(1, w.Nanoseconds()))
		}
	}
	for _, c := range res.Cases {
		c.P50Us = float64(c.hist.ValueAtQuantile(50))
		c.P99Us = float64(c.hist.ValueAtQuantile(99))
		c.MeanUs = c.hist.Mean()
		c.MaxUs = float64(c.hist.Max())
		c.WriteP50Ns = float64(c.writeHist.ValueAtQuantile(50))
		c.WriteP99Ns = float64(c.writeHist.ValueAtQuantile(99))
		c.WriteMeanNs = c.writeHist.Mean()
	}
	printSyncPrim(stdout, res)
	if o.out != "" {
		return writeJSON(o.out, io.Discard, res)
	}
	return nil
}

// open creates the case's file, prepares it and maps it.
func (c *syncPrimCase) open(path string, size int64) error {
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	c.f = f
	if c.File == "grown" {
		return f.Sync() // the directory entry; the file grows with each append
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("fallocate: %w", err)
	}
	if c.File == "prewritten" {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero, off); err != nil {
				return err
			}
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if c.File == "prewritten" {
		// The zeros' writes left the page cache in large folios; a copy
		// into them would dirty a whole folio, and the sync write it.
		// Evicted, the pages come back one by one (Populate below).
		if err := unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED); err != nil {
			return fmt.Errorf("fadvise: %w", err)
		}
	}
	if c.Primitive == "pwrite" {
		return nil
	}
	if c.seg, err = vfs.Default.OpenSegment(path, size); err != nil {
		return err
	}
	if c.File != "fallocated" {
		c.seg.Populate(0, size, vfs.PopulateWrite)
	}
	return nil
}

// appendSync appends b at the case's position and makes it durable; it
// returns how long the write took (the copy into the mapping, or the
// pwrite) and how long the sync took. The write is timed apart because a
// sync changes what the next write costs: msync cleans and write-protects
// the tail page, so the next append into it takes a write fault
// (ext4_page_mkwrite), which a put pays under the store's lock.
func (c *syncPrimCase) appendSync(b []byte) (write, sync time.Duration, err error) {
	lo, hi := c.pos, c.pos+int64(len(b))
	c.pos = hi
	start := time.Now()
	switch c.Primitive {
	case "msync":
		copy(c.seg.Bytes()[lo:hi], b)
		write = time.Since(start)
		start = time.Now()
		err = c.seg.Sync(lo, hi)
	case "fdatasync":
		copy(c.seg.Bytes()[lo:hi], b)
		write = time.Since(start)
		start = time.Now()
		err = unix.Fdatasync(int(c.f.Fd()))
	case "pwrite":
		if _, err = c.f.WriteAt(b, lo); err == nil {
			write = time.Since(start)
			start = time.Now()
			err = unix.Fdatasync(int(c.f.Fd()))
		}
	}
	return write, time.Since(start), err
}

func (c *syncPrimCase) close() {
	if c.seg != nil {
		c.seg.Close()
		c.seg = nil
	}
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// filesystemOf names the filesystem type of dir, from /proc/self/mounts
// (the longest mount point that is a prefix of dir).
func filesystemOf(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	best, fstype := "", ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, fstype = mp, f[2]+" on "+f[0]
		}
	}
	return fstype
}

func printSyncPrim(w io.Writer, res *SyncPrimResult) {
	fmt.Fprintf(w, "%s, %d CPU (%s), %s, %d appends per case\n", res.Date, res.Machine.NProc, res.Machine.CPU, res.Filesystem, res.Iterations)
	fmt.Fprintln(w, "| size | file | primitive | p50 | p99 | mean | max | write p50 | write p99 | write mean |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range res.Cases {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", resource.NewQuantity(c.Size, resource.BinarySI), c.File, c.Primitive,
			fmtLatency(int64(c.P50Us)), fmtLatency(int64(c.P99Us)), fmtLatency(int64(c.MeanUs)), fmtLatency(int64(c.MaxUs)),
			time.Duration(c.WriteP50Ns), time.Duration(c.WriteP99Ns), time.Duration(c.WriteMeanNs).Round(10*time.Nanosecond))
	}
}
