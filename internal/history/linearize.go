package history

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Checker (d): linearizability per queue, with porcupine.
//
// The model's state is a queue's length (its next offset), not its
// values: Append(v) -> o is legal iff o == length, and makes it o+1;
// Read(o) -> found is legal iff o < length, Read(o) -> absent iff
// o >= length. What a read found is checked outside porcupine
// (readContents): every put in the checked history has a known offset
// (ok puts return it, unknown ones are resolved by the final contents),
// so in every linearization the value at offset o is the value of the one
// put at o, and a read of o must have found exactly that. Together the
// two are the full-log model of design §5.4 (d) (state = the queue's
// values), which this package used before and which its tests still
// compare against (TestLinearizableAgreesWithFullLogModel).
//
// Bounded pieces. porcupine keeps, per cache entry, a bitset over every
// operation of the history it searches, so its memory grows with the
// square of a partition's length: a queue of 850,000 operations (the
// 30-minute long form) held 22 GB before it was killed. A queue's
// history is therefore cut, by offset, into pieces of about pieceOps
// operations, checked one at a time from their first offset.
//
// Why a cut is sound. Give each put at offset k its linearization point
// t_k. A linearization exists iff the points can be picked with
// t_0 <= t_1 <= ... (ties ordered by offset), t_k no earlier than L_k
// (the put's call and the call of every read that found k absent) and no
// later than H_k (the put's return and the return of every read that
// found k), since a read constrains only the point of the put at its
// offset: so iff L_j <= H_k for every j <= k. A piece [a, b) checked from
// length a covers the pairs inside it; a cut at b is taken only where
// max(L_0..L_{b-1}) <= min(H_b..H_end), which covers the pairs across
// it, and only between offsets that each hold exactly one put. In a
// linearizable history every offset passes that test; where it fails the
// piece grows past the violation, so porcupine sees it (and draws it).
//
// Memory guard. A piece larger than maxPieceOps is refused with an error
// (no cut point was sound for that long), and porcupine's search over a
// piece is held to searchBytes of cache: past it the search is stopped
// and the piece reported undecided. Either fails the check; neither can
// grow until the machine runs out of memory.
var (
	pieceOps    = 2000
	maxPieceOps = 20000
	searchBytes = int64(512 << 20)
)

// input and output of a porcupine operation.
type input struct {
	kind   Kind
	queue  int32
	value  string // a put's
	offset int64  // a read's
}

type output struct {
	offset int64
	found  bool
	value  string
}

// pieceModel is the length model for a piece starting at offset base;
// its search stops (every step refused) after budget successful steps,
// each of which may add an entry to porcupine's cache, and sets *over.
func pieceModel(base, budget int64, over *bool) porcupine.Model {
	var steps int64
	return porcupine.Model{
		Init: func() any { return base },
		Step: func(state, in, out any) (bool, any) {
			n, i, o := state.(int64), in.(input), out.(output)
			if steps >= budget {
				*over = true
				return false, n
			}
			switch {
			case i.kind == Put && o.offset == n:
				steps++
				return true, n + 1
			case i.kind == Read && o.found == (o.offset >= 0 && o.offset < n):
				steps++
				return true, n
			}
			return false, n
		},
		Hash: func(state any) uint64 { return uint64(state.(int64)) * 0x9e3779b97f4a7c15 },
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			switch {
			case i.kind == Put:
				return fmt.Sprintf("put(%s) -> %d", i.value, o.offset)
			case o.found:
				return fmt.Sprintf("read(%d) -> %s", o.offset, o.value)
			default:
				return fmt.Sprintf("read(%d) -> absent", o.offset)
			}
		},
		DescribeState: func(state any) string { return fmt.Sprintf("length %d", state.(int64)) },
	}
}

