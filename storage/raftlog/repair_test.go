package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	iofs "io/fs"
	"math/rand/v2"
	"path/filepath"
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

// twoReplicas writes the same n entries (all kinds, rolls with blanks)
// to two replicas on their own MemFS, synced, with commit as the commit
// index, and closes them.
func twoReplicas(t *testing.T, seed uint64, n int, commit uint64) (a, b *vfs.MemFS, ents []*pb.Entry) {
	t.Helper()
	a, b = vfs.NewMem(), vfs.NewMem()
	ra, rb := mustOpen(t, a), mustOpen(t, b)
	g := &gen{rng: rand.New(rand.NewPCG(seed, 7)), term: 1}
	for uint64(len(ents)) < uint64(n) {
		e := g.entries(ra.log, uint64(len(ents))+1, 1)
		for _, r := range []*replica{ra, rb} {
			if err := r.log.Append([]*pb.Entry{proto.Clone(e[0]).(*pb.Entry)}); err != nil {
				t.Fatal(err)
			}
		}
		ents = append(ents, e[0])
	}
	for _, r := range []*replica{ra, rb} {
		if err := r.log.SetHardState(&pb.HardState{Term: proto.Uint64(g.term), Commit: proto.Uint64(commit)}); err != nil {
			t.Fatal(err)
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, ents
}

// repairFrom runs Repair on the replica in fs, fetching from peer (an
// open replica) in chunks of at most 3 entries and 2 KiB.
func repairFrom(fs vfs.FS, peer *replica) (RepairReport, error) {
	nop := zerolog.Nop()
	cl, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: testFileSize, RequireCRC: true,
		Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(1, nil)})
	if err != nil {
		return RepairReport{}, err
	}
	defer cl.Close()
	return Repair(RepairOptions{FS: fs, Dir: "/d/raft", Commitlog: cl, IndexUnits: testUnits, RequireCRC: true,
		Peers: []Peer{peerOf(2, peer)}})
}

// peerOf is an open replica as the peer id Repair asks: its State (with
// its node id set to id) and its entries in chunks of at most 3 entries
// and 2 KiB.
func peerOf(id uint64, r *replica) Peer {
	fetches := 0
	return Peer{ID: id,
		State: func() (PeerState, error) {
			st, err := r.log.State()
			st.Meta.NodeID = id
			return st, err
		},
		Fetch: func(lo, hi uint64) (Range, error) {
			fetches++
			if fetches > 1000 {
				return Range{}, errors.New("too many fetches")
			}
			return r.log.ReadRange(lo, min(hi, lo+3), 2<<10)
		}}
}

// sameFiles fails unless every file under dir is byte-identical on a and b.
func sameFiles(t *testing.T, a, b vfs.FS, dir string) {
	t.Helper()
	ents, err := a.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if e.IsDir || strings.Contains(e.Name, ".") {
			continue
		}
		x, errA := a.ReadFile(filepath.Join(dir, e.Name))
		y, errB := b.ReadFile(filepath.Join(dir, e.Name))
		if errA == nil && commitlog.AllZero(x) && errors.Is(errB, iofs.ErrNotExist) {
			continue // a file the allocator prepared on one side only
		}
		if errA != nil || errB != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s/%s differs after the repair (%v, %v)", dir, e.Name, errA, errB)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no files in %s", dir)
	}
}

