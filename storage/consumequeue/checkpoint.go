package consumequeue

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

// Checkpoint is what recovery starts from. It records offsets, not only
// timestamps (RocketMQ #678): Flushed is a commitlog offset below which
// every byte was durable when it was written; Dispatched (≤ Flushed) is the
// offset below which every record's consume-queue entry was durable, and
// Queues holds each queue's entry count at that point.
//
// Neither offset ever falls inside a batch, which recovery relies on to
// start its scan at a record that is not in the middle of one: Flushed is
// a value of the write position (segment.File.Flush syncs up to the written end), and
// Dispatched is where a dispatch round stopped, at the written or durable
// end; the commitlog publishes the write position once, after the whole
// batch is copied, and a batch never crosses a file, so every value either
// takes is a batch boundary (the file starts recovery may begin at are
// boundaries too).
//
// On disk it is one line of JSON followed by a line with its CRC-32C,
// replaced atomically (write temp, fsync, rename, fsync dir), so it is
// either the old or the new one, never torn.
//
// A replication group member's checkpoint also records its raft state
// (design replication.md §3.6, RaftPoint): the applied index and its term,
// the commit end (the commitlog offset past the last applied DATA entry)
// and the log end (past the last durable one), with Dispatched ≤
// CommitEnd. Recovery checks them against the raft log (a raft directory
// that lost applied entries, or holds another log, is refused), and they
// say what the consume queues and the store's applied state reflect.
type Checkpoint struct {
	Version    int              `json:"version"`
	Flushed    int64            `json:"flushed"`
	Dispatched int64            `json:"dispatched"`
	StoreTime  int64            `json:"store_time_ms"`
	Queues     map[string]int64 `json:"queues"`
	RaftPoint
}

// RaftPoint is a group member's raft state as a checkpoint records it
// (all zero standalone).
type RaftPoint struct {
	RaftApplied     uint64 `json:"raft_applied_index,omitempty"`
	RaftAppliedTerm uint64 `json:"raft_applied_term,omitempty"`
	CommitEnd       int64  `json:"commit_end,omitempty"`
	LogEnd          int64  `json:"log_end,omitempty"`
}

// CheckpointName is the checkpoint's file, in the data dir.
const CheckpointName = "checkpoint"

// QueueName is "topic/queueID", the checkpoint's key for a queue.
func QueueName(topic string, queueID int32) string { return topic + "/" + strconv.Itoa(int(queueID)) }

// SplitQueueName parses a QueueName.
func SplitQueueName(s string) (string, int32, bool) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 0 || !record.ValidTopic(s[:i]) {
		return "", 0, false
	}
	return s[:i], int32(n), true
}

// CheckpointError reports a checkpoint file that fails its checks (CRC,
// JSON, offsets). Open refuses to start on it: without the flushed offset
// recovery cannot tell acknowledged records from a torn tail, and
// guessing could cut acknowledged messages. Every record is still in the
// commitlog; `storaged check` reports the file and `storaged repair
// --rebuild-checkpoint` (storage.RebuildCheckpoint) sets it aside and writes a
// new one from a full scan of the commitlog. It wraps base.ErrCorrupt.
type CheckpointError struct {
	File   string // the checkpoint's path
	Reason string
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("storage: corrupt checkpoint file %s: %s", e.File, e.Reason)
}

// Unwrap implements errors.Unwrap.
func (e *CheckpointError) Unwrap() error { return base.ErrCorrupt }

// ReadCheckpoint returns the checkpoint in dir, a zero one if there is
// none, or a *CheckpointError if it fails its CRC or says nonsense.
func ReadCheckpoint(fs vfs.FS, dir string) (Checkpoint, bool, error) {
	b, err := fs.ReadFile(filepath.Join(dir, CheckpointName))
	if errors.Is(err, iofs.ErrNotExist) {
		return Checkpoint{Queues: map[string]int64{}}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("storage: read checkpoint: %w", err)
	}
	bad := func(format string, args ...any) (Checkpoint, bool, error) {
		return Checkpoint{}, false, &CheckpointError{File: filepath.Join(dir, CheckpointName), Reason: fmt.Sprintf(format, args...)}
	}
	body, ok := base.Unseal(b)
	if !ok {
		return bad("it fails its CRC (%d bytes)", len(b))
	}
	var c Checkpoint
	if err := json.Unmarshal(body, &c); err != nil {
		return bad("%v", err)
	}
	if c.Queues == nil {
		c.Queues = map[string]int64{}
	}
	if c.Dispatched > c.Flushed || c.Flushed < 0 || c.Dispatched < 0 {
		return bad("offsets dispatched %d, flushed %d", c.Dispatched, c.Flushed)
	}
	if r := c.RaftPoint; r != (RaftPoint{}) && ((r.RaftApplied == 0) != (r.RaftAppliedTerm == 0) || r.CommitEnd < c.Dispatched || r.LogEnd < 0) {
		return bad("raft applied index %d of term %d, commit end %d, log end %d, dispatched %d (want dispatched ≤ commit end)",
			r.RaftApplied, r.RaftAppliedTerm, r.CommitEnd, r.LogEnd, c.Dispatched)
	}
	return c, true, nil
}

// WriteCheckpoint replaces the checkpoint atomically and durably.
func WriteCheckpoint(fs vfs.FS, dir string, c Checkpoint) error {
	c.Version = 1
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("storage: encode checkpoint: %w", err)
	}
	if err := base.WriteAtomic(fs, dir, CheckpointName, base.Seal(body)); err != nil {
		return fmt.Errorf("storage: checkpoint: %w", err)
	}
	return nil
}
