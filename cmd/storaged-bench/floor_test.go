package main

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// TestFloorRequestLimitMatchesStoraged: every floor kind takes a body of
// the store's size limit and refuses a request beyond the receive limit
// (server.MaxRecvMsgSize) with RESOURCE_EXHAUSTED, as storaged does. The
// edge floor runs server.NewGRPCServer itself, so the grpc floor, built
// from server.GRPCServerOptions, is checked against the real server.
func TestFloorRequestLimitMatchesStoraged(t *testing.T) {
	for _, tc := range []struct {
		name string
		body int
		want codes.Code
	}{
		{"at the message size limit", storage.DefaultMaxMessageSize, codes.OK},
		{"beyond the receive limit", server.MaxRecvMsgSize(storage.DefaultMaxMessageSize) + 1, codes.ResourceExhausted},
	} {
		for _, kind := range []string{floorGRPC, floorEdge, floorBare} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				f := startTestFloor(t, kind, nil)
				creds, _ := (&tlsOptions{}).credentials()
				conns, err := dial(f.Addr(), 1, creds)
				if err != nil {
					t.Fatal(err)
				}
				defer closeAll(conns)
				_, err = storagedv1.NewMessageStoreServiceClient(conns[0]).PutMessage(context.Background(),
					&storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: make([]byte, tc.body)}})
				if c := status.Code(err); c != tc.want {
					t.Fatalf("code %v (%v), want %v", c, err, tc.want)
				}
			})
		}
	}
}
