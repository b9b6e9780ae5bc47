// Package txn keeps the state of transactional half messages (RocketMQ's
// TransactionalMessageService): which half messages are pending, how often
// each was checked, and how the ended ones ended, built only from the
// records of two system topics, and the codec of the op records.
//
// A half message is a record of HalfTopic (queue 0) carrying its real
// topic and queue in REAL_TOPIC / REAL_QID (RocketMQ's layout). An op
// record is a record of OpTopic (queue 0) whose body lists half-topic
// queue offsets as decimal text separated by commas (RocketMQ's op body)
// and whose TAGS says what happened to them: "d" (RocketMQ's REMOVETAG)
// for an end, with TRAN_OP_RESOLUTION saying COMMIT, ROLLBACK or DISCARD
// (storaged's), or "c" (storaged's) for a check sent. The table changes
// only by applying those records in log order (storage's system-record
// hook), so every replica of a group holds the same table at the same log
// position, and Open rebuilds it by replaying both topics.
//
// The table's snapshot (snapshot.go) spares a start most of that replay.
// The store owns the lock discipline (Table.Mu).
package txn

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Names, RocketMQ's where RocketMQ has one.
const (
	// HalfTopic holds half messages (TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC).
	HalfTopic = "RMQ_SYS_TRANS_HALF_TOPIC"
	// OpTopic holds op records (TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC).
	OpTopic = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
	// PropertyTransactionPrepared marks a half message
	// (MessageConst.PROPERTY_TRANSACTION_PREPARED); cleared on commit.
	PropertyTransactionPrepared = "TRAN_MSG"
	// PropertyCheckImmunity is a half message's own first-check delay in
	// seconds (MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS).
	PropertyCheckImmunity = "CHECK_IMMUNITY_TIME_IN_SECONDS"
	// PropertyPreparedQueueOffset is the half's queue offset on a
	// committed message (MessageConst.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET).
	PropertyPreparedQueueOffset = "TRAN_PREPARED_QUEUE_OFFSET"
	// PropertyResolution is how an end op ended its halves (storaged's).
	PropertyResolution = "TRAN_OP_RESOLUTION"
	// RemoveTag tags an end op (TransactionalMessageUtil.REMOVE_TAG).
	RemoveTag = "d"
	// CheckTag tags a check op (storaged's).
	CheckTag = "c"
	// MaxOpOffsets bounds the half offsets of one op record.
	MaxOpOffsets = 1024
)

// Kind is what an op record did.
type Kind uint8

// Op kinds.
const (
	Commit Kind = iota + 1
	Rollback
	Discard // rolled back by the store after its last check
	Check
)

