package replica

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/raftlog"
	"github.com/storaged/storaged/storage/record"
)

// readyVoter is a one-voter group's member that is the ready leader, with
// opts' bounds (ID, Log, FileSize, Transport, Host and Ticks are set here).
func readyVoter(t *testing.T, opts Options) (*Node, *raftlog.Log) {
	t.Helper()
	_, rl := open(t, 1, []uint64{1})
	opts.ID, opts.Log, opts.FileSize, opts.Transport, opts.Host, opts.Ticks = 1, rl, fileSize, nopTransport{}, &fakeHost{}, make(chan time.Time)
	n, err := New(opts, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	if err := n.Campaign(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", n.Ready)
	return n, rl
}

// dataEntries are the DATA entries of rl (records, not commands or empty
// entries): their commitlog offset and length, in log order.
func dataEntries(t *testing.T, rl *raftlog.Log) [][2]int64 {
	t.Helper()
	first, err := rl.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := rl.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	ents, err := rl.Entries(first, last+1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]int64
	for _, e := range ents {
		if d := e.GetData(); len(d) >= record.MinLen && record.HasMagic(d) {
			out = append(out, [2]int64{record.PhysOffset(d), int64(len(d))})
		}
	}
	return out
}

// committed waits, at most a minute, for every waiter and fails unless
// each committed.
func committed(t *testing.T, ws ...*Waiter) {
	t.Helper()
	deadline := time.After(time.Minute)
	for i, w := range ws {
		select {
		case <-w.Done():
		case <-deadline:
			t.Fatalf("put %d: no outcome after a minute", i)
		}
		if err := w.Err(); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

// TestProposeOneEntry: puts stamped before raft is next asked to act are
// proposed as one entry holding their records back to back, and each
// put's waiter is answered when it commits.
func TestProposeOneEntry(t *testing.T) {
	n, rl := readyVoter(t, Options{})
	size, _ := putOf("a")
	var ws []*Waiter
	var pos []int64
	n.mu.Lock() // the loop cannot propose them before all three are stamped
	for _, body := range []string{"a", "b", "c"} {
		w, p, err := n.proposeLocked(putOf(body))
		if err != nil {
			n.mu.Unlock()
			t.Fatal(err)
		}
		ws, pos = append(ws, w), append(pos, p)
	}
	n.mu.Unlock()
	committed(t, ws...)
	if want := []int64{0, int64(size), 2 * int64(size)}; !slices.Equal(pos, want) {
		t.Fatalf("puts at %v, want %v", pos, want)
	}
	if got, want := dataEntries(t, rl), [][2]int64{{0, 3 * int64(size)}}; !slices.Equal(got, want) {
		t.Fatalf("data entries (offset, length) %v, want %v", got, want)
	}
	if end := n.Info().CommitEnd; end != 3*int64(size) {
		t.Fatalf("commit end %d, want %d", end, 3*size)
	}
}

// TestProposeEntryBounds: an entry of stamped puts lies in one commitlog
// file and holds at most MaxSizePerMsg bytes: a put that would cross the
// file's end, or the bound, has the puts before it proposed first and
// starts the next entry (at the next file's start).
func TestProposeEntryBounds(t *testing.T) {
	size, _ := putOf("a")
	for _, tc := range []struct {
		name    string
		maxMsg  uint64
		perEnt  int // puts an entry holds before the bound
		nextOff func(prevEnd int64) int64
	}{
		{name: "file end", maxMsg: 1 << 20, perEnt: fileSize / size, nextOff: func(int64) int64 { return fileSize }},
		{name: "message size", maxMsg: uint64(3 * size), perEnt: 3, nextOff: func(end int64) int64 { return end }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, rl := readyVoter(t, Options{MaxSizePerMsg: tc.maxMsg})
			var ws []*Waiter
			var last int64
			n.mu.Lock()
			for range tc.perEnt + 1 {
				w, p, err := n.proposeLocked(putOf("a"))
				if err != nil {
					n.mu.Unlock()
					t.Fatal(err)
				}
				ws, last = append(ws, w), p
			}
			n.mu.Unlock()
			committed(t, ws...)
			end := int64(tc.perEnt * size)
			want := [][2]int64{{0, end}, {tc.nextOff(end), int64(size)}}
			if got := dataEntries(t, rl); !slices.Equal(got, want) {
				t.Fatalf("data entries (offset, length) %v, want %v", got, want)
			}
			if last != want[1][0] {
				t.Fatalf("the last put at %d, want %d", last, want[1][0])
			}
		})
	}
}

// TestProposeDroppedEntry: an entry of stamped puts raft refuses (its
// bound on uncommitted bytes passed) fails every put in it with
// ErrProposalDropped, nothing stored: their stamps are undone in the
// reverse order of their commits, the tail goes back, and the next put
// takes the place the refused ones were stamped for.
func TestProposeDroppedEntry(t *testing.T) {
	n, rl := readyVoter(t, Options{MaxUncommittedBytes: 1})
	var calls []string // under n.mu, as the stamps run
	stamp := func(name string) (int, Stamp) {
		size, st := putOf(name)
		return size, func(pos int64, dst []byte) ([]byte, func(), func(), error) {
			data, _, _, err := st(pos, dst)
			return data, func() { calls = append(calls, "commit "+name) }, func() { calls = append(calls, "undo "+name) }, err
		}
	}
	size, _ := putOf("a")
	// Under the node's lock throughout, so that a is still uncommitted
	// when b and c are proposed (raft counts it committed at Advance,
	// which the loop calls under the lock).
	n.mu.Lock()
	a, _, err := n.proposeLocked(stamp("a"))
	if err == nil {
		err = n.flushLocked()
	}
	tail := n.tail
	var b, c *Waiter
	if err == nil {
		b, _, err = n.proposeLocked(stamp("b"))
	}
	if err == nil {
		c, _, err = n.proposeLocked(stamp("c"))
	}
	if err != nil {
		n.mu.Unlock()
		t.Fatal(err)
	}
	stamped := n.tail
	ferr := n.flushLocked()
	after := n.tail
	n.mu.Unlock()

	if !errors.Is(ferr, ErrProposalDropped) || stamped != tail+2*int64(size) || after != tail {
		t.Fatalf("flush: %v; tail %d, %d stamped, %d after", ferr, tail, stamped, after)
	}
	for name, w := range map[string]*Waiter{"b": b, "c": c} {
		select { // answered by the flush, under the lock
		case <-w.Done():
		default:
			t.Fatalf("%s: no outcome after its entry was refused", name)
		}
		if !errors.Is(w.Err(), ErrProposalDropped) {
			t.Fatalf("%s: %v", name, w.Err())
		}
	}
	if want := []string{"commit a", "commit b", "commit c", "undo c", "undo b"}; !slices.Equal(calls, want) {
		t.Fatalf("stamp calls %q, want %q", calls, want)
	}
	committed(t, a)
	// Raft lowers its count of uncommitted bytes at the Advance after a
	// committed (a's waiter is answered before it): until then d would be
	// dropped too.
	deadline := time.After(time.Minute)
	for {
		n.mu.Lock()
		adv := n.appliedLocked(n.commit) // a's index, or past it
		n.mu.Unlock()
		if adv == nil {
			break
		}
		select {
		case <-adv:
		case <-deadline:
			t.Fatal("raft did not count a applied within a minute")
		}
	}
	n.mu.Lock()
	d, pos, err := n.proposeLocked(putOf("d"))
	if err == nil {
		err = n.flushLocked()
	}
	n.mu.Unlock()
	if err != nil || pos != tail {
		t.Fatalf("d: %v at %d, want %d", err, pos, tail)
	}
	committed(t, d)
	if got, want := dataEntries(t, rl), [][2]int64{{0, int64(size)}, {tail, int64(size)}}; !slices.Equal(got, want) {
		t.Fatalf("data entries (offset, length) %v, want %v", got, want)
	}
}
