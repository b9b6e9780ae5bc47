// Package schedule is delayed delivery (RocketMQ ScheduleMessageService):
// it follows each delay level's queue of SCHEDULE_TOPIC_XXXX and, once a
// message's delivery time has come on the store's clock, puts it again to
// its real topic through schedule.Host.Redeliver, then persists its
// progress (config/delayOffset.json) once the re-puts are durable. It also
// owns the delay table's parsing and Divert, the rewrite of a delayed
// message for the schedule topic.
//
// It owns its progress, its lock and its goroutine. It must never deliver
// early (the due time is never before the delay has passed on the clock,
// whatever the store time says after a clock set back), never lose a
// message (progress is persisted only after the re-puts it covers are
// durable: at least once), never size memory by a queue id read from disk
// (only the delay table's levels are served), and never deliver while the
// host says it is not Delivering (a slave or a follower).
//
// In a replicated group the progress that counts is the group's: when the
// host's Epoch changes (a new leadership of this replica) the scheduler
// resumes from Host.Replicated before it delivers, and after each round
// that delivered it hands its progress to Host.ProposeProgress for that
// epoch (a command in the raft log, after the re-puts it covers). Its own
// file is then a cache. Standalone the epoch stays 0 and none of this runs.
package schedule
