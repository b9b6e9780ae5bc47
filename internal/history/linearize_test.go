package history

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// withPieces runs f with the piece sizes and search budget set, restoring
// them after.
func withPieces(t *testing.T, target, limit int, bytes int64) {
	t.Helper()
	oldT, oldL, oldB := pieceOps, maxPieceOps, searchBytes
	pieceOps, maxPieceOps, searchBytes = target, limit, bytes
	t.Cleanup(func() { pieceOps, maxPieceOps, searchBytes = oldT, oldL, oldB })
}

// drawn is the visualization files in dir.
func drawn(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "linearizability-*.html"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLinearizable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ops    []Op
		stored Stored
		want   string // "" = must pass
		drawn  bool   // a failure porcupine finds, drawn into the dir
	}{
		{name: "sequential", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), read(1, 1, 0, 0, 2, 3, true, "a"), read(2, 1, 0, 1, 4, 5, false, "")}},
		{name: "concurrent puts in either order", ops: []Op{put(0, 0, 0, "a", 0, 10, OK, 1), put(1, 1, 0, "b", 1, 9, OK, 0),
			read(2, 2, 0, 1, 11, 12, true, "a")}},
		{name: "read concurrent with a put may miss it", ops: []Op{put(0, 0, 0, "a", 0, 10, OK, 0), read(1, 1, 0, 0, 1, 2, false, "")}},
		{name: "read concurrent with a put may see it", ops: []Op{put(0, 0, 0, "a", 0, 10, OK, 0), read(1, 1, 0, 0, 1, 2, true, "a")}},
		{name: "a return at the call's instant is concurrent", ops: []Op{put(0, 0, 0, "a", 0, 5, OK, 0), read(1, 1, 0, 0, 5, 6, false, "")}},
		{name: "unknown put seen", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0), read(1, 1, 0, 0, 5, 6, true, "a")},
			stored: Stored{0: {rec(0, "a")}}},
		{name: "unknown put never seen", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0), read(1, 1, 0, 0, 5, 6, false, ""),
			put(2, 0, 0, "b", 7, 8, OK, 0)}, stored: Stored{0: {rec(0, "b")}}},
		{name: "unknown put without the final contents", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0)},
			want: "needs the final contents"},
		{name: "queues are separate", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), put(1, 0, 1, "b", 2, 3, OK, 0)}},
		{name: "stale read after an ack", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), read(1, 1, 0, 0, 2, 3, false, "")},
			want: "not linearizable", drawn: true},
		{name: "lost append: read absent after a later put", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), put(1, 0, 0, "b", 2, 3, OK, 1),
			read(2, 1, 0, 0, 4, 5, false, "")}, want: "not linearizable", drawn: true},
		{name: "read of a value never put", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), read(1, 1, 0, 0, 2, 3, true, "z")},
			want: `found "z", but the put at offset 0 wrote "a"`},
		{name: "read of an offset nothing was put at", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), read(1, 1, 0, 1, 2, 3, true, "a")},
			want: "not linearizable", drawn: true},
		{name: "offset skipped", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 1)}, want: "not linearizable", drawn: true},
		{name: "same offset twice", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), put(1, 0, 0, "b", 2, 3, OK, 0)},
			want: "not linearizable", drawn: true},
		{name: "same offset twice, concurrent", ops: []Op{put(0, 0, 0, "a", 0, 5, OK, 0), put(1, 1, 0, "b", 1, 6, OK, 0)},
			want: "not linearizable", drawn: true},
		{name: "read sees a put that had not started", ops: []Op{read(0, 1, 0, 0, 0, 1, true, "a"), put(1, 0, 0, "a", 2, 3, OK, 0)},
			want: "not linearizable", drawn: true},
		{name: "offsets out of real-time order", ops: []Op{put(0, 0, 0, "b", 0, 1, OK, 1), put(1, 0, 0, "a", 2, 3, OK, 0)},
			want: "not linearizable", drawn: true},
		{name: "value vanishes", ops: []Op{put(0, 0, 0, "a", 0, 1, OK, 0), read(1, 1, 0, 0, 2, 3, true, "a"), read(2, 1, 0, 0, 4, 5, false, "")},
			want: "not linearizable", drawn: true},
		{name: "unknown put resolved by the final contents", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0), put(1, 1, 0, "b", 5, 6, OK, 1),
			read(2, 2, 0, 0, 7, 8, true, "a")}, stored: Stored{0: {rec(0, "a"), rec(1, "b")}}},
		{name: "unknown put absent at the end dropped", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0), put(1, 1, 0, "b", 5, 6, OK, 0)},
			stored: Stored{0: {rec(0, "b")}}},
		{name: "read of an unknown put that is not stored at the end", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0),
			read(1, 1, 0, 0, 2, 3, true, "a"), put(2, 1, 0, "b", 5, 6, OK, 0)}, stored: Stored{0: {rec(0, "b")}},
			want: `found "a", but the put at offset 0 wrote "b"`, drawn: true}, // and before b's put began
		{name: "unknown put stored before an ack it followed", ops: []Op{put(0, 0, 0, "b", 0, 1, OK, 1), put(1, 0, 0, "a", 2, 3, Unknown, 0)},
			stored: Stored{0: {rec(0, "a"), rec(1, "b")}}, want: "not linearizable", drawn: true},
		{name: "resolved unknown put closed by a read that saw it", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0),
			read(1, 1, 0, 0, 2, 3, true, "a"), put(2, 2, 0, "b", 4, 5, OK, 1)}, stored: Stored{0: {rec(0, "a"), rec(1, "b")}}},
		{name: "resolved unknown put read absent after its proof", ops: []Op{put(0, 0, 0, "a", 0, 1, Unknown, 0),
			put(1, 2, 0, "b", 2, 3, OK, 1), read(2, 1, 0, 0, 4, 5, false, "")}, stored: Stored{0: {rec(0, "a"), rec(1, "b")}},
			want: "not linearizable", drawn: true},
		{name: "failed put ignored", ops: []Op{put(0, 0, 0, "a", 0, 1, Fail, 5), read(1, 1, 0, 0, 2, 3, false, "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Linearizable(tc.ops, tc.stored, dir, 10*time.Second)
			check(t, err, tc.want)
			files := drawn(t, dir)
			switch {
			case tc.drawn && len(files) != 1:
				t.Fatalf("want one visualization in %s, found %v", dir, files)
			case tc.drawn && !strings.Contains(err.Error(), files[0]):
				t.Fatalf("failure %q does not name the visualization %s", err, files[0])
			case !tc.drawn && len(files) > 0:
				t.Fatalf("a visualization %v for a failure porcupine did not find", files)
			}
			if tc.drawn {
				if b, rerr := os.ReadFile(files[0]); rerr != nil || len(b) == 0 {
					t.Fatalf("visualization %s: %v (%d bytes)", files[0], rerr, len(b))
				}
			}
		})
	}
}

