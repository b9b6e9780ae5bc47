package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// POP consumption of the RocketMQ protocol (the SimpleConsumer's and
// PushConsumer's receive, ack, nack and dead-lettering), mapped onto the
// store's POP state (storage/pop.go: kept in the commitlog, so a restart
// neither loses an ack nor forgets a message handed out):
//
//	ReceiveMessage   → PopReceive: every queue of the topic on this broker
//	                   (the request's queue id is not used, as a RocketMQ
//	                   broker pops all its queues for queue id -1), after
//	                   the group's retry topic; a TAG filter as PullMessage's.
//	                   Answered: the delivery timestamp, the messages (each
//	                   with its receipt handle, delivery attempt and
//	                   invisible duration), then OK; MESSAGE_NOT_FOUND after
//	                   the long poll when nothing is visible.
//	AckMessage       → PopAck: a status per entry, INVALID_RECEIPT_HANDLE for
//	                   a handle whose delivery is over; the call's status is
//	                   the entries' when they agree, else MULTIPLE_RESULTS.
//	ChangeInvisibleDuration → PopChangeInvisible: the new receipt handle.
//	ForwardMessageToDeadLetterQueue → PopForwardDLQ (%DLQ%<group>).
//	QueryAssignment  → one assignment: the topic on this broker, queue id -1
//	                   (all queues), for the PushConsumer's receives.
//
// In a replication group the leader serves these calls (a follower's
// *storage.NotLeaderError is HA_NOT_AVAILABLE, as a refused send; routes
// name the leader): each change is answered once committed on a majority,
// SLAVE_PERSISTENCE_TIMEOUT when it was not seen committed in time.
//
// A group's max delivery attempts are what its client's settings name
// (Telemetry backoff_policy.max_attempts), else the server's
// (WithConsumerMaxAttempts); a message received that many times without
// an ack goes to %DLQ%<group>. A receive without an invisible duration
// (the PushConsumer's, auto_renew) gets defaultAutoRenewInvisible; storaged
// does not renew it while the client works (a message processed longer
// than that is delivered again).
//
// A FIFO consumer group (RocketMQ's consumeMessageOrderly: configured with
// WithFifoConsumerGroups, or named fifo by its client's settings) has its
// receives consume each queue in order (storage.PopRequest.Fifo): a queue
// is not popped while the group has one of its messages in flight, and a
// message not acked in time is delivered again in place, not through
// %RETRY%<group>. Its clients are told fifo in the settings reply.

// Bounds of POP requests beyond the store's.
const (
	// defaultAutoRenewInvisible is the invisible duration of a receive
	// that names none (the RocketMQ proxy's defaultInvisibleTimeMills).
	defaultAutoRenewInvisible = 60 * time.Second
	// maxAttemptGroups bounds the groups whose max attempts the server
	// remembers from their clients' settings (beyond it: the server's).
	maxAttemptGroups = 10000
)

// Method names of the POP calls in logs and error mapping.
const (
	methodReceiveMessage method = "ReceiveMessage"
	methodAckMessage     method = "AckMessage"
	methodChangeInvis    method = "ChangeInvisibleDuration"
	methodForwardDLQ     method = "ForwardMessageToDeadLetterQueue"
)

// PopStore is what POP consumption needs from the store; *storage.Store
// implements it. A store without it answers UNSUPPORTED.
type PopStore interface {
	PopReceive(ctx context.Context, req storage.PopRequest) ([]storage.PopMessage, error)
	PopAck(ctx context.Context, group, topic string, handles []string) ([]error, error)
	PopChangeInvisible(ctx context.Context, group, topic, handle string, d time.Duration) (storage.PopMessage, error)
	PopForwardDLQ(ctx context.Context, group, topic, handle string) error
}

var (
	_ PopStore = (*storage.Store)(nil)
	_ PopStore = (*DeferredStore)(nil)
)

// groupAttempts remembers each group's max attempts from its clients'
// settings (bounded: maxAttemptGroups).
type groupAttempts struct {
	mu sync.Mutex
	m  map[string]int32
}

