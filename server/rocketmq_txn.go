package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

	rocketmqv2 "github.com/storaged/storaged/gen/apache/rocketmq/v2"
	"github.com/storaged/storaged/storage"
)

// Transactional messages of the RocketMQ protocol (storage/transactions.go
// keeps them):
//
//   - SendMessage with message type TRANSACTION (one message a send, no
//     message group, no delivery timestamp) stores a half message; its
//     answer's message_id and transaction_id are the half record's msgId
//     (the commitlog offset names the transaction). system_properties.
//     orphaned_transaction_recovery_duration becomes its
//     CHECK_IMMUNITY_TIME_IN_SECONDS (whole seconds, at least 1).
//   - EndTransaction COMMIT puts the message to its topic and queue,
//     ROLLBACK drops it; a repeated end answers OK; an id that names no
//     pending transaction, or an end the other way, INVALID_TRANSACTION_ID.
//   - The store's check loop (a master; a group's ready leader) asks about a
//     half older than its immunity through CheckTransaction: a
//     RecoverOrphanedTransactionCommand on the Telemetry stream of a
//     connected producer whose settings name the half's topic (one, in
//     turn). The SDKs answer with EndTransaction (source SERVER_CHECK). No
//     producer connected: the check is counted and nothing is sent, as
//     RocketMQ does.

// methodEndTransaction names EndTransaction in logs and error mapping.
const methodEndTransaction method = "EndTransaction"

// maxImmunitySeconds bounds a half message's own check immunity.
const maxImmunitySeconds = 86400

// TransactionStore is what transactional messages need from the store;
// *storage.Store implements it.
type TransactionStore interface {
	EndTransaction(ctx context.Context, topic string, phys int64, commit bool) (storage.TransactionResult, error)
	SetTransactionChecker(c storage.TransactionChecker)
}

var (
	_ TransactionStore = (*storage.Store)(nil)
	_ TransactionStore = (*DeferredStore)(nil)
)

// EndTransaction implements rocketmqv2.MessagingServiceServer.
func (r *rocketMQ) EndTransaction(ctx context.Context, req *rocketmqv2.EndTransactionRequest) (*rocketmqv2.EndTransactionResponse, error) {
	answer := func(st *rocketmqv2.Status) (*rocketmqv2.EndTransactionResponse, error) {
		return &rocketmqv2.EndTransactionResponse{Status: st}, nil
	}
	topic, st := checkTopic(req.GetTopic())
	if st != nil {
		return answer(st)
	}
	var commit bool
	switch req.GetResolution() {
	case rocketmqv2.TransactionResolution_COMMIT:
		commit = true
	case rocketmqv2.TransactionResolution_ROLLBACK:
	default:
		return answer(v2Status(rocketmqv2.Code_BAD_REQUEST, "resolution must be COMMIT or ROLLBACK, got %d", int32(req.GetResolution())))
	}
	id := req.GetTransactionId()
	_, phys, err := storage.ParseMsgID(id)
	if err != nil || phys < 0 {
		return answer(v2Status(rocketmqv2.Code_INVALID_TRANSACTION_ID, "transaction id %.64q is not one storaged gave out", id))
	}
	if mid := req.GetMessageId(); mid != "" && mid != id {
		return answer(v2Status(rocketmqv2.Code_INVALID_TRANSACTION_ID, "message id %.64q is not the message of transaction %s", mid, id))
	}
	ts, ok := r.svc.store.(TransactionStore)
	if !ok {
		return answer(v2Status(rocketmqv2.Code_UNSUPPORTED, "this store keeps no transactional messages"))
	}
	res, err := ts.EndTransaction(ctx, topic, phys, commit)
	switch {
	case errors.Is(err, storage.ErrTransactionNotFound):
		return answer(v2Status(rocketmqv2.Code_INVALID_TRANSACTION_ID, "%v", err))
	case errors.Is(err, storage.ErrTransactionEnded):
		return answer(v2Status(rocketmqv2.Code_INVALID_TRANSACTION_ID, "%v", err))
	case err != nil:
		return answer(grpcToV2(r.svc.putError(ctx, methodEndTransaction, res.Op, err)))
	case res.Repeated:
		return answer(v2Status(rocketmqv2.Code_OK, "the transaction had ended this way already"))
	}
	return answer(putStatusToV2(res.Op.Status))
}