// resolve gives each put of unknown outcome (or still pending) the queue
// offset of its copy in the final contents, as Jepsen does with what was
// read at the end: a copy of its value that no ok put claims goes to the
// unknown sends of that value in call order; -1 for a send left without
// a copy, which never took effect and is dropped (a read that saw its
// value then fails, since no put at that offset wrote it). A log never
// loses a record it took, which Lost and Duplicates check on the same
// final contents.
func resolve(ops []Op, stored Stored) map[int]int64 {
	resolved := map[int]int64{}  // op ID → queue offset of its copy
	free := map[string][]int64{} // value → offsets no ok put claims
	claimed := map[[2]int64]bool{}
	for _, o := range ops {
		if o.Kind == Put && o.Outcome == OK {
			claimed[[2]int64{int64(o.Queue), o.Offset}] = true
		}
	}
	for q, rs := range stored {
		for _, r := range rs {
			if !claimed[[2]int64{int64(q), r.Offset}] {
				free[r.Value] = append(free[r.Value], r.Offset)
			}
		}
	}
	for _, o := range ops { // ops are in call order
		if o.Kind == Put && (o.Outcome == Unknown || o.Outcome == Pending) {
			if offs := free[o.Value]; len(offs) > 0 {
				resolved[o.ID], free[o.Value] = offs[0], offs[1:]
			} else {
				resolved[o.ID] = -1
			}
		}
	}
	return resolved
}

// operations turns a history into porcupine operations by queue: ok puts
// with their offsets, resolved unknown puts (closed at the first
// operation that proves they took effect, see proofs), and ok reads that
// are not weak. Failed operations did nothing and are left out, so are
// reads without an answer.
func operations(ops []Op, stored Stored) map[int32][]porcupine.Operation {
	resolved := resolve(ops, stored)
	var end int64
	for _, o := range ops {
		end = max(end, o.Call, o.Return)
	}
	proof := proofs(ops)
	by := map[int32][]porcupine.Operation{}
	add := func(o Op, ret int64, out output) {
		by[o.Queue] = append(by[o.Queue], porcupine.Operation{ClientId: o.Client,
			Input: input{kind: o.Kind, queue: o.Queue, value: o.Value, offset: o.Offset}, Call: o.Call, Return: ret, Output: out})
	}
	for _, o := range ops {
		switch {
		case o.Kind == Put && (o.Outcome == Unknown || o.Outcome == Pending):
			if off := resolved[o.ID]; off >= 0 {
				add(o, max(o.Call+1, min(end+1, proof(o.Queue, off))), output{offset: off})
			}
		case o.Kind == Put && o.Outcome == OK:
			add(o, o.Return, output{offset: o.Offset})
		case o.Kind == Read && o.Outcome == OK && !o.Weak:
			add(o, o.Return, output{offset: o.Offset, found: o.Found, value: o.Value})
		}
	}
	return by
}

// proofs returns, for a queue offset, the earliest time by which a put
// there must have taken effect: the return of an ok read that found a
// message at that offset or later, or of an ok put at a later offset.
// Closing a resolved unknown put there instead of at the end of the
// history excludes no valid linearization (its effect precedes that
// operation's), and lets the offsets after it be cut from it. A proof
// earlier than the put's own call (impossible in a linearizable history)
// closes it just after its call, so that the check fails.
func proofs(ops []Op) func(q int32, off int64) int64 {
	type ev struct{ key, ret int64 }
	by := map[int32][]ev{}
	for _, o := range ops {
		switch {
		case o.Outcome == OK && o.Kind == Read && o.Found && !o.Weak:
			by[o.Queue] = append(by[o.Queue], ev{o.Offset, o.Return})
		case o.Outcome == OK && o.Kind == Put:
			by[o.Queue] = append(by[o.Queue], ev{o.Offset - 1, o.Return})
		}
	}
	for q, evs := range by {
		slices.SortFunc(evs, func(a, b ev) int { return cmp.Compare(a.key, b.key) })
		for i := len(evs) - 2; i >= 0; i-- { // suffix minimum of returns
			evs[i].ret = min(evs[i].ret, evs[i+1].ret)
		}
		by[q] = evs
	}
	return func(q int32, off int64) int64 {
		evs := by[q]
		i, _ := slices.BinarySearchFunc(evs, off, func(e ev, t int64) int { return cmp.Compare(e.key, t) })
		if i == len(evs) {
			return math.MaxInt64
		}
		return evs[i].ret
	}
}