// set records n for group when n is in range and there is room; it
// returns the group's attempts, def when none is known.
func (a *groupAttempts) set(group string, n, def int32) int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > 0 && n <= storage.MaxPopAttempts {
		if _, ok := a.m[group]; ok || len(a.m) < maxAttemptGroups {
			if a.m == nil {
				a.m = map[string]int32{}
			}
			a.m[group] = n
		}
	}
	if v, ok := a.m[group]; ok {
		return v
	}
	return def
}

func (a *groupAttempts) get(group string, def int32) int32 { return a.set(group, 0, def) }

// groupFifo remembers the groups whose clients' settings said fifo
// (bounded: maxAttemptGroups; beyond it a group is FIFO only when
// configured so).
type groupFifo struct {
	mu sync.Mutex
	m  map[string]bool
}

func (f *groupFifo) set(group string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m) < maxAttemptGroups {
		if f.m == nil {
			f.m = map[string]bool{}
		}
		f.m[group] = true
	}
}

func (f *groupFifo) get(group string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[group]
}

// isFifo reports whether group consumes in order: configured so
// (WithFifoConsumerGroups), or its client's settings said fifo.
func (r *rocketMQ) isFifo(group string) bool { return r.svc.fifoGroups[group] || r.fifo.get(group) }

// popStore is the store's PopStore, or a Status saying it has none.
func (r *rocketMQ) popStore() (PopStore, *rocketmqv2.Status) {
	if ps, ok := r.svc.store.(PopStore); ok {
		return ps, nil
	}
	return nil, v2Status(rocketmqv2.Code_UNSUPPORTED, "this store keeps no POP consumption state")
}

// popStatus maps a failed POP call to the protocol's Code.
func (r *rocketMQ) popStatus(m method, err error) *rocketmqv2.Status {
	var verr *storage.ValidationError
	switch {
	case errors.Is(err, storage.ErrInvalidHandle):
		return v2Status(rocketmqv2.Code_INVALID_RECEIPT_HANDLE, "%v", err)
	case errors.Is(err, storage.ErrTooManyInflight):
		return v2Status(rocketmqv2.Code_TOO_MANY_REQUESTS, "%v; acknowledge messages first", err)
	case errors.Is(err, storage.ErrPopNotDurable) && errors.Is(err, storage.ErrReplicationTimeout):
		return v2Status(rocketmqv2.Code_SLAVE_PERSISTENCE_TIMEOUT, "%v", err)
	case errors.Is(err, storage.ErrPopNotDurable):
		return v2Status(rocketmqv2.Code_MASTER_PERSISTENCE_TIMEOUT, "%v", err)
	case errors.As(err, &verr):
		code := rocketmqv2.Code_BAD_REQUEST
		switch verr.Field {
		case "consumer_group":
			code = rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP
		case "topic":
			code = rocketmqv2.Code_ILLEGAL_TOPIC
		case "invisible_duration":
			code = rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME
		}
		return v2Status(code, "%s: %s", verr.Field, verr.Reason)
	}
	return grpcToV2(r.svc.offsetError(m, err))
}

// checkHandleRequest checks what the ack, change and forward calls name.
func checkHandleRequest(group, topic *rocketmqv2.Resource) (string, string, *rocketmqv2.Status) {
	g, st := checkGroup(group)
	if st != nil {
		return "", "", st
	}
	t, st := checkTopic(topic)
	if st != nil {
		return "", "", st
	}
	return g, t, nil
}

