package server

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// AdminServiceName is the full name of the AdminService.
const AdminServiceName = "storaged.v1.AdminService"

// AdminStore is what the admin service needs from the store;
// *storage.Store implements it (storage/topics_store.go has the contracts).
type AdminStore interface {
	CreateTopic(name string, queues int32) (storage.TopicConfig, error)
	UpdateTopic(name string, queues int32) (storage.TopicConfig, error)
	Topic(name string) (storage.TopicInfo, error)
	Topics(after string, limit int) ([]storage.TopicInfo, bool, error)
	DeleteTopic(name string) (int64, error)
	ConsumerGroups(after string, limit int) ([]storage.ConsumerGroupInfo, bool, error)
	ConsumerGroup(group string, after storage.ConsumerQueueKey, limit int) (storage.ConsumerGroupInfo, []storage.ConsumerQueue, bool, error)
	// Membership changes of a replication group (storage/group_members.go);
	// storage.ErrNotGroup on a standalone store.
	AddLearner(ctx context.Context, id uint64, peerAddr string) (storage.GroupMembership, error)
	PromoteLearner(ctx context.Context, id uint64) (storage.GroupMembership, error)
	RemoveMember(ctx context.Context, id uint64) (storage.GroupMembership, error)
	Membership() (storage.MembershipUpdate, error)
	// MoveLeadership hands the group's leadership to voter to (0: the most
	// caught-up active one) and returns the new leader (storage/group.go).
	MoveLeadership(ctx context.Context, to uint64) (uint64, error)
}

var _ AdminStore = (*storage.Store)(nil)

// AdminService implements storagedv1.AdminServiceServer on an AdminStore:
// topic configuration, served apart from the data plane (AdminServer).
type AdminService struct {
	storagedv1.UnimplementedAdminServiceServer
	store AdminStore
	log   zerolog.Logger
	group func() AdminGroup // nil: standalone, or not told (admin_members.go)
}

// AdminOption configures an AdminService.
type AdminOption func(*AdminService)

// NewAdminService returns the admin service over store.
func NewAdminService(store AdminStore, log zerolog.Logger, opts ...AdminOption) *AdminService {
	a := &AdminService{store: store, log: log}
	for _, o := range opts {
		o(a)
	}
	return a
}

// CreateTopic implements storagedv1.AdminServiceServer.
func (a *AdminService) CreateTopic(_ context.Context, req *storagedv1.CreateTopicRequest) (*storagedv1.CreateTopicResponse, error) {
	if _, err := a.store.CreateTopic(req.GetName(), req.GetQueueCount()); err != nil {
		return nil, a.adminError("CreateTopic", err)
	}
	t, err := a.store.Topic(req.GetName())
	if err != nil {
		return nil, a.adminError("CreateTopic", err)
	}
	return &storagedv1.CreateTopicResponse{Topic: topicProto(t)}, nil
}

// UpdateTopic implements storagedv1.AdminServiceServer.
func (a *AdminService) UpdateTopic(_ context.Context, req *storagedv1.UpdateTopicRequest) (*storagedv1.UpdateTopicResponse, error) {
	if _, err := a.store.UpdateTopic(req.GetName(), req.GetQueueCount()); err != nil {
		return nil, a.adminError("UpdateTopic", err)
	}
	t, err := a.store.Topic(req.GetName())
	if err != nil {
		return nil, a.adminError("UpdateTopic", err)
	}
	return &storagedv1.UpdateTopicResponse{Topic: topicProto(t)}, nil
}

// GetTopic implements storagedv1.AdminServiceServer.
func (a *AdminService) GetTopic(_ context.Context, req *storagedv1.GetTopicRequest) (*storagedv1.GetTopicResponse, error) {
	if fe := validateTopic("name", req.GetName()); fe != nil {
		return nil, badAdmin(fe.Field, fe.Reason)
	}
	t, err := a.store.Topic(req.GetName())
	if err != nil {
		return nil, a.adminError("GetTopic", err)
	}
	return &storagedv1.GetTopicResponse{Topic: topicProto(t)}, nil
}

