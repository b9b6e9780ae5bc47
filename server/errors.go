package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/storaged/storaged/storage"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error this service
// returns. The ErrorInfo reason is the RocketMQ PutMessageStatus name.
const ErrorDomain = "storaged"

// ErrStarting is returned by a DeferredStore before its store is set: the
// store is still opening (recovering its commitlog).
var ErrStarting = errors.New("server: store is starting")

// ErrDraining refuses a message that arrives on a PutMessageStream after
// the server started shutting down (Service.Drain). Nothing is stored.
var ErrDraining = errors.New("server: shutting down")

// ErrStreamEnding refuses a message that arrives on a PutMessageStream
// after its soft end (streamlife.go): the connection is about to reach its
// age limit, and the stream ends before the connection is cut. Nothing is
// stored; the client sends it again on a new stream.
var ErrStreamEnding = errors.New("server: stream ending before the connection age limit")

// ErrorInfo reasons of read errors (puts use the RocketMQ status name).
const (
	ReasonOffsetOutOfRange = "OFFSET_OUT_OF_RANGE"
	ReasonQueueNotFound    = "QUEUE_NOT_FOUND"
	ReasonNoRecord         = "NO_RECORD_AT_OFFSET"
	ReasonDataCorrupted    = "DATA_CORRUPTED"
	ReasonInvalidRequest   = "INVALID_REQUEST"
	// ReasonUnavailable is also the put status name for the same condition.
	ReasonUnavailable = "SERVICE_NOT_AVAILABLE"
	ReasonCancelled   = "CANCELLED"
	ReasonDeadline    = "DEADLINE_EXCEEDED"
	ReasonInternal    = "INTERNAL"
	// ReasonSystemBusy: the in-flight read bytes limit is reached
	// (ErrReadBusy); RocketMQ's broker answers SYSTEM_BUSY when it sheds
	// load, and its clients back off and retry.
	ReasonSystemBusy = "SYSTEM_BUSY"
)

// ErrorInfo reasons of the topic configuration (puts and AdminService).
const (
	// ReasonTopicNotExist is RocketMQ's ResponseCode.TOPIC_NOT_EXIST: a
	// put to an unknown topic with auto-creation off, or an admin call on
	// an unknown topic (NOT_FOUND).
	ReasonTopicNotExist = "TOPIC_NOT_EXIST"
	// ReasonTopicExist: CreateTopic on an existing topic (ALREADY_EXISTS).
	ReasonTopicExist = "TOPIC_EXIST"
	// ReasonGroupNotExist: GetConsumerGroup of a group that never committed
	// an offset nor received by POP (RocketMQ
	// ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST).
	ReasonGroupNotExist = "SUBSCRIPTION_GROUP_NOT_EXIST"
	// ReasonQueueCountLowered: UpdateTopic with fewer queues
	// (FAILED_PRECONDITION).
	ReasonQueueCountLowered = "QUEUE_COUNT_LOWERED"
	// ReasonTooManyTopics: the topic limit (--max-topics) is reached
	// (RESOURCE_EXHAUSTED, metadata cause TOO_MANY_TOPICS). It is the name
	// of RocketMQ's put status for a put that would create a queue beyond
	// the broker's limit (LMQ_CONSUME_QUEUE_NUM_EXCEEDED), so a put keeps
	// the rule "reason = the RocketMQ put status" and an admin call gets the
	// same reason for the same condition. Not retried by default: it clears
	// only once topics are deleted or the limit is raised.
	ReasonTooManyTopics = "LMQ_CONSUME_QUEUE_NUM_EXCEEDED"
)

