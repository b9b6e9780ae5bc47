package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// Phases of the polls scenario: the producer alone, with idle long polls
// held open on empty queues, and with tag-filtered long polls (a tag no
// message has) on a full queue.
const (
	phaseAlone  = "alone"
	phaseIdle   = "idle-polls"
	phaseTagged = "tag-polls"
)

// pollsPhases is the order of the phases in each round: every phase with
// polls comes right after a phase alone, which its ratio compares with.
var pollsPhases = []string{phaseAlone, phaseIdle, phaseAlone, phaseTagged}

// pollsConfig is the polls scenario.
type pollsConfig struct {
	Rounds int `json:"rounds"`
	// Producer is the measured load: unary PutMessage to one queue.
	Producer loadConfig `json:"-"`
	// IdlePolls long polls spread over IdleQueues queues of a topic; each
	// queue holds one message: a poll gets it from offset 0, then waits
	// past it (so that a queue not yet readable after its put is not an
	// error).
	IdlePolls  int `json:"idle_polls"`
	IdleQueues int `json:"idle_queues"`
	// TagPolls long polls with a tag no message has, from offset 0 of a
	// queue holding TagQueueMessages messages.
	TagPolls         int           `json:"tag_polls"`
	TagQueueMessages int64         `json:"tag_queue_messages"`
	Wait             time.Duration `json:"wait_ns"`
	PollConnections  int           `json:"poll_connections"`
}

func defaultPollsConfig() pollsConfig {
	p := defaultLoadConfig()
	p.Concurrency, p.Queues, p.Topic, p.Duration, p.Warmup = 8, 1, "limits-producer", 5*time.Second, time.Second
	return pollsConfig{Rounds: 3, Producer: p, IdlePolls: 2000, IdleQueues: 8, TagPolls: 20, TagQueueMessages: 300000,
		Wait: 30 * time.Second, PollConnections: 4}
}

func (c *pollsConfig) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Rounds, "polls-rounds", c.Rounds, "polls: rounds of the phases alone, idle polls, alone, tag polls")
	fs.IntVar(&c.Producer.Concurrency, "producer-concurrency", c.Producer.Concurrency, "polls: producer PutMessage calls in flight (one queue)")
	fs.IntVar(&c.Producer.BodySize, "producer-body-size", c.Producer.BodySize, "polls: producer body `bytes`")
	fs.DurationVar(&c.Producer.Duration, "producer-duration", c.Producer.Duration, "polls: measured producer time of each phase")
	fs.DurationVar(&c.Producer.Warmup, "producer-warmup", c.Producer.Warmup, "polls: unmeasured producer time before each phase")
	fs.Int64Var(&c.Producer.Messages, "producer-messages", 0, "polls: measure this many producer messages per phase instead of --producer-duration")
	fs.IntVar(&c.IdlePolls, "idle-polls", c.IdlePolls, "polls: idle long polls held open")
	fs.IntVar(&c.IdleQueues, "idle-poll-queues", c.IdleQueues, "polls: queues the idle polls are spread over")
	fs.IntVar(&c.TagPolls, "tag-polls", c.TagPolls, "polls: tag-filtered long polls (a tag no message has)")
	fs.Int64Var(&c.TagQueueMessages, "tag-queue-messages", c.TagQueueMessages, "polls: messages in the queue the tag polls scan")
	fs.DurationVar(&c.Wait, "poll-wait", c.Wait, "polls: PullMessages wait of every poll")
	fs.IntVar(&c.PollConnections, "poll-connections", c.PollConnections, "polls: gRPC connections the polls are spread over")
}

func (c *pollsConfig) validate() error {
	if c.Producer.Messages > 0 {
		c.Producer.Duration = 0
	}
	var errs []error
	if c.Rounds <= 0 || c.IdleQueues <= 0 || c.PollConnections <= 0 || c.TagQueueMessages <= 0 {
		errs = append(errs, errors.New("--polls-rounds, --idle-poll-queues, --poll-connections and --tag-queue-messages must be positive"))
	}
	if c.IdlePolls < 0 || c.TagPolls < 0 || c.Wait <= 0 {
		errs = append(errs, errors.New("--idle-polls and --tag-polls must not be negative, --poll-wait must be positive"))
	}
	if err := c.Producer.validate(); err != nil {
		errs = append(errs, fmt.Errorf("producer: %w", err))
	}
	return errors.Join(errs...)
}

