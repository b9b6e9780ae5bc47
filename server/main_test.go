package server

import (
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/experimental"
)

func TestMain(m *testing.M) {
	// As cmd/storaged's main does: the servers of these tests run with
	// storaged's buffer pool (TestBufferPoolInstalled).
	experimental.SetDefaultBufferPool(NewBufferPool())
	goleak.VerifyTestMain(m)
}