// Retry delays suggested in RetryInfo when nothing was appended and the
// same server may take the put soon.
const (
	retryDelayBusy        = 200 * time.Millisecond // OS_PAGE_CACHE_BUSY
	retryDelayUnavailable = time.Second            // starting, closing, slave, not writable
	// retryDelayDiskFull: above the disk warning watermark. Writes resume
	// once retention (forced above the clean watermark, every disk check)
	// or the operator has freed space; retrying faster only adds load.
	retryDelayDiskFull = 5 * time.Second
	// retryDelayReadBusy: the in-flight read answers are being sent; a
	// 16 MiB answer takes tens of milliseconds on a fast link.
	retryDelayReadBusy = 100 * time.Millisecond
	// retryDelayStreamEnding: the server is fine, only this stream ends;
	// a new stream takes the message at once.
	retryDelayStreamEnding = time.Millisecond
)

// method names the RPC an error belongs to; request field paths depend on it.
type method string

const (
	methodPutMessage       method = "PutMessage"
	methodPutMessages      method = "PutMessages"
	methodPutMessageStream method = "PutMessageStream"
	methodGetMessage       method = "GetMessage"
	methodPullMessages     method = "PullMessages"
	methodGetQueueInfo     method = "GetQueueInfo"
)

// putError is the one mapping from a failed put (storage.PutResult + error,
// see storage.Store.PutMessage) to a gRPC status. Every status carries an
// ErrorInfo{Reason: res.Status.String(), Domain: ErrorDomain}.
//
// Appended (res.Appended()), durability unknown:
//
//	ctx cancelled / deadline passed while waiting for the flush → CANCELLED / DEADLINE_EXCEEDED
//	anything else (sync failed, store closed meanwhile)        → INTERNAL
//
// The message says the message may have been stored; ErrorInfo metadata
// holds stored=unknown and where it was appended: msg_id, wrote_offset,
// wrote_bytes, queue_id, queue_offset, message_count, store_timestamp_ms
// (milliseconds since the epoch). In group mode a put proposed
// and not committed within the replication timeout
// (storage.ErrReplicationTimeout, FLUSH_SLAVE_TIMEOUT) is DEADLINE_EXCEEDED
// with metadata outcome=unknown.
//
// Nothing appended:
//
//	*fieldError, *storage.ValidationError → INVALID_ARGUMENT + BadRequest
//	ErrStarting, ErrDraining, ErrClosed, ErrSlave, ErrNotWritable → UNAVAILABLE + RetryInfo
//	ErrStreamEnding                       → UNAVAILABLE + RetryInfo, cause STREAM_ENDING
//	storage.ErrBusy (OS_PAGE_CACHE_BUSY)  → UNAVAILABLE + RetryInfo
//	*storage.NotLeaderError (group mode)  → UNAVAILABLE + RetryInfo, metadata cause, leader_id, leader_addr,
//	                                        term (notLeaderStatus)
//	storage.ErrInSyncReplicasNotEnough    → UNAVAILABLE + RetryInfo (IN_SYNC_REPLICAS_NOT_ENOUGH)
//	storage.ErrWriteFailed (read-only)    → UNAVAILABLE, no RetryInfo: retry on another replica
//	storage.ErrWriteRetrying              → UNAVAILABLE + RetryInfo, cause WRITE_RETRYING: a background
//	                                        write is failing and retried; RESOURCE_EXHAUSTED + RetryInfo,
//	                                        cause DISK_FULL, when it failed for lack of space
//	storage.ErrNotWritable + ErrDiskFull  → RESOURCE_EXHAUSTED + RetryInfo, cause DISK_FULL: above the
//	                                        disk warning watermark; clears once space is freed
//	storage.ErrDiskFull (ENOSPC at create) → RESOURCE_EXHAUSTED, cause DISK_FULL
//	storage.ErrTopicNotFound (auto-creation off) → NOT_FOUND, reason TOPIC_NOT_EXIST
//	storage.ErrTooManyTopics              → RESOURCE_EXHAUSTED, cause TOO_MANY_TOPICS
//	storage.ErrTopicConfig (the auto-created topic not persisted) → UNAVAILABLE + RetryInfo,
//	                                        cause TOPIC_CONFIG_NOT_PERSISTED
//	storage.ErrCorrupt                    → DATA_LOSS (logged)
//	ctx ended before the append           → CANCELLED / DEADLINE_EXCEEDED
//	storage.ErrCreateFile                 → UNAVAILABLE + RetryInfo (logged; the next put tries the roll again)
//	anything else                         → INTERNAL (logged; the client message has no paths)
func (s *Service) putError(ctx context.Context, m method, res storage.PutResult, err error) error {
	reason := res.Status
	if reason == 0 {
		reason = storage.UnknownError
	}
	info := &errdetails.ErrorInfo{Reason: reason.String(), Domain: ErrorDomain}
	log := s.log.With().Str("grpc.method", string(m)).Str("put_status", reason.String()).Logger()

	if res.Appended() {
		return s.appendedError(ctx, log, res, err, info)
	}

	var fe *fieldError
	var verr *storage.ValidationError
	var nl *storage.NotLeaderError
	switch {
	case errors.As(err, &nl): // group mode: not the ready leader, or superseded; nothing stored
		return s.notLeaderStatus(info, nl.Cause, nl.LeaderID, nl.Term, "put")
	case errors.Is(err, storage.ErrInSyncReplicasNotEnough):
		return unavailable(info, retryDelayUnavailable, "the group's leader has too few recently active followers to commit; "+
			"nothing was stored; retry shortly")
	case errors.As(err, &fe):
		return invalidArgument(info, fe.Field, fe.Reason)
	case errors.As(err, &verr):
		return invalidArgument(info, requestField(m, verr.Field), verr.Reason)
	case errors.Is(err, ErrStarting):
		return unavailable(info, retryDelayUnavailable, "the store is starting (recovering its commitlog); nothing was stored; retry shortly")
	case errors.Is(err, ErrDraining):
		return unavailable(info, retryDelayUnavailable, "the server is shutting down; nothing was stored; reconnect and retry")
	case errors.Is(err, ErrStreamEnding):
		info.Metadata = map[string]string{"cause": "STREAM_ENDING"}
		return unavailable(info, retryDelayStreamEnding, "this stream is ending before its connection reaches its age limit; "+
			"nothing was stored; send it on a new stream")
	case errors.Is(err, context.Canceled):
		return newStatus(codes.Canceled, "the call was cancelled before the append; nothing was stored", info)
	case errors.Is(err, context.DeadlineExceeded):
		return newStatus(codes.DeadlineExceeded, "the deadline passed before the append; nothing was stored", info)
	case errors.Is(err, storage.ErrTopicNotFound):
		info.Reason = ReasonTopicNotExist
		return newStatus(codes.NotFound, "the topic does not exist (topic auto-creation is off, or the topic was just deleted); "+
			"nothing was stored; create it through the admin service", info)
	case errors.Is(err, storage.ErrTooManyTopics):
		info.Metadata = map[string]string{"cause": "TOO_MANY_TOPICS"}
		return newStatus(codes.ResourceExhausted, "the put would create a topic, and the store holds the most topics it may (--max-topics); "+
			"nothing was stored", info)
	case errors.Is(err, storage.ErrTopicConfig):
		info.Metadata = map[string]string{"cause": "TOPIC_CONFIG_NOT_PERSISTED"}
		return unavailable(info, retryDelayUnavailable, "the store could not persist the topic this put creates "+
			"(disk full or out of file descriptors); nothing was stored; retry")
	case errors.Is(err, storage.ErrWriteRetrying):
		// A background write (checkpoint, consume queue, delay progress)
		// is failing and being retried: not sticky, the store logs it
		// (throttled) and the health watcher turns NOT_SERVING.
		if errors.Is(err, storage.ErrDiskFull) {
			info.Metadata = map[string]string{"cause": "DISK_FULL"}
			return newStatus(codes.ResourceExhausted, "the store's disk is full: a background write failed with no space left and is being retried; "+
				"nothing was stored; writes resume by themselves once space is freed", info,
				&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayDiskFull)})
		}
		info.Metadata = map[string]string{"cause": "WRITE_RETRYING"}
		return unavailable(info, retryDelayUnavailable, "a background write of the store failed and is being retried; "+
			"nothing was stored; writes resume by themselves once it succeeds")
	case errors.Is(err, storage.ErrDiskFull) && errors.Is(err, storage.ErrNotWritable):
		// The disk watermark: the store and the health watcher log the
		// transition once (the call log still has each refused call).
		info.Metadata = map[string]string{"cause": "DISK_FULL"}
		return newStatus(codes.ResourceExhausted, "the store's disk is above its warning watermark and takes no writes; "+
			"nothing was stored; writes resume once space is freed", info,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayDiskFull)})
	case errors.Is(err, storage.ErrDiskFull):
		s.logLimit.Event("put refused: disk full", log.Error()).Err(err).Msg("put refused: disk full")
		info.Metadata = map[string]string{"cause": "DISK_FULL"}
		return newStatus(codes.ResourceExhausted, "no space left on the store's disk; nothing was stored", info)
	case errors.Is(err, storage.ErrTimerFull):
		return newStatus(codes.ResourceExhausted, "the store holds its maximum of pending timer messages (--max-timer-messages); "+
			"nothing was stored; retry once some are delivered", info,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayBusy)})
	case errors.Is(err, storage.ErrTransactionsFull):
		return newStatus(codes.ResourceExhausted, "the store holds its maximum of pending transactional half messages "+
			"(--max-pending-transactions); nothing was stored; retry once some are ended", info,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayBusy)})
	case errors.Is(err, storage.ErrBusy):
		return unavailable(info, retryDelayBusy, "the store is busy (OS page cache busy); nothing was stored; retry later")
	case errors.Is(err, storage.ErrWriteFailed):
		info.Metadata = map[string]string{"cause": "READ_ONLY"}
		return newStatus(codes.Unavailable, "the store is read-only after a failed disk write or sync and takes no writes until it is restarted; "+
			"nothing was stored; retry on another replica", info)
	case errors.Is(err, storage.ErrClosed):
		return unavailable(info, retryDelayUnavailable, "the store is shutting down; nothing was stored")
	case errors.Is(err, storage.ErrSlave):
		return unavailable(info, retryDelayUnavailable, "this store is a slave and takes no writes; nothing was stored; send writes to the master")
	case errors.Is(err, storage.ErrNotWritable):
		return unavailable(info, retryDelayUnavailable, "the store is not accepting writes right now; nothing was stored")
	case errors.Is(err, storage.ErrCorrupt):
		s.logLimit.Event("put refused: corrupt", log.Error()).Err(err).Msg("put refused: corrupt data in the store")
		return newStatus(codes.DataLoss, "the store found corrupt data; nothing was stored", info)
	case errors.Is(err, storage.ErrCreateFile):
		// Nothing was appended and the next put tries the roll again: a
		// passing cause (EMFILE, ENOMEM for the mapping) clears by itself.
		s.logLimit.Event("put refused: create file", log.Error()).Err(err).Msg("put refused: cannot create the next commitlog file")
		return unavailable(info, retryDelayUnavailable, "the store could not create its next commitlog file; nothing was stored; retry later")
	}
	if reason == storage.OSPageCacheBusy { // group mode: raft dropped the proposal
		return unavailable(info, retryDelayBusy, "the store is busy (the proposal was dropped); nothing was stored; retry later")
	}
	s.logLimit.Event("put failed: unexpected", log.Error()).Err(err).Msg("put failed with an unexpected error")
	return newStatus(codes.Internal, "internal error; nothing was stored", info)
}

