package storage

import "github.com/storaged/storaged/storage/consumequeue"

// prepareRoom is the commitlog allocator's room check: a file is
// preallocated ahead of need only when the data dir's file system keeps
// prepareReserve bytes plus one consume-queue file free after it. On a
// nearly full disk the fallocate would hold all of the free space while it
// runs and then fail; every small write meanwhile fails with ENOSPC, the
// checkpoint retention needs before it may delete among them (a store
// that refuses puts for a full disk could then not free it). When the
// disk cannot be read, the allocator goes ahead as before.
func prepareRoom(o Options) func(size int64) bool {
	reserve := uint64(prepareReserve + int64(o.ConsumeQueueEntries)*consumequeue.EntrySize)
	return func(size int64) bool {
		u, err := o.StatDisk(o.Dir)
		return err != nil || u.Avail >= uint64(size)+reserve
	}
}

// prepareReserve is the room prepareRoom leaves for the store's small
// files (checkpoint, topic table, delay progress) besides a consume-queue
// file.
const prepareReserve = 1 << 20
