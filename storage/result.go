package storage

import (
	"net/netip"
	"time"
)

// AppendResult is what an append into the commitlog did (RocketMQ
// AppendMessageResult).
type AppendResult struct {
	Status AppendStatus
	// WroteOffset is the commitlog offset of the first record.
	WroteOffset int64
	// WroteBytes is the number of bytes of all records written (for
	// END_OF_FILE: the space the blank filled).
	WroteBytes int32
	// StoreTimestamp is the in-lock store time, Unix milliseconds.
	StoreTimestamp int64
	// Topic and QueueID are where the message went: the schedule topic and
	// level-1 for a delayed message.
	Topic   string
	QueueID int32
	// QueueOffset is the logical offset of the (first) message in its queue.
	QueueOffset int64
	// MsgNum is 1, or the number of messages in a batch.
	MsgNum int32
	// StoreHost is the host in the msgId.
	StoreHost netip.AddrPort
	// Offsets are the commitlog offsets of each message of a batch (nil for
	// a single message).
	Offsets []int64
	// LockedAt is when the append took the commitlog lock and LockHeld how
	// long it held it: the append latency histogram's observation, handed
	// out so that a caller can time the append (the server's trace span)
	// without a clock read of its own. Zero when nothing was appended.
	LockedAt time.Time
	LockHeld time.Duration
}

// MsgID returns the offset msgId of the (first) message.
func (a *AppendResult) MsgID() string { return MsgID(a.StoreHost, a.WroteOffset) }

// MsgIDs returns one offset msgId per message.
func (a *AppendResult) MsgIDs() []string {
	if len(a.Offsets) == 0 {
		return []string{a.MsgID()}
	}
	ids := make([]string, len(a.Offsets))
	for i, off := range a.Offsets {
		ids[i] = MsgID(a.StoreHost, off)
	}
	return ids
}

// NextOffset is the commitlog offset just past the written records: the
// offset a sync must reach for them to be durable.
func (a *AppendResult) NextOffset() int64 { return a.WroteOffset + int64(a.WroteBytes) }

// PutResult is RocketMQ's PutMessageResult: a status and, when something
// was appended, the append result.
type PutResult struct {
	Status PutStatus
	// Append is set (Append.Status == AppendOK) when the message is in the
	// commitlog, whatever Status says about its durability.
	Append AppendResult
	// FlushWaitStart and FlushWait time a sync-mode put's wait for the
	// flush covering it (the flush wait histogram's observation, for the
	// same reason as AppendResult.LockedAt). Zero when the put did not wait
	// for a flush: async mode, WAIT=false, or nothing appended.
	FlushWaitStart time.Time
	FlushWait      time.Duration
}

// Appended reports whether the message is in the commitlog.
func (r *PutResult) Appended() bool { return r.Append.Status == AppendOK }