// appendedError reports a put that is in the commitlog but whose durability
// is unknown. It must never claim the message was lost, nor that it is safe.
func (s *Service) appendedError(ctx context.Context, log zerolog.Logger, res storage.PutResult, err error, info *errdetails.ErrorInfo) error {
	a := &res.Append
	info.Metadata = map[string]string{
		"stored":        "unknown",
		"msg_id":        a.MsgID(),
		"wrote_offset":  strconv.FormatInt(a.WroteOffset, 10),
		"wrote_bytes":   strconv.FormatInt(int64(a.WroteBytes), 10),
		"queue_id":      strconv.FormatInt(int64(a.QueueID), 10),
		"queue_offset":  strconv.FormatInt(a.QueueOffset, 10),
		"message_count": strconv.FormatInt(int64(a.MsgNum), 10),
		// The rest of the AppendResult a stream answer carries: a
		// follower that forwarded a stream message rebuilds it from
		// these (appendResultOf).
		"store_timestamp_ms": strconv.FormatInt(a.StoreTimestamp, 10),
	}
	code, why := codes.Internal, "an unexpected error occurred while waiting for the disk flush"
	switch {
	case errors.Is(err, storage.ErrReplicationTimeout):
		// FLUSH_SLAVE_TIMEOUT as an error (design §1): the entry may
		// still commit, or be truncated by the next leader.
		info.Metadata["outcome"] = "unknown"
		code, why = codes.DeadlineExceeded, "it was not committed by a majority of the group within --replication-timeout"
	case errors.Is(err, context.Canceled):
		code, why = codes.Canceled, "the call was cancelled while waiting for the disk flush"
	case errors.Is(err, context.DeadlineExceeded):
		code, why = codes.DeadlineExceeded, "the deadline passed while waiting for the disk flush"
	case errors.Is(err, storage.ErrWriteFailed):
		why = "the disk flush failed and the store is now read-only"
	case errors.Is(err, storage.ErrClosed):
		why = "the store closed before a flush covered the message"
	}
	ev := log.Warn()
	if code == codes.Internal {
		ev = log.Error()
	}
	ev.Err(err).Str("msg_id", a.MsgID()).Int64("wrote_offset", a.WroteOffset).Msg("put appended, durability unknown")
	msg := fmt.Sprintf("the message was appended at commitlog offset %d (msgId %s) but its durability is unknown: %s; "+
		"it may have been stored, so a retry may store it twice", a.WroteOffset, a.MsgID(), why)
	return newStatus(code, msg, info)
}

