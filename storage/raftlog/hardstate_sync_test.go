package raftlog

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/vfs"
)

// TestHardStateSyncPolicy: Sync fdatasyncs raft/hardstate only when the
// term or vote changed (or nothing was synced before); a commit-only
// change is written and rides along; SyncCommit syncs what was written,
// once; a crash right after commit-only changes keeps the term and vote
// and a commit at least the last one synced; Compact syncs the commit it
// compacts against.
func TestHardStateSyncPolicy(t *testing.T) {
	fs, r, hsSyncs := openCountingHardStateSyncs(t)
	defer func() { r.close() }()
	g := &gen{rng: rand.New(rand.NewPCG(1, 2)), term: 1}
	step := func(what string, hs *pb.HardState, n int, wantSyncs int64) {
		t.Helper()
		last, _ := r.log.LastIndex()
		if n > 0 {
			if err := r.log.Append(g.entries(r.log, last+1, n)); err != nil {
				t.Fatal(err)
			}
		}
		if hs != nil {
			if err := r.log.SetHardState(hs); err != nil {
				t.Fatal(err)
			}
		}
		before := hsSyncs.Load()
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := hsSyncs.Load() - before; got != wantSyncs {
			t.Errorf("%s: %d fdatasyncs of raft/hardstate, want %d", what, got, wantSyncs)
		}
	}
	mk := mkHardState
	step("first HardState", mk(1, 1, 0), 4, 1)
	step("commit only", mk(1, 1, 2), 2, 0)
	step("commit only again", mk(1, 1, 4), 2, 0)
	step("entries, no HardState", nil, 1, 0)
	step("same HardState", mk(1, 1, 4), 1, 0)

	// A power cut now: term and vote survive, the commit is 0, 2 or 4.
	for seed := range uint64(20) {
		img := crashImage(t, r, fs, seed)
		hs := recoveredHS(t, img)
		if hs.GetTerm() != 1 || hs.GetVote() != 1 || hs.GetCommit() > 4 {
			t.Fatalf("seed %d: recovered %v after commit-only writes over term 1 vote 1", seed, hs)
		}
	}

	before := hsSyncs.Load()
	if err := r.log.SyncCommit(); err != nil {
		t.Fatal(err)
	}
	if err := r.log.SyncCommit(); err != nil {
		t.Fatal(err)
	}
	if got := hsSyncs.Load() - before; got != 1 {
		t.Errorf("two SyncCommits after commit-only writes: %d fdatasyncs, want 1", got)
	}
	for seed := range uint64(20) {
		if hs := recoveredHS(t, crashImage(t, r, fs, seed)); !proto.Equal(normHS(hs), normHS(mk(1, 1, 4))) {
			t.Fatalf("seed %d: recovered %v after SyncCommit, want term 1 vote 1 commit 4", seed, hs)
		}
	}

	step("new term", mk(2, 0, 4), 1, 1)
	step("vote", mk(2, 3, 4), 0, 1)
	step("commit only in the new term", mk(2, 3, 6), 1, 0)
	before = hsSyncs.Load()
	if err := r.log.Compact(5); err != nil {
		t.Fatal(err)
	}
	if got := hsSyncs.Load() - before; got != 1 {
		t.Errorf("Compact past the commit on disk: %d fdatasyncs, want 1", got)
	}
	for seed := range uint64(20) {
		if hs := recoveredHS(t, crashImage(t, r, fs, seed)); hs.GetCommit() < 6 {
			t.Fatalf("seed %d: recovered commit %d after Compact(5) synced commit 6", seed, hs.GetCommit())
		}
	}
}

// openCountingHardStateSyncs opens a replica on a MemFS that counts the
// fdatasyncs of raft/hardstate.
func openCountingHardStateSyncs(t *testing.T) (*vfs.MemFS, *replica, *atomic.Int64) {
	t.Helper()
	fs := vfs.NewMem()
	syncs := new(atomic.Int64)
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpFileSync && filepath.Base(path) == "hardstate" {
			syncs.Add(1)
		}
		return nil
	})
	r, err := openReplica(fs)
	if err != nil {
		t.Fatal(err)
	}
	return fs, r, syncs
}

