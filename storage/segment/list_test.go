package segment

import (
	"errors"
	"slices"
	"sync"
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

// popFS records every Populate call's mode per file: the seam that shows
// how the allocator faults a file in (MemFS's Populate changes nothing).
type popFS struct {
	vfs.FS
	mu    sync.Mutex
	modes map[string][]vfs.PopulateMode
}

type popSegment struct {
	vfs.Segment
	fs   *popFS
	path string
}

func (s popSegment) Populate(lo, hi int64, how vfs.PopulateMode) {
	s.fs.mu.Lock()
	s.fs.modes[s.path] = append(s.fs.modes[s.path], how)
	s.fs.mu.Unlock()
	s.Segment.Populate(lo, hi, how)
}

func (f *popFS) CreateSegment(path string, size int64) (vfs.Segment, error) {
	s, err := f.FS.CreateSegment(path, size)
	if err != nil {
		return nil, err
	}
	return popSegment{s, f, path}, nil
}

func (f *popFS) OpenSegment(path string, size int64) (vfs.Segment, error) {
	s, err := f.FS.OpenSegment(path, size)
	if err != nil {
		return nil, err
	}
	return popSegment{s, f, path}, nil
}

func (f *popFS) modesOf(path string) []vfs.PopulateMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.modes[path])
}

// TestAdoptPopulatesClean: a file created now is populated in the
// configured mode; a file that existed before (adopted after a restart)
// is never write-populated, which would dirty its pages again and write
// the rest of it back as zeros once more, but read-populated; the other
// modes apply to it unchanged.
func TestAdoptPopulatesClean(t *testing.T) {
	for _, tc := range []struct {
		how, adopted vfs.PopulateMode
	}{
		{vfs.PopulateWrite, vfs.PopulateRead},
		{vfs.PopulateRead, vfs.PopulateRead},
		{vfs.PopulateWillNeed, vfs.PopulateWillNeed},
	} {
		t.Run(tc.how.String(), func(t *testing.T) {
			fs := &popFS{FS: vfs.NewMem(), modes: map[string][]vfs.PopulateMode{}}
			const size, chunk = 4 * PageSize, PageSize
			if err := fs.MkdirAll("/c"); err != nil {
				t.Fatal(err)
			}
			q := NewList(fs, "/c", size, Options{Populate: tc.how, PopulateChunk: chunk})
			if err := q.Load(); err != nil {
				t.Fatal(err)
			}
			q.Prepare(0) // as commitlog.Log.Start does
			f, err := q.Roll()
			if err != nil {
				t.Fatal(err)
			}
			f.Publish(PageSize)
			q.WaitPopulated()
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			created := fs.modesOf(f.Path())
			if len(created) == 0 || slices.ContainsFunc(created, func(m vfs.PopulateMode) bool { return m != tc.how }) {
				t.Fatalf("created file populated %v, want only %v", created, tc.how)
			}

			q2 := NewList(fs, "/c", size, Options{Populate: tc.how, PopulateChunk: chunk})
			defer q2.Close()
			if err := q2.Load(); err != nil {
				t.Fatal(err)
			}
			q2.Last().SetPositions(PageSize, PageSize) // as recovery does
			q2.Adopt(q2.Last())
			q2.WaitPopulated()
			adopted := fs.modesOf(f.Path())[len(created):]
			// The adopted file's first page is written: the other three are
			// populated, one chunk each.
			if len(adopted) != 3 || slices.ContainsFunc(adopted, func(m vfs.PopulateMode) bool { return m != tc.adopted }) {
				t.Fatalf("adopted file populated %v, want 3 chunks of %v", adopted, tc.adopted)
			}
		})
	}
}
