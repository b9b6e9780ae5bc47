package proctest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

var binary string

func TestMain(m *testing.M) { Main(m, &binary) }

func put(t *testing.T, p *Process, body string) *storagedv1.PutMessageResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).PutMessage(ctx, &storagedv1.PutMessageRequest{
		Message: &storagedv1.Message{Topic: "Proc", Body: []byte(body)}})
	if err != nil {
		t.Fatalf("put %q: %v", body, err)
	}
	return res
}

// TestLifecycle drives every signal once: a put, SIGSTOP (a put waits),
// SIGCONT (it completes), SIGTERM (a clean exit), a restart on the same
// port, kill -9, a restart, and both puts read back.
func TestLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts storaged processes")
	}
	p := Start(t, Options{Binary: binary, Name: "p", DataDir: filepath.Join(t.TempDir(), "d"), Flags: []string{"--flush-mode", "sync"}})
	addr := p.Addr()
	put(t, p, "one")

	p.Pause(t)
	done := make(chan *storagedv1.PutMessageResponse, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, _ := storagedv1.NewMessageStoreServiceClient(p.Conn()).PutMessage(ctx, &storagedv1.PutMessageRequest{
			Message: &storagedv1.Message{Topic: "Proc", Body: []byte("two")}})
		done <- res
	}()
	p.Resume(t)
	if res := <-done; res == nil || res.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		t.Fatalf("put across a pause: %v", res)
	}

	if err := p.Term(t, 60*time.Second); err != nil {
		t.Fatalf("SIGTERM: exit %v, want a clean exit", err)
	}
	if p.Running() || p.Conn() != nil {
		t.Fatal("still running after SIGTERM")
	}
	p.Restart(t)
	if p.Addr() != addr {
		t.Fatalf("restarted on %s, want the same address %s", p.Addr(), addr)
	}
	p.Kill(t)
	p.Restart(t)
	var got []string
	if err := PullQueue(context.Background(), storagedv1.NewMessageStoreServiceClient(p.Conn()), "Proc", 0, func(m *storagedv1.StoredMessage) {
		got = append(got, string(m.Body))
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Fatalf("read back %q, want [one two]", got)
	}
}

// TestSources: the files New opens for go test's cache are the module's
// own, all exist, and include go.mod, go.sum and the store's code, so a
// change to any of them reruns the process-level suites.
func TestSources(t *testing.T) {
	var mod, sum, store bool
	for _, f := range sources {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("source %s: %v", f, err)
		}
		switch {
		case filepath.Base(f) == "go.mod":
			mod = true
		case filepath.Base(f) == "go.sum":
			sum = true
		case strings.HasSuffix(f, filepath.Join("storage", "replica", "replica.go")):
			store = true
		}
	}
	if !mod || !sum || !store {
		t.Fatalf("%d sources: go.mod %v, go.sum %v, storage/replica/replica.go %v", len(sources), mod, sum, store)
	}
}