// ReceiveMessage implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) ReceiveMessage(req *rocketmqv2.ReceiveMessageRequest, stream grpc.ServerStreamingServer[rocketmqv2.ReceiveMessageResponse]) error {
	sendStatus := func(st *rocketmqv2.Status) error {
		return stream.Send(&rocketmqv2.ReceiveMessageResponse{Content: &rocketmqv2.ReceiveMessageResponse_Status{Status: st}})
	}
	ctx := stream.Context()
	pr, st := r.receiveRequest(ctx, req)
	var ps PopStore
	if st == nil {
		ps, st = r.popStore()
	}
	if st != nil {
		return sendStatus(st)
	}
	// A drain ends the long poll: the client is told nothing is new.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.svc.draining, cancel)
	defer stop()
	msgs, err := ps.PopReceive(pctx, pr)
	if err != nil && !(ctx.Err() == nil && errors.Is(err, context.Canceled)) {
		return sendStatus(r.popStatus(methodReceiveMessage, err))
	}
	if len(msgs) == 0 {
		return sendStatus(v2Status(rocketmqv2.Code_MESSAGE_NOT_FOUND, "no new message"))
	}
	if err := stream.Send(&rocketmqv2.ReceiveMessageResponse{Content: &rocketmqv2.ReceiveMessageResponse_DeliveryTimestamp{
		DeliveryTimestamp: timestamppb.New(time.UnixMilli(r.svc.now()))}}); err != nil {
		return err
	}
	for _, m := range msgs {
		v := toV2Message(m.Record)
		v.Topic = &rocketmqv2.Resource{Name: m.Topic}
		sp := v.SystemProperties
		sp.MessageId = m.MsgID
		h, attempt := m.Handle, m.Attempt
		sp.ReceiptHandle, sp.DeliveryAttempt = &h, &attempt
		sp.InvisibleDuration = durationpb.New(pr.Invisible)
		if err := stream.Send(&rocketmqv2.ReceiveMessageResponse{Content: &rocketmqv2.ReceiveMessageResponse_Message{Message: v}}); err != nil {
			return err
		}
	}
	return sendStatus(okStatus())
}

// receiveRequest validates a ReceiveMessageRequest into a store receive.
func (r *rocketMQ) receiveRequest(ctx context.Context, req *rocketmqv2.ReceiveMessageRequest) (storage.PopRequest, *rocketmqv2.Status) {
	group, st := checkGroup(req.GetGroup())
	if st != nil {
		return storage.PopRequest{}, st
	}
	if req.GetMessageQueue() == nil {
		return storage.PopRequest{}, v2Status(rocketmqv2.Code_BAD_REQUEST, "message queue is required")
	}
	topic, st := checkTopic(req.GetMessageQueue().GetTopic())
	if st != nil {
		return storage.PopRequest{}, st
	}
	tags, st := tagFilter(req.GetFilterExpression())
	if st != nil {
		return storage.PopRequest{}, st
	}
	n := int(req.GetBatchSize())
	if n < 1 || n > storage.MaxPopBatch {
		return storage.PopRequest{}, v2Status(rocketmqv2.Code_BAD_REQUEST, "batch size must be 1-%d, got %d", storage.MaxPopBatch, n)
	}
	invisible := defaultAutoRenewInvisible
	switch d := req.GetInvisibleDuration(); {
	case d != nil:
		if err := d.CheckValid(); err != nil {
			return storage.PopRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME, "invisible duration: %v", err)
		}
		invisible = d.AsDuration()
	case !req.GetAutoRenew():
		return storage.PopRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME, "an invisible duration is required unless auto_renew is set")
	}
	if invisible < storage.MinPopInvisible || invisible > storage.MaxPopInvisible {
		return storage.PopRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME, "invisible duration %v is outside [%v, %v]",
			invisible, storage.MinPopInvisible, storage.MaxPopInvisible)
	}
	var wait time.Duration
	if d := req.GetLongPollingTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return storage.PopRequest{}, v2Status(rocketmqv2.Code_ILLEGAL_POLLING_TIME, "long polling timeout must be a duration of zero or more")
		}
		wait = d.AsDuration()
	}
	return storage.PopRequest{Group: group, Topic: topic, Tags: tags, MaxMessages: n, Invisible: invisible,
		Wait: r.svc.boundWait(ctx, wait), MaxAttempts: int(r.attempts.get(group, r.svc.consumerMaxAttempts)), Fifo: r.isFifo(group)}, nil
}

