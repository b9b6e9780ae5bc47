// Package flush makes appended bytes durable. It knows nothing of messages:
// it calls a Syncer, which the storage package's commitlog implements.
//
// Two policies, mirroring RocketMQ's flush services:
//
//   - Async (ASYNC_FLUSH) syncs on a ticker, only when enough pages are
//     dirty, and thoroughly every so often. Puts are acknowledged before
//     their bytes are durable; an OS crash loses at most what was written
//     since the last sync (about Interval under load, ThoroughInterval for a
//     trickle; the storage package's checkpoint also syncs, every second by
//     default, which bounds the trickle's window tighter).
//   - GroupCommit (SYNC_FLUSH) makes each waiter wait until a sync covering
//     its offset has returned. Waiters that arrive while a sync runs are
//     answered together by the next one, so one msync acknowledges many puts.
//     Before a sync it waits, up to one sync's duration, for the group the
//     last sync released to come back (see gather): callers that wait for
//     their ack before their next put otherwise split into two cohorts that
//     each pay two syncs per put.
//
// A failed sync is sticky in both: the error is kept, every current and later
// waiter gets it, no later sync is attempted, and the owner is told through
// OnError. Retrying an fsync after a failure can "succeed" over pages the
// kernel already dropped (fsyncgate), so nothing is ever acknowledged after
// one.
package flush

import "errors"

// Syncer makes appended bytes durable.
type Syncer interface {
	// Sync syncs dirty data and returns the durable offset: every byte
	// below it is on stable storage. With minPages > 0 it may skip files
	// with fewer dirty pages than that; minPages == 0 syncs everything
	// written before the call. Calls are serialised by the caller.
	Sync(minPages int) (durable int64, err error)
}

var (
	// ErrTimeout is returned by GroupCommit.Wait when no sync covered the
	// offset within the timeout. The bytes are appended, not known durable:
	// RocketMQ's FLUSH_DISK_TIMEOUT.
	ErrTimeout = errors.New("flush: timed out waiting for sync")

	// ErrClosed is returned by Wait after Close when the final sync did not
	// cover the offset.
	ErrClosed = errors.New("flush: closed")

	// ErrSyncFailed wraps the cause of a failed sync. It is sticky.
	ErrSyncFailed = errors.New("flush: sync failed")
)
