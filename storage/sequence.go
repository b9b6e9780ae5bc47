package storage

import (
	"sync/atomic"
	"time"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/record"
)

// sequencer is the sequencing step of an append: it assigns each record its
// queue offset and store time, apart from where the bytes land (the
// commitlog's placement). A replicated leader stamps these where it
// proposes; a single node does it inside commitlog.Log.Append's callbacks.
//
// Its table is touched only from those callbacks (begin, commit), from
// Log.Locked (a topic delete), and before the log takes appends (set, at
// Open): the commitlog's append lock serialises all of them, so the table
// needs no lock of its own and costs a put one map lookup. lastStoreTS is
// also published atomically for the checkpoint and retention.
type sequencer struct {
	next        map[consumequeue.Key]*queueNext // next queue offset per topic-queue
	lastStoreTS atomic.Int64                    // store times never go backwards along the log
}

// queueNext is a topic-queue's next queue offset, held by pointer so that
// an append looks the key up once.
type queueNext struct{ offset int64 }

// sequenced is what begin assigned to one append.
type sequenced struct {
	storeTS int64
	first   int64      // queue offset of the first record (0 when none is assigned)
	next    *queueNext // nil: the records take no queue offset (prepared, rolled back)
}

func (q *sequencer) init() { q.next = make(map[consumequeue.Key]*queueNext) }

// begin stamps an append to k at now: the store time is re-stamped so it
// never goes backwards along the log (recovery and retention rely on it),
// and records of a normal or committed transaction type take queue
// offsets from the queue's next one. REQUIRES: the append lock.
func (q *sequencer) begin(k consumequeue.Key, tx int32, now time.Time) sequenced {
	st := sequenced{storeTS: max(now.UnixMilli(), q.lastStoreTS.Load())}
	if tx == record.TransactionNotType || tx == record.TransactionCommitType {
		if st.next = q.next[k]; st.next == nil {
			st.next = new(queueNext)
			q.next[k] = st.next
		}
		st.first = st.next.offset
	}
	return st
}

// queueOffset is the queue offset of record i of the append (0 for
// records that take none, as RocketMQ writes them).
func (st sequenced) queueOffset(i int) int64 {
	if st.next == nil {
		return 0
	}
	return st.first + int64(i)
}

// undo takes back a commit of st whose append was refused (a group's
// put in an entry raft dropped), the commits after it undone first: the
// queue's next offset is st's first again. The store time stays: it only
// keeps the next one from going back. REQUIRES: the append lock.
func (q *sequencer) undo(st sequenced) {
	if st.next != nil {
		st.next.offset = st.first
	}
}

// commit advances the sequencer past an append of n records once their
// bytes are placed. REQUIRES: the append lock.
func (q *sequencer) commit(st sequenced, n int) {
	q.lastStoreTS.Store(st.storeTS)
	if st.next != nil {
		st.next.offset = st.first + int64(n)
	}
}

// set makes k's next queue offset n (Open, from the rebuilt consume
// queues). REQUIRES: no appends yet.
func (q *sequencer) set(k consumequeue.Key, n int64) { q.next[k] = &queueNext{offset: n} }

// take removes every queue of topic from the table and returns them, for a
// topic delete (restore puts them back if the delete is undone).
// REQUIRES: the append lock (Log.Locked).
func (q *sequencer) take(topic string) map[consumequeue.Key]*queueNext {
	saved := map[consumequeue.Key]*queueNext{}
	for k, v := range q.next {
		if k.Topic == topic {
			saved[k] = v
			delete(q.next, k)
		}
	}
	return saved
}

// restore puts back what take removed. REQUIRES: the append lock.
func (q *sequencer) restore(saved map[consumequeue.Key]*queueNext) {
	for k, v := range saved {
		q.next[k] = v
	}
}
