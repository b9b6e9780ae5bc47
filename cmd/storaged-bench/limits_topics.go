package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// topicsConfig is the topics scenario: Topics topics with one message
// each (one unary PutMessage per topic, queue 0), then a restart.
type topicsConfig struct {
	Topics      int    `json:"topics"`
	Concurrency int    `json:"concurrency"`
	BodySize    int    `json:"body_size"`
	Prefix      string `json:"prefix"`
}

func defaultTopicsConfig() topicsConfig {
	return topicsConfig{Topics: goalCQTopics, Concurrency: 8, BodySize: 16, Prefix: "limits-topic-"}
}

func (c *topicsConfig) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Topics, "topics", c.Topics, "topics: number of `topics`, one message each")
	fs.IntVar(&c.Concurrency, "topics-concurrency", c.Concurrency, "topics: puts in flight")
	fs.IntVar(&c.BodySize, "topics-body-size", c.BodySize, "topics: body `bytes` of each message")
}

func (c *topicsConfig) validate() error {
	if c.Topics <= 0 || c.Concurrency <= 0 || c.BodySize <= 0 {
		return errors.New("--topics, --topics-concurrency and --topics-body-size must be positive")
	}
	return nil
}

func (c *topicsConfig) topic(i int) string { return fmt.Sprintf("%s%05d", c.Prefix, i) }

// TopicsResult is what the topics scenario measured.
type TopicsResult struct {
	topicsConfig
	// EmptyAtServing is /proc of the first process at SERVING, on an
	// empty data dir: what a store costs before any topic.
	EmptyAtServing procSample       `json:"empty_at_serving"`
	PutSeconds     float64          `json:"put_seconds"`
	PutOK          int64            `json:"put_ok"`
	PutErrors      map[string]int64 `json:"put_errors,omitempty"` // gRPC code or put status → count
	BeforeStop     procSample       `json:"before_stop"`          // the first process, after its puts
	ConsumeQueue   dirUsage         `json:"consume_queue"`        // data-dir/consumequeue after the first stop
	// CQBytesPerTopic is ConsumeQueue.AllocatedBytes / PutOK; the goal is
	// goalCQBytes for goalCQTopics topics.
	CQBytesPerTopic float64 `json:"cq_allocated_bytes_per_topic"`
	// RestartSeconds is the time from the start of the second process to
	// the health of MessageStoreService SERVING; AtServing is /proc then:
	// its WriteBytes are what the restart wrote.
	RestartSeconds float64    `json:"restart_to_serving_seconds"`
	AtServing      procSample `json:"at_serving"`
	// Found counts the topics whose message a pull from offset 0 returned
	// after the restart; TouchPeak is the peaks of /proc during those
	// pulls (every queue touched once), AfterTouch /proc at their end.
	Found        int64            `json:"found_after_restart"`
	TouchErrors  map[string]int64 `json:"touch_errors,omitempty"`
	TouchSeconds float64          `json:"touch_seconds"`
	TouchPeak    procSample       `json:"touch_peak"`
	AfterTouch   procSample       `json:"after_touch"`
	// ConsumeQueueAfter is data-dir/consumequeue after the second stop.
	ConsumeQueueAfter dirUsage `json:"consume_queue_after_restart"`
	// MaxOpenQueueFiles is --max-open-queue-files of the storaged command
	// line, else the binary's default from its -h ("" without the flag).
	MaxOpenQueueFiles string `json:"max_open_queue_files,omitempty"`
}

// maxOpenQueueFilesFlag is the storaged flag that bounds the consume-queue
// files held open (issue 11); revisions before it lack it.
const maxOpenQueueFilesFlag = "max-open-queue-files"