// Topics of the polls scenario.
const (
	idlePollTopic = "limits-idle"
	tagPollTopic  = "limits-tagged"
	tagPollTag    = "limits-stored-tag"
	tagPollFilter = "limits-no-such-tag"
)

// PollsResult is what the polls scenario measured.
type PollsResult struct {
	pollsConfig
	ProducerConcurrency int          `json:"producer_concurrency"`
	ProducerBodySize    int          `json:"producer_body_size"`
	FillSeconds         float64      `json:"fill_seconds"` // putting the tag queue's messages
	Phases              []*pollPhase `json:"phases"`
	// Ratios of each phase with polls to the phase alone right before it,
	// over the rounds.
	IdleP50Ratio   Stat `json:"idle_p50_ratio"`
	IdleP99Ratio   Stat `json:"idle_p99_ratio"`
	TaggedP50Ratio Stat `json:"tagged_p50_ratio"`
	TaggedP99Ratio Stat `json:"tagged_p99_ratio"`
	// Throughput ratios (msgs/s with polls ÷ alone): the producer is a
	// closed loop, so when most calls are fast and a few take the
	// polls' scans, msgs/s shows what p50 hides.
	IdleThroughputRatio   Stat `json:"idle_throughput_ratio"`
	TaggedThroughputRatio Stat `json:"tagged_throughput_ratio"`
}

// pollPhase is one producer run of the polls scenario.
type pollPhase struct {
	Round    int      `json:"round"`
	Name     string   `json:"name"`
	Producer *Summary `json:"producer"`
	// Polls held open during the phase; PollAnswers counts the answers
	// they got (a poll answered is issued again from its next_offset),
	// PollErrors the failures by gRPC code.
	Polls       int              `json:"polls"`
	PollAnswers int64            `json:"poll_answers"`
	PollMsgs    int64            `json:"poll_messages"`
	PollErrors  map[string]int64 `json:"poll_errors,omitempty"`
	ServerCPU   float64          `json:"server_cpu_seconds"`
	P50Ratio    float64          `json:"p50_ratio,omitempty"` // to the phase alone before it
	P99Ratio    float64          `json:"p99_ratio,omitempty"`
	// ThroughputRatio is msgs/s ÷ that of the phase alone before it.
	ThroughputRatio float64 `json:"throughput_ratio,omitempty"`
}

