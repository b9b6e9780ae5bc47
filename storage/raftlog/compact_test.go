package raftlog

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/vfs"
)

// TestCompactPowerLoss: after Compact(i) returns, every power-cut image
// (MemFS.Crash, with more entries appended and not synced meanwhile)
// recovers with FirstIndex i+1, Term(i) the base term, every committed
// entry above i as it was, and no index file wholly below i+1; a cut
// after raft/base was written but before the old index files went (the
// files are put back by hand) recovers the same and deletes them; and
// Compact refuses an index past the durable commit.
func TestCompactPowerLoss(t *testing.T) {
	for seed := range uint64(40) {
		if err := compactRun(seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func compactRun(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xba5e))
	fs := vfs.NewMem()
	r, err := openReplica(fs)
	if err != nil {
		return err
	}
	g := &gen{rng: rng, term: 1}
	for k := uint64(1); k < 60; {
		ents := g.entries(r.log, k, 1+rng.IntN(5))
		if err := r.log.Append(ents); err != nil {
			return err
		}
		k += uint64(len(ents))
	}
	last, _ := r.log.LastIndex()
	commit := last - rng.Uint64N(5)
	if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(commit)}); err != nil {
		return err
	}
	if err := r.log.Sync(); err != nil {
		return err
	}
	want, err := r.log.Entries(1, commit+1, ^uint64(0))
	if err != nil {
		return err
	}
	if err := r.log.Compact(commit + 1); !errors.Is(err, ErrCompactUncommitted) {
		return fmt.Errorf("Compact past the commit: %v", err)
	}
	i := 1 + rng.Uint64N(commit)
	baseTerm, _ := r.log.Term(i)
	pre := fs.Crash(rng) // everything is synced: the state before Compact
	if err := r.log.Compact(i); err != nil {
		return err
	}
	// A cut after raft/base was written, before the old index files went.
	if err := writeBase(pre, "/d/raft", r.log.base); err != nil {
		return err
	}
	// More entries, not synced: a crash may keep any part of them.
	if more := g.entries(r.log, last+1, 3); r.log.Append(more) != nil {
		return errors.New("append after Compact failed")
	}
	check := func(img vfs.FS, what string) error {
		rr, err := openReplica(img)
		if err != nil {
			return fmt.Errorf("%s: reopen: %w", what, err)
		}
		defer rr.close()
		if f, _ := rr.log.FirstIndex(); f != i+1 {
			return fmt.Errorf("%s: FirstIndex %d, want %d", what, f, i+1)
		}
		if tm, err := rr.log.Term(i); err != nil || tm != baseTerm {
			return fmt.Errorf("%s: Term(%d) = %d %v, want %d", what, i, tm, err, baseTerm)
		}
		if _, err := rr.log.Entries(i, i+1, 0); !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("%s: Entries below FirstIndex: %v", what, err)
		}
		got, err := rr.log.Entries(i+1, commit+1, ^uint64(0))
		if err != nil && i < commit {
			return fmt.Errorf("%s: %w", what, err)
		}
		for j, e := range got {
			if err := sameEntry(want[i+uint64(j)], e); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		if uint64(len(got)) != commit-i {
			return fmt.Errorf("%s: %d committed entries above %d, want %d", what, len(got), i, commit-i)
		}
		ents, err := img.ReadDir("/d/raft/index")
		if err != nil {
			return err
		}
		for _, e := range ents {
			if n, err := strconv.ParseUint(e.Name, 10, 64); err == nil && len(e.Name) == 20 && n+testUnits <= i+1 {
				return fmt.Errorf("%s: index file %s is wholly below FirstIndex %d", what, e.Name, i+1)
			}
		}
		return nil
	}
	if err := check(pre, "cut inside Compact"); err != nil {
		return err
	}
	for k := range 3 {
		if err := check(fs.Crash(rand.New(rand.NewPCG(seed, uint64(k)))), fmt.Sprintf("crash image %d", k)); err != nil {
			return err
		}
	}
	if err := r.close(); err != nil {
		return err
	}
	return check(fs, "kill -9")
}
