package storage

import "strconv"

// divert rewrites a delay-level message for the schedule topic (RocketMQ
// HookUtils.handleScheduleMessage): topic SCHEDULE_TOPIC_XXXX, queue =
// level-1 with levels above the table clamped, and REAL_TOPIC/REAL_QID kept
// in the properties so the scheduler can put it back. The DELAY property
// stays (rewritten if clamped). Only for transaction types NOT and COMMIT.
// It copies the properties; the caller's message is not modified.
func divert(r *recordSpec, level, maxLevel int) {
	if level > maxLevel {
		level = maxLevel
	}
	props := make([]Property, 0, len(r.props)+2)
	for _, p := range r.props {
		switch p.Key {
		case PropertyRealTopic, PropertyRealQueueID:
			continue // ours win
		case PropertyDelayLevel:
			p.Value = strconv.Itoa(level)
		}
		props = append(props, p)
	}
	props = append(props,
		Property{Key: PropertyRealTopic, Value: r.topic},
		Property{Key: PropertyRealQueueID, Value: strconv.Itoa(int(r.queueID))})
	r.props = props
	r.topic = ScheduleTopic
	r.queueID = int32(level - 1)
}
