// Package retention deletes expired commitlog files and watches the disk
// (RocketMQ CleanCommitLogService, CleanConsumeQueueService and the disk
// checks of DefaultMessageStore).
//
// It owns its round lock, its goroutine and the disk state (usage, the
// put refusal above the warning watermark). It removes files from the
// front of the commitlog's segment.List, unmaps them under the list's read
// guard and deletes them oldest first, and asks retention.Host how far it
// may go (DeletableEnd), tells it which files are about to go
// (BeforeDelete: a group replica compacts its raft log past them first,
// and keeps them if it cannot) and asks it to trim the consume queues
// after. Exclusive holds rounds off while something else replaces the
// files (a group replica installing a snapshot).
//
// It must never delete the file being written, a file reaching past the
// checkpoint's dispatched offset or the durable end, or one holding a
// delayed message whose delivery is not yet persisted; never delete a file
// younger than FileReservedTime to make room (the warning watermark stops
// writes instead); and never leave a gap in the files (deletion stops at
// the first failure).
package retention