// genHistory makes a random history of clients (one operation at a time
// each) over queues, by running it: every operation takes effect at a
// random point of its interval (integer times, so that calls and returns
// often coincide), puts append, reads read near the end. Puts end ok,
// unknown (taken effect or not, sometimes still pending) or failed
// (nothing happened). It returns the history in call order and the final
// contents: a linearizable history, before mutate.
func genHistory(rng *rand.Rand, clients, n, queues int, maxDur int64) ([]Op, Stored) {
	type planned struct {
		op    Op
		point int64
	}
	at := make([]int64, clients)
	var ps []planned
	for i := range n {
		c := rng.IntN(clients)
		call := at[c]
		ret := call + 1 + rng.Int64N(maxDur)
		at[c] = ret + rng.Int64N(3)
		o := Op{Client: c, Queue: int32(rng.IntN(queues)), Call: call, Return: ret, Kind: Put, Value: fmt.Sprintf("v%d", i)}
		if rng.IntN(5) < 2 {
			o.Kind, o.Value = Read, ""
		}
		ps = append(ps, planned{o, call + rng.Int64N(ret-call+1)})
	}
	slices.SortStableFunc(ps, func(a, b planned) int { return int(a.point - b.point) })
	logs := map[int32][]string{}
	var ops []Op
	for _, p := range ps {
		o := p.op
		q := o.Queue
		switch o.Kind {
		case Put:
			switch r := rng.IntN(10); {
			case r < 6:
				o.Outcome, o.Offset = OK, int64(len(logs[q]))
				logs[q] = append(logs[q], o.Value)
			case r < 8:
				o.Outcome = Unknown
				if rng.IntN(2) == 0 {
					logs[q] = append(logs[q], o.Value)
				}
				if rng.IntN(4) == 0 {
					o.Outcome, o.Return = Pending, 0
				}
			default:
				o.Outcome = Fail
			}
		case Read:
			o.Outcome = OK
			o.Offset = max(0, int64(len(logs[q]))-2+rng.Int64N(4))
			if o.Offset < int64(len(logs[q])) {
				o.Found, o.Value = true, logs[q][o.Offset]
			}
		}
		ops = append(ops, o)
	}
	stored := Stored{}
	for q, vs := range logs {
		for i, v := range vs {
			stored[q] = append(stored[q], rec(int64(i), v))
		}
	}
	return inCallOrder(ops), stored
}

