package raftlog

import (
	"errors"
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/vfs"
)

// filledReplica is a replica with about 80 entries of every kind,
// synced, committed up to the last.
func filledReplica(t *testing.T, seed uint64) (*replica, *gen, uint64) {
	t.Helper()
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x1a57)), term: 1}
	for k := uint64(1); k < 80; {
		ents := g.entries(r.log, k, 1+g.rng.IntN(5))
		if err := r.log.Append(ents); err != nil {
			t.Fatal(err)
		}
		k += uint64(len(ents))
	}
	last, _ := r.log.LastIndex()
	if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(last)}); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	return r, g, last
}

// TestCompactBelow: retention's compaction drops exactly the entries
// before the first DATA entry at or past the offset whose files go (every
// DATA entry left starts at or past it), never past the applied index it
// is given, and refuses (ErrCompactUncommitted) when a DATA entry below
// the offset lies past that index; an offset below what is compacted
// already changes nothing.
func TestCompactBelow(t *testing.T) {
	for seed := range uint64(20) {
		r, _, last := filledReplica(t, seed)
		// The offset: the start of the file holding the middle entry's data.
		var off int64 = -1
		var firstAt uint64 // the first DATA entry at or past off
		for i := last / 2; i <= last && off < 0; i++ {
			if u, err := r.log.unitAt(i); err == nil && u.Kind == KindData && u.Pos >= testFileSize {
				off = u.Pos - u.Pos%testFileSize
			}
		}
		if off < 0 {
			t.Fatalf("seed %d: no DATA entry past the first file", seed)
		}
		for i := uint64(1); i <= last; i++ {
			if u, _ := r.log.unitAt(i); u.Kind == KindData && u.Pos >= off {
				firstAt = i
				break
			}
		}
		// A DATA entry below off past the applied index: refused.
		var below uint64
		for i := firstAt - 1; i >= 1; i-- {
			if u, _ := r.log.unitAt(i); u.Kind == KindData {
				below = i
				break
			}
		}
		if err := r.log.CompactBelow(off, below-1); !errors.Is(err, ErrCompactUncommitted) {
			t.Fatalf("seed %d: compaction past the applied index %d: %v", seed, below-1, err)
		}
		if f, _ := r.log.FirstIndex(); f != 1 {
			t.Fatalf("seed %d: a refused compaction moved FirstIndex to %d", seed, f)
		}
		if err := r.log.CompactBelow(off, last); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if f, _ := r.log.FirstIndex(); f != firstAt {
			t.Fatalf("seed %d: FirstIndex %d, want %d (the first DATA entry at or past %d)", seed, f, firstAt, off)
		}
		for i := firstAt; i <= last; i++ {
			if u, err := r.log.unitAt(i); err != nil || (u.Kind == KindData && u.Pos < off) {
				t.Fatalf("seed %d: entry %d kept with data at %d below %d (%v)", seed, i, u.Pos, off, err)
			}
		}
		if _, err := r.log.Entries(firstAt-1, firstAt, 0); !errors.Is(err, raft.ErrCompacted) {
			t.Fatalf("seed %d: an entry below FirstIndex: %v", seed, err)
		}
		if err := r.log.CompactBelow(0, last); err != nil {
			t.Fatalf("seed %d: an offset below the compacted part: %v", seed, err)
		}
		if f, _ := r.log.FirstIndex(); f != firstAt {
			t.Fatalf("seed %d: FirstIndex moved to %d on a no-op", seed, f)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCompactBelowWithoutData: with no DATA entry below the offset,
// CompactBelow compacts nothing: neither a log of EMPTY and CMD entries
// only (a group that stored nothing: TestGroupSim seed 4223), at any
// offset, nor such a log's leading entries before a DATA entry at or past
// the offset. Once a DATA entry lies below it, the leading entries go as
// before.
func TestCompactBelowWithoutData(t *testing.T) {
	r := mustOpen(t, vfs.NewMem())
	defer func() {
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}()
	var ents []*pb.Entry
	for i := uint64(1); i <= 6; i++ {
		e := &pb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(i)}
		if i%2 == 0 {
			e.Data = []byte{0, 0, 0, 0, 0xC0, 0xDE, 0, byte(i)} // a command
		}
		ents = append(ents, e)
	}
	commit := func() uint64 {
		t.Helper()
		last, _ := r.log.LastIndex()
		if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(last)}); err != nil {
			t.Fatal(err)
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
		return last
	}
	if err := r.log.Append(ents); err != nil {
		t.Fatal(err)
	}
	last := commit()
	for _, off := range []int64{0, 1, testFileSize, 1 << 40} {
		if err := r.log.CompactBelow(off, last); err != nil {
			t.Fatalf("no data, offset %d: %v", off, err)
		}
		if f, _ := r.log.FirstIndex(); f != 1 {
			t.Fatalf("no data, offset %d: FirstIndex %d, want 1 (nothing compacted)", off, f)
		}
	}
	// DATA entries from here on, the first at pos.
	pos, err := r.log.NextPos(last, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4223, 1))
	at := pos
	var data []*pb.Entry
	for i := last + 1; i <= last+3; i++ {
		specs := records(rng, 1)
		p := Place(at, specsLen(specs), testFileSize)
		e := &pb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(i), Data: encodeAt(specs, p)}
		at = p + int64(len(e.Data))
		data = append(data, e)
	}
	if err := r.log.Append(data); err != nil {
		t.Fatal(err)
	}
	last = commit()
	firstData := data[0].GetIndex()
	if err := r.log.CompactBelow(pos, last); err != nil {
		t.Fatal(err)
	}
	if f, _ := r.log.FirstIndex(); f != 1 {
		t.Fatalf("data only at or past %d: FirstIndex %d, want 1", pos, f)
	}
	// Past the first DATA entry's start: it and the entries before it go.
	if err := r.log.CompactBelow(pos+1, last); err != nil {
		t.Fatal(err)
	}
	if f, _ := r.log.FirstIndex(); f != firstData+1 {
		t.Fatalf("a DATA entry below the offset: FirstIndex %d, want %d", f, firstData+1)
	}
}

