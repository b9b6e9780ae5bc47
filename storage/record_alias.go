package storage

import (
	"net/netip"

	"github.com/storaged/storaged/storage/record"
)

// The record vocabulary lives in storage/record (the codec, stdlib only);
// these names keep it reachable as storage.X for callers of the store.
type (
	// Record is a decoded stored message (record.Record).
	Record = record.Record
	// Property is one key/value pair of a message's properties.
	Property = record.Property
	// Message is one message to store.
	Message = record.Message
	// Batch is several messages for one topic and queue.
	Batch = record.Batch
	// BatchMessage is one message of a Batch.
	BatchMessage = record.BatchMessage
	// DecodeError describes why bytes are not a valid record.
	DecodeError = record.DecodeError
)

// Record layout and vocabulary (see storage/record).
const (
	MagicV1             = record.MagicV1
	MagicV2             = record.MagicV2
	MagicBlank          = record.MagicBlank
	BlankLen            = record.BlankLen
	MaxTopicLength      = record.MaxTopicLength
	MaxPropertiesLength = record.MaxPropertiesLength

	PropertyKeys        = record.PropertyKeys
	PropertyTags        = record.PropertyTags
	PropertyWaitStoreOK = record.PropertyWaitStoreOK
	PropertyDelayLevel  = record.PropertyDelayLevel
	PropertyRealTopic   = record.PropertyRealTopic
	PropertyRealQueueID = record.PropertyRealQueueID
	PropertyUniqKey     = record.PropertyUniqKey
	PropertyTranMsg     = record.PropertyTranMsg
	PropertyInnerNum    = record.PropertyInnerNum
	PropertyCRC32       = record.PropertyCRC32
	PropertyBatch       = record.PropertyBatch

	ScheduleTopic = record.ScheduleTopic

	TransactionNotType      = record.TransactionNotType
	TransactionPreparedType = record.TransactionPreparedType
	TransactionCommitType   = record.TransactionCommitType
	TransactionRollbackType = record.TransactionRollbackType

	FlagCompressed  = record.FlagCompressed
	FlagMultiTags   = record.FlagMultiTags
	FlagBornHostV6  = record.FlagBornHostV6
	FlagStoreHostV6 = record.FlagStoreHostV6
	FlagNeedUnwrap  = record.FlagNeedUnwrap
	FlagInnerBatch  = record.FlagInnerBatch
)

// ErrCorrupt marks bytes on disk that fail their checks (magic, length,
// CRC, offset). It is a marker: the wrapping error names file and offset.
var ErrCorrupt = record.ErrCorrupt

// BodyCRC is RocketMQ's body CRC: CRC-32/IEEE masked to 31 bits.
func BodyCRC(b []byte) uint32 { return record.BodyCRC(b) }

// IsBlank reports whether b starts with an end-of-file blank record.
func IsBlank(b []byte) bool { return record.IsBlank(b) }

// DecodeRecord decodes and verifies the stored message at the start of b
// (record.Decode).
func DecodeRecord(b []byte) (*Record, int, error) { return record.Decode(b) }

// DecodeRecordStrict is DecodeRecord requiring the whole-record CRC
// (record.DecodeStrict).
func DecodeRecordStrict(b []byte) (*Record, int, error) { return record.DecodeStrict(b) }

// MsgID builds RocketMQ's offset msgId (record.MsgID).
func MsgID(host netip.AddrPort, offset int64) string { return record.MsgID(host, offset) }

// ParseMsgID decodes an offset msgId into its store host and offset.
func ParseMsgID(id string) (netip.AddrPort, int64, error) { return record.ParseMsgID(id) }

// TagsCode is the consume-queue tags code of a TAGS value (record.TagsCode).
func TagsCode(tags string) int64 { return record.TagsCode(tags) }