func mkHardState(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

// crashImage is the image a power cut would leave now.
func crashImage(t *testing.T, r *replica, fs *vfs.MemFS, seed uint64) *vfs.MemFS {
	t.Helper()
	r.cl.WaitPopulated()
	return fs.Crash(rand.New(rand.NewPCG(seed, 7)))
}

// recoveredHS opens img as a replica and returns its HardState.
func recoveredHS(t *testing.T, img *vfs.MemFS) *pb.HardState {
	t.Helper()
	rec, err := openReplica(img)
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	defer rec.close()
	hs, _, err := rec.log.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// TestSyncCommitFailureStops: a failed fdatasync of raft/hardstate in
// SyncCommit is sticky: SyncCommit and the next Sync both refuse.
func TestSyncCommitFailureStops(t *testing.T) {
	fs := vfs.NewMem()
	r, err := openReplica(fs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.close() }()
	g := &gen{rng: rand.New(rand.NewPCG(3, 4)), term: 1}
	if err := r.log.Append(g.entries(r.log, 1, 2)); err != nil {
		t.Fatal(err)
	}
	hs := func(commit uint64) *pb.HardState {
		return &pb.HardState{Term: proto.Uint64(1), Vote: proto.Uint64(1), Commit: proto.Uint64(commit)}
	}
	for _, c := range []uint64{0, 2} { // the first is synced, the commit-only change is not
		if err := r.log.SetHardState(hs(c)); err != nil {
			t.Fatal(err)
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	fs.SetInjector(vfs.OnCall(vfs.OpFileSync, 1, vfs.ErrInjected, false))
	if err := r.log.SyncCommit(); !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("SyncCommit with a failing fdatasync: %v", err)
	}
	fs.SetInjector(nil)
	if err := r.log.SyncCommit(); !errors.Is(err, ErrStopped) {
		t.Fatalf("SyncCommit after a failed one: %v, want ErrStopped", err)
	}
	if err := r.log.Sync(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Sync after a failed SyncCommit: %v, want ErrStopped", err)
	}
}

// TestAdvanceCommit: the raft loop's commit-only write while a Sync runs.
// It is refused past the entries synced, writes without an fdatasync,
// keeps the term and vote, never lowers the commit, and a HardState left
// pending for the next Sync (a Ready's, with a lower commit) keeps the
// higher commit whether its term changed or not.
func TestAdvanceCommit(t *testing.T) {
	fs, r, hsSyncs := openCountingHardStateSyncs(t)
	defer func() { r.close() }()
	g := &gen{rng: rand.New(rand.NewPCG(5, 6)), term: 1}
	mk := mkHardState
	current := func() *pb.HardState {
		t.Helper()
		hs, _, err := r.log.InitialState()
		if err != nil {
			t.Fatal(err)
		}
		return normHS(hs)
	}
	if err := r.log.Append(g.entries(r.log, 1, 4)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.SetHardState(mk(1, 1, 0)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Append(g.entries(r.log, 5, 2)); err != nil { // not synced
		t.Fatal(err)
	}
	if err := r.log.AdvanceCommit(5); err == nil {
		t.Fatal("AdvanceCommit(5) with entries synced up to 4: accepted")
	}
	before := hsSyncs.Load()
	if err := r.log.AdvanceCommit(3); err != nil {
		t.Fatal(err)
	}
	if err := r.log.AdvanceCommit(2); err != nil { // lower: nothing
		t.Fatal(err)
	}
	if got := hsSyncs.Load() - before; got != 0 {
		t.Errorf("commit-only AdvanceCommits: %d fdatasyncs, want 0", got)
	}
	if got := current(); !proto.Equal(got, normHS(mk(1, 1, 3))) {
		t.Errorf("after AdvanceCommit(3), AdvanceCommit(2): %v, want term 1 vote 1 commit 3", got)
	}

	// A Ready's HardState with an older commit, written by the Sync.
	if err := r.log.SetHardState(mk(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := current(); !proto.Equal(got, normHS(mk(1, 1, 3))) {
		t.Errorf("a pending commit 2 after AdvanceCommit(3): %v, want commit 3", got)
	}
	before = hsSyncs.Load()
	if err := r.log.SetHardState(mk(2, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if err := r.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := current(); !proto.Equal(got, normHS(mk(2, 0, 3))) {
		t.Errorf("a new term with an older commit: %v, want term 2 vote 0 commit 3", got)
	}
	if got := hsSyncs.Load() - before; got != 1 {
		t.Errorf("a new term: %d fdatasyncs, want 1", got)
	}
	if err := r.log.AdvanceCommit(6); err != nil {
		t.Fatal(err)
	}
	if err := r.log.SyncCommit(); err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(20) {
		if hs := recoveredHS(t, crashImage(t, r, fs, seed)); !proto.Equal(normHS(hs), normHS(mk(2, 0, 6))) {
			t.Fatalf("seed %d: recovered %v after AdvanceCommit(6) and SyncCommit, want term 2 vote 0 commit 6", seed, hs)
		}
	}
}

// TestSyncLatency: each Sync is timed once (SyncLatency,
// storaged_raft_log_sync_seconds), with entries to make durable or
// without; the Entries calls have their own histogram.
func TestSyncLatency(t *testing.T) {
	_, r, _ := openCountingHardStateSyncs(t)
	defer func() { r.close() }()
	g := &gen{rng: rand.New(rand.NewPCG(3, 4)), term: 1}
	for i, n := range []int{3, 0, 2} {
		if n > 0 {
			last, _ := r.log.LastIndex()
			if err := r.log.Append(g.entries(r.log, last+1, n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.log.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := r.log.SyncLatency().Count(); got != uint64(i+1) {
			t.Fatalf("after %d Syncs: %d timed", i+1, got)
		}
	}
	before := r.log.EntriesLatency().Count()
	if _, err := r.log.Entries(1, 6, 1<<20); err != nil {
		t.Fatal(err)
	}
	if s, e := r.log.SyncLatency().Count(), r.log.EntriesLatency().Count(); s != 3 || e != before+1 {
		t.Fatalf("after an Entries call: %d Syncs timed, %d Entries calls (%d before)", s, e, before)
	}
}
