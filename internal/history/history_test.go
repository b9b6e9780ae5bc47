package history

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ops builders for hand-made histories (times in arbitrary units).
func put(id, client int, q int32, v string, call, ret int64, out Outcome, off int64) Op {
	return Op{ID: id, Client: client, Kind: Put, Queue: q, Value: v, Call: call, Return: ret, Outcome: out, Offset: off,
		CommitLogOffset: 100 * off}
}

func read(id, client int, q int32, off int64, call, ret int64, found bool, v string) Op {
	return Op{ID: id, Client: client, Kind: Read, Queue: q, Offset: off, Call: call, Return: ret, Outcome: OK, Found: found, Value: v}
}

func rec(off int64, v string) Record {
	return Record{Offset: off, Value: v, CommitLogOffset: 100 * off}
}

func TestLost(t *testing.T) {
	ops := []Op{put(0, 0, 0, "0:0", 0, 1, OK, 0), put(1, 0, 0, "0:1", 2, 3, OK, 1), put(2, 1, 1, "1:0", 0, 5, Unknown, 0)}
	for _, tc := range []struct {
		name   string
		stored Stored
		want   string // "" = must pass
	}{
		{"all there", Stored{0: {rec(0, "0:0"), rec(1, "0:1")}}, ""},
		{"unknown also there", Stored{0: {rec(0, "0:0"), rec(1, "0:1")}, 1: {rec(0, "1:0")}}, ""},
		{"lost ack", Stored{0: {rec(0, "0:0")}}, "nothing stored there"},
		{"other value at the offset", Stored{0: {rec(0, "0:0"), rec(1, "9:9")}}, `"9:9" stored there`},
		{"moved in the commitlog", Stored{0: {rec(0, "0:0"), {Offset: 1, Value: "0:1", CommitLogOffset: 7}}}, "stored at commitlog 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acked, err := Lost(ops, tc.stored)
			if acked != 2 {
				t.Errorf("acked = %d, want 2", acked)
			}
			check(t, err, tc.want)
		})
	}
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("want a pass, got %v", err)
	case want != "" && err == nil:
		t.Fatalf("want a failure containing %q, got a pass", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("want a failure containing %q, got %v", want, err)
	}
}

func TestDuplicates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ops    []Op
		stored Stored
		dups   int
		want   string
	}{
		{"once", []Op{put(0, 0, 0, "0:0", 0, 1, OK, 0)}, Stored{0: {rec(0, "0:0")}}, 0, ""},
		{"acked twice without a retry", []Op{put(0, 0, 0, "0:0", 0, 1, OK, 0)},
			Stored{0: {rec(0, "0:0"), rec(1, "0:0")}}, 1, "duplicate"},
		{"unknown then retried ok", []Op{put(0, 0, 0, "0:0", 0, 1, Unknown, 0),
			func() Op { o := put(1, 0, 0, "0:0", 2, 3, OK, 1); o.Attempt = 1; return o }()},
			Stored{0: {rec(0, "0:0"), rec(1, "0:0")}}, 1, ""},
		{"three copies from two sends", []Op{put(0, 0, 0, "0:0", 0, 1, Unknown, 0),
			func() Op { o := put(1, 0, 0, "0:0", 2, 3, OK, 1); o.Attempt = 1; return o }()},
			Stored{0: {rec(0, "0:0"), rec(1, "0:0"), rec(2, "0:0")}}, 2, "stored 3 times"},
		{"never sent", nil, Stored{0: {rec(0, "7:7")}}, 0, "never sent"},
		{"failed definitely, yet stored", []Op{put(0, 0, 0, "0:0", 0, 1, Fail, 0)}, Stored{0: {rec(0, "0:0")}}, 0,
			"every send failed definitely"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dups, err := Duplicates(tc.ops, tc.stored)
			if dups != tc.dups {
				t.Errorf("dups = %d, want %d", dups, tc.dups)
			}
			check(t, err, tc.want)
		})
	}
}

func TestLiveness(t *testing.T) {
	ops := make([]Op, 0, 100)
	for i := range 100 {
		ops = append(ops, put(i, 0, 0, Value(0, i), 0, 1, OK, int64(i)))
	}
	ops = append(ops, put(100, 0, 0, "x", 0, 1, Unknown, 0))
	if rate, err := Liveness(ops, 10*time.Second, 10); err != nil || rate != 10 {
		t.Fatalf("100 ok in 10 s at a floor of 10/s: rate %v, %v", rate, err)
	}
	_, err := Liveness(ops, 10*time.Second, 11)
	check(t, err, "below the floor")
	_, err = Liveness(nil, time.Second, 1)
	check(t, err, "below the floor") // an idle run fails
}