// ListTopics implements storagedv1.AdminServiceServer. The page token is
// the last topic name of the previous page.
func (a *AdminService) ListTopics(_ context.Context, req *storagedv1.ListTopicsRequest) (*storagedv1.ListTopicsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, badAdmin("page_size", "page size must not be negative")
	}
	if tok := req.GetPageToken(); tok != "" && storage.TopicNameProblem(tok) != "" {
		return nil, badAdmin("page_token", "not a page token this service returned")
	}
	ts, more, err := a.store.Topics(req.GetPageToken(), int(req.GetPageSize()))
	if err != nil {
		return nil, a.adminError("ListTopics", err)
	}
	resp := &storagedv1.ListTopicsResponse{Topics: make([]*storagedv1.Topic, len(ts))}
	for i, t := range ts {
		resp.Topics[i] = topicProto(t)
	}
	if more && len(ts) > 0 {
		resp.NextPageToken = ts[len(ts)-1].Name
	}
	return resp, nil
}

// DeleteTopic implements storagedv1.AdminServiceServer.
func (a *AdminService) DeleteTopic(_ context.Context, req *storagedv1.DeleteTopicRequest) (*storagedv1.DeleteTopicResponse, error) {
	at, err := a.store.DeleteTopic(req.GetName())
	if err != nil && at == 0 {
		return nil, a.adminError("DeleteTopic", err)
	}
	if err != nil { // deleted; only the file removal failed (a restart finishes it)
		a.log.Warn().Err(err).Str("topic", req.GetName()).Msg("topic deleted; its consume-queue files were not all removed")
	}
	return &storagedv1.DeleteTopicResponse{DeletedAtOffset: at}, nil
}

// ListConsumerGroups implements storagedv1.AdminServiceServer. The page
// token is the last group name of the previous page.
func (a *AdminService) ListConsumerGroups(_ context.Context, req *storagedv1.ListConsumerGroupsRequest) (*storagedv1.ListConsumerGroupsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, badAdmin("page_size", "page size must not be negative")
	}
	if tok := req.GetPageToken(); tok != "" && storage.GroupProblem(tok) != "" {
		return nil, badAdmin("page_token", "not a page token this service returned")
	}
	gs, more, err := a.store.ConsumerGroups(req.GetPageToken(), int(req.GetPageSize()))
	if err != nil {
		return nil, a.adminError("ListConsumerGroups", err)
	}
	resp := &storagedv1.ListConsumerGroupsResponse{Groups: make([]*storagedv1.ConsumerGroupSummary, len(gs))}
	for i, g := range gs {
		resp.Groups[i] = groupProto(g)
	}
	if more && len(gs) > 0 {
		resp.NextPageToken = gs[len(gs)-1].Name
	}
	return resp, nil
}

// GetConsumerGroup implements storagedv1.AdminServiceServer. The page
// token is "TOPIC/QUEUE" of the last queue of the previous page (a topic
// name holds no '/').
func (a *AdminService) GetConsumerGroup(_ context.Context, req *storagedv1.GetConsumerGroupRequest) (*storagedv1.GetConsumerGroupResponse, error) {
	if p := storage.GroupProblem(req.GetName()); p != "" {
		return nil, badAdmin("name", p)
	}
	if req.GetPageSize() < 0 {
		return nil, badAdmin("page_size", "page size must not be negative")
	}
	var after storage.ConsumerQueueKey
	if tok := req.GetPageToken(); tok != "" {
		k, ok := parseQueueToken(tok)
		if !ok {
			return nil, badAdmin("page_token", "not a page token this service returned")
		}
		after = k
	}
	info, qs, more, err := a.store.ConsumerGroup(req.GetName(), after, int(req.GetPageSize()))
	if err != nil {
		return nil, a.adminError("GetConsumerGroup", err)
	}
	resp := &storagedv1.GetConsumerGroupResponse{Group: groupProto(info), Queues: make([]*storagedv1.ConsumerQueueProgress, len(qs))}
	for i, q := range qs {
		resp.Queues[i] = &storagedv1.ConsumerQueueProgress{Topic: q.Topic, QueueId: q.QueueID,
			CommittedOffset: q.Committed, MinOffset: q.Min, MaxOffset: q.Max, Lag: q.Lag, Pop: q.Pop, Inflight: q.Inflight}
	}
	if more && len(qs) > 0 {
		last := qs[len(qs)-1]
		resp.NextPageToken = last.Topic + "/" + strconv.FormatInt(int64(last.QueueID), 10)
	}
	return resp, nil
}

