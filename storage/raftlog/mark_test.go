package raftlog

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// appendSynced appends n generated entries after the last, commits them
// and syncs; it returns the new last index.
func appendSynced(t *testing.T, r *replica, g *gen, n int) uint64 {
	t.Helper()
	last, _ := r.log.LastIndex()
	ents := g.entries(r.log, last+1, n)
	if err := r.log.Append(ents); err != nil {
		t.Fatal(err)
	}
	last += uint64(n)
	if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(last)}); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	return last
}

// TestMarkStartsTheWalk: a start walks the index from raft/mark, not from
// FirstIndex, and ends where a walk from FirstIndex would (the same last
// index, data and meta-log ends); units below the mark are not checked at
// start: a damaged one there is found when read, and a start without the
// mark (or with a mark that does not match its entry) walks everything
// and refuses it.
func TestMarkStartsTheWalk(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	g := &gen{rng: rand.New(rand.NewPCG(5, 6)), term: 1}
	marked := appendSynced(t, r, g, 60)
	if err := r.log.SaveMark(1); err != nil {
		t.Fatal(err)
	}
	last := appendSynced(t, r, g, 20)
	wantData, wantMeta := r.log.dataEnd, r.log.metaEnd
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	reopen := func(what string) (*replica, error) {
		t.Helper()
		rr, err := openReplica(fs)
		if err != nil {
			return nil, err
		}
		if l, _ := rr.log.LastIndex(); l != last || rr.log.dataEnd != wantData || rr.log.metaEnd != wantMeta {
			rr.close()
			t.Fatalf("%s: last %d, data end %d, meta-log end %d; want %d, %d, %d", what, l, rr.log.dataEnd, rr.log.metaEnd,
				last, wantData, wantMeta)
		}
		return rr, nil
	}
	rr, err := reopen("from the mark")
	if err != nil {
		t.Fatal(err)
	}
	if from, to := rr.log.RecoveryWalk(); from != marked+1 || to != last {
		t.Fatalf("the walk checked %d..%d, want %d..%d (from the mark)", from, to, marked+1, last)
	}
	// A mark at the last entry: the next start walks nothing, and knows
	// the newest CONF entry from the mark alone.
	if err := rr.log.SaveMark(1); err != nil {
		t.Fatal(err)
	}
	if err := rr.close(); err != nil {
		t.Fatal(err)
	}
	if rr, err = reopen("from a mark at the end"); err != nil {
		t.Fatal(err)
	}
	var cc counts
	if from, to := rr.log.RecoveryWalk(); from != last+1 || to != last {
		rr.close()
		t.Fatalf("the walk checked %d..%d, want none (the mark at %d)", from, to, last)
	}
	if err := checkLastConf(rr.log, &cc); err != nil || cc.ConfsUnknown != 0 || cc.ConfsKnown == 0 {
		rr.close()
		t.Fatalf("LastConf after a start from the mark: %v (%+v)", err, cc)
	}
	// Damage a unit below the mark, with the member stopped.
	const damaged = 7
	rr.log.idx.slot(damaged)[3] ^= 1
	if err := rr.close(); err != nil {
		t.Fatal(err)
	}
	rr, err = reopen("from the mark, a unit below it damaged")
	if err != nil {
		t.Fatal(err)
	}
	var ce *base.CorruptionError
	if _, err := rr.log.Entries(damaged, damaged+1, 1<<20); !errors.As(err, &ce) {
		rr.close()
		t.Fatalf("read of the damaged entry %d: %v, want a CorruptionError", damaged, err)
	}
	if err := rr.close(); err != nil {
		t.Fatal(err)
	}
	// A mark whose unit CRC does not match its entry is not taken.
	b, err := fs.ReadFile("/d/raft/" + markName)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := base.Unseal(b)
	bad := append([]byte(nil), body...)
	at := bytes.Index(bad, []byte(`"unit_crc":`)) + len(`"unit_crc":`)
	bad[at] = '1' + (bad[at]-'0')%9 // another first digit
	if err := fs.WriteFile("/d/raft/"+markName, base.Seal(bad)); err != nil {
		t.Fatal(err)
	}
	if _, err := openReplica(fs); !errors.As(err, &ce) {
		t.Fatalf("a start with a mark that does not match: %v, want the CorruptionError of a walk from FirstIndex", err)
	}
	if err := fs.Remove("/d/raft/" + markName); err != nil {
		t.Fatal(err)
	}
	if _, err := openReplica(fs); !errors.As(err, &ce) {
		t.Fatalf("a start without the mark: %v, want the CorruptionError of a walk from FirstIndex", err)
	}
}

