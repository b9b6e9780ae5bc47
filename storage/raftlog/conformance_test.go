package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/vfs"
)

// conformanceSequences is the number of random sequences of
// TestConformance (design §5.2: 10,000), scaled down under -race.
func conformanceSequences() int {
	if raceEnabled || testing.Short() {
		return 500
	}
	return 10000
}

// leader generates entries the way a raft leader and its stamping put
// path would: terms never below the previous entry's, DATA records stamped
// for where they go (Place from the end of the previous DATA entry), and
// entries that replace others (k at or below the last index) in a term no
// entry had before: raft makes at most one entry per index and term, and
// raft/mark relies on it (mark.go).
type gen struct {
	rng  *rand.Rand
	term uint64
}

func (g *gen) entries(l *Log, k uint64, n int) []*pb.Entry {
	end, err := l.NextPos(k-1, 0)
	if err != nil {
		panic(err)
	}
	prevTerm, err := l.Term(k - 1)
	if err != nil {
		panic(err)
	}
	if last, _ := l.LastIndex(); g.rng.IntN(3) == 0 || k <= last {
		g.term++
	}
	g.term = max(g.term, prevTerm)
	var out []*pb.Entry
	for j := 0; j < n; j++ {
		e := &pb.Entry{Term: proto.Uint64(g.term), Index: proto.Uint64(k + uint64(j))}
		switch g.rng.IntN(6) {
		case 0: // EMPTY
		case 1: // CMD: storaged command bytes (no record magic at +4)
			e.Data = append([]byte{0, 0, 0, 0, 0xC0, 0xDE, 0, 1}, make([]byte, g.rng.IntN(40))...)
		case 2: // CONF
			e.Type = pb.EntryConfChangeV2.Enum()
			if g.rng.IntN(4) == 0 {
				e.Type = pb.EntryConfChange.Enum()
			}
			e.Data = make([]byte, g.rng.IntN(30))
			for i := range e.Data {
				e.Data[i] = byte(g.rng.Uint32())
			}
		default: // DATA
			specs := records(g.rng, 1+g.rng.IntN(3))
			pos := Place(end, specsLen(specs), testFileSize)
			e.Data = encodeAt(specs, pos)
			end = pos + int64(len(e.Data))
		}
		out = append(out, e)
	}
	return out
}

// TestConformance runs random sequences of Append (overlapping, so
// truncating), SetHardState, Sync and restart (close and reopen from the
// same MemFS) against raft.MemoryStorage, comparing Entries, Term,
// FirstIndex, LastIndex, InitialState and Snapshot after every step.
func TestConformance(t *testing.T) {
	n := conformanceSequences()
	diffs := 0
	var c counts
	for seed := 0; seed < n && diffs == 0; seed++ {
		if err := conformanceSequence(uint64(seed), &c); err != nil {
			t.Errorf("seed %d: %v", seed, err)
			diffs++
		}
	}
	t.Logf("%d sequences, %d with differences; %+v", n, diffs, c)
	// The suite must exercise what it claims to.
	if c.Truncations == 0 || c.DataTruncations == 0 || c.Restarts == 0 || c.Blanks == 0 || c.Entries == 0 || c.Compactions == 0 ||
		c.IndexFilesDropped == 0 || c.Marks == 0 || c.MarkStarts == 0 || c.MarksIgnored == 0 || c.ConfsKnown == 0 || c.ConfsUnknown == 0 ||
		c.Cached == 0 || c.Uncached == 0 {
		t.Errorf("the sequences missed a case: %+v", c)
	}
}

type counts struct {
	Entries, Truncations, DataTruncations, Restarts, Blanks int
	Compactions, IndexFilesDropped                          int
	// Marks written (SaveMark after a Sync), restarts whose walk began at
	// one, and restarts that found one and walked from the base instead
	// (a truncation had cut the marked entry, or compaction passed it).
	Marks, MarkStarts, MarksIgnored int
	// Steps after which the entry cache held entries, and steps after
	// which some entry had to be read from the files.
	Cached, Uncached int
	// Steps after which LastConf was known (and checked against the
	// units) and named an entry, and steps after which it was not known.
	ConfsKnown, ConfsUnknown int
}

// checkLastConf checks LastConf, when known, against the units: the
// newest CONF entry from FirstIndex on (an older one, compacted, counts
// as none there).
func checkLastConf(l *Log, c *counts) error {
	got, ok := l.LastConf()
	if !ok {
		c.ConfsUnknown++
		return nil
	}
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	var want uint64
	for i := last; i >= first && i > 0; i-- {
		if u, err := l.unitAt(i); err != nil {
			return err
		} else if u.Kind == KindConf {
			want = i
			break
		}
	}
	if got < first {
		got = 0
	}
	if got != want {
		return fmt.Errorf("LastConf %d, the units' newest CONF entry %d (first %d, last %d)", got, want, first, last)
	}
	if got > 0 {
		c.ConfsKnown++
	}
	return nil
}

