package consumequeue

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/storaged/storaged/storage/vfs"
)

// TestFileCacheReturnsToItsLimit: when every open file is in use the cache
// opens past its limit (a checkpoint's parallel syncs do that), and the
// excess is closed as each use ends, not left open until the next open.
func TestFileCacheReturnsToItsLimit(t *testing.T) {
	dir := t.TempDir()
	c := newCQFiles(vfs.Default, 2)
	var files []*cqFile
	for i := range 5 {
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, &cqFile{path: p})
	}
	for _, cf := range files { // all five in use at once
		if _, err := c.acquire(cf, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.openCount(); n != 5 {
		t.Fatalf("%d open while 5 are in use", n)
	}
	for i, cf := range files {
		c.release(cf)
		if want := max(2, 5-(i+1)); c.openCount() != want {
			t.Fatalf("after %d releases: %d open, want %d", i+1, c.openCount(), want)
		}
	}
	// Idle files within the limit stay open for the next use.
	if _, err := c.acquire(files[4], false); err != nil {
		t.Fatal(err)
	}
	c.release(files[4])
	if n := c.openCount(); n != 2 {
		t.Fatalf("%d open after a reuse, want 2", n)
	}
	for _, cf := range files {
		if err := c.forget(cf); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.openCount(); n != 0 {
		t.Fatalf("%d open after forgetting all", n)
	}
}
