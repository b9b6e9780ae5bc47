package consumequeue

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/fault"
	"github.com/storaged/storaged/storage/vfs"
)

// Key names a topic-queue.
type Key struct {
	Topic string
	Queue int32
}

// Log is what the index reads and syncs: the commitlog.
type Log interface {
	// At returns the bytes from commitlog offset off to the end of the
	// file holding it, nil when no file holds it. The index reads only
	// below the watermark and at or above the checkpoint's dispatched
	// offset, which retention never deletes, so it holds no read guard.
	At(off int64) []byte
	// FileSize is the size of every commitlog file (a blank ends a file).
	FileSize() int64
	// Sync makes the commitlog durable (flush.Syncer); the checkpoint
	// calls Sync(0) before it records an offset as durable.
	Sync(minPages int) (int64, error)
}

// Applier applies one record of a system topic, rec (its whole bytes,
// lengths checked, in the mapping: copy what is kept), stored at
// commitlog offset phys. It runs inside a dispatch round (the dispatcher's
// goroutine or a putter's), under the round lock: it must be quick and
// must not call the Index.
type Applier func(phys int64, rec []byte)

// Options configure an Index. Every field is required; the storage facade
// fills them from its own Options.
type Options struct {
	FS  vfs.FS
	Dir string // the data dir: queues in Dir/consumequeue, the checkpoint in Dir
	// EntriesPerFile is the number of 20-byte entries per queue file.
	EntriesPerFile int
	// MaxOpenFiles bounds the queue files open at once (LRU).
	MaxOpenFiles       int
	CheckpointInterval time.Duration
	// RequireCRC: records carry the whole-record CRC (a rebuild checks it).
	RequireCRC bool
	// AwaitTimeout bounds AwaitDispatched (a put never hangs on the index).
	AwaitTimeout time.Duration
	// Watermark is the commitlog offset the dispatcher may index up to:
	// the durable end in sync mode, the written end in async mode, the
	// commit index under replication.
	Watermark func() int64
	// Tombstones is the deleted topics and the commitlog offsets of their
	// deletes: records of a topic below it are not indexed. Read-only map.
	Tombstones func() map[string]int64
	// Delay is the delay of a delay level (1-based): a schedule-topic
	// entry's tags code is its delivery time.
	Delay func(level int) time.Duration
	// Apply, if set, returns the applier of topic's records (nil: topic
	// has none): the hook through which the store keeps the state it
	// builds from its system topics' records (consumer offsets) in step
	// with what is indexed. See Index.StartApplyingPaused.
	Apply func(topic string) Applier
	// LastStoreTime is the newest store time stamped (the checkpoint
	// records it).
	LastStoreTime func() int64
	// Raft, if set (a replication group member), is the raft state the
	// checkpoint records beside its offsets (Checkpoint.RaftApplied and
	// the rest); ok false records none this time (no raft node yet).
	Raft func() (p RaftPoint, ok bool)
	// Fail makes the store read-only: called for damage in the commitlog
	// (no retry can help) and a failed commitlog sync.
	Fail   func(error)
	Faults *fault.Set
	Clock  base.Clock
	Logger *zerolog.Logger
}