// TestInstallSnapshot: after InstallSnapshot at S (past the log's end,
// over a commitlog ending at the snapshot's data end) the log is raft's
// after ApplySnapshot: FirstIndex S+1, LastIndex S, Term(S) the
// snapshot's term, no entries, Snapshot() at S, the HardState commit at
// least S; entries after S append at the data end, and all of it survives
// a reopen and a power cut.
func TestInstallSnapshot(t *testing.T) {
	r, g, last := filledReplica(t, 3)
	fs := r.fs.(*vfs.MemFS)
	s, term := last+17, g.term+2
	end := r.cl.MaxOffset()
	var steps []string
	if err := r.log.InstallSnapshot(s, term, end, func(st string) { steps = append(steps, st) }); err != nil {
		t.Fatal(err)
	}
	if len(steps) != 4 {
		t.Fatalf("steps %v, want the 4 of InstallBase", steps)
	}
	check := func(l *Log, what string, lastWant uint64) {
		t.Helper()
		first, _ := l.FirstIndex()
		lastGot, _ := l.LastIndex()
		tm, err := l.Term(s)
		snap, _ := l.Snapshot()
		hs, _, _ := l.InitialState()
		if first != s+1 || lastGot != lastWant || err != nil || tm != term || snap.GetMetadata().GetIndex() != s ||
			snap.GetMetadata().GetTerm() != term || hs.GetCommit() < s {
			t.Fatalf("%s: first %d last %d Term(S) %d %v snapshot %v commit %d", what, first, lastGot, tm, err, snap.GetMetadata(), hs.GetCommit())
		}
		if _, err := l.Term(s - 1); !errors.Is(err, raft.ErrCompacted) {
			t.Fatalf("%s: Term below the base: %v", what, err)
		}
	}
	check(r.log, "after the install", s)
	g.term = term
	ents := g.entries(r.log, s+1, 6)
	if err := r.log.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(term), Commit: proto.Uint64(s + 6)}); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	check(r.log, "after appends", s+6)
	img := fs.Crash(rand.New(rand.NewPCG(1, 2)))
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	for what, f := range map[string]vfs.FS{"reopened": fs, "power cut": img} {
		rr, err := openReplica(f)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		check(rr.log, what, s+6)
		got, err := rr.log.Entries(s+1, s+7, ^uint64(0))
		if err != nil || len(got) != 6 {
			t.Fatalf("%s: entries after the base: %d %v", what, len(got), err)
		}
		for i, e := range got {
			if err := sameEntry(ents[i], e); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		if err := rr.close(); err != nil {
			t.Fatal(err)
		}
	}
	// The commitlog must already be the snapshot's.
	r2, _, _ := filledReplica(t, 4)
	if err := r2.log.InstallSnapshot(500, 9, r2.cl.MaxOffset()+1, nil); err == nil {
		t.Fatal("an install over a commitlog that does not end at the snapshot's end")
	}
	r2.close()
}
