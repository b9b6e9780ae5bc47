// Package consumequeue is the consume queues and their dispatcher
// (RocketMQ ConsumeQueue and ReputMessageService): for every topic-queue,
// 20-byte entries (commitlog offset, size, tags code) in RocketMQ's files
// and naming, written by one dispatcher that follows the commitlog up to a
// watermark (Options.Watermark: the durable end in sync mode, the written
// end in async mode, the commit index under replication).
//
// It owns the queues (Index, its map and lock), their files (an LRU of
// open descriptors bounded by Options.MaxOpenFiles), the dispatch position
// and round lock, the checkpoint (the file recovery starts from, and the
// syncs that make what it records durable), the long-poll notifier and the
// read-your-writes wait a put uses (AwaitDispatched). It reads the
// commitlog only through the Log interface and learns about deleted
// topics, delay levels and the newest store time through Options funcs.
//
// It must never index past the watermark (so that nothing is readable
// before it is durable, or committed), never sync on the dispatch path
// (the checkpoint does, for everything written since the last one), and
// never hold a pointer to the store.
package consumequeue
