package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// pullsConfig is the pulls scenario: Pulls concurrent PullMessages of
// MaxBytes each (1024 messages at most, the server's cap), Waves times, on
// a queue holding FillBytes of BodySize messages, against a server
// restarted after the fill so that its VmHWM covers the pulls alone.
type pullsConfig struct {
	Pulls       int   `json:"pulls"`
	Waves       int   `json:"waves"`
	MaxBytes    int   `json:"max_bytes"`
	IncludeRaw  bool  `json:"include_raw"`
	FillBytes   int64 `json:"fill_bytes"`
	BodySize    int   `json:"body_size"`
	Connections int   `json:"connections"`
}

func defaultPullsConfig() pullsConfig {
	return pullsConfig{Pulls: 32, Waves: 2, MaxBytes: 16 << 20, IncludeRaw: true, FillBytes: 40 << 20, BodySize: 32 << 10, Connections: 4}
}

func (c *pullsConfig) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Pulls, "pulls", c.Pulls, "pulls: concurrent PullMessages calls in each wave")
	fs.IntVar(&c.Waves, "pull-waves", c.Waves, "pulls: waves of concurrent pulls")
	fs.IntVar(&c.MaxBytes, "pull-max-bytes", c.MaxBytes, "pulls: max_bytes of each pull")
	fs.BoolVar(&c.IncludeRaw, "pull-include-raw", c.IncludeRaw, "pulls: include_raw of each pull")
	fs.Int64Var(&c.FillBytes, "pull-fill-bytes", c.FillBytes, "pulls: body `bytes` stored in the pulled queue (at least --pull-max-bytes)")
	fs.IntVar(&c.BodySize, "pull-body-size", c.BodySize, "pulls: body `bytes` of each stored message")
	fs.IntVar(&c.Connections, "pull-connections", c.Connections, "pulls: gRPC connections the pulls are spread over")
}

func (c *pullsConfig) validate() error {
	if c.Pulls <= 0 || c.Waves <= 0 || c.MaxBytes <= 0 || c.BodySize <= 0 || c.Connections <= 0 {
		return errors.New("--pulls, --pull-waves, --pull-max-bytes, --pull-body-size and --pull-connections must be positive")
	}
	if c.FillBytes < int64(c.MaxBytes) {
		return errors.New("--pull-fill-bytes must be at least --pull-max-bytes")
	}
	return nil
}

const pullTopic = "limits-pulled"

// PullsResult is what the pulls scenario measured.
type PullsResult struct {
	pullsConfig
	StoredMessages int64 `json:"stored_messages"`
	// Baseline is /proc of the restarted server before the pulls (once its
	// RSS is still); Peak the peaks sampled during the waves, End /proc
	// after them. End.HWMBytes (VmHWM) is the peak RSS since the reset;
	// the goal is checked on what the pulls added, End.HWMBytes -
	// Baseline.RSSBytes (the baseline holds the populated commitlog).
	Baseline procSample `json:"baseline"`
	Peak     procSample `json:"peak"`
	End      procSample `json:"end"`
	// SettleSeconds is how long the RSS took to be still after the start
	// (Settled false: it was not within settleTimeout); HWMReset says
	// whether VmHWM was reset then (/proc/PID/clear_refs), else it covers
	// the whole life of the process.
	SettleSeconds float64 `json:"settle_seconds"`
	Settled       bool    `json:"settled"`
	HWMReset      bool    `json:"hwm_reset"`
	// GoalBytes is goalPullAnswerMult × Pulls × MaxBytes + goalPullHeadroom.
	GoalBytes int64 `json:"goal_bytes"`
	// Answered pulls, their largest answer (bodies + raw records) and the
	// messages of the largest; refusals and failures by gRPC code, and how
	// many RESOURCE_EXHAUSTED carried RetryInfo.
	OK               int64            `json:"ok"`
	MaxAnswerBytes   int64            `json:"max_answer_bytes"`
	MaxAnswerMsgs    int              `json:"max_answer_messages"`
	Failed           map[string]int64 `json:"failed,omitempty"`
	ExhaustedRetry   int64            `json:"resource_exhausted_with_retry_info"`
	WaveSeconds      []float64        `json:"wave_seconds"`
	ClientRecvLimitB int              `json:"client_recv_limit_bytes"`
}

