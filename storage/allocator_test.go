package storage

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// TestRollDoesNotWaitForPopulate: the allocator hands a new file over as soon
// as it is created and mapped, and faults it in afterwards, chunk by chunk.
// A put must not wait for that population (it took seconds per GiB here and
// stalled the put lock at every roll), and once the writer has taken the
// file and asked for the next one, the allocator stops populating it.
func TestRollDoesNotWaitForPopulate(t *testing.T) {
	old := populateChunk
	populateChunk = 4096
	t.Cleanup(func() { populateChunk = old })

	fs := vfs.NewMem()
	first := filepath.Join("/d", "commitlog", fileName(0))
	var (
		mu      sync.Mutex
		calls   = map[string]int{}
		blocked = make(chan struct{})
		release = make(chan struct{})
	)
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op != vfs.OpPopulate {
			return nil
		}
		mu.Lock()
		calls[path]++
		n := calls[path]
		mu.Unlock()
		if path == first && n == 1 {
			close(blocked)
			<-release // hold the first chunk of the first file
		}
		return nil
	})
	s, err := Open(Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	<-blocked // the allocator created file 0 and is populating it

	done := make(chan error, 1)
	go func() {
		_, err := s.PutMessage(context.Background(), msg("T", "while the file is being populated"))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("put: %v", err)
		}
	case <-time.After(10 * time.Second): // a failure guard, not a wait for success
		t.Fatal("the put waited for the allocator to populate its file")
	}
	// The put took file 0 and asked for file 1: after the held chunk, the
	// allocator moves on to file 1 instead of populating the rest of file 0.
	close(release)
	s.queue.alloc.waitReady(64 << 10)
	mu.Lock()
	defer mu.Unlock()
	if calls[first] != 1 {
		t.Errorf("file 0 populated in %d chunks after the writer took it, want 1 (the one held)", calls[first])
	}
}

// waitReady waits until the allocator has prepared the file starting at from.
func (a *allocator) waitReady(from int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.ready == nil || a.ready.from != from {
		a.cond.Wait()
	}
}
