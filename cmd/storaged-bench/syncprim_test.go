package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/storaged/storaged/storage/storagetest"
)

// TestSyncPrimFilesSinglePages: the mapped files syncprim prepares the way
// storaged does hold single pages, so a small write dirties one page and
// its sync writes one page. Before, the populated file was faulted in
// through readahead and the prewritten one through its zeros' writes, both
// into large folios (Linux 6.16+ ext4, XFS): one byte dirtied up to 512
// pages, and the table of BENCHMARKS.md measured the folios, not the
// primitive.
func TestSyncPrimFilesSinglePages(t *testing.T) {
	for _, kind := range []string{"populated", "prewritten"} {
		t.Run(kind, func(t *testing.T) {
			const size = 64 << 20 // readahead grows its folios over a long run of faults
			c := &syncPrimCase{Primitive: "msync", File: kind, Size: 4096}
			path := filepath.Join(t.TempDir(), kind)
			if err := c.open(path, size); err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if err := c.seg.Sync(0, size); err != nil { // population left dirty zeros
				t.Fatal(err)
			}
			for _, off := range []int64{0, 40<<20 + 100, size - 100} {
				dirty := storagetest.DirtiedBy(t, path, func() { c.seg.Bytes()[off] = 1 })
				if dirty != 1 {
					t.Errorf("one byte at %d dirtied %d pages, want 1", off, dirty)
				}
				if err := c.seg.Sync(off, off+1); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestSyncPrimCommand runs the subcommand end to end on a small scale: one
// case per preparation and primitive (grown only with pwrite), each with
// every append timed, and the JSON it writes reads back.
func TestSyncPrimCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.json")
	const iterations = 20
	args := []string{"--dir", dir, "--iterations", "20", "--sizes", "4Ki,64Ki", "--out", out}
	if err := runSyncPrimCommand(args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res SyncPrimResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	want := 2 * ((len(syncFileKinds)-1)*len(syncPrimitives) + 1) // two sizes; grown with pwrite only
	if len(res.Cases) != want {
		t.Fatalf("%d cases, want %d", len(res.Cases), want)
	}
	seen := map[string]bool{}
	for _, c := range res.Cases {
		key := fmt.Sprintf("%s/%s/%d", c.File, c.Primitive, c.Size)
		if seen[key] {
			t.Errorf("case %s twice", key)
		}
		seen[key] = true
		if c.File == "grown" && c.Primitive != "pwrite" {
			t.Errorf("grown with %s: a mapping cannot grow with its file", c.Primitive)
		}
		if c.P50Us <= 0 || c.MaxUs < c.P50Us || c.WriteP50Ns <= 0 {
			t.Errorf("%s %s %d: p50 %v µs, max %v µs, write p50 %v ns", c.File, c.Primitive, c.Size, c.P50Us, c.MaxUs, c.WriteP50Ns)
		}
	}
	if res.Iterations != iterations {
		t.Errorf("iterations %d, want %d", res.Iterations, iterations)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 { // out.json; the case files are removed
		t.Errorf("%d entries left in the directory, want only the JSON", len(entries))
	}
}
