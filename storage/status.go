package storage

// PutStatus is RocketMQ's PutMessageStatus: the outcome of a put as the
// store reports it. PutOK and the degraded statuses (FlushDiskTimeout,
// FlushSlaveTimeout, SlaveNotAvailable) mean the message is in the log; every
// other status means nothing was appended.
type PutStatus uint8

// The statuses, in RocketMQ's order (store/PutMessageStatus.java).
const (
	PutOK PutStatus = iota + 1
	FlushDiskTimeout
	FlushSlaveTimeout
	SlaveNotAvailable
	ServiceNotAvailable
	CreateMappedFileFailed
	MessageIllegal
	PropertiesSizeExceeded
	OSPageCacheBusy
	UnknownError
	InSyncReplicasNotEnough
	PutToRemoteBrokerFail
	LMQConsumeQueueNumExceeded
	WheelTimerFlowControl
	WheelTimerMsgIllegal
	WheelTimerNotEnable

	numStatuses = int(WheelTimerNotEnable) + 1
)

var statusNames = [...]string{
	0:                          "UNSPECIFIED",
	PutOK:                      "PUT_OK",
	FlushDiskTimeout:           "FLUSH_DISK_TIMEOUT",
	FlushSlaveTimeout:          "FLUSH_SLAVE_TIMEOUT",
	SlaveNotAvailable:          "SLAVE_NOT_AVAILABLE",
	ServiceNotAvailable:        "SERVICE_NOT_AVAILABLE",
	CreateMappedFileFailed:     "CREATE_MAPPED_FILE_FAILED",
	MessageIllegal:             "MESSAGE_ILLEGAL",
	PropertiesSizeExceeded:     "PROPERTIES_SIZE_EXCEEDED",
	OSPageCacheBusy:            "OS_PAGE_CACHE_BUSY",
	UnknownError:               "UNKNOWN_ERROR",
	InSyncReplicasNotEnough:    "IN_SYNC_REPLICAS_NOT_ENOUGH",
	PutToRemoteBrokerFail:      "PUT_TO_REMOTE_BROKER_FAIL",
	LMQConsumeQueueNumExceeded: "LMQ_CONSUME_QUEUE_NUM_EXCEEDED",
	WheelTimerFlowControl:      "WHEEL_TIMER_FLOW_CONTROL",
	WheelTimerMsgIllegal:       "WHEEL_TIMER_MSG_ILLEGAL",
	WheelTimerNotEnable:        "WHEEL_TIMER_NOT_ENABLE",
}

// String returns the RocketMQ name of the status, e.g. "PUT_OK".
func (s PutStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "UNSPECIFIED"
}

// Stored reports whether a put with this status left the message in the log
// (PutMessageResult.isOk in RocketMQ: durability may still be degraded).
func (s PutStatus) Stored() bool {
	switch s {
	case PutOK, FlushDiskTimeout, FlushSlaveTimeout, SlaveNotAvailable:
		return true
	}
	return false
}

// AppendStatus is RocketMQ's AppendMessageStatus: what one append into a
// mapped file did.
type AppendStatus uint8

// The append statuses.
const (
	AppendOK AppendStatus = iota + 1
	AppendEndOfFile
	AppendMessageSizeExceeded
	AppendPropertiesSizeExceeded
	AppendUnknownError
)

// String returns the RocketMQ name of the append status.
func (s AppendStatus) String() string {
	switch s {
	case AppendOK:
		return "PUT_OK"
	case AppendEndOfFile:
		return "END_OF_FILE"
	case AppendMessageSizeExceeded:
		return "MESSAGE_SIZE_EXCEEDED"
	case AppendPropertiesSizeExceeded:
		return "PROPERTIES_SIZE_EXCEEDED"
	case AppendUnknownError:
		return "UNKNOWN_ERROR"
	}
	return "UNSPECIFIED"
}