// producerRegistry is the producers with an open Telemetry stream and the
// topics their settings name, for the transaction checks.
type producerRegistry struct {
	mu      sync.Mutex
	byTopic map[string][]*producerStream
	turn    map[string]int
}

// producerStream is one producer's Telemetry stream: out feeds its sender.
type producerStream struct {
	client string
	topics []string
	out    chan *rocketmqv2.TelemetryCommand
}

// producerOutbox bounds the commands waiting for one stream; a check that
// finds it full is dropped (the store checks again an interval later).
const producerOutbox = 64

func newProducerRegistry() *producerRegistry {
	return &producerRegistry{byTopic: map[string][]*producerStream{}, turn: map[string]int{}}
}

// set (re)registers p for topics; nil topics unregister it.
func (g *producerRegistry) set(p *producerStream, topics []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range p.topics {
		l := g.byTopic[t]
		for i, q := range l {
			if q == p {
				l = append(l[:i:i], l[i+1:]...)
				break
			}
		}
		if len(l) == 0 {
			delete(g.byTopic, t)
			delete(g.turn, t)
		} else {
			g.byTopic[t] = l
		}
	}
	p.topics = topics
	for _, t := range topics {
		g.byTopic[t] = append(g.byTopic[t], p)
	}
}

// pick returns the next producer of topic in turn, nil for none.
func (g *producerRegistry) pick(topic string) *producerStream {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.byTopic[topic]
	if len(l) == 0 {
		return nil
	}
	i := g.turn[topic] % len(l)
	g.turn[topic] = i + 1
	return l[i]
}

// CheckTransaction implements storage.TransactionChecker: a
// RecoverOrphanedTransactionCommand to a producer of the half's topic,
// never blocking.
func (s *Service) CheckTransaction(c storage.TransactionCheck) {
	p := s.producers.pick(c.Topic)
	if p == nil {
		return
	}
	m := toV2Message(c.Half)
	m.Topic = &rocketmqv2.Resource{Name: c.Topic}
	m.SystemProperties.MessageType = rocketmqv2.MessageType_TRANSACTION
	m.SystemProperties.QueueId = c.Queue
	m.SystemProperties.QueueOffset = nil
	delete(m.UserProperties, storage.PropertyTransactionPrepared)
	delete(m.UserProperties, storage.PropertyCheckImmunity)
	cmd := &rocketmqv2.TelemetryCommand{Status: okStatus(), Command: &rocketmqv2.TelemetryCommand_RecoverOrphanedTransactionCommand{
		RecoverOrphanedTransactionCommand: &rocketmqv2.RecoverOrphanedTransactionCommand{Message: m, TransactionId: m.SystemProperties.MessageId},
	}}
	select {
	case p.out <- cmd:
	default:
		s.logLimit.Event("transaction check dropped", s.log.Warn()).Str("client", p.client).Str("topic", c.Topic).
			Msg("transaction check not sent: the producer's telemetry stream is backed up")
	}
}

// immunitySeconds is a half's CHECK_IMMUNITY_TIME_IN_SECONDS from its
// orphaned_transaction_recovery_duration, or a Status.
func immunitySeconds(sp *rocketmqv2.SystemProperties) (string, *rocketmqv2.Status) {
	d := sp.GetOrphanedTransactionRecoveryDuration()
	if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
		return "", v2Status(rocketmqv2.Code_BAD_REQUEST, "orphaned transaction recovery duration must be positive")
	}
	sec := (d.AsDuration().Milliseconds() + 999) / 1000
	return fmt.Sprint(min(sec, maxImmunitySeconds)), nil
}