// readContents is the half of the model porcupine does not see: an ok
// read that found a message at offset o found the value of the put at o
// (an ok put that returned o, or an unknown one resolved there). With no
// put at o, or several, porcupine's length check fails the history; only
// a single put with another value is reported here.
func readContents(q int32, h []porcupine.Operation) []string {
	putAt := map[int64][]string{}
	for _, op := range h {
		if i := op.Input.(input); i.kind == Put {
			o := op.Output.(output).offset
			putAt[o] = append(putAt[o], i.value)
		}
	}
	var problems []string
	for _, op := range h {
		i, o := op.Input.(input), op.Output.(output)
		if i.kind != Read || !o.found {
			continue
		}
		if vs := putAt[o.offset]; len(vs) == 1 && vs[0] != o.value {
			problems = append(problems, fmt.Sprintf("q%d: read(%d) at %v..%v found %q, but the put at offset %d wrote %q",
				q, o.offset, time.Duration(op.Call), time.Duration(op.Return), o.value, o.offset, vs[0]))
		}
	}
	return problems
}

// piece is a run of a queue's offsets, [base, base+n), with every
// operation on them, checked by porcupine from length base.
type piece struct {
	queue int32
	base  int64
	ops   []porcupine.Operation
}

// errTooLarge: a piece outgrew maxPieceOps (see the guard above).
var errTooLarge = errors.New("history: piece too large to check")

