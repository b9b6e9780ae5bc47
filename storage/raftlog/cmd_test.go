package raftlog

import (
	"bytes"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// TestLastCmd: the backward scan finds, for every pair of bounds, the
// newest CMD entry in them its predicate accepts (checked against Entries,
// entry by entry), before and after a reopen, and nothing outside them.
func TestLastCmd(t *testing.T) {
	fs := vfs.NewMem()
	r := mustOpen(t, fs)
	g := &gen{rng: rand.New(rand.NewPCG(5, 6)), term: 1}
	if err := r.log.Append(g.entries(r.log, 1, 80)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	even := func(b []byte) bool { return len(b)%2 == 0 }
	check := func(l *Log) {
		t.Helper()
		cmds, cut := 0, 0
		for hi := uint64(0); hi <= 82; hi++ {
			for _, lo := range []uint64{0, 1, hi / 2, hi, hi + 1} {
				var want []byte
				var wantIdx uint64
				for i := min(hi, 80); i >= max(lo, 1); i-- {
					ents, err := l.Entries(i, i+1, 1<<30)
					if err != nil {
						t.Fatal(err)
					}
					e := ents[0]
					if d := e.GetData(); e.GetType() == pb.EntryNormal && len(d) > 0 && !record.HasMagic(d) && even(d) {
						want, wantIdx = d, i
						break
					}
				}
				got, idx, err := l.LastCmd(lo, hi, even)
				if err != nil || idx != wantIdx || !bytes.Equal(got, want) {
					t.Fatalf("LastCmd(%d, %d): index %d (%d bytes), %v; want index %d (%d bytes)", lo, hi, idx, len(got), err, wantIdx, len(want))
				}
				if idx != 0 {
					cmds++
				}
				if whole, _, _ := l.LastCmd(0, hi, even); whole != nil && got == nil {
					cut++ // one below lo, not found: lo bounds the scan
				}
			}
		}
		if cmds == 0 || cut == 0 {
			t.Fatalf("%d bounds found a command, %d left one out below lo: the test tested too little", cmds, cut)
		}
	}
	check(r.log)
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	r = mustOpen(t, fs)
	defer r.close()
	check(r.log)
}