// readError is the one mapping from a failed read (GetMessage,
// PullMessages, GetQueueInfo) to a gRPC status. Every status carries an
// ErrorInfo{Reason: one of the Reason* constants, Domain: ErrorDomain}:
//
//	*storage.RangeError (ErrOutOfRange)   → OUT_OF_RANGE, metadata offset, min_offset, max_offset
//	storage.ErrQueueNotFound              → NOT_FOUND
//	storage.ErrNoRecord                   → NOT_FOUND (NO_RECORD_AT_OFFSET)
//	storage.ErrIllegal (malformed msgId)  → INVALID_ARGUMENT + BadRequest on msg_id
//	storage.ErrCorrupt                    → DATA_LOSS (logged; no bytes are returned)
//	ErrStarting, storage.ErrClosed        → UNAVAILABLE + RetryInfo
//	ErrReadBusy (in-flight read limit)    → RESOURCE_EXHAUSTED (SYSTEM_BUSY, cause PULL_INFLIGHT_BYTES) + RetryInfo
//	ctx ended                             → CANCELLED / DEADLINE_EXCEEDED
//	anything else                         → INTERNAL (logged; no paths in the message)
//
// A linearizable read (storage.Store.ReadBarrier) also refuses, nothing read:
//
//	*storage.NotLeaderError               → UNAVAILABLE + RetryInfo, as a refused put (notLeaderStatus)
//	storage.ErrReadIndexTimeout           → UNAVAILABLE (SERVICE_NOT_AVAILABLE, cause READ_INDEX_TIMEOUT) + RetryInfo
//	storage.ErrReadIndexBusy              → RESOURCE_EXHAUSTED (SYSTEM_BUSY, cause READ_INDEX_WAITERS) + RetryInfo
//	storage.ErrWriteFailed                → UNAVAILABLE (cause READ_ONLY), no RetryInfo: ask another replica
func (s *Service) readError(m method, err error) error {
	var re *storage.RangeError
	var nl *storage.NotLeaderError
	switch {
	case errors.As(err, &nl):
		return s.notLeaderStatus(&errdetails.ErrorInfo{Domain: ErrorDomain}, nl.Cause, nl.LeaderID, nl.Term, "read")
	case errors.Is(err, storage.ErrReadIndexTimeout):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": "READ_INDEX_TIMEOUT"}}, retryDelayUnavailable,
			"this leader could not confirm with a quorum of its group that it still leads, within the replication timeout; "+
				"nothing was read; retry (a new leader may be elected meanwhile)")
	case errors.Is(err, storage.ErrReadIndexBusy):
		return newStatus(codes.ResourceExhausted, "too many linearizable reads are waiting for the leader's quorum check; "+
			"nothing was read; retry after the delay", &errdetails.ErrorInfo{Reason: ReasonSystemBusy, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": "READ_INDEX_WAITERS"}},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayReadBusy)})
	case errors.Is(err, storage.ErrWriteFailed):
		return newStatus(codes.Unavailable, "this replica stopped after a failed disk write and serves no linearizable read; "+
			"nothing was read; ask another replica", &errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": "READ_ONLY"}})
	case errors.As(err, &re):
		info := &errdetails.ErrorInfo{Reason: ReasonOffsetOutOfRange, Domain: ErrorDomain, Metadata: map[string]string{
			"offset":     strconv.FormatInt(re.Offset, 10),
			"min_offset": strconv.FormatInt(re.Min, 10),
			"max_offset": strconv.FormatInt(re.Max, 10),
		}}
		msg := fmt.Sprintf("%s %d is out of range: readable offsets are [%d, %d)", re.What, re.Offset, re.Min, re.Max)
		if re.What == "queue offset" {
			msg = fmt.Sprintf("queue offset %d is out of range: the queue holds offsets [%d, %d); pull from %d to %d",
				re.Offset, re.Min, re.Max, re.Min, re.Max)
		}
		return newStatus(codes.OutOfRange, msg, info)
	case errors.Is(err, storage.ErrQueueNotFound):
		return newStatus(codes.NotFound, "no message was ever stored in this topic and queue",
			&errdetails.ErrorInfo{Reason: ReasonQueueNotFound, Domain: ErrorDomain})
	case errors.Is(err, storage.ErrNoRecord):
		return newStatus(codes.NotFound, "no message starts at this commitlog offset (use an offset or msgId a put returned)",
			&errdetails.ErrorInfo{Reason: ReasonNoRecord, Domain: ErrorDomain})
	case errors.Is(err, storage.ErrIllegal):
		return badRead("msg_id", "not an offset msgId: want 32 (IPv4 store host) or 56 (IPv6) hex characters")
	case errors.Is(err, ErrReadBusy):
		info := &errdetails.ErrorInfo{Reason: ReasonSystemBusy, Domain: ErrorDomain,
			Metadata: map[string]string{"cause": "PULL_INFLIGHT_BYTES"}}
		var be *busyError
		if errors.As(err, &be) {
			info.Metadata["reserved_bytes"] = strconv.FormatInt(be.want, 10)
			info.Metadata["limit_bytes"] = strconv.FormatInt(be.limit, 10)
		}
		return newStatus(codes.ResourceExhausted, "the server is sending as many read answers as its in-flight read limit allows; "+
			"nothing was read; retry after the delay, or ask for a smaller max_bytes", info,
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelayReadBusy)})
	case errors.Is(err, ErrStarting):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain}, retryDelayUnavailable,
			"the store is starting (recovering its commitlog); retry shortly")
	case errors.Is(err, storage.ErrClosed):
		return unavailable(&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: ErrorDomain}, retryDelayUnavailable,
			"the store is shutting down")
	case errors.Is(err, context.Canceled):
		return newStatus(codes.Canceled, "the call was cancelled", &errdetails.ErrorInfo{Reason: ReasonCancelled, Domain: ErrorDomain})
	case errors.Is(err, context.DeadlineExceeded):
		return newStatus(codes.DeadlineExceeded, "the deadline passed", &errdetails.ErrorInfo{Reason: ReasonDeadline, Domain: ErrorDomain})
	case errors.Is(err, storage.ErrCorrupt):
		s.logLimit.Event("read refused: corrupt "+string(m), s.log.Error()).Err(err).Str("grpc.method", string(m)).Msg("read refused: stored data failed its checks")
		return newStatus(codes.DataLoss, "the stored data failed its integrity checks (CRC, size or offset); "+
			"no bytes were returned; the server log names the offset", &errdetails.ErrorInfo{Reason: ReasonDataCorrupted, Domain: ErrorDomain})
	}
	s.logLimit.Event("read failed: unexpected "+string(m), s.log.Error()).Err(err).Str("grpc.method", string(m)).Msg("read failed with an unexpected error")
	return newStatus(codes.Internal, "internal error", &errdetails.ErrorInfo{Reason: ReasonInternal, Domain: ErrorDomain})
}