// topics runs the topics scenario.
func (l *limitsRun) topics(ctx context.Context) (*TopicsResult, error) {
	c := l.o.topics
	dir, cleanup, err := l.dataDir(scenarioTopics)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res := &TopicsResult{topicsConfig: c, MaxOpenQueueFiles: flagValue(strings.Fields(l.o.storagedArgs), maxOpenQueueFilesFlag)}
	if res.MaxOpenQueueFiles == "" {
		if ok, def := storagedFlag(l.o.storaged, maxOpenQueueFilesFlag); ok {
			res.MaxOpenQueueFiles = def + " (default)"
		}
	}

	p, _, err := l.start(ctx, "topics-1", dir)
	if err != nil {
		return nil, err
	}
	defer func() { p.Stop() }() // a no-op once stopped
	if res.EmptyAtServing, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	conns, err := dialPlain(p.grpc, 1)
	if err != nil {
		return nil, err
	}
	body := randomBody(c.BodySize)
	t0 := time.Now()
	ok, errs := forEachTopic(ctx, c, conns[0], func(ctx context.Context, cl storagedv1.MessageStoreServiceClient, topic string) string {
		resp, err := cl.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: topic, Body: body}})
		switch {
		case err != nil:
			return errName(err)
		case resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK:
			return statusName(resp.GetStatus())
		}
		return ""
	})
	closeAll(conns)
	res.PutSeconds, res.PutOK, res.PutErrors = time.Since(t0).Seconds(), ok, errs
	l.logf("topics: %d of %d puts PUT_OK in %.1fs (errors %v)", ok, c.Topics, res.PutSeconds, errs)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if res.BeforeStop, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	if err := p.Stop(); err != nil {
		return nil, err
	}
	cq := filepath.Join(dir, "consumequeue")
	if res.ConsumeQueue, err = diskUsage(cq); err != nil {
		return nil, err
	}
	if ok > 0 {
		res.CQBytesPerTopic = float64(res.ConsumeQueue.AllocatedBytes) / float64(ok)
	}

	p, d, err := l.start(ctx, "topics-2", dir)
	if err != nil {
		return nil, err
	}
	res.RestartSeconds = d.Seconds()
	if res.AtServing, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	conns, err = dialPlain(p.grpc, 1)
	if err != nil {
		return nil, err
	}
	w := watchProc(p.pid())
	t0 = time.Now()
	res.Found, res.TouchErrors = forEachTopic(ctx, c, conns[0], func(ctx context.Context, cl storagedv1.MessageStoreServiceClient, topic string) string {
		resp, err := cl.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic, MaxMessages: 1})
		switch {
		case err != nil:
			return errName(err)
		case len(resp.GetMessages()) != 1:
			return "no message"
		}
		return ""
	})
	res.TouchSeconds = time.Since(t0).Seconds()
	closeAll(conns)
	res.TouchPeak, err = w.stop()
	if err != nil {
		return nil, err
	}
	if res.AfterTouch, err = sampleProc(p.pid()); err != nil {
		return nil, err
	}
	if err := p.Stop(); err != nil {
		return nil, err
	}
	if res.ConsumeQueueAfter, err = diskUsage(cq); err != nil {
		return nil, err
	}
	l.logf("topics: restart %.2fs, RSS %s, wrote %s, fds %d; %d found, peak fds %d while touching",
		res.RestartSeconds, mib(float64(res.AtServing.RSSBytes)), mib(float64(res.AtServing.WriteBytes)), res.AtServing.FDs, res.Found, res.TouchPeak.FDs)
	return res, nil
}

// forEachTopic calls f for topics 0..c.Topics-1 with c.Concurrency calls in
// flight on cc, and counts the calls f answers "" (ok) and the others by
// what f answered.
func forEachTopic(ctx context.Context, c topicsConfig, cc *grpc.ClientConn, f func(ctx context.Context, cl storagedv1.MessageStoreServiceClient, topic string) string) (int64, map[string]int64) {
	cl := storagedv1.NewMessageStoreServiceClient(cc)
	var next, ok atomic.Int64
	var errs codeCounts
	var wg sync.WaitGroup
	for range c.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= c.Topics {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				out := f(cctx, cl, c.topic(i))
				cancel()
				if out == "" {
					ok.Add(1)
				} else {
					errs.add(out)
				}
			}
		})
	}
	wg.Wait()
	return ok.Load(), errs.snapshot()
}

