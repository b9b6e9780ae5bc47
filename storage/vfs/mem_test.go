package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"testing"
)

func TestMemCrashKeepsOnlyWhatWasSynced(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	seg, err := m.CreateSegment("/d/seg", 3*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	m.SyncDir("/d")
	b := seg.Bytes()
	copy(b, bytes.Repeat([]byte{1}, pageSize)) // page 0: synced below
	if err := seg.Sync(0, pageSize); err != nil {
		t.Fatal(err)
	}
	copy(b[pageSize:], bytes.Repeat([]byte{2}, pageSize)) // page 1: never synced
	m.WriteFile("/d/new", []byte("not in a synced dir"))  // created after the last SyncDir
	m.Rename("/d/seg", "/d/renamed")                      // not synced either

	sawKept, sawDropped, sawTorn := false, false, false
	for seed := uint64(0); seed < 64; seed++ {
		img := m.Crash(rand.New(rand.NewPCG(seed, 1)))
		if _, err := img.ReadFile("/d/new"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a file created after the last directory sync survived: %v", err)
		}
		if _, err := img.ReadFile("/d/renamed"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatal("an unsynced rename survived")
		}
		data, err := img.ReadFile("/d/seg")
		if err != nil {
			t.Fatalf("the synced file is gone: %v", err)
		}
		if !bytes.Equal(data[:pageSize], bytes.Repeat([]byte{1}, pageSize)) {
			t.Fatal("a synced page changed")
		}
		page := data[pageSize : 2*pageSize]
		switch {
		case bytes.Equal(page, bytes.Repeat([]byte{2}, pageSize)):
			sawKept = true
		case bytes.Equal(page, make([]byte, pageSize)):
			sawDropped = true
		default:
			for s := 0; s < pageSize; s += sectorSize { // torn: whole sectors old or new
				sec := page[s : s+sectorSize]
				if !bytes.Equal(sec, make([]byte, sectorSize)) && !bytes.Equal(sec, bytes.Repeat([]byte{2}, sectorSize)) {
					t.Fatal("a sector is neither old nor new")
				}
			}
			sawTorn = true
		}
		if !bytes.Equal(data[2*pageSize:], make([]byte, pageSize)) {
			t.Fatal("an untouched page changed")
		}
	}
	if !sawKept || !sawDropped || !sawTorn {
		t.Fatalf("unsynced page outcomes: kept %v dropped %v torn %v", sawKept, sawDropped, sawTorn)
	}
}

func TestMemInjectorAndLock(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	m.SetInjector(OnCall(OpSync, 2, ErrInjected, false))
	seg, _ := m.CreateSegment("/d/s", pageSize)
	if err := seg.Sync(0, 1); err != nil {
		t.Fatal(err)
	}
	if err := seg.Sync(0, 1); !errors.Is(err, ErrInjected) {
		t.Fatalf("second sync: %v", err)
	}
	if err := seg.Sync(0, 1); err != nil {
		t.Fatalf("third sync (not sticky): %v", err)
	}
	m.SetInjector(OnCall(OpCreateSegment, 1, ErrInjected, true))
	if _, err := m.CreateSegment("/d/t", pageSize); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("create: %v", err)
	}
	l, err := m.Lock("/d/lock")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock("/d/lock"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v", err)
	}
	l.Close()
	if _, err := m.Lock("/d/lock"); err != nil {
		t.Fatalf("lock after release: %v", err)
	}
}

func TestOSSegment(t *testing.T) {
	dir := t.TempDir()
	seg, err := Default.CreateSegment(dir+"/s", 2*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	copy(seg.Bytes(), "hello")
	if err := seg.Sync(0, 5); err != nil {
		t.Fatal(err)
	}
	seg.Close()
	if _, err := Default.CreateSegment(dir+"/s", 2*pageSize); err == nil {
		t.Fatal("created over an existing file")
	}
	if _, err := Default.OpenSegment(dir+"/s", pageSize); err == nil {
		t.Fatal("opened with the wrong size")
	}
	seg, err = Default.OpenSegment(dir+"/s", 2*pageSize)
	if err != nil || string(seg.Bytes()[:5]) != "hello" {
		t.Fatalf("reopen: %v", err)
	}
	seg.Close()
	l, err := Default.Lock(dir + "/lock")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Default.Lock(dir + "/lock"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second flock: %v", err)
	}
	l.Close()
}

// TestMemFile: a File grows as it is written, reads back what was written,
// counts its handles and bytes, and a crash keeps what its last Sync made
// durable (the new size and data only if they reached the disk by chance).
func TestMemFile(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d")
	if _, err := m.OpenFile("/d/f", false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open without create: %v", err)
	}
	f, err := m.OpenFile("/d/f", true)
	if err != nil {
		t.Fatal(err)
	}
	m.SyncDir("/d")
	if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(" world"), 5); err != nil { // not synced
		t.Fatal(err)
	}
	got := make([]byte, 11)
	if n, err := f.ReadAt(got, 0); n != 11 || err != nil || string(got) != "hello world" {
		t.Fatalf("read %q (%d): %v", got, n, err)
	}
	if n, err := f.ReadAt(got, 6); n != 5 || !errors.Is(err, io.EOF) {
		t.Fatalf("read past the end: %d, %v", n, err)
	}
	if m.OpenFiles() != 1 || m.Written() != 11 {
		t.Fatalf("open files %d, written %d", m.OpenFiles(), m.Written())
	}
	sizes := map[string]bool{}
	for seed := uint64(0); seed < 64; seed++ {
		img := m.Crash(rand.New(rand.NewPCG(seed, 2)))
		b, err := img.ReadFile("/d/f")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("hello")) || (len(b) != 5 && len(b) != 11) {
			t.Fatalf("crash image %q", b)
		}
		sizes[string(b)] = true
	}
	if !sizes["hello"] || len(sizes) < 2 {
		t.Fatalf("crash images %v: want the synced size and the grown one", sizes)
	}
	f.Close()
	if m.OpenFiles() != 0 {
		t.Fatalf("open files %d after close", m.OpenFiles())
	}
}

// TestMemFileInjection: the injector fails OpenFile (a create as ErrNoSpace),
// WriteAt and Sync, and each has no effect.
func TestMemFileInjection(t *testing.T) {
	cases := []struct {
		op      Op
		noSpace bool
	}{{OpOpenFile, true}, {OpFileWrite, false}, {OpFileSync, false}, {OpFileRead, false}}
	for _, c := range cases {
		t.Run(c.op.String(), func(t *testing.T) {
			m := NewMem()
			m.MkdirAll("/d")
			var f File
			if c.op != OpOpenFile {
				var err error
				if f, err = m.OpenFile("/d/f", true); err != nil {
					t.Fatal(err)
				}
			}
			m.SetInjector(OnCall(c.op, 1, ErrInjected, true))
			var err error
			switch c.op {
			case OpOpenFile:
				_, err = m.OpenFile("/d/f", true)
			case OpFileWrite:
				_, err = f.WriteAt([]byte("x"), 0)
			case OpFileSync:
				err = f.Sync()
			case OpFileRead:
				_, err = f.ReadAt(make([]byte, 1), 0)
			}
			if !errors.Is(err, ErrInjected) || errors.Is(err, ErrNoSpace) != c.noSpace {
				t.Fatalf("%v: %v", c.op, err)
			}
			if size, _ := m.Size("/d/f"); c.op == OpFileWrite && size != 0 {
				t.Fatalf("a failed write wrote %d bytes", size)
			}
		})
	}
}
