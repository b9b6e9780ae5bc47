package segment

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestListRollFindRemove: rolls make contiguous files named by offset; Find
// maps an offset to its file; RemoveFirst never takes the last file; Unmap
// waits for readers holding the guard; Load refuses a gap.
func TestListRollFindRemove(t *testing.T) {
	fs := vfs.NewMem()
	const size = 4096
	q := NewList(fs, "/c", size, Options{})
	if err := fs.MkdirAll("/c"); err != nil {
		t.Fatal(err)
	}
	if err := q.Load(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		f, err := q.Roll()
		if err != nil {
			t.Fatal(err)
		}
		if f.From() != int64(i)*size || f.Name() != FileName(int64(i)*size) {
			t.Fatalf("roll %d: file %s from %d", i, f.Name(), f.From())
		}
		f.Publish(size)
	}
	if f := q.Find(size + 10); f == nil || f.From() != size {
		t.Fatalf("Find(%d) = %v", size+10, f)
	}
	if q.Find(3*size) != nil || q.Find(-1) != nil {
		t.Fatal("Find outside the files found one")
	}
	q.ReadLock()
	gone := q.RemoveFirst(5)
	if len(gone) != 2 || q.MinOffset() != 2*size {
		t.Fatalf("RemoveFirst(5) took %d files, min %d", len(gone), q.MinOffset())
	}
	unmapped := make(chan error, 1)
	go func() { unmapped <- q.Unmap(gone) }()
	select {
	case <-unmapped:
		t.Fatal("Unmap did not wait for the reader holding the guard")
	default:
	}
	if gone[0].Data() == nil {
		t.Fatal("a file was unmapped under a reader")
	}
	q.ReadUnlock()
	if err := <-unmapped; err != nil || gone[0].Data() != nil {
		t.Fatalf("Unmap: %v", err)
	}
	if err := fs.Remove(gone[1].Path()); err != nil { // leave a gap: file 0 is still on disk
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q2 := NewList(fs, "/c", size, Options{})
	defer q2.Close()
	if err := q2.Load(); err == nil {
		t.Fatal("Load accepted a gap between files")
	}
	q2.Close()
	if _, err := q2.Roll(); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("Roll after Close: %v", err)
	}
}
