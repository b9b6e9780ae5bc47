package raftlog

import (
	"errors"
	iofs "io/fs"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/vfs"
)

// metaOf is testMeta for member id of a group with the given voters.
func metaOf(id uint64, voters ...uint64) Meta {
	m := testMeta
	m.NodeID = id
	if len(voters) > 0 {
		m.Voters = voters
	}
	return m
}

// genLogs generates a common prefix of n entries and, after it, one
// suffix per seed (m entries each, in terms above the prefix's): each
// suffix is a different log continuing the prefix, as two leaders of
// later terms would have written them.
func genLogs(t *testing.T, seed uint64, n, m int, suffixSeeds ...uint64) (common []*pb.Entry, suffixes [][]*pb.Entry) {
	t.Helper()
	r := mustOpen(t, vfs.NewMem())
	defer r.close()
	g := &gen{rng: rand.New(rand.NewPCG(seed, 7)), term: 1}
	appendOne := func(e *pb.Entry) {
		if err := r.log.Append([]*pb.Entry{proto.Clone(e).(*pb.Entry)}); err != nil {
			t.Fatal(err)
		}
	}
	for len(common) < n {
		e := g.entries(r.log, uint64(len(common))+1, 1)[0]
		appendOne(e)
		common = append(common, e)
	}
	for k, s := range suffixSeeds {
		gs := &gen{rng: rand.New(rand.NewPCG(s, 9)), term: g.term + 1 + uint64(k)*100}
		var suf []*pb.Entry
		for len(suf) < m {
			e := gs.entries(r.log, uint64(n+len(suf))+1, 1)[0]
			appendOne(e) // the first one truncates the previous suffix (nothing is committed)
			suf = append(suf, e)
		}
		suffixes = append(suffixes, suf)
	}
	return common, suffixes
}

// writeReplica writes ents and hs to a new replica as the member meta
// names, synced, and closes it.
func writeReplica(t *testing.T, meta Meta, hs *pb.HardState, ents ...[]*pb.Entry) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewMem()
	r, err := openReplicaAs(fs, meta)
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for _, run := range ents {
		for _, e := range run {
			if e.GetIndex() != next {
				t.Fatalf("entry %d, want %d", e.GetIndex(), next)
			}
			if err := r.log.Append([]*pb.Entry{proto.Clone(e).(*pb.Entry)}); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	if err := r.log.Joined(); err != nil { // caught up once: a member that kept its data dir
		t.Fatal(err)
	}
	if err := r.log.SetHardState(hs); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	return fs
}

func hardState(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

// openAs opens the replica in fs as meta names it, failing the test on
// an error; the replica is closed at the end of the test.
func openAs(t *testing.T, fs vfs.FS, meta Meta) *replica {
	t.Helper()
	r, err := openReplicaAs(fs, meta)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.close() })
	return r
}

// repairWith runs Repair on the replica in fs with o's peers, self and
// checkpoint point.
func repairWith(fs vfs.FS, o RepairOptions) (RepairReport, error) {
	nop := zerolog.Nop()
	cl, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: testFileSize, RequireCRC: true,
		Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(1, nil)})
	if err != nil {
		return RepairReport{}, err
	}
	defer cl.Close()
	o.FS, o.Dir, o.Commitlog, o.IndexUnits, o.RequireCRC = fs, "/d/raft", cl, testUnits, true
	return Repair(o)
}

// wantCorrupt fails unless err is a *CorruptionError naming file.
func wantCorrupt(t *testing.T, err error, file string) {
	t.Helper()
	var cerr *base.CorruptionError
	if !errors.As(err, &cerr) || cerr.File != file {
		t.Fatalf("%v, want a corruption error naming %s", err, file)
	}
}