func conformanceSequence(seed uint64, c *counts) (err error) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	fs := vfs.NewMem()
	// The entry cache off, a few entries' worth (evicting all the time),
	// or the default (the whole sequence's entries between restarts).
	cacheBytes := [...]int{-1, 1 + rng.IntN(4096), 0}[rng.IntN(3)]
	open := func() (*replica, error) { return openReplicaCache(fs, testMeta, 0, false, cacheBytes) }
	r, err := open()
	if err != nil {
		return err
	}
	defer func() {
		if r == nil {
			return // a reopen failed: its error is err
		}
		if cerr := r.close(); err == nil {
			err = cerr
		}
	}()
	ms := raft.NewMemoryStorage()
	g := &gen{rng: rng}
	hs := &pb.HardState{}
	syncedHS := hs
	steps := 10 + rng.IntN(30)
	for step := 0; step < steps; step++ {
		last, _ := ms.LastIndex()
		var what string
		switch op := rng.IntN(11); {
		case op < 5: // Append, overlapping a random uncommitted suffix sometimes
			k := last + 1
			if last > hs.GetCommit() && rng.IntN(3) == 0 {
				k = hs.GetCommit() + 1 + rng.Uint64N(last-hs.GetCommit())
			}
			ents := g.entries(r.log, k, 1+rng.IntN(5))
			what = fmt.Sprintf("Append(%d..%d)", k, k+uint64(len(ents))-1)
			if err := ms.Append(ents); err != nil {
				return err
			}
			before := r.cl.MaxOffset()
			if err := r.log.Append(ents); err != nil {
				return fmt.Errorf("step %d %s: %w", step, what, err)
			}
			c.Entries += len(ents)
			if k <= last {
				c.Truncations++
				if end, _ := r.log.NextPos(k-1, 0); end < before {
					c.DataTruncations++
				}
			}
			for _, e := range ents {
				if u, _ := r.log.unitAt(e.GetIndex()); u.Flags&FlagBlank != 0 {
					c.Blanks++
				}
			}
		case op < 7: // SetHardState
			hs = &pb.HardState{Term: proto.Uint64(max(hs.GetTerm(), g.term)), Vote: proto.Uint64(rng.Uint64N(4)),
				Commit: proto.Uint64(hs.GetCommit() + rng.Uint64N(last-hs.GetCommit()+1))}
			what = fmt.Sprintf("SetHardState(%v)", hs)
			ms.SetHardState(hs)
			if err := r.log.SetHardState(hs); err != nil {
				return err
			}
		case op < 9:
			what = "Sync"
			if err := r.log.Sync(); err != nil {
				return fmt.Errorf("step %d Sync: %w", step, err)
			}
			syncedHS = hs
			if rng.IntN(2) == 0 {
				what = "Sync, SaveMark"
				if err := r.log.SaveMark(1); err != nil {
					return fmt.Errorf("step %d SaveMark: %w", step, err)
				}
				c.Marks++
			}
		case op == 10: // Compact up to a durably committed index, as raft's owner would
			first, _ := ms.FirstIndex()
			commit := syncedHS.GetCommit()
			if commit < first {
				what = "no Compact (nothing durably committed past FirstIndex)"
				break
			}
			i := first + rng.Uint64N(commit-first+1)
			what = fmt.Sprintf("Compact(%d)", i)
			if _, err := ms.CreateSnapshot(i, nil, nil); err != nil {
				return err
			}
			if err := ms.Compact(i); err != nil {
				return err
			}
			files := len(r.log.idx.files)
			if err := r.log.Compact(i); err != nil {
				return fmt.Errorf("step %d %s: %w", step, what, err)
			}
			c.Compactions++
			c.IndexFilesDropped += files - len(r.log.idx.files)
			if err := r.log.Compact(i); !errors.Is(err, raft.ErrCompacted) {
				return fmt.Errorf("step %d %s again: %v, want ErrCompacted", step, what, err)
			}
		case op == 9:
			what = "restart"
			c.Restarts++
			if rng.IntN(2) == 0 {
				if err := r.log.Sync(); err != nil {
					return err
				}
				syncedHS = hs
			} else {
				// kill -9: the page cache keeps every byte, but a HardState
				// set since the last Sync was never written.
				what = "kill -9 and restart"
				hs = syncedHS
				ms.SetHardState(hs)
			}
			if err := r.close(); err != nil {
				return err
			}
			_, marked := fs.Size("/d/raft/" + markName)
			if r, err = open(); err != nil {
				return fmt.Errorf("step %d reopen: %w", step, err)
			}
			switch {
			case r.log.markSaved > 0:
				c.MarkStarts++
			case marked == nil:
				c.MarksIgnored++
			}
		}
		if err := compare(ms, r.log, rng); err != nil {
			return fmt.Errorf("after step %d %s: %w", step, what, err)
		}
		if f, l := r.log.first, r.log.last; l >= f {
			if len(r.log.cache.ents) > 0 {
				c.Cached++
			}
			if len(r.log.cache.ents) == 0 || r.log.cache.first > f {
				c.Uncached++
			}
		}
		if err := checkLastConf(r.log, c); err != nil {
			return fmt.Errorf("after step %d %s: %w", step, what, err)
		}
	}
	return nil
}

