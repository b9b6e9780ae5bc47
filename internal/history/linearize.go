package history

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// A queue's state in the model: its values in offset order, as an
// immutable linked list so that the states porcupine keeps for every
// explored prefix share their common part (a slice per state would cost
// O(n²) memory on long histories).
type qstate struct {
	prev *qstate
	v    string
	n    int // length including this node
}

func (s *qstate) len() int {
	if s == nil {
		return 0
	}
	return s.n
}

func (s *qstate) at(off int64) string {
	for s != nil && int64(s.n-1) > off {
		s = s.prev
	}
	return s.v
}

func (s *qstate) push(v string) *qstate { return &qstate{prev: s, v: v, n: s.len() + 1} }

func equalStates(a, b *qstate) bool {
	for a != b {
		if a.len() != b.len() || a.v != b.v {
			return false
		}
		a, b = a.prev, b.prev
	}
	return true
}

// input and output of a porcupine operation.
type input struct {
	kind   Kind
	queue  int32
	value  string // a put's
	offset int64  // a read's
}

type output struct {
	unknown bool // a put whose outcome is unknown: it happened or not
	offset  int64
	found   bool
	value   string
}

// queueModel is the per-queue model of design §5.4 (d): Append(v) -> o is
// legal iff o == len(state); Read(o) -> v requires state[o] == v, and
// Read(o) -> absent requires o >= len(state). A put of unknown outcome
// either took effect (at some point before the end) or never did.
var queueModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[int32][]porcupine.Operation{}
		var order []int32
		for _, op := range h {
			q := op.Input.(input).queue
			if _, ok := by[q]; !ok {
				order = append(order, q)
			}
			by[q] = append(by[q], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, q := range order {
			out = append(out, by[q])
		}
		return out
	},
	Init: func() []any { return []any{(*qstate)(nil)} },
	Step: func(state, in, out any) []any {
		s, i, o := state.(*qstate), in.(input), out.(output)
		switch i.kind {
		case Put:
			if o.unknown {
				return []any{s, s.push(i.value)}
			}
			if o.offset == int64(s.len()) {
				return []any{s.push(i.value)}
			}
		case Read:
			if o.found && o.offset >= 0 && o.offset < int64(s.len()) && s.at(o.offset) == o.value {
				return []any{s}
			}
			if !o.found && o.offset >= int64(s.len()) {
				return []any{s}
			}
		}
		return nil
	},
	Equal: func(a, b any) bool { return equalStates(a.(*qstate), b.(*qstate)) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		switch {
		case i.kind == Put && o.unknown:
			return fmt.Sprintf("put(%s) -> ?", i.value)
		case i.kind == Put:
			return fmt.Sprintf("put(%s) -> %d", i.value, o.offset)
		case o.found:
			return fmt.Sprintf("read(%d) -> %s", o.offset, o.value)
		default:
			return fmt.Sprintf("read(%d) -> absent", o.offset)
		}
	},
	DescribeState: func(state any) string {
		s := state.(*qstate)
		if s.len() == 0 {
			return "[]"
		}
		return fmt.Sprintf("[%d values, last %s]", s.len(), s.v)
	},
}

// operations turns a history into porcupine operations: failed operations
// are left out (they did nothing), so are reads without an answer (they
// change nothing); unknown and pending puts stay open until after the end.
//
// With the final contents (stored non-nil), an unknown put is resolved as
// Jepsen does with what was read at the end: a copy of its value that no ok
// put claims gives it its offset (copies go to unknown sends in call
// order), and one left without a copy never took effect and is dropped (a
// read that saw it then fails, since no put wrote its value). This keeps
// the search linear where thousands of open puts would make it explode;
// a log never loses a record it took, which Lost and Duplicates check on
// the same final contents.
func operations(ops []Op, stored Stored) []porcupine.Operation {
	var end int64
	for _, o := range ops {
		end = max(end, o.Call, o.Return)
	}
	resolved := map[int]int64{} // op ID → queue offset of its copy
	if stored != nil {
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
	}
	proof := proofs(ops)
	var h []porcupine.Operation
	for _, o := range ops {
		if off, ok := resolved[o.ID]; ok {
			if off >= 0 {
				h = append(h, porcupine.Operation{ClientId: o.Client, Input: o.input(), Call: o.Call,
					Return: max(o.Call+1, min(end+1, proof(o.Queue, off))), Output: output{offset: off}})
			}
			continue
		}
		in := o.input()
		switch {
		case o.Outcome == OK && o.Kind == Put:
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: o.Return,
				Output: output{offset: o.Offset}})
		case o.Outcome == OK && o.Kind == Read && !o.Weak:
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: o.Return,
				Output: output{offset: o.Offset, found: o.Found, value: o.Value}})
		case o.Kind == Put && (o.Outcome == Unknown || o.Outcome == Pending):
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: end + 1,
				Output: output{unknown: true}})
		}
	}
	return h
}

// proofs returns, for a queue offset, the earliest time by which a put
// there must have taken effect: the return of an ok read that found a
// message at that offset or later, or of an ok put at a later offset.
// Closing a resolved unknown put there instead of at the end of the
// history excludes no valid linearization (its effect precedes that
// operation's), and keeps porcupine's search short on long histories. A
// proof earlier than the put's own call (impossible in a linearizable
// history) closes it just after its call, so that the check fails.
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

func (o Op) input() input {
	return input{kind: o.Kind, queue: o.Queue, value: o.Value, offset: o.Offset}
}

// Linearizable checks checker (d) with porcupine, partitioned by queue,
// with unknown puts resolved against stored (nil: left open, see
// operations). A history that is not linearizable (or that porcupine could not decide
// within timeout) is an error naming the HTML visualization written into
// dir.
func Linearizable(ops []Op, stored Stored, dir string, timeout time.Duration) error {
	model := queueModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, operations(ops, stored), timeout)
	if res == porcupine.Ok {
		return nil
	}
	path := filepath.Join(dir, "linearizability.html")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("history: porcupine says %s; writing the visualization: %w", res, err)
	}
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return fmt.Errorf("history: porcupine says %s; writing the visualization: %w", res, err)
	}
	if res == porcupine.Unknown {
		return fmt.Errorf("history: porcupine could not decide within %v (partial visualization: %s)", timeout, path)
	}
	return fmt.Errorf("history: not linearizable; visualization: %s", path)
}
