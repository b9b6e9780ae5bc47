package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/storaged/storaged/storage/vfs"
)

// checkpoint is what recovery starts from. It records offsets, not only
// timestamps (RocketMQ #678): Flushed is a commitlog offset below which
// every byte was durable when it was written; Dispatched (≤ Flushed) is the
// offset below which every record's consume-queue entry was durable, and
// Queues holds each queue's entry count at that point.
//
// Neither offset ever falls inside a batch, which recovery relies on to
// start its scan at a record that is not in the middle of one: Flushed is
// a value of the write position (mappedFile.flush syncs up to wrote), and
// Dispatched is where a dispatch round stopped, at the written or durable
// end; appendRecords publishes the write position once, after the whole
// batch is copied, and a batch never crosses a file, so every value either
// takes is a batch boundary (the file starts recovery may begin at are
// boundaries too).
//
// On disk it is one line of JSON followed by a line with its CRC-32C,
// replaced atomically (write temp, fsync, rename, fsync dir), so it is
// either the old or the new one, never torn.
type checkpoint struct {
	Version    int              `json:"version"`
	Flushed    int64            `json:"flushed"`
	Dispatched int64            `json:"dispatched"`
	StoreTime  int64            `json:"store_time_ms"`
	Queues     map[string]int64 `json:"queues"`
}

const checkpointName = "checkpoint"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func queueName(topic string, queueID int32) string { return topic + "/" + strconv.Itoa(int(queueID)) }

func splitQueueName(s string) (string, int32, bool) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 0 || !validTopic(s[:i]) {
		return "", 0, false
	}
	return s[:i], int32(n), true
}

// CheckpointError reports a checkpoint file that fails its checks (CRC,
// JSON, offsets). Open refuses to start on it: without the flushed offset
// recovery cannot tell acknowledged records from a torn tail, and
// guessing could cut acknowledged messages. Every record is still in the
// commitlog; `storaged check` reports the file and `storaged repair
// --rebuild-checkpoint` (RebuildCheckpoint) sets it aside and writes a
// new one from a full scan of the commitlog. It wraps ErrCorrupt.
type CheckpointError struct {
	File   string // the checkpoint's path
	Reason string
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("storage: corrupt checkpoint file %s: %s", e.File, e.Reason)
}

// Unwrap implements errors.Unwrap.
func (e *CheckpointError) Unwrap() error { return ErrCorrupt }

// readCheckpoint returns the checkpoint in dir, a zero one if there is
// none, or a *CheckpointError if it fails its CRC or says nonsense.
func readCheckpoint(fs vfs.FS, dir string) (checkpoint, bool, error) {
	b, err := fs.ReadFile(filepath.Join(dir, checkpointName))
	if errors.Is(err, iofs.ErrNotExist) {
		return checkpoint{Queues: map[string]int64{}}, false, nil
	}
	if err != nil {
		return checkpoint{}, false, fmt.Errorf("storage: read checkpoint: %w", err)
	}
	bad := func(format string, args ...any) (checkpoint, bool, error) {
		return checkpoint{}, false, &CheckpointError{File: filepath.Join(dir, checkpointName), Reason: fmt.Sprintf(format, args...)}
	}
	body, sum, ok := strings.Cut(strings.TrimSuffix(string(b), "\n"), "\n")
	want, perr := strconv.ParseUint(sum, 10, 32)
	if !ok || perr != nil || crc32.Checksum([]byte(body), castagnoli) != uint32(want) {
		return bad("it fails its CRC (%d bytes)", len(b))
	}
	var c checkpoint
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		return bad("%v", err)
	}
	if c.Queues == nil {
		c.Queues = map[string]int64{}
	}
	if c.Dispatched > c.Flushed || c.Flushed < 0 || c.Dispatched < 0 {
		return bad("offsets dispatched %d, flushed %d", c.Dispatched, c.Flushed)
	}
	return c, true, nil
}

// writeCheckpoint replaces the checkpoint atomically and durably.
func writeCheckpoint(fs vfs.FS, dir string, c checkpoint) error {
	c.Version = 1
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("storage: encode checkpoint: %w", err)
	}
	data := fmt.Sprintf("%s\n%d\n", body, crc32.Checksum(body, castagnoli))
	tmp := filepath.Join(dir, checkpointName+".tmp")
	if err := fs.WriteFile(tmp, []byte(data)); err != nil {
		return fmt.Errorf("storage: write checkpoint: %w", err)
	}
	if err := fs.Rename(tmp, filepath.Join(dir, checkpointName)); err != nil {
		return fmt.Errorf("storage: rename checkpoint: %w", err)
	}
	return syncDir(fs, dir)
}

// The abort marker exists while a store is open: created after recovery,
// removed on a clean close. Present at Open means the last run did not
// close cleanly.
const abortName = "abort"

func createAbort(fs vfs.FS, dir string) error {
	if err := fs.WriteFile(filepath.Join(dir, abortName), fmt.Appendf(nil, "%d\n", os.Getpid())); err != nil {
		return fmt.Errorf("storage: create abort marker: %w", err)
	}
	return syncDir(fs, dir)
}

func removeAbort(fs vfs.FS, dir string) error {
	if err := fs.Remove(filepath.Join(dir, abortName)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("storage: remove abort marker: %w", err)
	}
	return syncDir(fs, dir)
}

func abortExists(fs vfs.FS, dir string) bool {
	_, err := fs.Size(filepath.Join(dir, abortName))
	return err == nil
}