// errName names a failed call for the counts: its gRPC code and the
// reason of its ErrorInfo (the RocketMQ status name), if any.
func errName(err error) string {
	code, reason := classify(err)
	if reason == "" {
		return code.String()
	}
	return code.String() + "/" + reason
}

// rows are the summary lines of the topics scenario.
func (t *TopicsResult) rows() []limitRow {
	n := strconv.Itoa(t.Topics) + " topics"
	perTopicGoal := float64(goalCQBytes) / goalCQTopics
	fdGoal := "bounded by --max-open-queue-files"
	if t.MaxOpenQueueFiles != "" {
		fdGoal += " " + t.MaxOpenQueueFiles
	}
	return []limitRow{
		{figure: n + ": puts PUT_OK", value: fmt.Sprintf("%d (%.0f/s)", t.PutOK, float64(t.PutOK)/t.PutSeconds), goal: strconv.Itoa(t.Topics),
			met: check(t.PutOK == int64(t.Topics))},
		{figure: n + ": consume-queue disk (allocated)", value: mib(float64(t.ConsumeQueue.AllocatedBytes)),
			goal: fmt.Sprintf("<= %s at %d", mib(perTopicGoal*float64(t.Topics)), t.Topics),
			met:  check(t.CQBytesPerTopic <= perTopicGoal)},
		{figure: n + ": consume-queue disk, files only (dirs excluded)", value: fmt.Sprintf("%s in %d files, %d dirs",
			mib(float64(t.ConsumeQueue.FileAllocatedBytes)), t.ConsumeQueue.Files, t.ConsumeQueue.Dirs), goal: ""},
		{figure: n + ": consume-queue disk per topic", value: fmt.Sprintf("%.1f KiB", t.CQBytesPerTopic/1024),
			goal: fmt.Sprintf("<= %.1f KiB", perTopicGoal/1024), met: check(t.CQBytesPerTopic <= perTopicGoal)},
		{figure: n + ": restart, start to SERVING", value: fmt.Sprintf("%.2f s", t.RestartSeconds),
			goal: "<= " + goalRestart.String(), met: check(t.RestartSeconds <= goalRestart.Seconds())},
		{figure: n + ": RSS at SERVING", value: mib(float64(t.AtServing.RSSBytes)), goal: "<= " + mib(goalRSSBytes),
			met: check(t.AtServing.RSSBytes <= goalRSSBytes)},
		{figure: n + ": RSS at SERVING without the commitlog mapping", value: mib(float64(t.AtServing.RSSBytes - t.AtServing.CommitLogRSSBytes)),
			goal: "<= " + mib(goalRSSBytes), met: check(t.AtServing.RSSBytes-t.AtServing.CommitLogRSSBytes <= goalRSSBytes)},
		{figure: n + ": RSS at SERVING: anon / commitlog / consumequeue mappings",
			value: fmt.Sprintf("%s / %s / %s", mib(float64(t.AtServing.AnonBytes)), mib(float64(t.AtServing.CommitLogRSSBytes)), mib(float64(t.AtServing.QueueRSSBytes))), goal: ""},
		{figure: n + ": bytes written by the restart, to SERVING", value: mib(float64(t.AtServing.WriteBytes)),
			goal: "<= " + mib(goalRestartWrites), met: check(t.AtServing.WriteBytes <= goalRestartWrites)},
		{figure: n + ": bytes written by the restart, to after reading every queue", value: mib(float64(t.AfterTouch.WriteBytes)),
			goal: "", met: nil},
		{figure: n + ": open fds at SERVING", value: fmt.Sprintf("%d (empty store: %d)", t.AtServing.FDs, t.EmptyAtServing.FDs), goal: fdGoal},
		{figure: n + ": peak open fds, one pull on every queue", value: fmt.Sprintf("%d (%d found)", t.TouchPeak.FDs, t.Found), goal: fdGoal},
		{figure: n + ": peak RSS, one pull on every queue", value: mib(float64(t.TouchPeak.RSSBytes)), goal: ""},
	}
}
