package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// Apache RocketMQ 5's client protocol, apache.rocketmq.v2.MessagingService
// (proto/apache/rocketmq/v2), served beside storaged.v1 on the same port so
// that the official RocketMQ 5 SDKs (Java, Go, C#, C++, Rust, Python,
// Node.js) produce to storaged unchanged, the way they talk to a RocketMQ
// proxy. This file has the session calls (QueryRoute, Heartbeat,
// Telemetry, NotifyClientTermination) and the calls not served;
// rocketmq_send.go has SendMessage and the status mapping,
// rocketmq_offsets.go the offset calls, rocketmq_pull.go PullMessage,
// rocketmq_pop.go POP consumption (ReceiveMessage, AckMessage,
// ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue,
// QueryAssignment).
//
// The protocol's own error convention holds: a call the server answered has
// gRPC status OK and its outcome in the response's apache.rocketmq.v2.Status
// (Code enum), which the SDKs turn into their exceptions (4xx codes: the
// request is wrong and is not retried as is; TOO_MANY_REQUESTS: back off;
// 5xx: retried). A call storaged does not serve answers UNSUPPORTED in that
// Status, never a bare gRPC UNIMPLEMENTED, so the SDKs raise their
// UnsupportedException with our message.
//
// What storaged is in this protocol: one broker (BrokerName, id 0, a
// master) holding every topic, with the topic's queues (storage topic
// config) all READ_WRITE; the broker's address in a route is the access
// point the client used (as the RocketMQ proxy answers), or in a replication
// group the leader's client address when this replica is not the leader
// and knows it.

// BrokerName is the broker name storaged answers in routes.
const BrokerName = "storaged"

// Bounds of what a RocketMQ client request may carry, beyond the gRPC
// receive limit.
const (
	// maxEndpointAddresses bounds the addresses of an access point (echoed
	// back in a route).
	maxEndpointAddresses = 16
	// MaxMessageGroupLength is the longest message group taken (the RocketMQ
	// proxy's default maxMessageGroupSize).
	MaxMessageGroupLength = 64
	// maxClientIDLength bounds the x-mq-client-id header.
	maxClientIDLength = 256
	// maxSettingsTopics bounds the topics of a producer's settings (echoed
	// back).
	maxSettingsTopics = 1024
	// maxSubscriptions bounds the subscriptions of a consumer's settings.
	maxSubscriptions = 1024
)

// Settings storaged answers on Telemetry.
const (
	// producerMaxAttempts is the send attempts a producer gets when its own
	// settings name none (the SDKs' default: 3).
	producerMaxAttempts = 3
	// consumerMaxAttempts is a consumer group's delivery attempts by
	// default (RocketMQ's default maxReconsumeTimes 16, + 1): see
	// WithConsumerMaxAttempts.
	consumerMaxAttempts = storage.DefaultPopMaxAttempts
	// receiveBatchSize is a push consumer's receive batch.
	receiveBatchSize = 32
)

// backoff is the policy the SDKs back off by after TOO_MANY_REQUESTS (and a
// consumer between delivery attempts). The SDKs read whole seconds.
var (
	backoffInitial    = time.Second
	backoffMax        = 10 * time.Second
	backoffMultiplier = float32(2)
)

// clientIDHeader is the metadata key of the client's id (every SDK call
// carries it).
const clientIDHeader = "x-mq-client-id"

// RouteStore is what QueryRoute and SendMessage need from the store beyond
// Store; *storage.Store implements it (storage.Store.RouteQueues).
type RouteStore interface {
	RouteQueues(topic string) (queues int32, exists bool, err error)
}

var (
	_ RouteStore = (*storage.Store)(nil)
	_ RouteStore = (*DeferredStore)(nil)
)

// rocketMQ implements rocketmqv2.MessagingServiceServer on the Service's
// store, limits and error mapping. It embeds the Unsafe interface, not the
// Unimplemented struct: a method added to the protocol must fail the build
// here, to be answered UNSUPPORTED on purpose.
type rocketMQ struct {
	rocketmqv2.UnsafeMessagingServiceServer
	svc *Service
	// next spreads messages without a message group over a topic's queues
	// (round robin, as the proxy's write selector).
	next atomic.Uint32
	// attempts are the groups' max delivery attempts their clients'
	// settings named (rocketmq_pop.go).
	attempts groupAttempts
	// fifo are the groups whose clients' settings said fifo
	// (rocketmq_pop.go).
	fifo groupFifo
}

