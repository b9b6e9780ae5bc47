package vfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

// TestOSFile: the OS File grows by WriteAt, reads back, truncates and
// syncs; OpenFile without create does not create.
func TestOSFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if _, err := Default.OpenFile(path, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open without create: %v", err)
	}
	f, err := Default.OpenFile(path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("entry"), 20); err != nil {
		t.Fatal(err)
	}
	if size, _ := Default.Size(path); size != 25 {
		t.Fatalf("size %d after a write at 20, want 25", size)
	}
	if err := f.Truncate(20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 20)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != string(make([]byte, 20)) {
		t.Fatalf("read %q: %v", b, err)
	}
}

func TestParsePopulateMode(t *testing.T) {
	for m := PopulateWrite; m <= PopulateZero; m++ {
		got, err := ParsePopulateMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParsePopulateMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	if _, err := ParsePopulateMode("eager"); err == nil {
		t.Error(`ParsePopulateMode("eager") accepted`)
	}
}