// TestOpenRefusesLostRaftState: a raft log whose hardstate has no valid
// slot, or is missing, or whose meta is damaged or missing, is refused
// at Open and by CommitEnd (which the store reads first) with a
// CorruptionError naming the file: a member restarted at term 0 could
// vote twice in a term, and one bootstrapped again would forget who it
// is. A missing raft/meta is not bootstrapped over the log. A new raft
// dir gets a valid HardState slot at bootstrap, so its first units never
// look like a lost HardState.
func TestOpenRefusesLostRaftState(t *testing.T) {
	common, _ := genLogs(t, 1, 20, 0)
	for _, c := range []struct {
		name, file string
		damage     func(fs *vfs.MemFS)
	}{
		{"hardstate zeroed", "raft/hardstate", func(fs *vfs.MemFS) { fs.WriteFile("/d/raft/hardstate", make([]byte, 2*slotSize)) }},
		{"hardstate missing", "raft/hardstate", func(fs *vfs.MemFS) { fs.Remove("/d/raft/hardstate") }},
		{"hardstate slots flipped", "raft/hardstate", func(fs *vfs.MemFS) {
			b, _ := fs.ReadFile("/d/raft/hardstate")
			b[10] ^= 1
			b[slotSize+10] ^= 1
			fs.WriteFile("/d/raft/hardstate", b)
		}},
		{"meta damaged", "raft/meta", func(fs *vfs.MemFS) {
			b, _ := fs.ReadFile("/d/raft/meta")
			b[3] ^= 1
			fs.WriteFile("/d/raft/meta", b)
		}},
		{"meta missing", "raft/meta", func(fs *vfs.MemFS) { fs.Remove("/d/raft/meta") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := writeReplica(t, metaOf(1), hardState(3, 1, 15), common)
			c.damage(fs)
			before, _ := fs.ReadFile("/d/raft/meta")
			_, err := CommitEnd(fs, "/d/raft", testUnits)
			wantCorrupt(t, err, c.file)
			_, err = openReplicaAs(fs, metaOf(1))
			wantCorrupt(t, err, c.file)
			// Open refuses too, without CommitEnd's check first.
			nop := zerolog.Nop()
			cl, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: testFileSize, RequireCRC: true,
				Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(1, nil)})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if _, err := cl.Recover(0, 0); err != nil {
				t.Fatal(err)
			}
			cl.Start()
			l, err := Open(Options{FS: fs, Dir: "/d/raft", Commitlog: cl, Meta: metaOf(1), RequireCRC: true, IndexUnits: testUnits})
			if err == nil {
				l.Close()
			}
			wantCorrupt(t, err, c.file)
			if after, _ := fs.ReadFile("/d/raft/meta"); !reflect.DeepEqual(before, after) {
				t.Fatal("the refused Open wrote raft/meta")
			}
		})
	}
	// A new dir: bootstrapped with a valid slot, it reopens with entries
	// synced before any HardState was set.
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	g := &gen{rng: rand.New(rand.NewPCG(3, 7)), term: 1}
	if err := r.log.Append(g.entries(r.log, 1, 3)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	r.close()
	if _, found, err := readHardState(fs, "/d/raft"); !found || err != nil {
		t.Fatalf("no valid HardState slot after bootstrap (%v)", err)
	}
	mustOpen(t, fs).close()
}