var _ rocketmqv2.MessagingServiceServer = (*rocketMQ)(nil)

// okStatus is the Status of a served call.
func okStatus() *rocketmqv2.Status {
	return &rocketmqv2.Status{Code: rocketmqv2.Code_OK, Message: "OK"}
}

func v2Status(code rocketmqv2.Code, format string, args ...any) *rocketmqv2.Status {
	return &rocketmqv2.Status{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Why the calls storaged does not serve are not served (README.md, "Use the
// RocketMQ clients").
const (
	notServedLite = "storaged has no lite topics"
)

// checkTopic checks a topic resource: a name storaged takes (the store's
// rule), no namespace, and not a topic the store keeps for itself.
func checkTopic(r *rocketmqv2.Resource) (string, *rocketmqv2.Status) {
	if r == nil || r.GetName() == "" {
		return "", v2Status(rocketmqv2.Code_ILLEGAL_TOPIC, "topic is required")
	}
	if r.GetResourceNamespace() != "" {
		return "", v2Status(rocketmqv2.Code_BAD_REQUEST, "storaged has no namespaces; connect without one (namespace %.64q)", r.GetResourceNamespace())
	}
	name := r.GetName()
	if p := storage.TopicNameProblem(name); p != "" {
		return "", v2Status(rocketmqv2.Code_ILLEGAL_TOPIC, "%s", p)
	}
	if storage.HiddenTopic(name) || storage.NotAllowedSendTopic(name) {
		return "", v2Status(rocketmqv2.Code_ILLEGAL_TOPIC, "topic %s is a system topic of the store; it is not served through the RocketMQ protocol", name)
	}
	return name, nil
}

// checkGroup checks a consumer group resource.
func checkGroup(r *rocketmqv2.Resource) (string, *rocketmqv2.Status) {
	if r == nil || r.GetName() == "" {
		return "", v2Status(rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP, "consumer group is required")
	}
	if r.GetResourceNamespace() != "" {
		return "", v2Status(rocketmqv2.Code_BAD_REQUEST, "storaged has no namespaces; connect without one (namespace %.64q)", r.GetResourceNamespace())
	}
	if p := storage.GroupProblem(r.GetName()); p != "" {
		return "", v2Status(rocketmqv2.Code_ILLEGAL_CONSUMER_GROUP, "%s", p)
	}
	return r.GetName(), nil
}

// checkEndpoints checks the access point a client sends with QueryRoute;
// it is echoed back as the broker's address.
func checkEndpoints(ep *rocketmqv2.Endpoints) *rocketmqv2.Status {
	n := len(ep.GetAddresses())
	switch {
	case n == 0:
		return v2Status(rocketmqv2.Code_ILLEGAL_ACCESS_POINT, "the access point (endpoints) is required")
	case n > maxEndpointAddresses:
		return v2Status(rocketmqv2.Code_ILLEGAL_ACCESS_POINT, "the access point has %d addresses, limit %d", n, maxEndpointAddresses)
	}
	for i, a := range ep.GetAddresses() {
		if h := a.GetHost(); h == "" || len(h) > 255 {
			return v2Status(rocketmqv2.Code_ILLEGAL_ACCESS_POINT, "access point address %d: host must be 1-255 bytes", i)
		}
		if p := a.GetPort(); p < 1 || p > 65535 {
			return v2Status(rocketmqv2.Code_ILLEGAL_ACCESS_POINT, "access point address %d: port %d is not in 1-65535", i, p)
		}
	}
	return nil
}

// routeStore is the store's RouteStore, or a Status saying it has none.
func (r *rocketMQ) routeStore() (RouteStore, *rocketmqv2.Status) {
	if rs, ok := r.svc.store.(RouteStore); ok {
		return rs, nil
	}
	return nil, v2Status(rocketmqv2.Code_INTERNAL_SERVER_ERROR, "this store keeps no topic configuration")
}

// QueryRoute implements rocketmqv2.MessagingServiceServer: the topic's
// queues, all READ_WRITE, on one broker. A topic that does not exist yet is
// routed with the queue count its first put creates it with while topic
// auto-creation is on (TOPIC_NOT_FOUND while it is off).
func (r *rocketMQ) QueryRoute(_ context.Context, req *rocketmqv2.QueryRouteRequest) (*rocketmqv2.QueryRouteResponse, error) {
	topic, st := checkTopic(req.GetTopic())
	if st == nil {
		st = checkEndpoints(req.GetEndpoints())
	}
	if st != nil {
		return &rocketmqv2.QueryRouteResponse{Status: st}, nil
	}
	rs, st := r.routeStore()
	if st != nil {
		return &rocketmqv2.QueryRouteResponse{Status: st}, nil
	}
	n, _, err := rs.RouteQueues(topic)
	if err != nil {
		return &rocketmqv2.QueryRouteResponse{Status: r.storeStatus(err)}, nil
	}
	broker := &rocketmqv2.Broker{Name: BrokerName, Id: 0, Endpoints: r.brokerEndpoints(req.GetEndpoints())}
	res := &rocketmqv2.Resource{Name: topic}
	mqs := make([]*rocketmqv2.MessageQueue, n) // n ≤ storage.MaxQueues
	for i := range mqs {
		mqs[i] = &rocketmqv2.MessageQueue{Topic: res, Id: int32(i), Permission: rocketmqv2.Permission_READ_WRITE, Broker: broker,
			AcceptMessageTypes: []rocketmqv2.MessageType{rocketmqv2.MessageType_NORMAL, rocketmqv2.MessageType_FIFO, rocketmqv2.MessageType_DELAY,
				rocketmqv2.MessageType_TRANSACTION}}
	}
	return &rocketmqv2.QueryRouteResponse{Status: okStatus(), MessageQueues: mqs}, nil
}

// brokerEndpoints is where a route sends the client: the leader's client
// address when this replica of a group knows another leader, else the
// access point the client came through.
func (r *rocketMQ) brokerEndpoints(access *rocketmqv2.Endpoints) *rocketmqv2.Endpoints {
	s := r.svc
	if s.replicaInfo != nil {
		ri := s.replicaInfo()
		if ri.LeaderID != 0 && ri.LeaderID != ri.ID {
			if ep := endpointsOf(s.leaderAddr(ri.LeaderID)); ep != nil {
				return ep
			}
		}
	}
	return access
}

// endpointsOf turns "host:port" into Endpoints, nil when it is not one.
func endpointsOf(hostport string) *rocketmqv2.Endpoints {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" {
		return nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil
	}
	scheme := rocketmqv2.AddressScheme_DOMAIN_NAME
	if a, err := netip.ParseAddr(host); err == nil {
		scheme = rocketmqv2.AddressScheme_IPv4
		if a.Is6() && !a.Is4In6() {
			scheme = rocketmqv2.AddressScheme_IPv6
		}
	}
	return &rocketmqv2.Endpoints{Scheme: scheme, Addresses: []*rocketmqv2.Address{{Host: host, Port: int32(p)}}}
}

// checkClient checks what a client says it is in Heartbeat and Settings: a
// type storaged serves and, for a consumer, its group.
func checkClient(t rocketmqv2.ClientType, group *rocketmqv2.Resource) *rocketmqv2.Status {
	switch t {
	case rocketmqv2.ClientType_PRODUCER:
		return nil
	case rocketmqv2.ClientType_PUSH_CONSUMER, rocketmqv2.ClientType_SIMPLE_CONSUMER, rocketmqv2.ClientType_PULL_CONSUMER:
		_, st := checkGroup(group)
		return st
	case rocketmqv2.ClientType_LITE_PUSH_CONSUMER, rocketmqv2.ClientType_LITE_SIMPLE_CONSUMER:
		return v2Status(rocketmqv2.Code_UNSUPPORTED, notServedLite)
	}
	return v2Status(rocketmqv2.Code_UNRECOGNIZED_CLIENT_TYPE, "client type %d is not one storaged knows", int32(t))
}

// Heartbeat implements rocketmqv2.MessagingServiceServer. storaged keeps no
// client registry (nothing is pushed to clients), so a heartbeat is only
// checked and answered.
func (r *rocketMQ) Heartbeat(_ context.Context, req *rocketmqv2.HeartbeatRequest) (*rocketmqv2.HeartbeatResponse, error) {
	if st := checkClient(req.GetClientType(), req.GetGroup()); st != nil {
		return &rocketmqv2.HeartbeatResponse{Status: st}, nil
	}
	return &rocketmqv2.HeartbeatResponse{Status: okStatus()}, nil
}

// NotifyClientTermination implements rocketmqv2.MessagingServiceServer:
// nothing to release (no client registry).
func (r *rocketMQ) NotifyClientTermination(context.Context, *rocketmqv2.NotifyClientTerminationRequest) (*rocketmqv2.NotifyClientTerminationResponse, error) {
	return &rocketmqv2.NotifyClientTerminationResponse{Status: okStatus()}, nil
}

// clientID is the client's x-mq-client-id, "" when absent or too long.
func clientID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(clientIDHeader)
	if len(v) != 1 || len(v[0]) > maxClientIDLength {
		return ""
	}
	return v[0]
}

// Telemetry implements rocketmqv2.MessagingServiceServer. A client opens it
// at start and sends its settings; the SDKs wait for the answer before they
// report started. storaged answers each Settings with the settings the
// client must use (settingsReply), sends a producer the transaction checks
// of the topics its settings name (RecoverOrphanedTransactionCommand,
// rocketmq_txn.go), ignores the reports a client sends about commands,
// and answers anything else with a BAD_REQUEST status. The stream stays open until the client ends it, the
// server drains, or its connection nears its age limit (the SDKs then open
// a new one, on another server if their connection moved).
//
// Receiving runs on a goroutine of its own so that the handler can return
// on drain while a Recv is blocked; it ends when the handler returns (the
// stream's context is then cancelled and Recv fails).
func (r *rocketMQ) Telemetry(stream grpc.BidiStreamingServer[rocketmqv2.TelemetryCommand, rocketmqv2.TelemetryCommand]) error {
	if clientID(stream.Context()) == "" {
		return stream.Send(&rocketmqv2.TelemetryCommand{Status: v2Status(rocketmqv2.Code_CLIENT_ID_REQUIRED,
			"the %s header is required (1-%d bytes)", clientIDHeader, maxClientIDLength)})
	}
	// On a connection served by GRPCServer the stream ends with OK at its
	// soft end (streamlife.go), before the connection's age limit would cut
	// it with an error: the SDKs then reopen it on their new connection.
	// Nothing is under way on this stream, so there is no hard end.
	var endC <-chan struct{}
	if l := r.svc.life; l != nil {
		if soft, _, ok := l.schedule(stream.Context(), l.now()); ok {
			c, release := l.at(soft)
			defer release()
			endC = c
		}
	}
	// A producer's stream carries the store's transaction checks
	// (rocketmq_txn.go) once its settings named its topics.
	prod := &producerStream{client: clientID(stream.Context()), out: make(chan *rocketmqv2.TelemetryCommand, producerOutbox)}
	defer r.svc.producers.set(prod, nil)
	cmds := make(chan *rocketmqv2.TelemetryCommand)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case cmds <- c:
			case <-done:
				return
			}
		}
	}()
	for {
		select {
		case c := <-cmds:
			if reply := r.telemetryReply(c, prod); reply != nil {
				if err := stream.Send(reply); err != nil {
					return err
				}
			}
		case c := <-prod.out:
			if err := stream.Send(c); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-r.svc.draining.Done():
			return nil
		case <-endC:
			return nil
		}
	}
}

