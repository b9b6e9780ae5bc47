package storage

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// FuzzRecover feeds arbitrary bytes to recovery as the content of a
// commitlog file (after a real record, so both valid and invalid data are
// seen) with an empty checkpoint: Open must never panic or allocate
// without bound; it ends in a valid prefix, and every record it then serves
// decodes cleanly.
func FuzzRecover(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	good := encodeSpec(f, record.Spec{Topic: "T", Body: []byte("seed"), StoreHost: DefaultStoreHost, PropCRC: true}, 0, 0, 1)
	f.Add(good)
	f.Add(append(append([]byte{}, good...), good...))
	// A batch of two (the first record carries its extent), whole and torn.
	first := record.Spec{Topic: "T", Body: []byte("b0"), StoreHost: DefaultStoreHost, PropCRC: true, BatchFirst: true, BatchCount: 2}
	second := record.Spec{Topic: "T", Body: []byte("b1"), StoreHost: DefaultStoreHost, PropCRC: true}
	first.Size()
	second.Size()
	first.BatchBytes = first.Total + second.Total
	b0 := encodeSpec(f, first, 0, 0, 1)
	batch := append(b0, encodeSpec(f, second, 1, int64(len(b0)), 1)...)
	f.Add(batch)
	f.Add(batch[:len(batch)-1])
	f.Fuzz(func(t *testing.T, data []byte) {
		const size = 4096
		if len(data) > size {
			data = data[:size]
		}
		fs := vfs.NewMem()
		dir := "/d/commitlog"
		fs.MkdirAll(dir)
		seg, err := fs.CreateSegment(filepath.Join(dir, fileName(0)), size)
		if err != nil {
			t.Fatal(err)
		}
		copy(seg.Bytes(), data)
		seg.Sync(0, size)
		seg.Close()
		fs.SyncDir(dir)
		s, err := Open(Options{Dir: "/d", FS: fs, FileSize: size, MaxMessageSize: 1024})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v", err)
			}
			return
		}
		defer s.Close()
		for _, q := range s.Queues() {
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: q.Topic, QueueID: q.QueueID, MaxMessages: 1000})
			if err != nil && !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("pull %v: %v", q, err)
			}
			for _, m := range res.Messages {
				if m.Topic != q.Topic {
					t.Fatalf("record of %s in queue %v", m.Topic, q)
				}
			}
		}
		// The store still takes writes after whatever it recovered.
		if _, err := s.PutMessage(context.Background(), &Message{Topic: "After", Body: []byte("x")}); err != nil {
			t.Fatalf("put after recovery: %v", err)
		}
	})
}