func TestFirstOKAfter(t *testing.T) {
	ops := []Op{put(0, 0, 0, "a", 0, 10, OK, 0), put(1, 0, 0, "b", 20, 50, Unknown, 0), put(2, 0, 0, "c", 60, 70, OK, 1)}
	if d, ok := FirstOKAfter(ops, 15); !ok || d != 55 {
		t.Fatalf("FirstOKAfter(15) = %v, %v; want 55, true", d, ok)
	}
	if _, ok := FirstOKAfter(ops, 71); ok {
		t.Fatal("FirstOKAfter past the end found a put")
	}
}

// TestWritesAfterHeals: a heal that stayed healed for the bound is held to
// it (an ok put returned within it), one cut short by the next fault or by
// the end of the history is only measured.
func TestWritesAfterHeals(t *testing.T) {
	ops := []Op{put(0, 0, 0, "a", 0, 10, OK, 0), put(1, 0, 0, "b", 20, 50, Unknown, 0), put(2, 0, 0, "c", 60, 70, OK, 1),
		put(3, 0, 0, "d", 70, 200, OK, 2), put(4, 0, 0, "e", 70, 120, Fail, 3)}
	for _, tc := range []struct {
		name          string
		heals, starts []int64
		end           int64
		within        time.Duration
		want          []time.Duration
		held          int
		fails         bool
	}{
		{name: "in time", heals: []int64{5, 55}, end: 300, within: 20, want: []time.Duration{5, 15}, held: 2},
		{name: "late", heals: []int64{15}, end: 300, within: 20, want: []time.Duration{55}, held: 1, fails: true},
		{name: "late, cut short by a fault", heals: []int64{15}, starts: []int64{30}, end: 300, within: 20, want: []time.Duration{55}},
		{name: "a fault before the heal does not cut it", heals: []int64{15}, starts: []int64{10}, end: 300, within: 20,
			want: []time.Duration{55}, held: 1, fails: true},
		{name: "late, cut short by the end", heals: []int64{75}, end: 90, within: 20, want: []time.Duration{125}},
		{name: "nothing after it", heals: []int64{250}, end: 300, within: 20, held: 1, fails: true},
	} {
		ds, held, err := WritesAfterHeals(ops, tc.heals, tc.starts, tc.end, tc.within)
		if !slices.Equal(ds, tc.want) || held != tc.held || (err != nil) != tc.fails {
			t.Errorf("%s: %v, %d held, %v; want %v, %d held, failing %v", tc.name, ds, held, err, tc.want, tc.held, tc.fails)
		}
	}
}

func writeSegment(t *testing.T, dir string, base int64, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "commitlog"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "commitlog", fmt.Sprintf("%020d", base))
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDivergent(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	seg0 := []byte(strings.Repeat("r", 16))
	writeSegment(t, a, 0, seg0)
	writeSegment(t, a, 16, []byte("0123456789abcdef"))
	writeSegment(t, b, 0, seg0)
	writeSegment(t, b, 16, []byte("0123456789abcdeX")) // differs in its last byte only
	writeSegment(t, c, 16, []byte("0123456789abcdef")) // retention removed its first file
	sum := func(dir string, from, to int64) string {
		t.Helper()
		d, err := CommitlogSHA256(dir, from, to)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if err := Divergent(map[string]string{"a": sum(a, 4, 31), "b": sum(b, 4, 31)}); err != nil {
		t.Fatalf("equal up to the differing byte: %v", err)
	}
	check(t, Divergent(map[string]string{"a": sum(a, 4, 32), "b": sum(b, 4, 32)}), "replicas diverge")
	if err := Divergent(map[string]string{"a": sum(a, 16, 32), "c": sum(c, 16, 32)}); err != nil {
		t.Fatalf("over [minOffset, end) a replica without the first file agrees: %v", err)
	}
	if _, err := CommitlogSHA256(c, 0, 32); err == nil {
		t.Fatal("a range starting before the replica's first file hashed")
	}
	if _, err := CommitlogSHA256(a, 0, 40); err == nil {
		t.Fatal("a range past the end hashed")
	}
}

func TestRecorderAndBody(t *testing.T) {
	r := NewRecorder()
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range 50 {
				v := Value(c, s)
				if got := ValueOf(Body(v, 100)); got != v {
					t.Errorf("ValueOf(Body(%q)) = %q", v, got)
				}
				id := r.Invoke(Op{Client: c, Kind: Put, Value: v})
				r.Finish(id, func(o *Op) { o.Outcome = OK })
			}
		}()
	}
	wg.Wait()
	ops := r.Ops()
	if len(ops) != 200 {
		t.Fatalf("%d ops recorded, want 200", len(ops))
	}
	for i, o := range ops {
		if o.ID != i || o.Outcome != OK || o.Return < o.Call {
			t.Fatalf("op %d recorded as %+v", i, o)
		}
	}
}