// AckMessage implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) AckMessage(ctx context.Context, req *rocketmqv2.AckMessageRequest) (*rocketmqv2.AckMessageResponse, error) {
	group, topic, st := checkHandleRequest(req.GetGroup(), req.GetTopic())
	entries := req.GetEntries()
	if st == nil && (len(entries) == 0 || len(entries) > storage.MaxPopAckEntries) {
		st = v2Status(rocketmqv2.Code_BAD_REQUEST, "an ack names 1-%d entries, got %d", storage.MaxPopAckEntries, len(entries))
	}
	var ps PopStore
	if st == nil {
		ps, st = r.popStore()
	}
	if st != nil {
		return &rocketmqv2.AckMessageResponse{Status: st}, nil
	}
	handles := make([]string, len(entries))
	for i, e := range entries {
		handles[i] = e.GetReceiptHandle()
	}
	errs, err := ps.PopAck(ctx, group, topic, handles)
	resp := &rocketmqv2.AckMessageResponse{Entries: make([]*rocketmqv2.AckMessageResultEntry, len(entries))}
	for i, e := range entries {
		est := okStatus()
		switch {
		case err != nil:
			est = r.popStatus(methodAckMessage, err)
		case errs[i] != nil:
			est = r.popStatus(methodAckMessage, errs[i])
		}
		resp.Entries[i] = &rocketmqv2.AckMessageResultEntry{MessageId: e.GetMessageId(), ReceiptHandle: e.GetReceiptHandle(), Status: est}
		switch {
		case i == 0:
			resp.Status = est
		case resp.Status.GetCode() != est.GetCode():
			resp.Status = v2Status(rocketmqv2.Code_MULTIPLE_RESULTS, "the entries have different outcomes: see each entry's status")
		}
	}
	return resp, nil
}

// ChangeInvisibleDuration implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) ChangeInvisibleDuration(ctx context.Context, req *rocketmqv2.ChangeInvisibleDurationRequest) (*rocketmqv2.ChangeInvisibleDurationResponse, error) {
	group, topic, st := checkHandleRequest(req.GetGroup(), req.GetTopic())
	var d time.Duration
	if st == nil {
		switch id := req.GetInvisibleDuration(); {
		case id == nil:
			st = v2Status(rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME, "an invisible duration is required")
		case id.CheckValid() != nil || id.AsDuration() < 0 || id.AsDuration() > storage.MaxPopInvisible:
			st = v2Status(rocketmqv2.Code_ILLEGAL_INVISIBLE_TIME, "invisible duration must be 0-%v", storage.MaxPopInvisible)
		default:
			d = id.AsDuration()
		}
	}
	var ps PopStore
	if st == nil {
		ps, st = r.popStore()
	}
	if st != nil {
		return &rocketmqv2.ChangeInvisibleDurationResponse{Status: st}, nil
	}
	m, err := ps.PopChangeInvisible(ctx, group, topic, req.GetReceiptHandle(), d)
	if err != nil {
		return &rocketmqv2.ChangeInvisibleDurationResponse{Status: r.popStatus(methodChangeInvis, err)}, nil
	}
	return &rocketmqv2.ChangeInvisibleDurationResponse{Status: okStatus(), ReceiptHandle: m.Handle}, nil
}

// ForwardMessageToDeadLetterQueue implements
// rocketmqv2.MessagingServiceServer: the message goes to %DLQ%<group> now
// (the client's delivery_attempt and max_delivery_attempts are its own
// reasons; storaged does not second-guess them).
func (r *rocketMQ) ForwardMessageToDeadLetterQueue(ctx context.Context, req *rocketmqv2.ForwardMessageToDeadLetterQueueRequest) (*rocketmqv2.ForwardMessageToDeadLetterQueueResponse, error) {
	group, topic, st := checkHandleRequest(req.GetGroup(), req.GetTopic())
	var ps PopStore
	if st == nil {
		ps, st = r.popStore()
	}
	if st != nil {
		return &rocketmqv2.ForwardMessageToDeadLetterQueueResponse{Status: st}, nil
	}
	if err := ps.PopForwardDLQ(ctx, group, topic, req.GetReceiptHandle()); err != nil {
		return &rocketmqv2.ForwardMessageToDeadLetterQueueResponse{Status: r.popStatus(methodForwardDLQ, err)}, nil
	}
	return &rocketmqv2.ForwardMessageToDeadLetterQueueResponse{Status: okStatus()}, nil
}

