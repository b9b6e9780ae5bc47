package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

func powerLossPoints() int {
	if raceEnabled || testing.Short() {
		return 100
	}
	return 1000
}

// TestPowerLoss cuts the power (vfs.MemFS.Crash: every page written since
// its last sync survives, is lost or is torn by sector) at random points
// of random Append/SetHardState/Sync sequences, some of them inside a
// Sync whose n-th msync or fsync fails, and recovers the image: recovery
// never fails or panics, every entry whose Sync returned is there (unless
// a later truncation removed it), nothing else but a prefix of what was
// appended since, and the HardState is the last synced one (a Sync that
// changed the term or vote, or SyncCommit) or one written after it with
// the same term and vote (a commit-only change rides along unsynced), or,
// when a Sync failed midway, the one being written.
func TestPowerLoss(t *testing.T) {
	n := powerLossPoints()
	var stats struct{ midSync, recoveredUnsynced, truncations, commitBehind int }
	for seed := 0; seed < n; seed++ {
		mid, extra, tr, behind, err := powerLossRun(uint64(seed))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if mid {
			stats.midSync++
		}
		stats.recoveredUnsynced += extra
		stats.truncations += tr
		if behind {
			stats.commitBehind++
		}
	}
	t.Logf("%d crash points: %d inside a failing Sync; %d unsynced entries survived; %d truncations; %d recovered a commit behind the last written",
		n, stats.midSync, stats.recoveredUnsynced, stats.truncations, stats.commitBehind)
	if stats.midSync == 0 || stats.truncations == 0 || stats.commitBehind == 0 {
		t.Error("the runs missed a case")
	}
}

