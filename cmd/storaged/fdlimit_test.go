package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/testenv"
)

// TestIdleConnectionsCannotExhaustFds runs the real binary under
// RLIMIT_NOFILE 128 (prlimit) and opens 150 idle TCP connections to it.
//
//   - Bounded (the default --max-connections, half the limit: 64): the
//     server serves 63 of them besides the client's and leaves the rest in
//     the accept backlog; the store still has descriptors for 20 new
//     consume-queue files and its checkpoints; every put is taken and
//     readable. Before, there was no bound.
//   - Unbounded (--max-connections -1, as before): the connections fill the
//     fd table and a new consume-queue file fails with EMFILE. That is a
//     transient fault now: puts are refused UNAVAILABLE (WRITE_RETRYING),
//     and once the idle connections close the retry succeeds, health is
//     SERVING again and the puts are taken, with no restart. Before, the
//     store turned read-only until restarted.
func TestIdleConnectionsCannotExhaustFds(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		testenv.Need(t, false, fmt.Sprintf("prlimit (util-linux) is not installed: %v", err))
	}
	const nofile, idle, queues = 128, 150, 20
	for _, tc := range []struct {
		name    string
		args    []string
		bounded bool
	}{
		{"bounded by default", nil, true},
		{"unbounded: EMFILE is transient", []string{"--max-connections", "-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--nofile=" + strconv.Itoa(nofile) + ":" + strconv.Itoa(nofile), binary,
				"--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "", "--data-dir", t.TempDir(),
				"--file-size", "64KiB", "--max-message-size", "4KiB", "--checkpoint-interval", "20ms",
				"--default-queues", strconv.Itoa(queues + 1)}, tc.args...)
			p := startCmd(t, exec.Command(prlimit, args...))
			cfg := p.logs.waitFor(t, "effective configuration")
			if tc.bounded && cfg["max_connections"] != float64(nofile/2) {
				t.Fatalf("max_connections %v under RLIMIT_NOFILE %d, want %d", cfg["max_connections"], nofile, nofile/2)
			}
			const limit = nofile / 2
			addr := p.logs.waitFor(t, "listening").str("grpc")
			conn := dial(t, addr)
			waitServing(t, conn) // the client's connection is served first
			client := storagedv1.NewMessageStoreServiceClient(conn)
			// The first put creates the topic (its config file) and takes
			// the first commitlog file; the 20 small puts below, to new
			// queues 1-20 of it, need no other, so what fails for want of
			// fds is the store's background writes, not a roll or the
			// topic config.
			if _, err := client.PutMessage(t.Context(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
				Topic: "fd", Body: []byte("queue 0")}}); err != nil {
				t.Fatal(err)
			}

			served := make(chan struct{}, idle)
			idleConns := make([]net.Conn, 0, idle)
			for range idle {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				idleConns = append(idleConns, c)
				t.Cleanup(func() { c.Close() })
				go func() {
					buf := make([]byte, 1)
					if _, err := c.Read(buf); err == nil { // the server's HTTP/2 settings: accepted
						served <- struct{}{}
					}
				}()
			}
			deadline := time.NewTimer(startTimeout)
			defer deadline.Stop()
			for i := 0; i < limit-1; i++ {
				select {
				case <-served:
				case <-deadline.C:
					t.Fatalf("%d idle connections served after %v, want %d", i, startTimeout, limit-1)
				}
			}

			ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
			defer cancel()
			put := func(q int32) error {
				_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
					Topic: "fd", QueueId: q, Body: []byte("queue " + strconv.Itoa(int(q)))}})
				return err
			}
			var refused []int32
			for q := int32(1); q <= queues; q++ {
				err := put(q)
				switch {
				case err == nil:
				case tc.bounded:
					t.Fatalf("put to new queue %d with %d idle connections open: %v", q, idle, err)
				case status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "retried"):
					refused = append(refused, q) // a background write is failing: retriable
				default:
					t.Fatalf("put to new queue %d out of fds: %v, want UNAVAILABLE (a background write being retried)", q, err)
				}
			}
			if !tc.bounded {
				// Out of fds: a consume-queue file or the checkpoint fails
				// with EMFILE, as a transient fault.
				p.logs.waitFor(t, "storage: a background write failed; retrying with backoff; puts are refused until it succeeds")
				for _, c := range idleConns { // the cause clears
					c.Close()
				}
				// Each failing source logs its recovery once; a refused put
				// is taken once every source has recovered.
				for _, q := range refused {
					for attempt := 0; ; attempt++ {
						err := put(q)
						if err == nil {
							break
						}
						if attempt == 3 || status.Code(err) != codes.Unavailable {
							t.Fatalf("put after the idle connections closed: %v", err)
						}
						p.logs.waitFor(t, "storage: a background write succeeded again; puts resume")
					}
				}
			}
			for q := int32(0); q <= queues; q++ {
				r, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "fd", QueueId: q, MaxMessages: 1,
					Wait: durationpb.New(30 * time.Second)})
				if err != nil || len(r.GetMessages()) != 1 {
					t.Fatalf("pull queue %d: %d messages, %v", q, len(r.GetMessages()), err)
				}
			}
			waitServing(t, conn)
			if tc.bounded {
				select {
				case <-served:
					t.Fatalf("more than %d connections served under --max-connections %d", limit-1, limit)
				default:
				}
			}
		})
	}
}