func weak(o Op) Op { o.Weak = true; return o }

func TestWeakReads(t *testing.T) {
	stored := Stored{0: {rec(0, "a"), rec(1, "b")}}
	ops := []Op{put(0, 0, 0, "a", 10, 20, OK, 0), put(1, 0, 0, "b", 30, 40, Unknown, 0)}
	for _, tc := range []struct {
		name    string
		read    Op
		checked int
		want    string
	}{
		{"the stored value", weak(read(2, 1, 0, 0, 15, 16, true, "a")), 1, ""},
		{"an unknown put's stored value", weak(read(2, 1, 0, 1, 35, 36, true, "b")), 1, ""},
		{"stale absent", weak(read(2, 1, 0, 1, 50, 51, false, "")), 0, ""},
		{"another value at the offset", weak(read(2, 1, 0, 1, 50, 51, true, "a")), 1, `"b" stored there`},
		{"past the final end", weak(read(2, 1, 0, 2, 50, 51, true, "b")), 1, "nothing stored there"},
		{"read before its put was sent", weak(read(2, 1, 0, 1, 5, 6, true, "b")), 1, "before its put was invoked"},
		{"never sent", weak(read(2, 1, 0, 0, 50, 51, true, "z")), 1, `"a" stored there`},
		{"a strong read is not this checker's", read(2, 1, 0, 0, 50, 51, true, "z"), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := WeakReads(append(slices.Clone(ops), tc.read), stored)
			if n != tc.checked {
				t.Errorf("checked %d reads, want %d", n, tc.checked)
			}
			check(t, err, tc.want)
		})
	}
	// A stored value nobody sent, read by a follower.
	_, err := WeakReads([]Op{weak(read(0, 1, 0, 0, 5, 6, true, "z"))}, Stored{0: {rec(0, "z")}})
	check(t, err, "never sent")
}

func TestWeakReadsLeftOutOfLinearizability(t *testing.T) {
	// A stale follower read after an ack: not linearizable as a strong
	// read, allowed as a weak one.
	ops := []Op{put(0, 0, 0, "a", 0, 1, OK, 0), weak(read(1, 1, 0, 0, 2, 3, false, ""))}
	if _, err := Linearizable(ops, nil, t.TempDir(), 10*time.Second); err != nil {
		t.Fatalf("a stale weak read failed the linearizability check: %v", err)
	}
	ops[1].Weak = false
	_, err := Linearizable(ops, nil, t.TempDir(), 10*time.Second)
	check(t, err, "not linearizable")
}

func TestUnavailabilityAndPercentile(t *testing.T) {
	ops := []Op{put(0, 0, 0, "a", 0, 10, OK, 0), put(1, 0, 0, "b", 20, 30, Unknown, 0), put(2, 1, 0, "c", 25, 90, OK, 1),
		put(3, 0, 0, "d", 40, 60, OK, 2), put(4, 0, 0, "e", 100, 110, Fail, 3)}
	got := Unavailability(ops, []int64{15, 35, 95})
	if want := []time.Duration{45, 25}; !slices.Equal(got, want) {
		t.Fatalf("Unavailability = %v, want %v (the fault at 95 has no ok put after it)", got, want)
	}
	ds := []time.Duration{5, 1, 4, 2, 3}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 3}, {99, 5}, {100, 5}, {1, 1}} {
		if got := Percentile(ds, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", ds, tc.p, got, tc.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("Percentile of nothing is not 0")
	}
}