func powerLossRun(seed uint64) (midSync bool, extra, truncations int, commitBehind bool, err error) {
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	fs := vfs.NewMem()
	r, err := openReplica(fs)
	if err != nil {
		return false, 0, 0, false, err
	}
	closed := false
	defer func() {
		if !closed {
			r.close()
		}
	}()
	g := &gen{rng: rng}
	var (
		cur       = []*pb.Entry{{}} // the latest log, cur[i] is entry i
		must      uint64            // entries 1..must must survive
		syncedHS  = &pb.HardState{} // the last one synced: bootstrap writes {0, 0, 0} first
		written   []*pb.HardState   // written by a Sync since syncedHS, not synced: same term and vote
		pendingHS *pb.HardState
		hs        = &pb.HardState{}
		syncFail  = rng.IntN(3) == 0
	)
	steps := 5 + rng.IntN(40)
	for step := 0; step < steps; step++ {
		last := uint64(len(cur) - 1)
		switch op := rng.IntN(10); {
		case op < 5:
			k := last + 1
			if last > hs.GetCommit() && rng.IntN(3) == 0 {
				k = hs.GetCommit() + 1 + rng.Uint64N(last-hs.GetCommit())
				truncations++
			}
			ents := g.entries(r.log, k, 1+rng.IntN(5))
			if err := r.log.Append(ents); err != nil {
				return false, 0, 0, false, err
			}
			cur = append(cur[:k], ents...)
			must = min(must, k-1)
		case op < 7:
			// Commit only what a Sync made durable here (a leader's commit
			// needs this node's sync too, or a quorum elsewhere: either
			// way raft never sets it past what recovery keeps).
			hs = &pb.HardState{Term: proto.Uint64(max(hs.GetTerm(), g.term)), Vote: proto.Uint64(rng.Uint64N(4)),
				Commit: proto.Uint64(hs.GetCommit() + rng.Uint64N(must-min(must, hs.GetCommit())+1))}
			if err := r.log.SetHardState(hs); err != nil {
				return false, 0, 0, false, err
			}
			pendingHS = hs
		default:
			if syncFail && rng.IntN(2) == 0 {
				// Fail the n-th msync or fsync of this Sync, then cut the power.
				ops := []vfs.Op{vfs.OpSync, vfs.OpFileSync}
				fs.SetInjector(vfs.OnCall(ops[rng.IntN(2)], 1+rng.IntN(3), vfs.ErrInjected, true))
				if err := r.log.Sync(); err == nil {
					fs.SetInjector(nil)
					must = last
					syncedHS, written = wroteHS(syncedHS, written, pendingHS)
					pendingHS = nil
					continue
				}
				fs.SetInjector(nil)
				midSync = true
				step = steps // crash now
				continue
			}
			if rng.IntN(4) == 0 {
				// What a checkpoint or a command's apply does first.
				if err := r.log.SyncCommit(); err != nil {
					return false, 0, 0, false, err
				}
				if len(written) > 0 {
					syncedHS, written = written[len(written)-1], nil
				}
				continue
			}
			if err := r.log.Sync(); err != nil {
				return false, 0, 0, false, err
			}
			must = last
			syncedHS, written = wroteHS(syncedHS, written, pendingHS)
			pendingHS = nil
		}
	}
	r.cl.WaitPopulated()
	img := fs.Crash(rng)
	r.close()
	closed = true

	rec, err := openReplica(img)
	if err != nil {
		return midSync, 0, 0, false, fmt.Errorf("recovery failed: %w", err)
	}
	defer rec.close()
	got, _ := rec.log.LastIndex()
	if got < must {
		return midSync, 0, 0, false, fmt.Errorf("recovered %d entries, %d were synced", got, must)
	}
	if got > uint64(len(cur)-1) {
		return midSync, 0, 0, false, fmt.Errorf("recovered %d entries, only %d were appended", got, len(cur)-1)
	}
	if got > 0 {
		ents, err := rec.log.Entries(1, got+1, ^uint64(0))
		if err != nil {
			return midSync, 0, 0, false, err
		}
		for j, e := range ents {
			if err := sameEntry(cur[j+1], e); err != nil {
				return midSync, 0, 0, false, fmt.Errorf("recovered entry %d: %w", j+1, err)
			}
		}
	}
	ghs, _, _ := rec.log.InitialState()
	okHS := proto.Equal(normHS(ghs), normHS(syncedHS)) || (midSync && pendingHS != nil && proto.Equal(normHS(ghs), normHS(pendingHS)))
	for _, w := range written {
		okHS = okHS || proto.Equal(normHS(ghs), normHS(w))
	}
	if !okHS {
		return midSync, 0, 0, false, fmt.Errorf("recovered HardState %v, synced %v, written since %v (pending %v)", ghs, syncedHS, written, pendingHS)
	}
	if len(written) > 0 && ghs.GetCommit() < written[len(written)-1].GetCommit() {
		commitBehind = true
	}
	// The recovered log takes appends and survives a clean restart.
	g.term = max(g.term, ghs.GetTerm())
	more := g.entries(rec.log, got+1, 3)
	if err := rec.log.Append(more); err != nil {
		return midSync, 0, 0, false, fmt.Errorf("append after recovery: %w", err)
	}
	if err := rec.log.Sync(); err != nil {
		return midSync, 0, 0, false, err
	}
	if last, _ := rec.log.LastIndex(); last != got+3 {
		return midSync, 0, 0, false, fmt.Errorf("last index %d after appending 3 to %d", last, got)
	}
	return midSync, int(got - must), truncations, commitBehind, nil
}

// wroteHS is the model of a successful Sync that had hs pending (nil:
// none): a new term or vote is synced, a commit-only change is written
// and rides along.
func wroteHS(synced *pb.HardState, written []*pb.HardState, hs *pb.HardState) (*pb.HardState, []*pb.HardState) {
	if hs == nil {
		return synced, written
	}
	if hs.GetTerm() != synced.GetTerm() || hs.GetVote() != synced.GetVote() {
		return hs, nil // a new term or vote: synced
	}
	last := synced
	if len(written) > 0 {
		last = written[len(written)-1]
	}
	if proto.Equal(normHS(hs), normHS(last)) {
		return synced, written // nothing changed: nothing written
	}
	return synced, append(written, hs)
}