// TestRepairRebuildsHardState: member 3's raft/hardstate is zeroed.
// Repair writes term = the highest of the peers' terms and its own log's,
// vote = 3 (no second vote in that term), commit = the highest index it
// holds identically to a peer that committed it (its log diverges from
// the peers' after entry 40, the peers committed 45) or the checkpoint's
// applied index when higher; the member then opens with that HardState
// and its whole log. It refuses when too few voters answer for every
// majority including member 3 to have one (3 voters: both peers), when a
// joining peer is one of them, and when the checkpoint's applied entry is
// not in the log; a learner needs one peer and votes for nobody.
func TestRepairRebuildsHardState(t *testing.T) {
	common, suf := genLogs(t, 2, 40, 10, 21, 22)
	peerLog, ownLog := suf[0], suf[1]
	lastTerm := ownLog[len(ownLog)-1].GetTerm()
	type group struct {
		c    *vfs.MemFS
		a, b *replica
	}
	setup := func(t *testing.T, termA, termB uint64, cMeta Meta, joiningB bool) group {
		fa := writeReplica(t, metaOf(1), hardState(termA, 1, 45), common, peerLog)
		fb := writeReplica(t, metaOf(2), hardState(termB, 1, 45), common, peerLog)
		if joiningB {
			fb.WriteFile("/d/raft/"+joiningName, []byte("joining\n"))
		}
		fc := writeReplica(t, cMeta, hardState(lastTerm, 2, 38), common, ownLog)
		fc.WriteFile("/d/raft/hardstate", make([]byte, 2*slotSize))
		if _, err := openReplicaAs(fc, cMeta); err == nil {
			t.Fatal("the member opened without its HardState")
		}
		return group{c: fc, a: openAs(t, fa, metaOf(1)), b: openAs(t, fb, metaOf(2))}
	}
	check := func(t *testing.T, g group, meta Meta, rep RepairReport, want HardState) {
		t.Helper()
		if rep.HardState == nil || *rep.HardState != want {
			t.Fatalf("rebuilt HardState %+v, want %+v", rep.HardState, want)
		}
		r := openAs(t, g.c, meta)
		hs, _, _ := r.log.InitialState()
		if hs.GetTerm() != want.Term || hs.GetVote() != want.Vote || hs.GetCommit() != want.Commit {
			t.Fatalf("opened with %v, want %+v", hs, want)
		}
		if last, _ := r.log.LastIndex(); last != 50 {
			t.Fatalf("last index %d after the repair, want 50", last)
		}
	}
	t.Run("both peers", func(t *testing.T) {
		g := setup(t, 4, 5, metaOf(3), false)
		rep, err := repairWith(g.c, RepairOptions{Peers: []Peer{peerOf(1, g.a), peerOf(2, g.b)}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, g, metaOf(3), rep, HardState{Term: max(5, lastTerm), Vote: 3, Commit: 40})
	})
	t.Run("a peer's term above the log's", func(t *testing.T) {
		g := setup(t, 4, lastTerm+7, metaOf(3), false)
		rep, err := repairWith(g.c, RepairOptions{Peers: []Peer{peerOf(1, g.a), peerOf(2, g.b)}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, g, metaOf(3), rep, HardState{Term: lastTerm + 7, Vote: 3, Commit: 40})
	})
	t.Run("checkpoint applied above", func(t *testing.T) {
		g := setup(t, 4, 5, metaOf(3), false)
		rep, err := repairWith(g.c, RepairOptions{Peers: []Peer{peerOf(1, g.a), peerOf(2, g.b)}, Applied: 44, AppliedTerm: ownLog[3].GetTerm()})
		if err != nil {
			t.Fatal(err)
		}
		check(t, g, metaOf(3), rep, HardState{Term: max(5, lastTerm), Vote: 3, Commit: 44})
	})
	t.Run("checkpoint applied another entry", func(t *testing.T) {
		g := setup(t, 4, 5, metaOf(3), false)
		_, err := repairWith(g.c, RepairOptions{Peers: []Peer{peerOf(1, g.a), peerOf(2, g.b)}, Applied: 44, AppliedTerm: 1})
		if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), "entry 44") {
			t.Fatalf("%v, want ErrRepair naming entry 44", err)
		}
	})
	refused := func(t *testing.T, g group, meta Meta, peers []Peer, want string) {
		t.Helper()
		rep, err := repairWith(g.c, RepairOptions{Peers: peers})
		if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v, want ErrRepair saying %q", err, want)
		}
		if len(rep.Peers) != len(peers) || rep.Peers[0].ID != 1 || rep.Peers[0].Term != 4 {
			t.Fatalf("the report says the peers answered %+v", rep.Peers)
		}
		if b, _ := g.c.ReadFile("/d/raft/hardstate"); !commitlog.AllZero(b) {
			t.Fatal("the refused repair wrote raft/hardstate")
		}
		if _, err := openReplicaAs(g.c, meta); err == nil {
			t.Fatal("the member opened after a refused repair")
		}
	}
	t.Run("one peer", func(t *testing.T) {
		g := setup(t, 4, 5, metaOf(3), false)
		refused(t, g, metaOf(3), []Peer{peerOf(1, g.a)}, "reach 1 more of members [2]")
	})
	t.Run("a joining peer", func(t *testing.T) {
		g := setup(t, 4, 5, metaOf(3), true)
		refused(t, g, metaOf(3), []Peer{peerOf(1, g.a), peerOf(2, g.b)}, "reach 1 more of members [2]")
	})
	t.Run("learner", func(t *testing.T) {
		m := metaOf(3, 1, 2)
		m.Learners = []uint64{3}
		g := setup(t, 4, 5, m, false)
		rep, err := repairWith(g.c, RepairOptions{Peers: []Peer{peerOf(2, g.b)}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, g, m, rep, HardState{Term: max(5, lastTerm), Vote: 0, Commit: 40})
	})
}