// parseQueueToken reads GetConsumerGroup's page token.
func parseQueueToken(tok string) (storage.ConsumerQueueKey, bool) {
	i := strings.LastIndexByte(tok, '/')
	if i < 0 || storage.TopicNameProblem(tok[:i]) != "" {
		return storage.ConsumerQueueKey{}, false
	}
	q, err := strconv.ParseInt(tok[i+1:], 10, 32)
	if err != nil || q < 0 {
		return storage.ConsumerQueueKey{}, false
	}
	return storage.ConsumerQueueKey{Topic: tok[:i], QueueID: int32(q)}, true
}

func groupProto(g storage.ConsumerGroupInfo) *storagedv1.ConsumerGroupSummary {
	return &storagedv1.ConsumerGroupSummary{Name: g.Name, QueueCount: int32(g.Queues), Lag: g.Lag, Inflight: g.Inflight}
}

func topicProto(t storage.TopicInfo) *storagedv1.Topic {
	p := &storagedv1.Topic{Name: t.Name, QueueCount: t.Queues, Queues: make([]*storagedv1.QueueOffsets, len(t.Offsets))}
	for i, q := range t.Offsets {
		p.Queues[i] = &storagedv1.QueueOffsets{QueueId: q.QueueID, MinOffset: q.Min, MaxOffset: q.Max}
	}
	return p
}

// AdminServer is the admin gRPC server: AdminService (and reflection when
// configured) on its own grpc.Server, built from GRPCServerOptions (the
// same call logging, recovery, keepalive and TLS as the data plane), on
// its own listener, so that a Service or a mesh in front of the data
// port exposes no admin call.
type AdminServer struct {
	srv *grpc.Server
	log zerolog.Logger
}

// NewAdminServer builds the admin server for svc. cfg.Registerer is
// ignored: the data plane's server registers the gRPC metrics, and a
// second registration of the same collectors would fail.
func NewAdminServer(svc *AdminService, cfg GRPCConfig) (*AdminServer, error) {
	cfg.Registerer = nil
	opts, err := GRPCServerOptions(cfg)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(opts...)
	storagedv1.RegisterAdminServiceServer(srv, svc)
	if cfg.Reflection {
		reflection.Register(srv)
	}
	return &AdminServer{srv: srv, log: cfg.Logger}, nil
}

