package storage

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"pgregory.net/rapid"

	"github.com/storaged/storaged/storage/vfs"
)

// modelOnDisk runs TestModel on real files in t.TempDir() instead of MemFS.
var modelOnDisk = flag.Bool("model-disk", false, "run TestModel on real files instead of MemFS")

func readFileFS(fs vfs.FS, path string) ([]byte, error) {
	if fs == nil {
		return os.ReadFile(path)
	}
	return fs.ReadFile(path)
}

// TestModel drives the store with random puts, batches and reopens on tiny
// files (so END_OF_FILE blanks and rolls happen all the time) and checks it
// against a model: every acknowledged message is on disk at its offset with
// its bytes, queue offsets are dense per queue, and a message never crosses
// a file.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir := t.TempDir()
		fileSize := rapid.SampledFrom([]int64{4096, 8192}).Draw(rt, "fileSize")
		opts := Options{Dir: dir, FileSize: fileSize, MaxMessageSize: 2048}
		if !*modelOnDisk {
			// MemFS by default (5 s against 44 s on disk, measured): the
			// model checks the store's logic, and heap segments let the race
			// detector see every access. .ci/run's heavy-suite step runs
			// it on real files too (-model-disk).
			opts.FS = vfs.NewMem()
		}
		s, err := Open(opts)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { s.Close() }()
		type stored struct {
			queue int32
			qoff  int64
			off   int64
			body  []byte
		}
		var model []stored
		next := map[int32]int64{}
		lastEnd := int64(0)
		check := func(res PutResult, bodies [][]byte, queue int32) {
			if res.Status != PutOK {
				rt.Fatalf("status %v", res.Status)
			}
			offs := res.Append.Offsets
			if offs == nil {
				offs = []int64{res.Append.WroteOffset}
			}
			if res.Append.QueueOffset != next[queue] {
				rt.Fatalf("queue %d offset %d, model says %d", queue, res.Append.QueueOffset, next[queue])
			}
			if res.Append.WroteOffset < lastEnd {
				rt.Fatalf("wrote at %d before the previous end %d", res.Append.WroteOffset, lastEnd)
			}
			if res.Append.WroteOffset/fileSize != (res.Append.NextOffset()-1)/fileSize {
				rt.Fatal("records cross a file boundary")
			}
			lastEnd = res.Append.NextOffset()
			for i, off := range offs {
				model = append(model, stored{queue, next[queue], off, bodies[i]})
				next[queue]++
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"put": func(rt *rapid.T) {
				q := rapid.Int32Range(0, 2).Draw(rt, "queue")
				body := rapid.SliceOfN(rapid.Byte(), 0, 1500).Draw(rt, "body")
				res, err := s.PutMessage(context.Background(), &Message{Topic: "M", QueueID: q, Body: body})
				if err != nil {
					rt.Fatal(err)
				}
				check(res, [][]byte{body}, q)
			},
			"batch": func(rt *rapid.T) {
				q := rapid.Int32Range(0, 2).Draw(rt, "queue")
				n := rapid.IntRange(1, 5).Draw(rt, "n")
				b := &Batch{Topic: "M", QueueID: q}
				var bodies [][]byte
				for i := 0; i < n; i++ {
					body := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(rt, "body")
					bodies = append(bodies, body)
					b.Messages = append(b.Messages, BatchMessage{Body: body})
				}
				res, err := s.PutMessages(context.Background(), b)
				if err != nil {
					rt.Fatal(err)
				}
				check(res, bodies, q)
			},
			"reopen": func(rt *rapid.T) {
				// Reopening costs several fsyncs; do it on 1 draw in 4.
				if rapid.IntRange(0, 3).Draw(rt, "reopenNow") != 0 {
					return
				}
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				if s, err = Open(opts); err != nil {
					rt.Fatal(err)
				}
			},
			"": func(rt *rapid.T) {
				for _, m := range model {
					from := m.off - m.off%fileSize
					b, err := readFileFS(opts.FS, filepath.Join(dir, "commitlog", fileName(from)))
					if err != nil {
						rt.Fatal(err)
					}
					rec, _, err := DecodeRecordStrict(b[m.off-from:])
					if err != nil {
						rt.Fatalf("record at %d: %v", m.off, err)
					}
					if rec.QueueID != m.queue || rec.QueueOffset != m.qoff || !bytes.Equal(rec.Body, m.body) || rec.PhysicalOffset != m.off {
						rt.Fatalf("record at %d differs: %s", m.off, fmt.Sprint(rec.QueueID, rec.QueueOffset))
					}
				}
			},
		})
	})
}
