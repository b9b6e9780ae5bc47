package schedule

import (
	"strconv"

	"github.com/storaged/storaged/storage/record"
)

// Divert rewrites a delay-level message for the schedule topic (RocketMQ
// HookUtils.handleScheduleMessage): topic SCHEDULE_TOPIC_XXXX, queue =
// level-1 with levels above the table clamped, and REAL_TOPIC/REAL_QID kept
// in the properties so the scheduler can put it back. The DELAY property
// stays (rewritten if clamped). Only for transaction types NOT and COMMIT.
// It copies the properties; the caller's message is not modified.
func Divert(r *record.Spec, level, maxLevel int) {
	if level > maxLevel {
		level = maxLevel
	}
	props := make([]record.Property, 0, len(r.Props)+2)
	for _, p := range r.Props {
		switch p.Key {
		case record.PropertyRealTopic, record.PropertyRealQueueID:
			continue // ours win
		case record.PropertyDelayLevel:
			p.Value = strconv.Itoa(level)
		}
		props = append(props, p)
	}
	props = append(props,
		record.Property{Key: record.PropertyRealTopic, Value: r.Topic},
		record.Property{Key: record.PropertyRealQueueID, Value: strconv.Itoa(int(r.QueueID))})
	r.Props = props
	r.Topic = record.ScheduleTopic
	r.QueueID = int32(level - 1)
}