// Serve accepts connections on lis until Shutdown. It returns nil after
// Shutdown, or the listener's error.
func (s *AdminServer) Serve(lis net.Listener) error {
	if err := s.srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown stops the server gracefully, cutting the calls still running
// after timeout. It reports whether the stop was graceful.
func (s *AdminServer) Shutdown(timeout time.Duration) bool {
	return stopGracefully(s.srv, timeout, s.log, "admin server: graceful stop timed out; closing the remaining connections")
}

// DeferredAdminStore is an AdminStore whose store is set later, once it
// has opened; until then every call is UNAVAILABLE (ErrStarting).
type DeferredAdminStore struct {
	p atomic.Pointer[adminBox]
}

type adminBox struct{ s AdminStore }

var _ AdminStore = (*DeferredAdminStore)(nil)

// Set makes every later call go to s.
func (d *DeferredAdminStore) Set(s AdminStore) { d.p.Store(&adminBox{s}) }

func (d *DeferredAdminStore) get() (AdminStore, error) {
	if b := d.p.Load(); b != nil {
		return b.s, nil
	}
	return nil, ErrStarting
}

// CreateTopic implements AdminStore.
func (d *DeferredAdminStore) CreateTopic(name string, queues int32) (storage.TopicConfig, error) {
	s, err := d.get()
	if err != nil {
		return storage.TopicConfig{}, err
	}
	return s.CreateTopic(name, queues)
}

// UpdateTopic implements AdminStore.
func (d *DeferredAdminStore) UpdateTopic(name string, queues int32) (storage.TopicConfig, error) {
	s, err := d.get()
	if err != nil {
		return storage.TopicConfig{}, err
	}
	return s.UpdateTopic(name, queues)
}

// Topic implements AdminStore.
func (d *DeferredAdminStore) Topic(name string) (storage.TopicInfo, error) {
	s, err := d.get()
	if err != nil {
		return storage.TopicInfo{}, err
	}
	return s.Topic(name)
}

// Topics implements AdminStore.
func (d *DeferredAdminStore) Topics(after string, limit int) ([]storage.TopicInfo, bool, error) {
	s, err := d.get()
	if err != nil {
		return nil, false, err
	}
	return s.Topics(after, limit)
}

// DeleteTopic implements AdminStore.
func (d *DeferredAdminStore) DeleteTopic(name string) (int64, error) {
	s, err := d.get()
	if err != nil {
		return 0, err
	}
	return s.DeleteTopic(name)
}

// ConsumerGroups implements AdminStore.
func (d *DeferredAdminStore) ConsumerGroups(after string, limit int) ([]storage.ConsumerGroupInfo, bool, error) {
	s, err := d.get()
	if err != nil {
		return nil, false, err
	}
	return s.ConsumerGroups(after, limit)
}

// ConsumerGroup implements AdminStore.
func (d *DeferredAdminStore) ConsumerGroup(group string, after storage.ConsumerQueueKey, limit int) (storage.ConsumerGroupInfo, []storage.ConsumerQueue, bool, error) {
	s, err := d.get()
	if err != nil {
		return storage.ConsumerGroupInfo{}, nil, false, err
	}
	return s.ConsumerGroup(group, after, limit)
}

// AddLearner implements AdminStore.
func (d *DeferredAdminStore) AddLearner(ctx context.Context, id uint64, peerAddr string) (storage.GroupMembership, error) {
	s, err := d.get()
	if err != nil {
		return storage.GroupMembership{}, err
	}
	return s.AddLearner(ctx, id, peerAddr)
}

// PromoteLearner implements AdminStore.
func (d *DeferredAdminStore) PromoteLearner(ctx context.Context, id uint64) (storage.GroupMembership, error) {
	s, err := d.get()
	if err != nil {
		return storage.GroupMembership{}, err
	}
	return s.PromoteLearner(ctx, id)
}

// RemoveMember implements AdminStore.
func (d *DeferredAdminStore) RemoveMember(ctx context.Context, id uint64) (storage.GroupMembership, error) {
	s, err := d.get()
	if err != nil {
		return storage.GroupMembership{}, err
	}
	return s.RemoveMember(ctx, id)
}

// MoveLeadership implements AdminStore.
func (d *DeferredAdminStore) MoveLeadership(ctx context.Context, to uint64) (uint64, error) {
	s, err := d.get()
	if err != nil {
		return 0, err
	}
	return s.MoveLeadership(ctx, to)
}

// Membership implements AdminStore.
func (d *DeferredAdminStore) Membership() (storage.MembershipUpdate, error) {
	s, err := d.get()
	if err != nil {
		return storage.MembershipUpdate{}, err
	}
	return s.Membership()
}
