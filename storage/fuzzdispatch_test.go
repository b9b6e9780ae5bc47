package storage

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/storaged/storaged/storage/vfs"
)

// FuzzRebuild: a store whose commitlog bytes were overwritten anywhere and
// whose consume queues were deleted opens (rebuilding them from the log) or
// refuses with an error wrapping ErrCorrupt; it never panics, and what it
// serves pulls without panicking.
func FuzzRebuild(f *testing.F) {
	const fileSize = 4096
	base := vfs.NewMem()
	o := Options{Dir: "/d", FS: base, FileSize: fileSize, MaxMessageSize: 1024}
	s, err := Open(o)
	if err != nil {
		f.Fatal(err)
	}
	var offs []int64
	for i := range 40 {
		r, err := s.PutMessage(context.Background(), msg("T"+strconv.Itoa(i%3), "m"+strconv.Itoa(i),
			Property{Key: PropertyTags, Value: "t" + strconv.Itoa(i%2)}))
		if err != nil {
			f.Fatal(err)
		}
		offs = append(offs, r.Append.WroteOffset)
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	f.Add(uint32(0), []byte{})
	f.Add(uint32(offs[3]+posBornHost+36), []byte{0xff, 0xff, 0xff, 0x00}) // issue 11's body length
	f.Add(uint32(offs[5]), []byte{0, 0, 0, 0})                            // a total size of 0
	f.Add(uint32(offs[20]+posMagic), []byte{0xde, 0xad})
	f.Fuzz(func(t *testing.T, at uint32, patch []byte) {
		fs := base.Crash(rand.New(rand.NewPCG(1, 1))) // everything was synced: a copy
		names, err := fs.ReadDir("/d/commitlog")
		if err != nil || len(names) == 0 {
			t.Fatalf("commitlog: %v", err)
		}
		k := int(at/fileSize) % len(names)
		path := filepath.Join("/d/commitlog", names[k].Name)
		b, err := fs.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		copy(b[int(at%fileSize):], patch)
		if err := fs.WriteFile(path, b); err != nil {
			t.Fatal(err)
		}
		if err := fs.RemoveAll("/d/consumequeue"); err != nil {
			t.Fatal(err)
		}
		s, err := Open(Options{Dir: "/d", FS: fs, FileSize: fileSize, MaxMessageSize: 1024})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v, want an error wrapping ErrCorrupt", err)
			}
			return
		}
		defer s.Close()
		for _, q := range s.Queues() {
			_, err := s.PullMessages(context.Background(), PullRequest{Topic: q.Topic, QueueID: q.QueueID, MaxMessages: 100})
			if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("pull %v: %v", q, err)
			}
		}
	})
}
