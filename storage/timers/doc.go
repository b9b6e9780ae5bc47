// Package timers is timer messages: delivery at an arbitrary time
// (RocketMQ 5's TimerMessageStore; the v2 protocol's delivery_timestamp),
// and recall of a pending one.
//
// # Records
//
// A message with TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS and
// no delay level, due later than now, is stored (Divert) on the system
// topic rmq_sys_wheel_timer, queue 0, with TIMER_OUT_MS = its delivery time
// (Unix ms) and REAL_TOPIC/REAL_QID, as RocketMQ's HookUtils does. The
// dispatcher writes its consume-queue entry with the delivery time as the
// tags code. A recall is a record on the same queue, after the message it
// recalls, with TIMER_DEL_UNIQKEY (the recalled record's commitlog
// offset), REAL_TOPIC and TIMER_OUT_MS; its tags code is
// record.TimerRecallTags. Everything the service knows is in those
// records, so a crash, a restart or a new leader rebuilds it from the log.
//
// # The due index
//
// In memory the service keeps the pending timer messages it has read
// from the queue (ingested, in queue order) in a B-tree ordered by
// (delivery time, commitlog offset), and their queue offsets in a second
// one: O(log n) per message to add, deliver or recall, and each round
// looks only at the head (no scan per tick). It holds at most
// Options.MaxPending entries: the store refuses a timer put beyond that
// (WHEEL_TIMER_FLOW_CONTROL), and if the log holds more (the bound was
// lowered) the rest waits in the queue, ingested as the index drains:
// later, never lost.
//
// # Progress
//
// A restart must not deliver a message twice more than it must, nor lose
// one. The progress is (Low, Ingested, DueMS, Phys): every entry below
// queue offset Low is resolved (delivered, recalled or skipped); and every
// entry below Ingested whose (delivery time, commitlog offset) is below
// (DueMS, Phys) is resolved, because the index held every unresolved
// ingested entry and (DueMS, Phys) was its smallest. A rebuild scans the
// queue from Low, skips what the progress says is resolved and applies
// the recall records it meets, so it holds every message not yet
// resolved: a message delivered after the progress was taken is delivered
// again (at least once), none is lost. Standalone the progress is
// config/timerProgress.json (sealed, replaced atomically), written only
// once the re-puts it covers are durable; in a replication group it is a
// command in the raft log (proposed by the ready leader after the re-puts
// it covers committed), and a replica that becomes the ready leader
// rebuilds its index from the last committed one before it delivers.
//
// The cost of the rebuild is the queue's entries from Low on (20 bytes
// each, read from the consume queue; only recall records are read from
// the commitlog): Low stays at the oldest pending message, so a message
// due in three days keeps every timer entry after it in the scan.
//
// It never delivers early: a message is put back to its real topic only
// once the store's clock reads its delivery time or later (a clock set
// back delays deliveries; it never hastens them).
package timers