// TestRecoveryRefusesLostCommitted: a damaged unit or record below the
// commit index, or a HardState commit past the log, is a CorruptionError;
// above the commit index too, unless the damage is torn (design §3.4): a
// record with an all-zero 512 B sector (what a power cut leaves of an
// unsynced page), or the last unit (the only one a kill -9 can leave
// half written). Torn damage is cut, keeping a copy.
func TestRecoveryRefusesLostCommitted(t *testing.T) {
	flipUnit := func(r *replica, u Unit, i uint64) { r.log.idx.slot(i)[3] ^= 1 }
	flipRecord := func(r *replica, u Unit, i uint64) { r.cl.At(u.Pos)[u.Len-1] ^= 1 }
	// tearRecord zeroes the entry's bytes from a sector boundary past its
	// first 100 bytes to its end: the sectors a power cut did not write.
	tearRecord := func(r *replica, u Unit, i uint64) {
		from := u.Pos + 100
		from += (commitlog.SectorSize - from%commitlog.SectorSize) % commitlog.SectorSize
		if from >= u.Pos+int64(u.Len) {
			from = u.Pos + 100
		}
		b := r.cl.At(from)
		clear(b[:u.Pos+int64(u.Len)-from])
	}
	cases := []struct {
		name    string
		commit  uint64
		at      uint64 // the entry damaged
		damage  func(r *replica, u Unit, i uint64)
		corrupt bool
	}{
		{"unit bit flip below commit", 6, 5, flipUnit, true},
		{"unit bit flip above commit", 3, 5, flipUnit, true},
		{"last unit torn above commit", 3, 8, flipUnit, false},
		{"record bit flip below commit", 6, 5, flipRecord, true},
		{"record bit flip above commit", 3, 5, flipRecord, true},
		{"last record bit flip above commit", 3, 8, flipRecord, true},
		{"record torn above commit", 3, 5, tearRecord, false},
		{"record torn below commit", 6, 5, tearRecord, true},
		{"unit zeroed below commit", 6, 5, func(r *replica, u Unit, i uint64) { clear(r.log.idx.slot(i)) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			r := mustOpen(t, fs)
			rng := rand.New(rand.NewPCG(1, 2))
			g := &gen{rng: rng, term: 1}
			var ents []*pb.Entry
			for len(ents) < 8 { // 8 DATA entries
				e := g.entries(r.log, uint64(len(ents))+1, 1)[0]
				if classify(e) != KindData {
					continue
				}
				if err := r.log.Append([]*pb.Entry{e}); err != nil {
					t.Fatal(err)
				}
				ents = append(ents, e)
			}
			if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(c.commit)}); err != nil {
				t.Fatal(err)
			}
			if err := r.log.Sync(); err != nil {
				t.Fatal(err)
			}
			u, err := r.log.unitAt(c.at)
			if err != nil {
				t.Fatal(err)
			}
			c.damage(r, u, c.at)
			if err := r.close(); err != nil {
				t.Fatal(err)
			}
			rec, err := openReplica(fs)
			var ce *base.CorruptionError
			if c.corrupt {
				if err == nil || !errors.As(err, &ce) {
					rec.close()
					t.Fatalf("recovery: %v, want a CorruptionError", err)
				}
				if ce.File == "" || !strings.Contains(err.Error(), fmt.Sprint(ce.Offset)) {
					t.Fatalf("the error names no file or offset: %v", err)
				}
				t.Log(err)
				// Refused, and nothing acknowledged was cut: the entry's
				// bytes are still in the commitlog.
				b, rerr := fs.ReadFile("/d/commitlog/" + segment.FileName(u.Pos-u.Pos%testFileSize))
				if off := u.Pos % testFileSize; rerr != nil || int64(len(b)) < off+int64(u.Len) || commitlog.AllZero(b[off:off+int64(u.Len)]) {
					t.Fatalf("entry %d's commitlog bytes were cut (%v)", c.at, rerr)
				}
				// Refused again on the next attempt: the first did not cut it either.
				if rec, err := openReplica(fs); !errors.As(err, &ce) {
					if err == nil {
						rec.close()
					}
					t.Fatalf("second recovery: %v, want a CorruptionError", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("recovery: %v", err)
			}
			defer rec.close()
			if last, _ := rec.log.LastIndex(); last != c.at-1 {
				t.Fatalf("recovered last index %d, want %d (cut at the damaged entry %d)", last, c.at-1, c.at)
			}
			if c.at == 8 {
				return // the unit was cut; the bytes are past the recovered end
			}
			// The cut bytes are kept for post-mortem.
			b, err := fs.ReadFile("/d/commitlog/" + segment.FileName(u.Pos) + ".broken")
			if err != nil || len(b) == 0 {
				t.Fatalf("the cut commitlog bytes: %d bytes, %v", len(b), err)
			}
		})
	}
}