func inCallOrder(ops []Op) []Op {
	slices.SortStableFunc(ops, func(a, b Op) int { return int(a.Call - b.Call) })
	for i := range ops {
		ops[i].ID = i
	}
	return ops
}

// mutate changes one thing in a history, which may or may not leave it
// linearizable: an offset, a read's answer, an operation's times, the
// final contents.
func mutate(rng *rand.Rand, ops []Op, stored Stored) ([]Op, Stored) {
	ops = slices.Clone(ops)
	i := rng.IntN(len(ops))
	o := &ops[i]
	switch rng.IntN(7) {
	case 0: // an offset off by one, or another's
		if o.Kind == Put && o.Outcome == OK {
			o.Offset = max(0, o.Offset-1+2*rng.Int64N(2))
		} else if o.Kind == Read {
			o.Offset++
		}
	case 1: // a read's answer flipped
		if o.Kind == Read {
			o.Found = !o.Found
			if o.Found {
				o.Value = ops[rng.IntN(len(ops))].Value
			}
		}
	case 2: // another value read
		if o.Kind == Read && o.Found {
			o.Value = ops[rng.IntN(len(ops))].Value
		}
	case 3: // moved earlier or later in time
		d := 1 + rng.Int64N(6)
		if rng.IntN(2) == 0 {
			d = -d
		}
		if o.Call+d >= 0 && o.Outcome != Pending {
			o.Call, o.Return = o.Call+d, o.Return+d
		}
	case 4: // two acks of one offset
		if o.Kind == Put && o.Outcome == OK {
			for _, p := range ops {
				if p.Kind == Put && p.Outcome == OK && p.Queue == o.Queue && p.ID != o.ID {
					o.Offset = p.Offset
					break
				}
			}
		}
	case 5: // a record missing from the final contents
		s := Stored{}
		for q, rs := range stored {
			s[q] = slices.Clone(rs)
		}
		for q, rs := range s {
			if len(rs) > 0 {
				j := rng.IntN(len(rs))
				s[q] = slices.Delete(rs, j, j+1)
				break
			}
		}
		stored = s
	case 6: // an unknown put's copy at another offset
		s := Stored{}
		for q, rs := range stored {
			s[q] = slices.Clone(rs)
			if len(rs) >= 2 {
				j, k := rng.IntN(len(rs)), rng.IntN(len(rs))
				s[q][j].Value, s[q][k].Value = s[q][k].Value, s[q][j].Value
			}
		}
		stored = s
	}
	return inCallOrder(ops), stored
}