// TestRepairFromPeer: a replica whose entries are damaged (a record, a
// unit below or above the commit index, a meta-log payload, an
// END_OF_FILE blank) refuses to open; Repair fetches the entries from a
// peer holding the same log, and the replica then opens with commitlog,
// index and meta-log byte-identical to the peer's.
func TestRepairFromPeer(t *testing.T) {
	const n, commit = 60, 50
	// Find entries of each kind in the generated log.
	_, _, ents := twoReplicas(t, 1, n, commit)
	pick := func(kind Kind, from uint64) uint64 {
		for i := from; i <= n; i++ {
			if classify(ents[i-1]) == kind {
				return i
			}
		}
		t.Fatalf("no %s entry from %d", kind, from)
		return 0
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, r *replica) uint64 // returns the damaged index
	}{
		{"record below commit", func(t *testing.T, r *replica) uint64 {
			i := pick(KindData, 10)
			u, _ := r.log.unitAt(i)
			r.cl.At(u.Pos)[u.Len/2] ^= 0x10
			return i
		}},
		{"two records below commit", func(t *testing.T, r *replica) uint64 {
			i := pick(KindData, 3)
			j := pick(KindData, i+5)
			for _, k := range []uint64{i, j} {
				u, _ := r.log.unitAt(k)
				r.cl.At(u.Pos)[u.Len-1] ^= 1
			}
			return i
		}},
		{"unit below commit", func(t *testing.T, r *replica) uint64 {
			i := pick(KindData, 20)
			r.log.idx.slot(i)[9] ^= 4
			return i
		}},
		{"unit above commit", func(t *testing.T, r *replica) uint64 {
			i := pick(KindData, commit+1)
			r.log.idx.slot(i)[1] ^= 4
			return i
		}},
		{"record above commit", func(t *testing.T, r *replica) uint64 {
			i := pick(KindData, commit+1)
			u, _ := r.log.unitAt(i)
			r.cl.At(u.Pos)[20] ^= 0x80
			return i
		}},
		{"meta-log payload", func(t *testing.T, r *replica) uint64 {
			i := pick(KindCmd, 2)
			u, _ := r.log.unitAt(i)
			b := make([]byte, 1)
			r.log.metaLog.ReadAt(b, u.Pos+5)
			b[0] ^= 1
			r.log.metaLog.WriteAt(b, u.Pos+5)
			return i
		}},
		{"blank", func(t *testing.T, r *replica) uint64 {
			for i := uint64(2); i <= commit; i++ {
				u, _ := r.log.unitAt(i)
				if u.Kind == KindData && u.Flags&FlagBlank != 0 {
					end, _ := r.log.dataEndAt(i - 1)
					r.cl.At(end)[6] ^= 1
					return i
				}
			}
			t.Fatal("no blank below the commit index")
			return 0
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b, _ := twoReplicas(t, 1, n, commit)
			rb := mustOpen(t, b)
			at := c.damage(t, rb)
			rb.close()
			if r, err := openReplica(b); err == nil {
				r.close()
				t.Fatal("the damaged replica opened")
			} else if !errors.Is(err, base.ErrCorrupt) {
				t.Fatalf("open the damaged replica: %v, want a corruption error", err)
			}
			// A raft/mark (mark.go) is not trusted past a repair: the
			// next start walks every unit again.
			if err := b.WriteFile("/d/raft/"+markName, []byte("a mark")); err != nil {
				t.Fatal(err)
			}
			peer := mustOpen(t, a)
			defer peer.close()
			rep, err := repairFrom(b, peer)
			if err != nil {
				t.Fatalf("repair: %v (%+v)", err, rep)
			}
			if len(rep.Repaired) == 0 || rep.Repaired[0] != at || rep.Entries != n {
				t.Fatalf("repaired %v of %d entries checked, want %d first of %d", rep.Repaired, rep.Entries, at, n)
			}
			if _, err := b.Size("/d/raft/" + markName); err == nil {
				t.Fatal("raft/mark is still there after the repair")
			}
			r, err := openReplica(b)
			if err != nil {
				t.Fatalf("open after the repair: %v", err)
			}
			if last, _ := r.log.LastIndex(); last != n {
				t.Fatalf("last index %d after the repair, want %d", last, n)
			}
			r.close()
			sameFiles(t, a, b, "/d/commitlog")
			sameFiles(t, a, b, "/d/raft/index")
			sameFiles(t, a, b, "/d/raft/meta-log")
		})
	}
}

// TestRepairRefusesOtherEntries: a peer whose log differs (other terms,
// other bytes) at the damaged index is refused, naming the index, and
// nothing is written; a peer whose log ends before it is refused too.
func TestRepairRefusesOtherEntries(t *testing.T) {
	const n, commit = 30, 25
	_, b, ents := twoReplicas(t, 1, n, commit)
	other, _, _ := twoReplicas(t, 2, n, commit) // another log
	short, _, _ := twoReplicas(t, 1, 10, 10)    // the same log, shorter
	var at uint64
	for i := uint64(12); i <= n; i++ {
		if classify(ents[i-1]) == KindData {
			at = i
			break
		}
	}
	rb := mustOpen(t, b)
	u, _ := rb.log.unitAt(at)
	rb.cl.At(u.Pos)[u.Len/2] ^= 0x10
	rb.close()
	before, _ := b.ReadFile("/d/commitlog/" + indexName(0))
	for name, fs := range map[string]*vfs.MemFS{"other": other, "short": short} {
		peer := mustOpen(t, fs)
		_, err := repairFrom(b, peer)
		peer.close()
		if !errors.Is(err, ErrRepair) || !strings.Contains(err.Error(), fmt.Sprint(at)) {
			t.Fatalf("%s peer: %v, want ErrRepair naming entry %d", name, err, at)
		}
		after, _ := b.ReadFile("/d/commitlog/" + indexName(0))
		if !bytes.Equal(before, after) {
			t.Fatalf("%s peer: the refused repair wrote to the commitlog", name)
		}
	}
}