// TestTruncateRefusesCommitted: raft never replaces a committed entry; if
// asked, the Log refuses and stops.
func TestTruncateRefusesCommitted(t *testing.T) {
	r := mustOpen(t, vfs.NewMem())
	defer r.close()
	g := &gen{rng: rand.New(rand.NewPCG(3, 4)), term: 1}
	if err := r.log.Append(g.entries(r.log, 1, 5)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(3)}); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Append(g.entries(r.log, 3, 1)); !errors.Is(err, ErrTruncateCommitted) {
		t.Fatalf("Append over committed entry 3: %v", err)
	}
	if _, err := r.log.Term(1); !errors.Is(err, ErrStopped) {
		t.Fatalf("after a refused truncation: %v, want ErrStopped", err)
	}
}

// TestMetaRefusesAnotherNode: a data dir bootstrapped for node 1 refuses
// to open as node 2, or for another group or file size.
func TestMetaRefusesAnotherNode(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(*Meta){
		func(m *Meta) { m.NodeID = 2 },
		func(m *Meta) { m.Group = "g2" },
		func(m *Meta) { m.ClusterUUID = "other" },
		func(m *Meta) { m.Voters = []uint64{1, 2} },
	} {
		want := testMeta
		m(&want)
		if _, _, err := loadOrBootstrapMeta(fs, "/d/raft", want, testUnits, false); !errors.Is(err, ErrMetaMismatch) {
			t.Errorf("meta %+v: %v, want ErrMetaMismatch", want, err)
		}
	}
	if _, _, err := loadOrBootstrapMeta(fs, "/d/raft", testMeta, testUnits, false); err != nil {
		t.Errorf("the same meta: %v", err)
	}
}

// TestTruncateKeepsCopy: the truncated commitlog bytes are kept in
// commitlog/<offset>.truncated, the suffix is gone from the log, and the
// new entries take its place.
func TestTruncateKeepsCopy(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	defer r.close()
	g := &gen{rng: rand.New(rand.NewPCG(5, 6)), term: 1}
	var ents []*pb.Entry
	for len(ents) < 5 {
		e := g.entries(r.log, uint64(len(ents))+1, 1)[0]
		if classify(e) != KindData {
			continue
		}
		if err := r.log.Append([]*pb.Entry{e}); err != nil {
			t.Fatal(err)
		}
		ents = append(ents, e)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	u3, _ := r.log.unitAt(3)
	p, _ := r.log.NextPos(2, 0)
	g.term = 2
	repl := g.entries(r.log, 3, 1)
	if err := r.log.Append(repl); err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile("/d/commitlog/" + segment.FileName(p) + ".truncated")
	if err != nil {
		t.Fatal(err)
	}
	if got := b[u3.Pos-p:][:u3.Len]; !bytes.Equal(got, ents[2].GetData()) {
		t.Fatal("the .truncated copy does not hold entry 3's bytes")
	}
	if last, _ := r.log.LastIndex(); last != 3 {
		t.Fatalf("last index %d after replacing 3..5 by one entry", last)
	}
	got, err := r.log.Entries(3, 4, ^uint64(0))
	if err != nil || sameEntry(repl[0], got[0]) != nil {
		t.Fatalf("entry 3 after the truncation: %v %v", got, err)
	}
}