// adminError is the one mapping from a failed AdminService call to a gRPC
// status; see proto/storaged/v1/admin.proto for the table:
//
//	*storage.ValidationError              → INVALID_ARGUMENT + BadRequest, reason INVALID_REQUEST
//	storage.ErrTopicNotFound              → NOT_FOUND, TOPIC_NOT_EXIST
//	storage.ErrTopicExists                → ALREADY_EXISTS, TOPIC_EXIST
//	storage.ErrQueuesLowered              → FAILED_PRECONDITION, QUEUE_COUNT_LOWERED
//	storage.ErrTooManyTopics              → RESOURCE_EXHAUSTED, LMQ_CONSUME_QUEUE_NUM_EXCEEDED, cause TOO_MANY_TOPICS
//	storage.ErrTopicConfig                → UNAVAILABLE + RetryInfo, cause TOPIC_CONFIG_NOT_PERSISTED
//	ErrStarting, storage.ErrClosed, ErrSlave → UNAVAILABLE + RetryInfo
//	*storage.NotLeaderError (a group)     → UNAVAILABLE + RetryInfo, SERVICE_NOT_AVAILABLE, metadata cause,
//	                                        leader_id, term: nothing changed; send it to the leader
//	storage.ErrTopicChangeTimeout (a group) → DEADLINE_EXCEEDED, metadata outcome unknown: retry
//	anything else                         → INTERNAL (logged)
func (a *AdminService) adminError(m string, err error) error {
	var verr *storage.ValidationError
	var nl *storage.NotLeaderError
	info := func(reason string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	}
	switch {
	case errors.As(err, &verr):
		field := verr.Field
		switch field {
		case "topic":
			field = "name"
		case "queues":
			field = "queue_count"
		}
		return badAdmin(field, verr.Reason)
	case errors.Is(err, storage.ErrTopicNotFound):
		return newStatus(codes.NotFound, "topic does not exist", info(ReasonTopicNotExist))
	case errors.Is(err, storage.ErrConsumerGroupNotFound):
		return newStatus(codes.NotFound, "no such consumer group: it has committed no offset", info(ReasonGroupNotExist))
	case errors.Is(err, storage.ErrTopicExists):
		return newStatus(codes.AlreadyExists, "topic already exists (UpdateTopic raises its queue count)", info(ReasonTopicExist))
	case errors.Is(err, storage.ErrQueuesLowered):
		return newStatus(codes.FailedPrecondition, "a topic's queue count can only be raised: "+
			"removing queues would orphan their messages and consumer offsets", info(ReasonQueueCountLowered))
	case errors.Is(err, storage.ErrTooManyTopics):
		i := info(ReasonTooManyTopics)
		i.Metadata = map[string]string{"cause": "TOO_MANY_TOPICS"}
		return newStatus(codes.ResourceExhausted, "the store holds the most topics it may (--max-topics); delete topics first", i)
	case errors.As(err, &nl):
		i := info(ReasonUnavailable)
		i.Metadata = map[string]string{"cause": nl.Cause, "leader_id": strconv.FormatUint(nl.LeaderID, 10),
			"term": strconv.FormatUint(nl.Term, 10)}
		return unavailable(i, retryDelayUnavailable, fmt.Sprintf("this member is not the group's ready leader (%s; leader %d): "+
			"nothing changed; send the call to the leader", nl.Cause, nl.LeaderID))
	case errors.Is(err, storage.ErrTopicChangeTimeout):
		i := info(ReasonUnavailable)
		i.Metadata = map[string]string{"outcome": "unknown"}
		return newStatus(codes.DeadlineExceeded, "the change was proposed to the group but not seen applied within "+
			"--replication-timeout; it may still apply; retry (creates and raises are idempotent)", i)
	case errors.Is(err, storage.ErrTopicConfig):
		i := info(ReasonUnavailable)
		i.Metadata = map[string]string{"cause": "TOPIC_CONFIG_NOT_PERSISTED"}
		return unavailable(i, retryDelayUnavailable, "the topic config could not be persisted (disk full or out of file descriptors); nothing changed; retry")
	case errors.Is(err, ErrStarting):
		return unavailable(info(ReasonUnavailable), retryDelayUnavailable, "the store is starting (recovering its commitlog); retry shortly")
	case errors.Is(err, storage.ErrClosed):
		return unavailable(info(ReasonUnavailable), retryDelayUnavailable, "the store is shutting down")
	case errors.Is(err, storage.ErrSlave):
		return unavailable(info(ReasonUnavailable), retryDelayUnavailable, "this store is a slave; manage topics on the master")
	}
	a.log.Error().Err(err).Str("grpc.method", m).Msg("admin call failed with an unexpected error")
	return newStatus(codes.Internal, "internal error", info(ReasonInternal))
}