// polls runs the polls scenario.
func (l *limitsRun) polls(ctx context.Context) (*PollsResult, error) {
	c := l.o.polls
	dir, cleanup, err := l.dataDir(scenarioPolls)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	p, _, err := l.start(ctx, "polls", dir)
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	res := &PollsResult{pollsConfig: c, ProducerConcurrency: c.Producer.Concurrency, ProducerBodySize: c.Producer.BodySize}

	// The tag queue, filled by batches; one message in each idle queue.
	t0 := time.Now()
	fill := defaultLoadConfig()
	fill.Method, fill.BatchSize, fill.Concurrency, fill.BodySize = methodBatch, 500, 4, 64
	fill.Duration, fill.Warmup, fill.Messages = 0, 0, c.TagQueueMessages
	fill.Topic, fill.Queues, fill.Tags = tagPollTopic, 1, tagPollTag
	if s, err := loadOnce(ctx, fill, p.grpc); err != nil {
		return nil, fmt.Errorf("fill %s: %w", tagPollTopic, err)
	} else if s.Messages != c.TagQueueMessages {
		return nil, fmt.Errorf("fill %s: %d of %d messages PUT_OK (errors %v, degraded %v)", tagPollTopic, s.Messages, c.TagQueueMessages, s.ErrorsByCode, s.DegradedBy)
	}
	idle := fill
	idle.Method, idle.Messages, idle.Concurrency, idle.Topic, idle.Queues, idle.Tags = methodUnary, int64(c.IdleQueues), 1, idlePollTopic, c.IdleQueues, ""
	if s, err := loadOnce(ctx, idle, p.grpc); err != nil || s.Messages != int64(c.IdleQueues) {
		return nil, fmt.Errorf("fill %s: %v (%+v)", idlePollTopic, err, s)
	}
	res.FillSeconds = time.Since(t0).Seconds()
	l.logf("polls: %d messages in %s/0, %d in %s, %.1fs", c.TagQueueMessages, tagPollTopic, c.IdleQueues, idlePollTopic, res.FillSeconds)

	conns, err := dialPlain(p.grpc, c.PollConnections)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	pid := p.pid()
	var idleP50, idleP99, tagP50, tagP99, idleThr, tagThr []float64
	for round := range c.Rounds {
		var alone *pollPhase
		for _, name := range pollsPhases {
			ph := &pollPhase{Round: round + 1, Name: name}
			var pl *pollers
			switch name {
			case phaseIdle:
				pl = startPollers(ctx, conns, c.IdlePolls, c.Wait, func(i int) *storagedv1.PullMessagesRequest {
					q := int32(i % c.IdleQueues)
					return &storagedv1.PullMessagesRequest{Topic: idlePollTopic, QueueId: q}
				})
			case phaseTagged:
				pl = startPollers(ctx, conns, c.TagPolls, c.Wait, func(int) *storagedv1.PullMessagesRequest {
					return &storagedv1.PullMessagesRequest{Topic: tagPollTopic, Tags: []string{tagPollFilter}}
				})
			}
			if pl != nil {
				ph.Polls = pl.n
				if _, err := waitInflight(ctx, p, func(n int64) bool { return n >= int64(pl.n) }); err != nil {
					pl.stop()
					return nil, fmt.Errorf("%s: %w (poll errors %v)", name, err, pl.errs.snapshot())
				}
			}
			cpu0, err0 := procCPU(pid)
			cfg := c.Producer
			cfg.Label = name
			s, err := loadOnce(ctx, cfg, p.grpc)
			cpu1, err1 := procCPU(pid)
			if pl != nil {
				ph.PollAnswers, ph.PollMsgs, ph.PollErrors = pl.stop()
				if _, werr := waitInflight(ctx, p, func(n int64) bool { return n == 0 }); werr != nil && err == nil {
					err = fmt.Errorf("%s: polls did not end: %w", name, werr)
				}
			}
			if err != nil {
				return nil, err
			}
			if err := errors.Join(err0, err1); err == nil {
				ph.ServerCPU = (cpu1 - cpu0).Seconds()
			}
			s.Target = "storaged"
			s.HostLoad1 = loadAverage()
			ph.Producer = s
			if name == phaseAlone {
				alone = ph
			} else if alone != nil && alone.Producer.Latency.P50Us > 0 && alone.Producer.Latency.P99Us > 0 {
				ph.P50Ratio = float64(s.Latency.P50Us) / float64(alone.Producer.Latency.P50Us)
				ph.P99Ratio = float64(s.Latency.P99Us) / float64(alone.Producer.Latency.P99Us)
				if alone.Producer.MsgsPerSec > 0 {
					ph.ThroughputRatio = s.MsgsPerSec / alone.Producer.MsgsPerSec
				}
				if name == phaseIdle {
					idleP50, idleP99, idleThr = append(idleP50, ph.P50Ratio), append(idleP99, ph.P99Ratio), append(idleThr, ph.ThroughputRatio)
				} else {
					tagP50, tagP99, tagThr = append(tagP50, ph.P50Ratio), append(tagP99, ph.P99Ratio), append(tagThr, ph.ThroughputRatio)
				}
			}
			res.Phases = append(res.Phases, ph)
			l.logf("polls: round %d %-10s %4d polls: %6.0f msgs/s, p50 %s, p99 %s, errors %d, server CPU %.2fs, poll answers %d, poll errors %v, load %.1f",
				ph.Round, name, ph.Polls, s.MsgsPerSec, fmtLatency(s.Latency.P50Us), fmtLatency(s.Latency.P99Us), s.Errors,
				ph.ServerCPU, ph.PollAnswers, ph.PollErrors, s.HostLoad1)
		}
	}
	res.IdleP50Ratio, res.IdleP99Ratio = newStat(idleP50), newStat(idleP99)
	res.TaggedP50Ratio, res.TaggedP99Ratio = newStat(tagP50), newStat(tagP99)
	res.IdleThroughputRatio, res.TaggedThroughputRatio = newStat(idleThr), newStat(tagThr)
	return res, p.Stop()
}

