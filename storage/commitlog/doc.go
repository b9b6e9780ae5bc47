// Package commitlog is the commitlog: placement of record bytes at the end
// of a run of mapped files (storage/segment), under the append lock.
//
// It owns the append lock and the file appends go to. Append takes a size
// and two callbacks: admit, run first under the lock with the store time
// (the caller's sequencing: queue offsets and store time are stamped
// there, in log order), and encode, which writes exactly the bytes asked
// for at the offset the log chose, after the log has rolled to a new file
// behind an END_OF_FILE blank when they did not fit. The bytes are
// published once, after encode: no reader, flush or checkpoint sees part
// of an append, so a batch is all or nothing to them. The log also serves
// reads (At, under the segment read guard), syncs (Sync: flush.Syncer),
// recovery (Recover: the scan that tells a torn tail from damage below the
// flushed offset), the offline repair cut (Cut, IsBoundary) and
// TruncateAfter, which a replica uses to drop an uncommitted suffix.
//
// It must never decide what a record says (topics, queue offsets, delay
// levels: its callers' business), never sync on the append path (the flush
// policy does), and never hold a pointer to the store.
package commitlog