// pulls runs the pulls scenario.
func (l *limitsRun) pulls(ctx context.Context) (*PullsResult, error) {
	c := l.o.pulls
	dir, cleanup, err := l.dataDir(scenarioPulls)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res := &PullsResult{pullsConfig: c, GoalBytes: goalPullAnswerMult*int64(c.Pulls)*int64(c.MaxBytes) + goalPullHeadroom,
		ClientRecvLimitB: dialRecvLimit}

	p, _, err := l.start(ctx, "pulls-fill", dir)
	if err != nil {
		return nil, err
	}
	defer func() { p.Stop() }()
	fill := defaultLoadConfig()
	fill.Method, fill.BodySize, fill.Concurrency = methodBatch, c.BodySize, 2
	fill.BatchSize = max(1, (1<<20)/c.BodySize) // about 1 MiB a call
	fill.Duration, fill.Warmup, fill.Messages = 0, 0, (c.FillBytes+int64(c.BodySize)-1)/int64(c.BodySize)
	fill.Topic, fill.Queues = pullTopic, 1
	s, err := loadOnce(ctx, fill, p.grpc)
	if err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	if s.Messages != fill.Messages {
		return nil, fmt.Errorf("fill: %d of %d messages PUT_OK (errors %v)", s.Messages, fill.Messages, s.ErrorsByCode)
	}
	res.StoredMessages = s.Messages
	if err := p.Stop(); err != nil {
		return nil, err
	}
	if p, _, err = l.start(ctx, "pulls", dir); err != nil {
		return nil, err
	}
	// The allocator populates the rest of the commitlog segment, then the
	// next one, in the background after the start (1 GiB each by
	// default): that is file RSS, not pull memory. Wait until the RSS is
	// still, then reset VmHWM, so that the peak covers the pulls.
	res.SettleSeconds, res.Settled = settleRSS(ctx, p.pid())
	res.HWMReset = resetHWM(p.pid()) == nil
	if res.Baseline, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	conns, err := dialPlain(p.grpc, c.Connections)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	var failed codeCounts
	var ok, retry, maxBytes atomic.Int64
	var maxMsgs atomic.Int64
	w := watchProc(p.pid())
	for range c.Waves {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range c.Pulls {
			cl := storagedv1.NewMessageStoreServiceClient(conns[i%len(conns)])
			wg.Go(func() {
				<-start
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				resp, err := cl.PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: pullTopic, MaxMessages: 1024,
					MaxBytes: int32(c.MaxBytes), IncludeRaw: c.IncludeRaw})
				if err != nil {
					st := status.Convert(err)
					failed.add(st.Code().String())
					if st.Code() == codes.ResourceExhausted && hasRetryInfo(st) {
						retry.Add(1)
					}
					return
				}
				ok.Add(1)
				var n int64
				for _, m := range resp.GetMessages() {
					n += int64(len(m.GetBody()) + len(m.GetRaw()))
				}
				atomicMax(&maxBytes, n)
				atomicMax(&maxMsgs, int64(len(resp.GetMessages())))
			})
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		res.WaveSeconds = append(res.WaveSeconds, time.Since(t0).Seconds())
	}
	if res.Peak, err = w.stop(); err != nil {
		return nil, err
	}
	if res.End, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	res.OK, res.Failed, res.ExhaustedRetry = ok.Load(), failed.snapshot(), retry.Load()
	res.MaxAnswerBytes, res.MaxAnswerMsgs = maxBytes.Load(), int(maxMsgs.Load())
	l.logf("pulls: %d waves of %d: %d answered (largest %s, %d msgs), failed %v; VmHWM %s (baseline RSS %s), goal %s",
		c.Waves, c.Pulls, res.OK, mib(float64(res.MaxAnswerBytes)), res.MaxAnswerMsgs, res.Failed,
		mib(float64(res.End.HWMBytes)), mib(float64(res.Baseline.RSSBytes)), mib(float64(res.GoalBytes)))
	return res, p.Stop()
}

// Bounds of settleRSS: the RSS is still when it moved less than
// settleSlack over settleWindow.
const (
	settleTimeout = time.Minute
	settleWindow  = time.Second
	settleSlack   = 1 << 20
	settlePoll    = 100 * time.Millisecond
)

// settleRSS waits until the VmRSS of pid is still, for at most
// settleTimeout, and returns how long that took and whether it was.
func settleRSS(ctx context.Context, pid int) (float64, bool) {
	t0 := time.Now()
	t := time.NewTicker(settlePoll)
	defer t.Stop()
	var window []uint64 // the samples of the last settleWindow
	for time.Since(t0) < settleTimeout && ctx.Err() == nil {
		s, err := sampleProc(pid)
		if err != nil {
			break
		}
		window = append(window, s.RSSBytes)
		if n := int(settleWindow / settlePoll); len(window) > n {
			window = window[1:]
			if slices.Max(window)-slices.Min(window) < settleSlack {
				return time.Since(t0).Seconds(), true
			}
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return time.Since(t0).Seconds(), false
}

// resetHWM resets the VmHWM of pid to its current RSS (clear_refs 5).
func resetHWM(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

func hasRetryInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// rows are the summary lines of the pulls scenario.
func (r *PullsResult) rows() []limitRow {
	raw := ""
	if r.IncludeRaw {
		raw = ", include_raw"
	}
	name := fmt.Sprintf("%d pulls x %d waves (%s%s)", r.Pulls, r.Waves, mib(float64(r.MaxBytes)), raw)
	refused := r.Failed[codes.ResourceExhausted.String()]
	var other int64
	for k, v := range r.Failed {
		if k != codes.ResourceExhausted.String() {
			other += v
		}
	}
	added := int64(r.End.HWMBytes) - int64(r.Baseline.RSSBytes)
	return []limitRow{
		{figure: name + ": server VmHWM", value: mib(float64(r.End.HWMBytes)), goal: ""},
		{figure: name + ": VmHWM - RSS before the pulls", value: mib(float64(added)), goal: "<= " + mib(float64(r.GoalBytes)) + " or refused",
			met: check(added <= r.GoalBytes && other == 0)},
		{figure: name + ": RSS (anon) before the pulls", value: fmt.Sprintf("%s (%s), still after %.1f s: %v, VmHWM reset: %v",
			mib(float64(r.Baseline.RSSBytes)), mib(float64(r.Baseline.AnonBytes)), r.SettleSeconds, r.Settled, r.HWMReset), goal: ""},
		{figure: name + ": peak RssAnon (sampled)", value: mib(float64(r.Peak.AnonBytes)), goal: ""},
		{figure: name + ": answered / RESOURCE_EXHAUSTED / other", value: fmt.Sprintf("%d / %d (%d RetryInfo) / %d", r.OK, refused, r.ExhaustedRetry, other),
			goal: "refusals with RetryInfo", met: check(other == 0 && refused == r.ExhaustedRetry)},
		{figure: name + ": largest answer", value: fmt.Sprintf("%s, %d msgs", mib(float64(r.MaxAnswerBytes)), r.MaxAnswerMsgs), goal: ""},
	}
}
