package raftlog

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// TestRecoverReadsPayloadsFromTheScan (Options.Checked): recovery reads
// the payload of a DATA entry only where the commitlog's recovery scan
// ran (from the checkpoint's dispatched offset, or the start of the file
// holding the commit end). A record damaged in a file below the scan
// does not stop a start, which no longer reads every retained file; a
// read of its entry still finds the damage (CRC). Reading every payload
// (Checked 0, what a start did before) refuses it, so the damage is one
// the raft log's check finds; damage inside the scan refuses to start.
func TestRecoverReadsPayloadsFromTheScan(t *testing.T) {
	type built struct {
		fs       vfs.FS
		n        uint64 // entries
		early    uint64 // a DATA entry wholly inside the first commitlog file
		late     uint64 // a DATA entry in the last file
		lastFile int64  // the last file's start
	}
	build := func(t *testing.T) built {
		fs := vfs.NewMem()
		r := mustOpen(t, fs)
		g := &gen{rng: rand.New(rand.NewPCG(3, 4)), term: 1}
		var b built
		b.fs = fs
		for r.log.DataEnd() < 4*testFileSize {
			e := g.entries(r.log, b.n+1, 1)[0]
			if classify(e) != KindData {
				continue
			}
			if err := r.log.Append([]*pb.Entry{e}); err != nil {
				t.Fatal(err)
			}
			b.n++
		}
		if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(b.n)}); err != nil {
			t.Fatal(err)
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
		last, err := r.log.unitAt(b.n)
		if err != nil {
			t.Fatal(err)
		}
		b.lastFile, b.late = last.Pos-last.Pos%testFileSize, b.n
		for i := uint64(1); i <= b.n && b.early == 0; i++ {
			if u, err := r.log.unitAt(i); err != nil {
				t.Fatal(err)
			} else if i > 1 && u.Pos+int64(u.Len) < testFileSize {
				b.early = i
			}
		}
		if b.early == 0 || b.lastFile < 2*testFileSize {
			t.Fatalf("the log did not span the files the test needs: early %d, last file at %d", b.early, b.lastFile)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// damage flips a bit of the PHYSICALOFFSET of the entry's first
	// record, with the replica stopped (its page cache is what MemFS keeps).
	damage := func(t *testing.T, b built, i uint64) {
		r := mustOpen(t, b.fs)
		u, err := r.log.unitAt(i)
		if err != nil {
			t.Fatal(err)
		}
		r.cl.At(u.Pos)[record.PosPhysOffset] ^= 1
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
	corrupt := func(t *testing.T, err error, r *replica, what, want string) {
		t.Helper()
		var ce *base.CorruptionError
		if !errors.As(err, &ce) {
			if r != nil {
				r.close()
			}
			t.Fatalf("%s: %v, want a CorruptionError", what, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want it to name %q", what, err, want)
		}
	}

	t.Run("below the scan", func(t *testing.T) {
		b := build(t)
		damage(t, b, b.early)
		r, err := openReplicaFrom(b.fs, testMeta, b.lastFile, true)
		corrupt(t, err, r, "recovery reading every payload", "PHYSICALOFFSET")
		r, err = openReplicaFrom(b.fs, testMeta, b.lastFile, false)
		if err != nil {
			t.Fatalf("recovery with the scan from %d: %v", b.lastFile, err)
		}
		if last, _ := r.log.LastIndex(); last != b.n {
			r.close()
			t.Fatalf("recovered up to entry %d of %d", last, b.n)
		}
		_, err = r.log.Entries(b.early, b.early+1, 1<<20)
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "CRC") {
			r.close()
			t.Fatalf("read of the damaged entry %d: %v, want a CRC CorruptionError", b.early, err)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("inside the scan", func(t *testing.T) {
		b := build(t)
		damage(t, b, b.late)
		r, err := openReplicaFrom(b.fs, testMeta, b.lastFile, false)
		corrupt(t, err, r, "recovery with the damage past the scan's start", "corrupt record")
	})
}
