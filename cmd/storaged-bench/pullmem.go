package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// runPullMemCommand measures the server memory of concurrent maximal pulls
// (issue 11, point 7): it starts storaged on a fresh data directory, stores
// --messages bodies of --body bytes in one queue, then runs --rounds rounds
// of --pulls concurrent PullMessages of --max-bytes each, and prints the
// server's peak resident set (VmHWM of /proc/PID/status) before and after.
// A pull refused with RESOURCE_EXHAUSTED is counted and retried after its
// RetryInfo delay, so every round serves all its pulls.
func runPullMemCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pullmem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("storaged", "", "storaged `binary` to start (required)")
	extra := fs.String("storaged-args", "", "extra storaged `flags`, space separated (e.g. --max-pull-inflight-bytes=256MiB)")
	pulls := fs.Int("pulls", 32, "concurrent pulls per round")
	rounds := fs.Int("rounds", 4, "rounds")
	maxBytes := fs.Int("max-bytes", 16<<20, "max_bytes of each pull")
	raw := fs.Bool("include-raw", false, "set include_raw")
	body := fs.Int("body", 1<<20, "body `bytes` of each stored message")
	messages := fs.Int("messages", 96, "messages stored before the pulls")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *bin == "" {
		return usageError{errors.New("pullmem: --storaged is required")}
	}
	dir, err := os.MkdirTemp("", "storaged-pullmem-")
	if err != nil {
		return err
	}
	// Small commitlog files: the mapped (file-backed) pages of the
	// preallocated files count in VmHWM too, and are not what is measured.
	sargs := []string{"--data-dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--file-size", "128MiB"}
	sargs = append(sargs, strings.Fields(*extra)...)
	p, err := startProc(ctx, "storaged", *bin, sargs, io.Discard, func() { os.RemoveAll(dir) })
	if err != nil {
		return err
	}
	defer p.Stop()
	pid := strconv.Itoa(p.cmd.Process.Pid)

	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4**maxBytes+(8<<20))))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := storagedv1.NewMessageStoreServiceClient(cc)
	payload := make([]byte, *body)
	for i := 0; i < *messages; i++ {
		if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "pullmem", Body: payload}}); err != nil {
			return fmt.Errorf("put %d: %w", i, err)
		}
	}
	for next := int64(0); next < int64(*messages); { // until every message is visible
		res, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "pullmem", QueueOffset: next,
			MaxMessages: 1, Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			return fmt.Errorf("wait for message %d: %w", next, err)
		}
		next = res.GetNextOffset()
	}
	before, err := procStatusKiB(pid, "VmHWM")
	if err != nil {
		return err
	}
	// The peak of anonymous memory (the Go heap and stacks, not the
	// mapped commitlog) is sampled: /proc keeps only the peak of the total.
	anonBefore, _ := procStatusKiB(pid, "RssAnon")
	peakAnon := anonBefore
	sampleDone := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleDone:
				return
			case <-t.C:
				if n, err := procStatusKiB(pid, "RssAnon"); err == nil && n > peakAnon {
					peakAnon = n
				}
			}
		}
	}()
	var (
		mu                 sync.Mutex
		served, refused    int
		bytesIn            int64
		firstErr           error
		perPull            = *maxBytes / *body
		offsets            = max(*messages-perPull, 1)
		start              = time.Now()
		refusedWithoutInfo int
	)
	for r := 0; r < *rounds; r++ {
		var wg sync.WaitGroup
		for i := 0; i < *pulls; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &storagedv1.PullMessagesRequest{Topic: "pullmem", QueueOffset: int64((i*7 + r) % offsets),
					MaxMessages: 1024, MaxBytes: int32(*maxBytes), IncludeRaw: *raw}
				for {
					res, err := client.PullMessages(ctx, req)
					mu.Lock()
					if err == nil {
						served++
						for _, m := range res.GetMessages() {
							bytesIn += int64(len(m.GetBody()) + len(m.GetRaw()))
						}
						mu.Unlock()
						return
					}
					delay, ok := retryDelay(err)
					if !ok {
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					refused++
					if delay <= 0 {
						refusedWithoutInfo++
						delay = 100 * time.Millisecond
					}
					mu.Unlock()
					select {
					case <-time.After(delay):
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	close(sampleDone)
	<-sampled
	after, err := procStatusKiB(pid, "VmHWM")
	if err != nil {
		return err
	}
	rss, _ := procStatusKiB(pid, "VmRSS")
	fmt.Fprintf(stdout, "pullmem: %d rounds x %d concurrent pulls, max_bytes %d MiB, include_raw %v, %d x %d KiB stored\n",
		*rounds, *pulls, *maxBytes>>20, *raw, *messages, *body>>10)
	fmt.Fprintf(stdout, "  served %d pulls (%d MiB) in %v; refused %d times with RESOURCE_EXHAUSTED (%d without RetryInfo)\n",
		served, bytesIn>>20, elapsed.Round(time.Millisecond), refused, refusedWithoutInfo)
	fmt.Fprintf(stdout, "  server VmHWM before the pulls %d MiB, after %d MiB; VmRSS after %d MiB\n", before>>10, after>>10, rss>>10)
	fmt.Fprintf(stdout, "  server RssAnon before the pulls %d MiB, peak during them %d MiB (sampled every 2 ms)\n", anonBefore>>10, peakAnon>>10)
	if firstErr != nil {
		return fmt.Errorf("pullmem: a pull failed: %w", firstErr)
	}
	return nil
}

// retryDelay reports whether err is RESOURCE_EXHAUSTED, and its RetryInfo
// delay (0 without one).
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, true
}

// procStatusKiB reads one of VmHWM, VmRSS, RssAnon of /proc/PID/status
// in KiB (prometheus/procfs, as sampleProc).
func procStatusKiB(pid, key string) (int64, error) {
	n, err := strconv.Atoi(pid)
	if err != nil {
		return 0, err
	}
	p, err := procfs.NewProc(n)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("/proc/%s/status: %w", pid, err)
	}
	switch key {
	case "VmHWM":
		return int64(st.VmHWM / 1024), nil
	case "VmRSS":
		return int64(st.VmRSS / 1024), nil
	case "RssAnon":
		return int64(st.RssAnon / 1024), nil
	}
	return 0, fmt.Errorf("/proc/%s/status: no %s", pid, key)
}