// telemetryReply is the answer to one command of a client, nil for none.
func (r *rocketMQ) telemetryReply(c *rocketmqv2.TelemetryCommand, prod *producerStream) *rocketmqv2.TelemetryCommand {
	switch cmd := c.GetCommand().(type) {
	case *rocketmqv2.TelemetryCommand_Settings:
		settings, st := r.settingsReply(cmd.Settings)
		if st != nil {
			return &rocketmqv2.TelemetryCommand{Status: st}
		}
		if settings.GetClientType() == rocketmqv2.ClientType_PRODUCER {
			var topics []string
			for _, t := range settings.GetPublishing().GetTopics() {
				if name, st := checkTopic(t); st == nil {
					topics = append(topics, name)
				}
			}
			r.svc.producers.set(prod, topics)
		}
		return &rocketmqv2.TelemetryCommand{Status: okStatus(), Command: &rocketmqv2.TelemetryCommand_Settings{Settings: settings}}
	case *rocketmqv2.TelemetryCommand_ThreadStackTrace, *rocketmqv2.TelemetryCommand_VerifyMessageResult:
		return nil // reports on commands storaged never sends
	}
	return &rocketmqv2.TelemetryCommand{Status: v2Status(rocketmqv2.Code_BAD_REQUEST,
		"storaged takes settings on the telemetry stream, and ignores thread stack and verification reports; nothing else")}
}