// TestRepairRebuildsMeta: member 3's raft/meta is damaged or missing.
// Repair rebuilds it from a peer's with this member's id (o.Self), equal
// to the one it lost, keeps the damaged copy, and the member opens. It
// refuses without o.Self, and when a peer's group, file size or members
// disagree with o.Self, writing nothing.
func TestRepairRebuildsMeta(t *testing.T) {
	common, _ := genLogs(t, 4, 30, 0)
	setup := func(t *testing.T, damage func(*vfs.MemFS)) (*vfs.MemFS, []Peer, Meta) {
		fa := writeReplica(t, metaOf(1), hardState(3, 1, 25), common)
		fc := writeReplica(t, metaOf(3), hardState(3, 1, 25), common)
		want, err := ReadMeta(fc, "/d/raft")
		if err != nil {
			t.Fatal(err)
		}
		damage(fc)
		if _, err := openReplicaAs(fc, metaOf(3)); err == nil {
			t.Fatal("the member opened with its raft/meta damaged")
		}
		return fc, []Peer{peerOf(1, openAs(t, fa, metaOf(1)))}, want
	}
	flip := func(fs *vfs.MemFS) {
		b, _ := fs.ReadFile("/d/raft/meta")
		b[len(b)/2] ^= 0x20
		fs.WriteFile("/d/raft/meta", b)
	}
	for name, damage := range map[string]func(*vfs.MemFS){
		"damaged": flip,
		"missing": func(fs *vfs.MemFS) { fs.Remove("/d/raft/meta") },
	} {
		t.Run(name, func(t *testing.T) {
			fc, peers, want := setup(t, damage)
			before, _ := fc.ReadFile("/d/raft/meta")
			rep, err := repairWith(fc, RepairOptions{Peers: peers, Self: metaOf(3)})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.MetaRebuilt || rep.HardState != nil || len(rep.Damaged) != 0 {
				t.Fatalf("report %+v, want only raft/meta rebuilt", rep)
			}
			got, err := ReadMeta(fc, "/d/raft")
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("rebuilt meta %+v (%v), want %+v", got, err, want)
			}
			if kept, err := fc.ReadFile("/d/raft/meta.broken"); name == "damaged" && (err != nil || !reflect.DeepEqual(kept, before)) {
				t.Fatalf("the damaged meta was not kept (%v)", err)
			}
			r := openAs(t, fc, metaOf(3))
			if last, _ := r.log.LastIndex(); last != 30 {
				t.Fatalf("last index %d, want 30", last)
			}
		})
	}
	for name, c := range map[string]struct {
		self Meta
		want string
	}{
		"no self":         {Meta{}, "--raft-id"},
		"another group":   {func() Meta { m := metaOf(3); m.Group = "g2"; return m }(), "group"},
		"another size":    {func() Meta { m := metaOf(3); m.FileSize *= 2; return m }(), "file size"},
		"not a member":    {metaOf(4), "does not list member 4"},
		"other members":   {metaOf(3, 1, 2, 3, 4, 5), "bootstrap members"},
		"from itself too": {metaOf(1), "own id"},
	} {
		t.Run(name, func(t *testing.T) {
			fc, peers, _ := setup(t, flip)
			before, _ := fc.ReadFile("/d/raft/meta")
			_, err := repairWith(fc, RepairOptions{Peers: peers, Self: c.self})
			if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrRepair saying %q", err, c.want)
			}
			if after, _ := fc.ReadFile("/d/raft/meta"); !reflect.DeepEqual(before, after) {
				t.Fatal("the refused repair wrote raft/meta")
			}
		})
	}
	// An intact meta that the flags do not name is refused too.
	fa := writeReplica(t, metaOf(1), hardState(3, 1, 25), common)
	fc := writeReplica(t, metaOf(3), hardState(3, 1, 25), common)
	peers := []Peer{peerOf(1, openAs(t, fa, metaOf(1)))}
	if _, err := repairWith(fc, RepairOptions{Peers: peers, Self: metaOf(2)}); !errors.Is(err, ErrMetaMismatch) {
		t.Fatalf("repair of node 3's dir as node 2: %v, want ErrMetaMismatch", err)
	}
}

