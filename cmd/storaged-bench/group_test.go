package main

import (
	"context"
	"io"
	"net"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// leaderFloor is a floorService that says it is the ready leader of a
// group, so that a client.LeaderTracker sends it puts.
type leaderFloor struct{ *floorService }

func (leaderFloor) GetReplicaInfo(context.Context, *storagedv1.GetReplicaInfoRequest) (*storagedv1.GetReplicaInfoResponse, error) {
	return &storagedv1.GetReplicaInfoResponse{Role: storagedv1.ReplicaRole_REPLICA_ROLE_LEADER, Ready: true, Term: 1}, nil
}

// TestTrackerStreamCase: the r3 target's route for a stream case, a
// client.Stream per generator stream behind trackerClient, sends every
// planned message once and ends (the plan's CloseSend ends Recv with
// io.EOF), for an OK floor and one failing every third message with a
// refusal (sent again by the Stream, so answered OK in the end).
func TestTrackerStreamCase(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer answerFunc
		msgs   int64 // messages the server receives
	}{
		{"ok", nil, 700},
		{"refusals", failingRefusal, 700 + 700/2}, // every third received is refused and sent again
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			svc := &floorService{host: lis.Addr().(*net.TCPAddr).AddrPort(), answer: tc.answer}
			srv := grpc.NewServer()
			storagedv1.RegisterMessageStoreServiceServer(srv, leaderFloor{svc})
			done := make(chan struct{})
			go func() {
				defer close(done)
				srv.Serve(lis)
			}()
			defer func() {
				srv.Stop()
				<-done
			}()
			var clients []storagedv1.MessageStoreServiceClient
			for range 2 {
				tr, err := client.New(client.Options{Addrs: []string{lis.Addr().String()}})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				clients = append(clients, trackerClient{tr: tr, inFlight: 16})
			}
			cfg := countConfig(methodStream, 700)
			cfg.Streams, cfg.Concurrency = 3, 16
			s, err := runLoadClients(context.Background(), cfg, clients, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			checkConsistent(t, s)
			if s.Messages != 700 || s.Errors != 0 {
				t.Errorf("messages %d errors %d (%v), want 700 and 0", s.Messages, s.Errors, s.ErrorsByCode)
			}
			if got := svc.msgs.Load(); got < tc.msgs-2 || got > tc.msgs+2 {
				t.Errorf("server received %d messages, want about %d", got, tc.msgs)
			}
		})
	}
}

// failingRefusal refuses every third put with UNAVAILABLE and storaged's
// ErrorInfo (nothing stored).
func failingRefusal(n int64) (storagedv1.PutMessageStatus, error) {
	if n%3 == 0 {
		st, err := status.New(codes.Unavailable, "busy").
			WithDetails(&errdetails.ErrorInfo{Reason: "OS_PAGE_CACHE_BUSY", Domain: "storaged"})
		if err != nil {
			panic(err)
		}
		return 0, st.Err()
	}
	return 0, nil
}
