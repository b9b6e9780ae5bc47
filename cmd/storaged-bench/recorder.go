package main

import (
	"maps"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// Histogram range: latencies are recorded in microseconds, from 1 µs to
// maxLatency, with 3 significant digits. Longer calls count as maxLatency.
const (
	maxLatency  = time.Minute
	latencyUnit = time.Microsecond
	sigFigs     = 3
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(maxLatency/latencyUnit), sigFigs)
}

// outcome is what one call (or one streamed message) came back with.
type outcome struct {
	msgs    int           // messages the call carried
	bytes   int           // body bytes the call carried
	latency time.Duration // from send to response or error
	status  storagedv1.PutMessageStatus
	// failed: no response, a gRPC error with this code and ErrorInfo
	// reason (for a stream, the error fields of the ack).
	failed bool
	code   codes.Code
	reason string
}

// failure sets the failure fields of o from a gRPC error.
func (o *outcome) failure(err error) {
	o.failed = true
	o.code, o.reason = classify(err)
}

// tally accumulates outcomes. Latency is recorded for every call that got
// a response (PUT_OK or a stored-but-degraded status such as
// FLUSH_DISK_TIMEOUT); messages and bytes count PUT_OK responses only.
// Failed calls are counted by gRPC code and by ErrorInfo reason; degraded
// responses by status.
type tally struct {
	hist      *hdrhistogram.Histogram
	calls     int64 // calls with a response (ok + degraded)
	okCalls   int64
	msgs      int64 // messages of PUT_OK responses
	bytes     int64 // body bytes of PUT_OK responses
	errors    int64 // failed calls
	errorMsgs int64 // messages of failed calls
	degraded  int64 // calls with a response whose status is not PUT_OK
	byCode    map[string]int64
	byReason  map[string]int64
	byStatus  map[string]int64
}

func newTally() *tally {
	return &tally{hist: newHistogram(), byCode: map[string]int64{}, byReason: map[string]int64{}, byStatus: map[string]int64{}}
}

func (t *tally) add(o *outcome) {
	if o.failed {
		t.errors++
		t.errorMsgs += int64(o.msgs)
		t.byCode[o.code.String()]++
		if o.reason != "" {
			t.byReason[o.reason]++
		}
		return
	}
	t.calls++
	v := int64(o.latency / latencyUnit)
	if v < 1 {
		v = 1
	}
	if err := t.hist.RecordValue(v); err != nil {
		t.hist.RecordValue(t.hist.HighestTrackableValue())
	}
	if o.status == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
		t.okCalls++
		t.msgs += int64(o.msgs)
		t.bytes += int64(o.bytes)
		return
	}
	t.degraded++
	t.byStatus[statusName(o.status)]++
}

// merge adds u into t.
func (t *tally) merge(u *tally) {
	t.hist.Merge(u.hist)
	t.calls += u.calls
	t.okCalls += u.okCalls
	t.msgs += u.msgs
	t.bytes += u.bytes
	t.errors += u.errors
	t.errorMsgs += u.errorMsgs
	t.degraded += u.degraded
	for _, p := range [][2]map[string]int64{{t.byCode, u.byCode}, {t.byReason, u.byReason}, {t.byStatus, u.byStatus}} {
		for k, v := range p[1] {
			p[0][k] += v
		}
	}
}

func (t *tally) reset() {
	t.hist.Reset()
	t.calls, t.okCalls, t.msgs, t.bytes, t.errors, t.errorMsgs, t.degraded = 0, 0, 0, 0, 0, 0, 0
	clear(t.byCode)
	clear(t.byReason)
	clear(t.byStatus)
}

// statusName is the RocketMQ name of s: PUT_OK, FLUSH_DISK_TIMEOUT, …
func statusName(s storagedv1.PutMessageStatus) string {
	const prefix = "PUT_MESSAGE_STATUS_"
	n := s.String()
	if len(n) > len(prefix) && n[:len(prefix)] == prefix {
		return n[len(prefix):]
	}
	return n
}

// classify returns the gRPC code of err and the reason of its
// google.rpc.ErrorInfo, if it has one (the RocketMQ status name for
// storaged's rejections).
func classify(err error) (codes.Code, string) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), ei.GetReason()
		}
	}
	return st.Code(), ""
}

// recorder collects outcomes from many goroutines into shards, so that
// they rarely contend, and keeps measured and warmup load apart. The
// progress loop drains the shards every second.
type recorder struct {
	shards []*shard

	mu       sync.Mutex // guards total and interval
	total    *tally     // measured outcomes drained so far
	interval *tally     // scratch for one progress interval
}

type shard struct {
	mu   sync.Mutex
	meas *tally // measured outcomes since the last drain
	warm *tally // warmup outcomes since the last drain
	_    [64]byte
}

func newRecorder(shards int) *recorder {
	r := &recorder{total: newTally(), interval: newTally()}
	for range shards {
		r.shards = append(r.shards, &shard{meas: newTally(), warm: newTally()})
	}
	return r
}

// record adds o to shard i (taken modulo the number of shards).
func (r *recorder) record(i int, measured bool, o *outcome) {
	s := r.shards[i%len(r.shards)]
	s.mu.Lock()
	if measured {
		s.meas.add(o)
	} else {
		s.warm.add(o)
	}
	s.mu.Unlock()
}

// drain moves what the shards hold into total (measured outcomes only)
// and returns a copy of the interval's outcomes, measured and warmup.
func (r *recorder) drain() *tally {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.interval.reset()
	for _, s := range r.shards {
		s.mu.Lock()
		r.interval.merge(s.meas)
		r.interval.merge(s.warm)
		r.total.merge(s.meas)
		s.meas.reset()
		s.warm.reset()
		s.mu.Unlock()
	}
	return r.interval.clone()
}

// clone returns a deep copy of t.
func (t *tally) clone() *tally {
	c := *t
	c.hist = t.hist.Clone()
	c.byCode, c.byReason, c.byStatus = maps.Clone(t.byCode), maps.Clone(t.byReason), maps.Clone(t.byStatus)
	return &c
}
