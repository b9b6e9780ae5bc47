package history

// The model this package checked with until the histories of the long
// form outgrew it: a queue's state was its whole list of values, and
// porcupine's search ran over a queue's entire history at once. It stays
// here as the reference the new check (linearize.go) is compared with on
// random small histories (TestLinearizableAgreesWithFullLogModel).

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/anishathalye/porcupine"
)

// A queue's state in the model: its values in offset order, as an
// immutable linked list so that the states porcupine keeps for every
// explored prefix share their common part (a slice per state would cost
// O(n²) memory on long histories).
type refState struct {
	prev *refState
	v    string
	n    int // length including this node
}

func (s *refState) len() int {
	if s == nil {
		return 0
	}
	return s.n
}

func (s *refState) at(off int64) string {
	for s != nil && int64(s.n-1) > off {
		s = s.prev
	}
	return s.v
}

func (s *refState) push(v string) *refState { return &refState{prev: s, v: v, n: s.len() + 1} }

func refEqualStates(a, b *refState) bool {
	for a != b {
		if a.len() != b.len() || a.v != b.v {
			return false
		}
		a, b = a.prev, b.prev
	}
	return true
}

// refInput and refOutput of a porcupine operation.
type refInput struct {
	kind   Kind
	queue  int32
	value  string // a put's
	offset int64  // a read's
}

type refOutput struct {
	unknown bool // a put whose outcome is unknown: it happened or not
	offset  int64
	found   bool
	value   string
}

// refModel is the per-queue model of design §5.4 (d): Append(v) -> o is
// legal iff o == len(state); Read(o) -> v requires state[o] == v, and
// Read(o) -> absent requires o >= len(state). A put of unknown outcome
// either took effect (at some point before the end) or never did.
var refModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[int32][]porcupine.Operation{}
		var order []int32
		for _, op := range h {
			q := op.Input.(refInput).queue
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
	Init: func() []any { return []any{(*refState)(nil)} },
	Step: func(state, in, out any) []any {
		s, i, o := state.(*refState), in.(refInput), out.(refOutput)
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
	Equal: func(a, b any) bool { return refEqualStates(a.(*refState), b.(*refState)) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(refInput), out.(refOutput)
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
		s := state.(*refState)
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
func refOperations(ops []Op, stored Stored) []porcupine.Operation {
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
	proof := refProofs(ops)
	var h []porcupine.Operation
	for _, o := range ops {
		if off, ok := resolved[o.ID]; ok {
			if off >= 0 {
				h = append(h, porcupine.Operation{ClientId: o.Client, Input: o.refInput(), Call: o.Call,
					Return: max(o.Call+1, min(end+1, proof(o.Queue, off))), Output: refOutput{offset: off}})
			}
			continue
		}
		in := o.refInput()
		switch {
		case o.Outcome == OK && o.Kind == Put:
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: o.Return,
				Output: refOutput{offset: o.Offset}})
		case o.Outcome == OK && o.Kind == Read && !o.Weak:
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: o.Return,
				Output: refOutput{offset: o.Offset, found: o.Found, value: o.Value}})
		case o.Kind == Put && (o.Outcome == Unknown || o.Outcome == Pending):
			h = append(h, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: end + 1,
				Output: refOutput{unknown: true}})
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
func refProofs(ops []Op) func(q int32, off int64) int64 {
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

func (o Op) refInput() refInput {
	return refInput{kind: o.Kind, queue: o.Queue, value: o.Value, offset: o.Offset}
}

// refLinearizable is the old Linearizable's verdict (no timeout, no
// visualization): porcupine over the full-log model, by queue.
func refLinearizable(ops []Op, stored Stored) bool {
	return porcupine.CheckOperations(refModel.ToModel(), refOperations(ops, stored))
}
