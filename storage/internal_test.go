package storage

import (
	"hash/crc32"
	"testing"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// Names the store's tests use for the parts' vocabulary.
const (
	cqEntrySize     = consumequeue.EntrySize
	cqBlockEntries  = consumequeue.BlockEntries
	pageSize        = segment.PageSize
	checkpointName  = consumequeue.CheckpointName
	delayOffsetName = "delayOffset.json"
	posMagic        = record.PosMagic
	posBornHost     = record.PosBornHost
	minRecordLen    = record.MinLen
	crcPropLen      = record.CRCPropertyLen
	batchPropLen    = record.BatchPropertyLen
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type checkpoint = consumequeue.Checkpoint

func fileName(from int64) string                     { return segment.FileName(from) }
func parseFileName(name string) (int64, bool)        { return segment.ParseFileName(name) }
func cqDir(root, topic string, queueID int32) string { return consumequeue.Dir(root, topic, queueID) }
func decodeCQ(b []byte) (int64, int32, int64)        { return consumequeue.DecodeEntry(b) }
func tagsCodeBytes(b []byte) int64                   { return record.TagsCodeBytes(b) }

func readCheckpoint(fs vfs.FS, dir string) (checkpoint, bool, error) {
	return consumequeue.ReadCheckpoint(fs, dir)
}

func writeCheckpoint(fs vfs.FS, dir string, c checkpoint) error {
	return consumequeue.WriteCheckpoint(fs, dir, c)
}

// encodeSpec encodes r as the store would at queue offset qo, commitlog
// offset phys and store time ts.
func encodeSpec(t testing.TB, r record.Spec, qo, phys, ts int64) []byte {
	t.Helper()
	r.BodyCRC = record.BodyCRC(r.Body)
	if ferr := r.Size(); ferr != nil {
		t.Fatalf("size: %v", ferr)
	}
	b := make([]byte, r.Total)
	r.Encode(b, qo, phys, ts)
	return b
}