// TestRepairCutsEntryNoMajorityHolds: member 3 holds entries 41-50 past
// the commit index 40 that no peer holds (member 1's log ends at 40,
// member 2 holds other entries there), and one of them is damaged, not
// torn. Repair cuts the log from it only when the peers that provably
// lack it leave fewer voters than a majority: with 3 voters both peers,
// with 5 three of the four (two peers that are down could hold it and,
// with member 3, commit it); a joining peer proves nothing. Otherwise it
// refuses naming the members to reach, and writes nothing. A peer that
// holds the same entry repairs it instead.
func TestRepairCutsEntryNoMajorityHolds(t *testing.T) {
	common, suf := genLogs(t, 5, 40, 10, 31, 32)
	own, other := suf[0], suf[1]
	var at uint64 // a DATA entry of member 3's suffix, not its last
	for _, e := range own[2 : len(own)-2] {
		if classify(e) == KindData {
			at = e.GetIndex()
			break
		}
	}
	if at == 0 {
		t.Fatal("no DATA entry in the suffix")
	}
	type member struct {
		id      uint64
		ents    [][]*pb.Entry
		joining bool
	}
	run := func(t *testing.T, voters []uint64, members []member) (*vfs.MemFS, []Peer) {
		fc := writeReplica(t, metaOf(3, voters...), hardState(9, 3, 40), common, own)
		r, err := openReplicaAs(fc, metaOf(3, voters...))
		if err != nil {
			t.Fatal(err)
		}
		u, _ := r.log.unitAt(at)
		r.cl.At(u.Pos)[u.Len/2] ^= 0x08
		r.close()
		if _, err := openReplicaAs(fc, metaOf(3, voters...)); !errors.Is(err, base.ErrCorrupt) {
			t.Fatalf("the damaged member opened: %v", err)
		}
		var peers []Peer
		for _, m := range members {
			fs := writeReplica(t, metaOf(m.id, voters...), hardState(9, 3, 40), m.ents...)
			if m.joining {
				fs.WriteFile("/d/raft/"+joiningName, []byte("joining\n"))
			}
			peers = append(peers, peerOf(m.id, openAs(t, fs, metaOf(m.id, voters...))))
		}
		return fc, peers
	}
	short := [][]*pb.Entry{common}
	diverged := [][]*pb.Entry{common, other}
	cut := func(t *testing.T, voters []uint64, members ...member) {
		t.Helper()
		fc, peers := run(t, voters, members)
		rep, err := repairWith(fc, RepairOptions{Peers: peers})
		if err != nil {
			t.Fatal(err)
		}
		if rep.CutFrom != at || len(rep.Repaired) != 0 {
			t.Fatalf("cut from %d, repaired %v; want the log cut from %d", rep.CutFrom, rep.Repaired, at)
		}
		if _, err := fc.ReadFile("/d/raft/index/" + indexName(at) + ".broken"); err != nil {
			t.Fatalf("the cut units were not kept: %v", err)
		}
		r := openAs(t, fc, metaOf(3, voters...))
		if last, _ := r.log.LastIndex(); last != at-1 {
			t.Fatalf("last index %d after the cut, want %d", last, at-1)
		}
		ents, err := r.log.Entries(1, at, ^uint64(0))
		if err != nil {
			t.Fatal(err)
		}
		for k, e := range ents {
			w := common
			if k >= len(common) {
				w, k = own, k-len(common)
			}
			if err := sameEntry(w[k], e); err != nil {
				t.Fatalf("entry %d after the cut: %v", e.GetIndex(), err)
			}
		}
		names, _ := fc.ReadDir("/d/commitlog")
		broken := false
		for _, n := range names {
			broken = broken || strings.HasSuffix(n.Name, ".broken")
		}
		if !broken {
			t.Fatal("the cut commitlog bytes were not kept as .broken")
		}
	}
	refuse := func(t *testing.T, voters []uint64, want string, members ...member) {
		t.Helper()
		fc, peers := run(t, voters, members)
		before, _ := fc.ReadFile("/d/raft/index/" + indexName(at-at%testUnits))
		_, err := repairWith(fc, RepairOptions{Peers: peers})
		if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v, want ErrRepair saying %q", err, want)
		}
		if after, _ := fc.ReadFile("/d/raft/index/" + indexName(at-at%testUnits)); !reflect.DeepEqual(before, after) {
			t.Fatal("the refused repair wrote index units")
		}
		if _, err := fc.ReadFile("/d/raft/index/" + indexName(at) + ".broken"); !errors.Is(err, iofs.ErrNotExist) {
			t.Fatal("the refused repair cut")
		}
	}
	three, five := []uint64{1, 2, 3}, []uint64{1, 2, 3, 4, 5}
	t.Run("3 voters, both peers lack it", func(t *testing.T) {
		cut(t, three, member{id: 1, ents: short}, member{id: 2, ents: diverged})
	})
	t.Run("3 voters, one peer asked", func(t *testing.T) {
		refuse(t, three, "reach 1 more of members [2]", member{id: 1, ents: short})
	})
	t.Run("3 voters, a joining peer", func(t *testing.T) {
		refuse(t, three, "reach 1 more of members [2]", member{id: 1, ents: short}, member{id: 2, ents: short, joining: true})
	})
	t.Run("3 voters, a peer holds it", func(t *testing.T) {
		fc, peers := run(t, three, []member{{id: 1, ents: short}, {id: 2, ents: [][]*pb.Entry{common, own}}})
		rep, err := repairWith(fc, RepairOptions{Peers: peers})
		if err != nil || rep.CutFrom != 0 || len(rep.Repaired) != 1 || rep.Repaired[0] != at {
			t.Fatalf("repaired %v, cut from %d (%v); want entry %d repaired from member 2", rep.Repaired, rep.CutFrom, err, at)
		}
		r := openAs(t, fc, metaOf(3))
		if last, _ := r.log.LastIndex(); last != 50 {
			t.Fatalf("last index %d, want 50", last)
		}
	})
	t.Run("5 voters, two peers lack it", func(t *testing.T) {
		refuse(t, five, "reach 1 more of members [4 5]", member{id: 1, ents: short}, member{id: 2, ents: diverged})
	})
	t.Run("5 voters, three peers lack it", func(t *testing.T) {
		cut(t, five, member{id: 1, ents: short}, member{id: 2, ents: diverged}, member{id: 4, ents: short})
	})
}