// settingsReply is what a client must use, answered to its settings: its
// own client type, access point and request timeout; an exponential
// backoff (the SDKs require that strategy); for a producer the largest body
// the store takes and message type validation on (a route lists the types
// storaged takes, so the SDK refuses the others before sending); for a
// consumer its group and subscriptions, whether the group consumes in
// order (fifo: WithFifoConsumerGroups, or its client's settings said so),
// and the receive batch and long-poll bounds.
func (r *rocketMQ) settingsReply(in *rocketmqv2.Settings) (*rocketmqv2.Settings, *rocketmqv2.Status) {
	t := in.GetClientType()
	var group *rocketmqv2.Resource
	if sub := in.GetSubscription(); sub != nil {
		group = sub.GetGroup()
	}
	if st := checkClient(t, group); st != nil {
		return nil, st
	}
	out := &rocketmqv2.Settings{
		ClientType:     in.ClientType,
		AccessPoint:    in.GetAccessPoint(),
		RequestTimeout: in.GetRequestTimeout(),
		Metric:         &rocketmqv2.Metric{On: false},
	}
	var attempts int32
	if t == rocketmqv2.ClientType_PRODUCER {
		pub := in.GetPublishing()
		if pub == nil {
			return nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "producer settings need publishing settings")
		}
		if n := len(pub.GetTopics()); n > maxSettingsTopics {
			return nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "publishing settings name %d topics, limit %d", n, maxSettingsTopics)
		}
		attempts = producerMaxAttempts
		if n := in.GetBackoffPolicy().GetMaxAttempts(); n > 0 {
			attempts = n
		}
		out.PubSub = &rocketmqv2.Settings_Publishing{Publishing: &rocketmqv2.Publishing{
			Topics:              pub.GetTopics(),
			MaxBodySize:         int32(min(r.svc.maxMessageSize, 1<<31-1)),
			ValidateMessageType: true,
		}}
	} else {
		sub := in.GetSubscription()
		if n := len(sub.GetSubscriptions()); n > maxSubscriptions {
			return nil, v2Status(rocketmqv2.Code_BAD_REQUEST, "subscription settings name %d subscriptions, limit %d", n, maxSubscriptions)
		}
		// The group's max attempts: what its client names, else the
		// server's; a receive of the group dead-letters by it.
		attempts = r.attempts.set(sub.GetGroup().GetName(), in.GetBackoffPolicy().GetMaxAttempts(), r.svc.consumerMaxAttempts)
		if sub.GetFifo() {
			r.fifo.set(sub.GetGroup().GetName())
		}
		out.PubSub = &rocketmqv2.Settings_Subscription{Subscription: &rocketmqv2.Subscription{
			Group:              sub.GetGroup(),
			Subscriptions:      sub.GetSubscriptions(),
			Fifo:               proto.Bool(r.isFifo(sub.GetGroup().GetName())),
			ReceiveBatchSize:   proto.Int32(receiveBatchSize),
			LongPollingTimeout: durationpb.New(r.svc.maxPullWait),
		}}
	}
	out.BackoffPolicy = &rocketmqv2.RetryPolicy{MaxAttempts: attempts, Strategy: &rocketmqv2.RetryPolicy_ExponentialBackoff{
		ExponentialBackoff: &rocketmqv2.ExponentialBackoff{Initial: durationpb.New(backoffInitial), Max: durationpb.New(backoffMax),
			Multiplier: backoffMultiplier}}}
	return out, nil
}

// The calls storaged does not serve: each answers UNSUPPORTED with why.

// SyncLiteSubscription implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) SyncLiteSubscription(context.Context, *rocketmqv2.SyncLiteSubscriptionRequest) (*rocketmqv2.SyncLiteSubscriptionResponse, error) {
	return &rocketmqv2.SyncLiteSubscriptionResponse{Status: v2Status(rocketmqv2.Code_UNSUPPORTED, notServedLite)}, nil
}