// pollers are long polls held open until stop: each issues its
// PullMessages again (from the answer's next_offset) whenever it is
// answered, so that the server always has n of them waiting.
type pollers struct {
	n       int
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	answers atomic.Int64
	msgs    atomic.Int64
	errs    codeCounts
}

// pollRetryDelay spaces the retries of a poll that failed, so that a
// server refusing polls is not spun on.
const pollRetryDelay = 100 * time.Millisecond

func startPollers(ctx context.Context, conns []*grpc.ClientConn, n int, wait time.Duration, req func(i int) *storagedv1.PullMessagesRequest) *pollers {
	ctx, cancel := context.WithCancel(ctx)
	pl := &pollers{n: n, cancel: cancel}
	for i := range n {
		cl := storagedv1.NewMessageStoreServiceClient(conns[i%len(conns)])
		r := req(i)
		r.Wait = durationpb.New(wait)
		pl.wg.Go(func() {
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, wait+10*time.Second)
				resp, err := cl.PullMessages(cctx, r)
				ccancel()
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					pl.errs.add(errName(err))
					t := time.NewTimer(pollRetryDelay)
					select {
					case <-ctx.Done():
					case <-t.C:
					}
					t.Stop()
					continue
				}
				pl.answers.Add(1)
				pl.msgs.Add(int64(len(resp.GetMessages())))
				r.QueueOffset = resp.GetNextOffset()
			}
		})
	}
	return pl
}

// stop cancels the polls, waits for their goroutines and returns the
// answers, messages and errors they got.
func (pl *pollers) stop() (int64, int64, map[string]int64) {
	pl.cancel()
	pl.wg.Wait()
	return pl.answers.Load(), pl.msgs.Load(), pl.errs.snapshot()
}

// rows are the summary lines of the polls scenario.
func (r *PollsResult) rows() []limitRow {
	var alone, aloneThr, load []float64
	for _, ph := range r.Phases {
		load = append(load, ph.Producer.HostLoad1)
		if ph.Name == phaseAlone {
			alone = append(alone, float64(ph.Producer.Latency.P50Us))
			aloneThr = append(aloneThr, ph.Producer.MsgsPerSec)
		}
	}
	a, at, ld := newStat(alone), newStat(aloneThr), newStat(load)
	goal := fmt.Sprintf("<= %.1fx", goalProducerRatio)
	ratio := func(s Stat) string { return fmt.Sprintf("%.3gx (%.3g-%.3g)", s.Median, s.Min, s.Max) }
	prod := fmt.Sprintf("producer c%d", r.ProducerConcurrency)
	return []limitRow{
		{figure: prod + " alone: p50, msgs/s (host load)", value: fmt.Sprintf("%s, %.0f (%.1f-%.1f)", fmtLatency(int64(a.Median)), at.Median, ld.Min, ld.Max), goal: ""},
		{figure: fmt.Sprintf("%s, %d idle polls: p50 ratio", prod, r.IdlePolls), value: ratio(r.IdleP50Ratio), goal: goal,
			met: check(r.IdleP50Ratio.Median <= goalProducerRatio)},
		{figure: fmt.Sprintf("%s, %d idle polls: p99 ratio", prod, r.IdlePolls), value: ratio(r.IdleP99Ratio), goal: goal,
			met: check(r.IdleP99Ratio.Median <= goalProducerRatio)},
		{figure: fmt.Sprintf("%s, %d tag polls on %d msgs: p50 ratio", prod, r.TagPolls, r.TagQueueMessages), value: ratio(r.TaggedP50Ratio), goal: goal,
			met: check(r.TaggedP50Ratio.Median <= goalProducerRatio)},
		{figure: fmt.Sprintf("%s, %d tag polls on %d msgs: p99 ratio", prod, r.TagPolls, r.TagQueueMessages), value: ratio(r.TaggedP99Ratio), goal: goal,
			met: check(r.TaggedP99Ratio.Median <= goalProducerRatio)},
		{figure: fmt.Sprintf("%s, %d idle polls: msgs/s ratio", prod, r.IdlePolls), value: ratio(r.IdleThroughputRatio), goal: ""},
		{figure: fmt.Sprintf("%s, %d tag polls on %d msgs: msgs/s ratio", prod, r.TagPolls, r.TagQueueMessages), value: ratio(r.TaggedThroughputRatio), goal: ""},
	}
}