// compare reports the first difference between want and got.
func compare(want *raft.MemoryStorage, got *Log, rng *rand.Rand) error {
	wf, _ := want.FirstIndex()
	gf, _ := got.FirstIndex()
	wl, _ := want.LastIndex()
	gl, _ := got.LastIndex()
	if wf != gf || wl != gl {
		return fmt.Errorf("FirstIndex/LastIndex %d/%d, MemoryStorage %d/%d", gf, gl, wf, wl)
	}
	whs, wcs, _ := want.InitialState()
	ghs, gcs, err := got.InitialState()
	if err != nil {
		return err
	}
	if !proto.Equal(normHS(whs), normHS(ghs)) {
		return fmt.Errorf("HardState %v, MemoryStorage %v", ghs, whs)
	}
	_ = wcs // MemoryStorage has no bootstrap ConfState; ours is raft/meta's
	if !proto.Equal(gcs, &pb.ConfState{Voters: testMeta.Voters}) {
		return fmt.Errorf("ConfState %v", gcs)
	}
	ws, _ := want.Snapshot()
	gs, _ := got.Snapshot()
	if ws.GetMetadata().GetIndex() != gs.GetMetadata().GetIndex() || ws.GetMetadata().GetTerm() != gs.GetMetadata().GetTerm() {
		return fmt.Errorf("Snapshot %v, MemoryStorage %v", gs.GetMetadata(), ws.GetMetadata())
	}
	for i := wf - 1; i <= wl+1; i++ {
		wt, werr := want.Term(i)
		gt, gerr := got.Term(i)
		if wt != gt || !errors.Is(gerr, werr) {
			return fmt.Errorf("Term(%d) = %d, %v; MemoryStorage %d, %v", i, gt, gerr, wt, werr)
		}
	}
	check := func(lo, hi, maxSize uint64) error {
		we, werr := want.Entries(lo, hi, maxSize)
		ge, gerr := got.Entries(lo, hi, maxSize)
		if !errors.Is(gerr, werr) || len(we) != len(ge) {
			return fmt.Errorf("Entries(%d, %d, %d): %d entries, %v; MemoryStorage %d, %v", lo, hi, maxSize, len(ge), gerr, len(we), werr)
		}
		for j := range we {
			if err := sameEntry(we[j], ge[j]); err != nil {
				return fmt.Errorf("Entries(%d, %d, %d)[%d]: %w", lo, hi, maxSize, j, err)
			}
		}
		return nil
	}
	if err := check(wf, wl+1, ^uint64(0)); err != nil {
		return err
	}
	if wl >= wf {
		lo := wf + rng.Uint64N(wl-wf+1)
		hi := lo + rng.Uint64N(wl+2-lo)
		if err := check(lo, hi, rng.Uint64N(8000)); err != nil {
			return err
		}
	}
	return check(wf-1, wf, 0) // below FirstIndex: ErrCompacted on both
}

func normHS(hs *pb.HardState) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(hs.GetTerm()), Vote: proto.Uint64(hs.GetVote()), Commit: proto.Uint64(hs.GetCommit())}
}

// sameEntry compares what raft sees of an entry (the getters: a missing
// Type is EntryNormal, a nil Data is empty).
func sameEntry(w, g *pb.Entry) error {
	if w.GetIndex() != g.GetIndex() || w.GetTerm() != g.GetTerm() || w.GetType() != g.GetType() || !bytes.Equal(w.GetData(), g.GetData()) {
		return fmt.Errorf("entry %d/%d %v (%d bytes), MemoryStorage %d/%d %v (%d bytes)",
			g.GetIndex(), g.GetTerm(), g.GetType(), len(g.GetData()), w.GetIndex(), w.GetTerm(), w.GetType(), len(w.GetData()))
	}
	return nil
}