// badAdmin is INVALID_ARGUMENT for an admin request field.
func badAdmin(field, reason string) error {
	return invalidArgument(&errdetails.ErrorInfo{Reason: ReasonInvalidRequest, Domain: ErrorDomain}, field, reason)
}

// badRead is INVALID_ARGUMENT for a read request field.
func badRead(field, reason string) error {
	return invalidArgument(&errdetails.ErrorInfo{Reason: ReasonInvalidRequest, Domain: ErrorDomain}, field, reason)
}

// requestField turns a storage.ValidationError field into the path of the
// request field it came from.
func requestField(m method, field string) string {
	if m == methodPutMessage || m == methodPutMessageStream {
		if field == "" {
			return "message"
		}
		return "message." + field
	}
	switch field {
	case "topic", "queue_id", "messages":
		return field
	}
	return "messages" // per-entry problems: the reason names the entry
}

func invalidArgument(info *errdetails.ErrorInfo, field, reason string) error {
	br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
		Field:       field,
		Description: reason,
		Reason:      info.Reason,
	}}}
	return newStatus(codes.InvalidArgument, "invalid request: "+field+": "+reason, info, br)
}

func unavailable(info *errdetails.ErrorInfo, delay time.Duration, msg string) error {
	return newStatus(codes.Unavailable, msg, info, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}

// newStatus builds the status error with its details. Details are plain
// generated messages, so adding them cannot fail in practice; if it ever
// did, the bare status is still the right code and message.
func newStatus(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st := status.New(code, msg)
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// panicError is what a recovered handler panic becomes: INTERNAL, with the
// usual ErrorInfo. The panic may have happened after the append.
func panicError() error {
	return newStatus(codes.Internal, "internal error; whether the message was stored is unknown",
		&errdetails.ErrorInfo{Reason: storage.UnknownError.String(), Domain: ErrorDomain,
			Metadata: map[string]string{"stored": "unknown"}})
}