// pieces cuts one queue's operations (see the soundness note above).
// Reads that found a message beyond the last put's offset go into the
// last piece (porcupine fails them); reads that found nothing there are
// left out, since every state the history can reach has them legal.
func pieces(q int32, h []porcupine.Operation, target, limit int) ([]piece, error) {
	var n int64 // one past the highest put offset
	for _, op := range h {
		if op.Input.(input).kind == Put {
			n = max(n, op.Output.(output).offset+1)
		}
	}
	lo := make([]int64, n) // L_k: latest call that bounds t_k from below
	hi := make([]int64, n) // H_k: earliest return that bounds it from above
	for k := range n {
		lo[k], hi[k] = math.MinInt64, math.MaxInt64
	}
	puts := make([]int, n)
	at := make([][]porcupine.Operation, n)
	var before, beyond []porcupine.Operation
	for _, op := range h {
		i, o := op.Input.(input), op.Output.(output)
		k := o.offset
		switch {
		case k < 0:
			before = append(before, op)
			continue
		case k >= n && i.kind == Read && o.found:
			beyond = append(beyond, op)
			continue
		case k >= n:
			continue
		}
		at[k] = append(at[k], op)
		switch {
		case i.kind == Put:
			puts[k]++
			lo[k], hi[k] = max(lo[k], op.Call), min(hi[k], op.Return)
		case o.found:
			hi[k] = min(hi[k], op.Return)
		default:
			lo[k] = max(lo[k], op.Call)
		}
	}
	sufHi := make([]int64, n+1)
	sufHi[n] = math.MaxInt64
	for k := n - 1; k >= 0; k-- {
		sufHi[k] = min(hi[k], sufHi[k+1])
	}
	var out []piece
	cur := piece{queue: q, base: 0, ops: before}
	preLo := int64(math.MinInt64) // max L over the offsets below k
	for k := range n {
		if len(cur.ops) >= target && k > 0 && puts[k-1] == 1 && puts[k] == 1 && preLo <= sufHi[k] {
			out = append(out, cur)
			cur = piece{queue: q, base: k}
		}
		cur.ops = append(cur.ops, at[k]...)
		if len(cur.ops) > limit {
			return nil, fmt.Errorf("%w: queue %d, offsets %d..%d: %d operations with no sound cut point (at most %d are checked at once): "+
				"not linearizable there, or too many operations in flight on the queue",
				errTooLarge, q, cur.base, k, len(cur.ops), limit)
		}
		preLo = max(preLo, lo[k])
	}
	cur.ops = append(cur.ops, beyond...)
	if len(cur.ops) > limit {
		return nil, fmt.Errorf("%w: queue %d, offsets from %d: %d operations (at most %d are checked at once)",
			errTooLarge, q, cur.base, len(cur.ops), limit)
	}
	if len(cur.ops) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// Checked says how a history was checked: in how many pieces, over how
// many operations, the largest piece.
type Checked struct {
	Pieces, Ops, Largest int
}

// maxDrawn bounds how many failing pieces are drawn.
const maxDrawn = 3

// Linearizable checks checker (d) with porcupine, by queue and in bounded
// pieces (see above), with unknown puts resolved against stored, the
// final contents (required when the history has any). A piece that is not
// linearizable is drawn by porcupine.Visualize into dir (the error names
// the file); a piece that porcupine could not decide within timeout (for
// the whole history) or within its memory budget, and a piece too large
// to check, are errors too.
func Linearizable(ops []Op, stored Stored, dir string, timeout time.Duration) (Checked, error) {
	var c Checked
	if stored == nil {
		for _, o := range ops {
			if o.Kind == Put && (o.Outcome == Unknown || o.Outcome == Pending) {
				return c, fmt.Errorf("history: %s: a put of unknown outcome needs the final contents to be resolved", o)
			}
		}
	}
	deadline := time.Now().Add(timeout)
	by := operations(ops, stored)
	var problems []string
	var all []piece
	for _, q := range slices.Sorted(maps.Keys(by)) {
		problems = append(problems, readContents(q, by[q])...)
		ps, err := pieces(q, by[q], pieceOps, maxPieceOps)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		all = append(all, ps...)
	}
	drawn := 0
	for _, p := range all {
		c.Pieces++
		c.Ops += len(p.ops)
		c.Largest = max(c.Largest, len(p.ops))
		left := time.Until(deadline)
		if left <= 0 {
			problems = append(problems, fmt.Sprintf("porcupine could not decide within %v (out of time before queue %d from offset %d)", timeout, p.queue, p.base))
			break
		}
		budget := max(searchBytes/(int64(len(p.ops))/8+160), 1000)
		var over bool
		res := porcupine.CheckOperationsTimeout(pieceModel(p.base, budget, &over), p.ops, left)
		where := fmt.Sprintf("queue %d from offset %d (%d operations)", p.queue, p.base, len(p.ops))
		if res == porcupine.Ok {
			continue
		}
		if over {
			problems = append(problems, fmt.Sprintf("porcupine could not decide %s within its memory budget (%d states, about %d MiB)",
				where, budget, searchBytes>>20))
			continue
		}
		if res == porcupine.Unknown {
			problems = append(problems, fmt.Sprintf("porcupine could not decide %s within %v", where, timeout))
			break
		}
		// Not linearizable: check it again, keeping what porcupine needs
		// to draw it.
		if drawn == maxDrawn {
			problems = append(problems, "not linearizable: "+where)
			continue
		}
		drawn++
		over = false
		model := pieceModel(p.base, budget, &over)
		_, info := porcupine.CheckOperationsVerbose(model, p.ops, max(time.Until(deadline), time.Second))
		path := filepath.Join(dir, fmt.Sprintf("linearizability-q%d-%d.html", p.queue, p.base))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			problems = append(problems, fmt.Sprintf("not linearizable: %s; writing the visualization: %v", where, err))
			continue
		}
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			problems = append(problems, fmt.Sprintf("not linearizable: %s; writing the visualization: %v", where, err))
			continue
		}
		problems = append(problems, fmt.Sprintf("not linearizable: %s; visualization: %s", where, path))
	}
	if len(problems) == 0 {
		return c, nil
	}
	return c, fmt.Errorf("history: %w", joined("linearizability problems", problems))
}