// TestLinearizableAgreesWithFullLogModel: on random small histories,
// linearizable ones and mutated ones, the length model with the contents
// check outside porcupine and cuts wherever they are sound (pieces of one
// operation) gives the verdict of the model this package used before,
// whose state was the queue's values (linearize_ref_test.go).
func TestLinearizableAgreesWithFullLogModel(t *testing.T) {
	withPieces(t, 1, 1000, 64<<20)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	dir := t.TempDir()
	var yes, no, multi int
	for i := range 3000 {
		ops, stored := genHistory(rng, 2+rng.IntN(3), 4+rng.IntN(12), 1+rng.IntN(2), 1+rng.Int64N(6))
		if rng.IntN(3) > 0 {
			ops, stored = mutate(rng, ops, stored)
		}
		want := refLinearizable(ops, stored)
		c, err := Linearizable(ops, stored, dir, time.Minute)
		if got := err == nil; got != want {
			var b strings.Builder
			for _, o := range ops {
				fmt.Fprintln(&b, o)
			}
			t.Fatalf("history %d: full-log model says linearizable=%v, length model %v (%v)\n%sstored %v", i, want, got, err, b.String(), stored)
		}
		if want {
			yes++
		} else {
			no++
		}
		if c.Pieces > 1 {
			multi++
		}
	}
	t.Logf("3000 histories: %d linearizable, %d not; %d checked in more than one piece", yes, no, multi)
	if yes < 300 || no < 300 || multi < 300 {
		t.Fatalf("the generator is too one-sided to prove agreement: %d linearizable, %d not, %d cut", yes, no, multi)
	}
}

// longHistory is a linearizable history like a group scenario's: writers
// putting over queues, each with up to `writers` puts in flight, and
// readers reading near the end.
func longHistory(rng *rand.Rand, writers, n, queues int) ([]Op, Stored) {
	return genHistory(rng, writers, n, queues, 40)
}

// TestLinearizableInPieces: a long history is checked in pieces near the
// target size (what bounds porcupine's memory), and a violation anywhere
// in it, however far from its start, is still found and drawn.
func TestLinearizableInPieces(t *testing.T) {
	withPieces(t, 500, 5000, 64<<20)
	rng := rand.New(rand.NewPCG(7, 14))
	ops, stored := longHistory(rng, 20, 60000, 2)
	c, err := Linearizable(ops, stored, t.TempDir(), time.Minute)
	if err != nil {
		t.Fatalf("a linearizable history of %d ops: %v", len(ops), err)
	}
	if c.Pieces < 40 || c.Largest > 1000 {
		t.Fatalf("%d operations checked in %d pieces, the largest %d: want at least 40 pieces, none over 1000", c.Ops, c.Pieces, c.Largest)
	}
	t.Logf("%d operations in %d pieces, the largest %d", c.Ops, c.Pieces, c.Largest)
	// A stale read late in the history: the read of an offset whose put
	// returned before the read was called, answered absent.
	var late Op
	for _, o := range ops[len(ops)*3/4:] {
		if o.Kind == Put && o.Outcome == OK {
			late = o
			break
		}
	}
	stale := Op{Client: 1000, Kind: Read, Queue: late.Queue, Offset: late.Offset, Call: late.Return + 1, Return: late.Return + 2, Outcome: OK}
	bad := inCallOrder(append(slices.Clone(ops), stale))
	dir := t.TempDir()
	_, err = Linearizable(bad, stored, dir, time.Minute)
	check(t, err, "not linearizable")
	if files := drawn(t, dir); len(files) != 1 || !strings.Contains(err.Error(), files[0]) {
		t.Fatalf("want the failing piece drawn and named: %v, %v", files, err)
	}
}

// TestLinearizableGuards: a piece that cannot be cut within the limit is
// refused, a search past its memory budget or its time is undecided, and
// each is an error, never a pass.
func TestLinearizableGuards(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 14))
	ops, stored := longHistory(rng, 20, 4000, 1)

	t.Run("piece too large", func(t *testing.T) {
		withPieces(t, 1000, 1000, 64<<20)
		// Everything from the first put on stays in flight until the
		// end: no offset can be cut from another.
		long := slices.Clone(ops)
		var end int64
		for _, o := range long {
			end = max(end, o.Return)
		}
		for i := range long {
			if long[i].Kind == Put && long[i].Outcome == OK {
				long[i].Return = end + 1
			}
		}
		_, err := Linearizable(long, stored, t.TempDir(), time.Minute)
		check(t, err, errTooLarge.Error())
	})
	t.Run("memory budget", func(t *testing.T) {
		withPieces(t, 1000, 5000, 1) // a budget of 1,000 states
		_, err := Linearizable(ops, stored, t.TempDir(), time.Minute)
		check(t, err, "within its memory budget")
	})
	t.Run("time", func(t *testing.T) {
		_, err := Linearizable(ops, stored, t.TempDir(), 0)
		check(t, err, "could not decide within 0s")
	})
}