// TestSaveMark: SaveMark(every) writes only once the synced log is every
// entries past the mark written last, names only synced entries, and
// writes again at once after a truncation cut the entry it named.
func TestSaveMark(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	defer r.close()
	g := &gen{rng: rand.New(rand.NewPCG(7, 8)), term: 1}
	// mark is raft/mark as a start would take it (Index 0: none).
	mark := func() logBase {
		m, _ := r.log.loadMark(1<<40, 1<<40)
		return m
	}
	sync := func(commit uint64) {
		t.Helper()
		if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(commit)}); err != nil {
			t.Fatal(err)
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	add := func(k uint64, n int) []*pb.Entry {
		t.Helper()
		ents := g.entries(r.log, k, n)
		if err := r.log.Append(ents); err != nil {
			t.Fatal(err)
		}
		return ents
	}
	save := func(every uint64) {
		t.Helper()
		if err := r.log.SaveMark(every); err != nil {
			t.Fatal(err)
		}
	}
	const commit = 10
	add(1, commit)
	sync(commit)
	add(commit+1, 3) // appended, not synced: not named
	save(5)
	if m := mark(); m.Index != commit {
		t.Fatalf("mark at %d, want entry %d, the last synced", m.Index, commit)
	}
	sync(commit)
	save(5) // 3 past it: not yet
	if m := mark(); m.Index != commit {
		t.Fatalf("mark at %d after 3 entries, want it left at %d until 5 more", m.Index, commit)
	}
	add(commit+4, 2)
	sync(commit)
	save(5)
	if m := mark(); m.Index != commit+5 {
		t.Fatalf("mark at %d, want %d (5 past the last one)", m.Index, commit+5)
	}
	// A truncation below the mark (uncommitted entries replaced): the
	// next SaveMark names the new entry, however few were added.
	ents := add(commit+2, 1)
	sync(commit)
	save(5)
	if m := mark(); m.Index != commit+2 || m.Term != ents[0].GetTerm() {
		t.Fatalf("mark %d (term %d) after the truncation, want %d (term %d)", m.Index, m.Term, commit+2, ents[0].GetTerm())
	}
}

// TestInstallRemovesMark: a snapshot install empties the meta-log, so the
// meta-log end a mark records would not hold: InstallBase removes it, and
// the start after the install walks from the new base.
func TestInstallRemovesMark(t *testing.T) {
	r, g, last := filledReplica(t, 9)
	if err := r.log.SaveMark(1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.fs.Size("/d/raft/" + markName); err != nil {
		t.Fatalf("no mark before the install: %v", err)
	}
	s := last + 5
	if err := r.log.InstallSnapshot(s, g.term+1, r.cl.MaxOffset(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.fs.Size("/d/raft/" + markName); err == nil {
		t.Fatal("raft/mark is still there after the install")
	}
	if err := r.log.SaveMark(1); err != nil { // nothing synced past the base: nothing to name
		t.Fatal(err)
	}
	if _, err := r.fs.Size("/d/raft/" + markName); err == nil {
		t.Fatal("a mark was written for the snapshot's base")
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	rr := mustOpen(t, r.fs)
	defer rr.close()
	if from, to := rr.log.RecoveryWalk(); from != s+1 || to != s {
		t.Fatalf("the walk after the install checked %d..%d, want none from %d", from, to, s+1)
	}
}