// QueryAssignment implements rocketmqv2.MessagingServiceServer: the
// PushConsumer receives from what it is assigned; storaged assigns every
// consumer the whole topic on its one broker (queue id -1: all queues, as
// a RocketMQ proxy assigns in POP mode), since POP needs no queue
// rebalancing.
func (r *rocketMQ) QueryAssignment(_ context.Context, req *rocketmqv2.QueryAssignmentRequest) (*rocketmqv2.QueryAssignmentResponse, error) {
	topic, st := checkTopic(req.GetTopic())
	if st == nil {
		_, st = checkGroup(req.GetGroup())
	}
	if st == nil {
		st = checkEndpoints(req.GetEndpoints())
	}
	var rs RouteStore
	if st == nil {
		rs, st = r.routeStore()
	}
	if st != nil {
		return &rocketmqv2.QueryAssignmentResponse{Status: st}, nil
	}
	if _, _, err := rs.RouteQueues(topic); err != nil {
		return &rocketmqv2.QueryAssignmentResponse{Status: r.storeStatus(err)}, nil
	}
	broker := &rocketmqv2.Broker{Name: BrokerName, Id: 0, Endpoints: r.brokerEndpoints(req.GetEndpoints())}
	mq := &rocketmqv2.MessageQueue{Topic: &rocketmqv2.Resource{Name: topic}, Id: -1, Permission: rocketmqv2.Permission_READ_WRITE,
		Broker: broker, AcceptMessageTypes: []rocketmqv2.MessageType{rocketmqv2.MessageType_NORMAL, rocketmqv2.MessageType_FIFO}}
	return &rocketmqv2.QueryAssignmentResponse{Status: okStatus(), Assignments: []*rocketmqv2.Assignment{{MessageQueue: mq}}}, nil
}

// pops returns the store's PopStore (DeferredStore).
func (d *DeferredStore) pops() (PopStore, error) {
	b := d.p.Load()
	if b == nil {
		return nil, ErrStarting
	}
	st, ok := b.s.(PopStore)
	if !ok {
		return nil, errNoPop
	}
	return st, nil
}

// errNoPop: the store set keeps no POP state.
var errNoPop = errors.New("server: this store keeps no POP consumption state")

// PopReceive implements PopStore.
func (d *DeferredStore) PopReceive(ctx context.Context, req storage.PopRequest) ([]storage.PopMessage, error) {
	st, err := d.pops()
	if err != nil {
		return nil, err
	}
	return st.PopReceive(ctx, req)
}

// PopAck implements PopStore.
func (d *DeferredStore) PopAck(ctx context.Context, group, topic string, handles []string) ([]error, error) {
	st, err := d.pops()
	if err != nil {
		return nil, err
	}
	return st.PopAck(ctx, group, topic, handles)
}

// PopChangeInvisible implements PopStore.
func (d *DeferredStore) PopChangeInvisible(ctx context.Context, group, topic, handle string, dur time.Duration) (storage.PopMessage, error) {
	st, err := d.pops()
	if err != nil {
		return storage.PopMessage{}, err
	}
	return st.PopChangeInvisible(ctx, group, topic, handle, dur)
}

// PopForwardDLQ implements PopStore.
func (d *DeferredStore) PopForwardDLQ(ctx context.Context, group, topic, handle string) error {
	st, err := d.pops()
	if err != nil {
		return err
	}
	return st.PopForwardDLQ(ctx, group, topic, handle)
}