func (k Kind) String() string {
	switch k {
	case Commit:
		return "COMMIT"
	case Rollback:
		return "ROLLBACK"
	case Discard:
		return "DISCARD"
	case Check:
		return "CHECK"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Op is one op record: kind applied to half-topic queue offsets.
type Op struct {
	Kind    Kind
	Offsets []int64
}

// ErrBadOp: an op record that does not decode.
var ErrBadOp = errors.New("txn: malformed op record")

// Encode returns the TAGS, TRAN_OP_RESOLUTION ("" for a check) and body
// of op. REQUIRES: 1 to MaxOpOffsets non-negative offsets, a known kind.
func Encode(op Op) (tags, resolution string, body []byte) {
	for i, o := range op.Offsets {
		if i > 0 {
			body = append(body, ',')
		}
		body = strconv.AppendInt(body, o, 10)
	}
	if op.Kind == Check {
		return CheckTag, "", body
	}
	return RemoveTag, op.Kind.String(), body
}

// Decode parses an op record from its TAGS, TRAN_OP_RESOLUTION and body.
// Every malformed input is an error wrapping ErrBadOp.
func Decode(tags, resolution string, body []byte) (Op, error) {
	var op Op
	switch {
	case tags == CheckTag && resolution == "":
		op.Kind = Check
	case tags == RemoveTag:
		switch resolution {
		case "COMMIT":
			op.Kind = Commit
		case "ROLLBACK":
			op.Kind = Rollback
		case "DISCARD":
			op.Kind = Discard
		default:
			return Op{}, fmt.Errorf("%w: resolution %.32q", ErrBadOp, resolution)
		}
	default:
		return Op{}, fmt.Errorf("%w: tags %.32q with resolution %.32q", ErrBadOp, tags, resolution)
	}
	if len(body) == 0 {
		return Op{}, fmt.Errorf("%w: no offsets", ErrBadOp)
	}
	n := strings.Count(string(body), ",") + 1
	if n > MaxOpOffsets {
		return Op{}, fmt.Errorf("%w: %d offsets, limit %d", ErrBadOp, n, MaxOpOffsets)
	}
	op.Offsets = make([]int64, 0, n)
	for f := range strings.SplitSeq(string(body), ",") {
		if f == "" || len(f) > 19 || (len(f) > 1 && f[0] == '0') {
			return Op{}, fmt.Errorf("%w: offset %.32q", ErrBadOp, f)
		}
		for i := 0; i < len(f); i++ {
			if f[i] < '0' || f[i] > '9' {
				return Op{}, fmt.Errorf("%w: offset %.32q", ErrBadOp, f)
			}
		}
		o, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return Op{}, fmt.Errorf("%w: offset %.32q", ErrBadOp, f)
		}
		op.Offsets = append(op.Offsets, o)
	}
	return op, nil
}

// Half is one pending half message.
type Half struct {
	// Offset is its queue offset on HalfTopic, Phys its commitlog offset.
	Offset, Phys int64
	// StoreMS is its store time (Unix ms); ImmunityMS its own first-check
	// delay (CHECK_IMMUNITY_TIME_IN_SECONDS), 0 for the store's default.
	StoreMS, ImmunityMS int64
	// Topic and Queue are its REAL_TOPIC and REAL_QID.
	Topic string
	Queue int32
	// Checks counts the check ops applied; LastCheckMS is the store time
	// of the last one (0: never checked).
	Checks      int32
	LastCheckMS int64
}

// Table is the pending half messages and the ends remembered. Every
// method REQUIRES Mu.
type Table struct {
	Mu      sync.Mutex
	pending map[int64]*Half // by half-topic queue offset
	byPhys  map[int64]int64 // commitlog offset → queue offset
	// done remembers how the last maxDone ended halves ended (by
	// commitlog offset), so a repeated end is answered as the first.
	done      map[int64]Kind
	doneOrder []int64 // ring of done's keys, oldest at doneHead
	doneHead  int
	maxDone   int
	// halfAt and opAt are the commitlog offsets of the last half and op
	// records applied (-1: none since New or Reset), applied the records
	// applied since New: what a snapshot records (snapshot.go).
	halfAt, opAt int64
	applied      uint64
}

// New returns an empty table remembering up to maxDone ends.
func New(maxDone int) *Table {
	return &Table{pending: map[int64]*Half{}, byPhys: map[int64]int64{}, done: map[int64]Kind{}, maxDone: max(maxDone, 1),
		halfAt: -1, opAt: -1}
}

// Reset empties the table (a rebuild).
func (t *Table) Reset() {
	clear(t.pending)
	clear(t.byPhys)
	clear(t.done)
	t.doneOrder, t.doneHead = t.doneOrder[:0], 0
	t.halfAt, t.opAt = -1, -1
}

// AddHalf applies a half message record.
func (t *Table) AddHalf(h Half) {
	if _, ok := t.pending[h.Offset]; ok {
		return
	}
	hh := h
	t.pending[h.Offset] = &hh
	t.byPhys[h.Phys] = h.Offset
}

// ApplyOp applies an op record stored at storeMS. Offsets of no pending
// half (ended already, or their record is gone) are ignored.
func (t *Table) ApplyOp(op Op, storeMS int64) {
	for _, o := range op.Offsets {
		h, ok := t.pending[o]
		if !ok {
			continue
		}
		if op.Kind == Check {
			h.Checks++
			h.LastCheckMS = storeMS
			continue
		}
		delete(t.pending, o)
		delete(t.byPhys, h.Phys)
		t.remember(h.Phys, op.Kind)
	}
}

func (t *Table) remember(phys int64, k Kind) {
	if _, ok := t.done[phys]; ok {
		t.done[phys] = k
		return
	}
	if len(t.doneOrder) < t.maxDone {
		t.doneOrder = append(t.doneOrder, phys)
	} else {
		delete(t.done, t.doneOrder[t.doneHead])
		t.doneOrder[t.doneHead] = phys
		t.doneHead = (t.doneHead + 1) % t.maxDone
	}
	t.done[phys] = k
}

// ByPhys is the pending half at commitlog offset phys (a copy).
func (t *Table) ByPhys(phys int64) (Half, bool) {
	o, ok := t.byPhys[phys]
	if !ok {
		return Half{}, false
	}
	return *t.pending[o], true
}

// Ended is how the half at phys ended, if it did recently.
func (t *Table) Ended(phys int64) (Kind, bool) {
	k, ok := t.done[phys]
	return k, ok
}

// Pending counts the pending halves.
func (t *Table) Pending() int { return len(t.pending) }

// All returns copies of the pending halves.
func (t *Table) All() []Half {
	out := make([]Half, 0, len(t.pending))
	for _, h := range t.pending {
		out = append(out, *h)
	}
	return out
}

// OldestPhys is the lowest commitlog offset of a pending half.
func (t *Table) OldestPhys() (int64, bool) {
	lo, ok := int64(0), false
	for p := range t.byPhys {
		if !ok || p < lo {
			lo, ok = p, true
		}
	}
	return lo, ok
}
