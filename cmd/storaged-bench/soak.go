package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// The soak subcommand checks a running deployment from outside, as a
// user of it would: it puts through client.LeaderTracker (every put keyed,
// the client's default) while something else disrupts the members (a
// rolling restart, a deleted pod, a kill -9, a drained node), prints a
// line a second, and lists every stretch of --gap or longer in which no
// put was acknowledged. When it stops (--duration, or SIGINT/SIGTERM) it
// reads every queue it wrote back from every member (--members, with the
// raw records) and checks what an acknowledgement promises:
//
//   - every acknowledged put is at the queue offset its answer named, with
//     its body byte for byte, on every member (lost, missing);
//   - the members hold byte-identical records at every offset they share
//     (divergent);
//   - no put is stored twice (duplicates: every put is keyed, so a retry
//     after an unknown outcome must find the first copy);
//   - no put the client called refused (client.NothingStored) is stored.
//
// It exits 1 when one of them fails, or when no put was acknowledged. A
// standalone storaged (GetReplicaInfo says so) is written through one
// plain connection instead of the tracker. README "A real run on Kubernetes"
// has the run it was written for; the test runs it against a local group
// whose leader is killed.

type soakOptions struct {
	targets    []string
	members    []string
	topic      string
	queues     int
	writers    int
	bodySize   int
	duration   time.Duration
	gap        time.Duration
	verifyWait time.Duration
	out        string
}

// Bounds of the soak subcommand. soakMaxAcks bounds what the run keeps
// (24 bytes an ack, 24 a message read back from the first member): the
// writers stop at it.
const (
	soakMaxAcks    = 20_000_000
	soakPutTimeout = 30 * time.Second
	soakPullBytes  = 4 << 20
	soakPullCount  = 512
	soakMaxExample = 10
	soakRetryWait  = 200 * time.Millisecond
)

// SoakResult is the JSON the soak subcommand writes.
type SoakResult struct {
	Date     string      `json:"date"`
	Machine  MachineInfo `json:"machine"`
	Command  string      `json:"command"`
	Targets  []string    `json:"targets"`
	Topic    string      `json:"topic"`
	Queues   int         `json:"queues"`
	Writers  int         `json:"writers"`
	BodySize int         `json:"body_size"`
	// Seconds is how long the writers ran; Capped says they stopped at
	// soakMaxAcks.
	Seconds      float64 `json:"seconds"`
	Capped       bool    `json:"capped,omitempty"`
	Acked        int64   `json:"acked"`
	AckedPerSec  float64 `json:"acked_per_sec"`
	Unknown      int64   `json:"unknown"`      // the client gave up on the outcome
	Refused      int64   `json:"refused"`      // the client proved nothing stored (client.NothingStored)
	OtherStatus  int64   `json:"other_status"` // answered with a status other than PUT_OK
	LongestGapMs float64 `json:"longest_gap_ms"`
	// Gaps are the stretches of at least GapMs without an ack, in order;
	// one that lasted to the end of writing is Open.
	GapMs float64   `json:"gap_ms"`
	Gaps  []SoakGap `json:"gaps"`
	// Checks of the reference member (the first one read whole):
	// acknowledged puts not at their offset
	// with their body, puts stored twice, bodies that name the run but are
	// not one of its puts byte for byte, messages of other writers on the
	// topic (not a failure), and the puts of unknown or refused outcome
	// found stored.
	Lost          int64    `json:"lost"`
	LostExamples  []string `json:"lost_examples,omitempty"`
	Duplicates    int64    `json:"duplicates"`
	Corrupt       int64    `json:"corrupt"`
	Foreign       int64    `json:"foreign"`
	UnknownStored int64    `json:"unknown_stored"`
	RefusedStored int64    `json:"refused_stored"`
	// Members: every member read back; one that could not be read within
	// --verify-wait has an Error and fails the run.
	Members []SoakMember `json:"members"`
	OK      bool         `json:"ok"`
}

// SoakGap is a stretch without an acknowledged put.
type SoakGap struct {
	Start string  `json:"start"` // the last ack before it (RFC 3339, UTC)
	Ms    float64 `json:"ms"`
	Open  bool    `json:"open,omitempty"`
}

// SoakMember is what one member holds of the run's queues.
type SoakMember struct {
	Addr string `json:"addr"`
	// MaxOffsets are its queues' ends when read.
	MaxOffsets []int64 `json:"max_offsets"`
	Read       int64   `json:"read"`
	// Missing: acknowledged puts past its end (it did not catch up within
	// --verify-wait); Divergent: offsets where its record differs from the
	// reference's.
	Missing   int64  `json:"missing"`
	Divergent int64  `json:"divergent"`
	Error     string `json:"error,omitempty"`
}

func parseSoakOptions(args []string, stderr io.Writer) (soakOptions, error) {
	o := soakOptions{queues: 4, writers: 16, bodySize: 1024, duration: time.Minute, gap: 200 * time.Millisecond,
		verifyWait: 2 * time.Minute, out: "soak.json"}
	var targets, members string
	fs := flag.NewFlagSet("storaged-bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&targets, "targets", "", "comma-separated client `addresses` the puts go to (a Service, or members; required)")
	fs.StringVar(&members, "members", "", "comma-separated client `addresses` of every member, read back at the end (default: --targets)")
	fs.StringVar(&o.topic, "topic", "", "`topic` to write (default: Soak- and a random suffix, new each run)")
	fs.IntVar(&o.queues, "queues", o.queues, "queues written, round robin")
	fs.IntVar(&o.writers, "writers", o.writers, "concurrent unary writers")
	fs.IntVar(&o.bodySize, "body-size", o.bodySize, "message body size in `bytes` (64 to 4 MiB)")
	fs.DurationVar(&o.duration, "duration", o.duration, "how long to write (SIGINT or SIGTERM ends it sooner)")
	fs.DurationVar(&o.gap, "gap", o.gap, "list every stretch at least this long without an ack")
	fs.DurationVar(&o.verifyWait, "verify-wait", o.verifyWait, "how long a member may take to catch up before it is read")
	fs.StringVar(&o.out, "out", o.out, "results JSON `file` (- for stdout)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	o.targets, o.members = splitAddrs(targets), splitAddrs(members)
	if len(o.members) == 0 {
		o.members = o.targets
	}
	if o.topic == "" {
		var b [4]byte
		rand.Read(b[:])
		o.topic = "Soak-" + hex.EncodeToString(b[:])
	}
	var errs []error
	if len(o.targets) == 0 || len(o.targets) > client.MaxMembers || len(o.members) > client.MaxMembers {
		errs = append(errs, fmt.Errorf("--targets is required; at most %d addresses in --targets and in --members", client.MaxMembers))
	}
	if o.queues < 1 || o.queues > 64 || o.writers < 1 || o.writers > 1024 || o.bodySize < 64 || o.bodySize > 4<<20 {
		errs = append(errs, errors.New("--queues 1-64, --writers 1-1024, --body-size 64-4MiB"))
	}
	if o.duration < time.Second || o.duration > 24*time.Hour || o.gap <= 0 || o.verifyWait < 0 {
		errs = append(errs, errors.New("--duration 1s-24h, --gap > 0, --verify-wait >= 0"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(stderr, "storaged-bench soak:", err)
		return o, usageError{err}
	}
	return o, nil
}

func splitAddrs(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func runSoakCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseSoakOptions(args, stderr)
	if err != nil {
		return err
	}
	res, err := runSoak(ctx, o, stderr, nil)
	if err != nil {
		return err
	}
	res.Command = "storaged-bench soak " + strings.Join(args, " ")
	if err := writeJSON(o.out, stdout, res); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("soak: %d acked, %d lost, %d duplicates, %d corrupt, %d refused but stored; members %s", res.Acked, res.Lost,
			res.Duplicates, res.Corrupt, res.RefusedStored, memberFailures(res.Members))
	}
	return nil
}

func memberFailures(ms []SoakMember) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s: %d missing, %d divergent%s", m.Addr, m.Missing, m.Divergent, map[bool]string{true: ", " + m.Error}[m.Error != ""]))
	}
	return strings.Join(parts, "; ")
}

// soakID names one put of the run: its writer and sequence number.
type soakID struct {
	w   int32
	seq int64
}

type soakAck struct {
	id     soakID
	queue  int32
	offset int64
}

// soakRun is one run's writers and what they were told.
type soakRun struct {
	o     soakOptions
	runID string
	// onAck, for tests, sees the number of acks after each one.
	onAck func(n int64)

	mu       sync.Mutex
	acks     []soakAck
	unknown  []soakID
	refused  []soakID
	other    int64
	lastAck  time.Time
	gaps     []SoakGap
	longest  time.Duration
	attempts []atomic.Int64 // per writer: puts begun (the next seq)
}

// soakBody is put seq of writer w in run: a header naming it, then bytes
// drawn from (w, seq), so that any damage to a body is seen.
func soakBody(run string, w int32, seq int64, size int) []byte {
	b := make([]byte, 0, size)
	b = fmt.Appendf(b, "soak %s %d %d ", run, w, seq)
	x := uint64(w)<<40 ^ uint64(seq) ^ 0x9e3779b97f4a7c15
	for len(b) < size {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b = append(b, 'a'+byte(x%26))
	}
	return b
}

// Marks in soakID.w for a body that is not one of the run's puts.
const (
	soakForeign = -1 // not the run's (another writer's message on the topic)
	soakCorrupt = -2 // names the run but is not exactly one of its bodies
)

// parseSoakBody names the put of run a body holds, or marks it foreign or
// corrupt.
func parseSoakBody(run string, body []byte) soakID {
	f := bytes.SplitN(body, []byte(" "), 5)
	if len(f) < 2 || string(f[0]) != "soak" || string(f[1]) != run {
		return soakID{w: soakForeign}
	}
	if len(f) != 5 {
		return soakID{w: soakCorrupt}
	}
	w, err1 := strconv.ParseInt(string(f[2]), 10, 32)
	seq, err2 := strconv.ParseInt(string(f[3]), 10, 64)
	if err1 != nil || err2 != nil || w < 0 || seq < 0 {
		return soakID{w: soakCorrupt}
	}
	id := soakID{int32(w), seq}
	if !bytes.Equal(body, soakBody(run, id.w, id.seq, len(body))) {
		return soakID{w: soakCorrupt}
	}
	return id
}

func (r *soakRun) record(id soakID, resp *storagedv1.PutMessageResponse, err error) (acked int64) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil && resp.GetStatus() == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK && resp.GetResult() != nil:
		r.acks = append(r.acks, soakAck{id: id, queue: resp.Result.QueueId, offset: resp.Result.QueueOffset})
		r.noteAck(now)
	case err == nil:
		r.other++
		r.unknown = append(r.unknown, id) // stored or not, as its status says: checked like an unknown outcome
	case client.NothingStored(err):
		r.refused = append(r.refused, id)
	default:
		r.unknown = append(r.unknown, id)
	}
	return int64(len(r.acks))
}

// noteAck records an ack at now and the gap it ends; r.mu is held.
func (r *soakRun) noteAck(now time.Time) {
	if d := now.Sub(r.lastAck); d >= r.o.gap {
		r.gaps = append(r.gaps, SoakGap{Start: r.lastAck.UTC().Format(time.RFC3339Nano), Ms: ms(d)})
	}
	r.longest = max(r.longest, now.Sub(r.lastAck))
	r.lastAck = now
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runSoak writes until o.duration passes or ctx ends, then reads back and
// checks; progress lines go to stderr. onAck (tests) sees the number of
// acks after each one.
func runSoak(ctx context.Context, o soakOptions, stderr io.Writer, onAck func(int64)) (*SoakResult, error) {
	r, res, err := soakWrite(ctx, o, stderr, onAck)
	if err != nil {
		return nil, err
	}
	// Reading back is not cut short by the signal that ended writing.
	r.verify(context.WithoutCancel(ctx), res, stderr)
	return res, nil
}

// soakWrite runs the writers and fills the write half of the result.
func soakWrite(ctx context.Context, o soakOptions, stderr io.Writer, onAck func(int64)) (*soakRun, *SoakResult, error) {
	tr, err := newSoakPutter(ctx, o.targets)
	if err != nil {
		return nil, nil, err
	}
	defer tr.Close()
	var id [4]byte
	rand.Read(id[:])
	r := &soakRun{o: o, runID: hex.EncodeToString(id[:]), onAck: onAck, attempts: make([]atomic.Int64, o.writers)}
	res := &SoakResult{Date: time.Now().UTC().Format(time.RFC3339), Machine: machineInfo(), Targets: o.targets, Topic: o.topic,
		Queues: o.queues, Writers: o.writers, BodySize: o.bodySize, GapMs: ms(o.gap), Gaps: []SoakGap{}}
	fmt.Fprintf(stderr, "soak: topic %s, %d writers, %d queues, %d B bodies, through %s\n", o.topic, o.writers, o.queues, o.bodySize,
		strings.Join(o.targets, ","))

	wctx, stopWriting := context.WithTimeout(ctx, o.duration)
	defer stopWriting()
	began := time.Now()
	r.lastAck = began
	var capped atomic.Bool
	var wg sync.WaitGroup
	for w := range int32(o.writers) {
		wg.Go(func() {
			for seq := int64(0); wctx.Err() == nil; seq++ {
				r.attempts[w].Store(seq + 1)
				q := int32((int64(w) + seq) % int64(o.queues))
				req := &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: o.topic, QueueId: q,
					Body: soakBody(r.runID, w, seq, o.bodySize)}}
				// An in-flight put outlives the end of writing: its
				// outcome is then known, not cut short.
				pctx, cancel := context.WithTimeout(context.WithoutCancel(wctx), soakPutTimeout)
				resp, err := tr.PutMessage(pctx, req)
				cancel()
				n := r.record(soakID{w, seq}, resp, err)
				if r.onAck != nil && err == nil {
					r.onAck(n)
				}
				if n >= soakMaxAcks {
					capped.Store(true)
					stopWriting()
				}
			}
		})
	}
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		r.progress(wctx, tr, stderr)
	}()
	wg.Wait()
	stopWriting()
	<-progressDone
	ended := time.Now()

	r.mu.Lock()
	defer r.mu.Unlock()
	if d := ended.Sub(r.lastAck); d >= o.gap {
		r.gaps = append(r.gaps, SoakGap{Start: r.lastAck.UTC().Format(time.RFC3339Nano), Ms: ms(d), Open: true})
	}
	res.Seconds = ended.Sub(began).Seconds()
	res.Capped = capped.Load()
	res.Acked, res.Unknown, res.Refused, res.OtherStatus = int64(len(r.acks)), int64(len(r.unknown))-r.other, int64(len(r.refused)), r.other
	res.AckedPerSec = float64(res.Acked) / res.Seconds
	res.LongestGapMs, res.Gaps = ms(r.longest), append(res.Gaps, r.gaps...)
	fmt.Fprintf(stderr, "soak: wrote for %.1f s: acked %d (%.0f/s), unknown %d, refused %d, other status %d; longest without an ack %.0f ms, %d gaps of %v or more\n",
		res.Seconds, res.Acked, res.AckedPerSec, res.Unknown, res.Refused, res.OtherStatus, res.LongestGapMs, len(res.Gaps), o.gap)
	return r, res, nil
}

// soakPutter is what the writers put through: a client.LeaderTracker
// over a group, or one connection to a standalone storaged.
type soakPutter interface {
	PutMessage(ctx context.Context, req *storagedv1.PutMessageRequest, opts ...grpc.CallOption) (*storagedv1.PutMessageResponse, error)
	Leader() string
	Close() error
}

// newSoakPutter asks the first target what it is: a standalone storaged
// gets a plain client (the tracker looks for a group's leader), anything
// else the tracker over every target.
func newSoakPutter(ctx context.Context, targets []string) (soakPutter, error) {
	cc, err := grpc.NewClient(targets[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c := storagedv1.NewMessageStoreServiceClient(cc)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	info, err := c.GetReplicaInfo(cctx, &storagedv1.GetReplicaInfoRequest{})
	cancel()
	if err == nil && info.Role == storagedv1.ReplicaRole_REPLICA_ROLE_STANDALONE {
		if len(targets) > 1 {
			cc.Close()
			return nil, fmt.Errorf("%s is a standalone storaged: give it alone in --targets", targets[0])
		}
		return standalonePutter{MessageStoreServiceClient: c, cc: cc}, nil
	}
	cc.Close()
	return client.New(client.Options{Addrs: targets})
}

type standalonePutter struct {
	storagedv1.MessageStoreServiceClient
	cc *grpc.ClientConn
}

func (p standalonePutter) Leader() string { return p.cc.Target() + " (standalone)" }
func (p standalonePutter) Close() error   { return p.cc.Close() }

// progress prints a line a second until ctx ends.
func (r *soakRun) progress(ctx context.Context, tr soakPutter, stderr io.Writer) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var before int
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.mu.Lock()
			n, unknown, refused := len(r.acks), len(r.unknown), len(r.refused)
			r.mu.Unlock()
			fmt.Fprintf(stderr, "%s acks %6d/s  total %d  unknown %d  refused %d  leader %s\n", now.UTC().Format("15:04:05"),
				n-before, n, unknown, refused, tr.Leader())
			before = n
		}
	}
}

// soakQueue is a member's copy of one queue: per offset from base, the
// record's digest and the put it holds (or soakForeign, soakCorrupt).
type soakQueue struct {
	base    int64
	digests []uint64
	ids     []soakID
}

// verify reads every member back and fills the checks of res.
func (r *soakRun) verify(ctx context.Context, res *SoakResult, stderr io.Writer) {
	highest := make([]int64, r.o.queues) // per queue, the end the acks need
	for _, a := range r.acks {
		if a.queue >= 0 && int(a.queue) < r.o.queues {
			highest[a.queue] = max(highest[a.queue], a.offset+1)
		}
	}
	// The reference is the first member read whole: the acks are checked
	// against it, the others compared with it.
	var ref []soakQueue
	for _, addr := range r.o.members {
		m := SoakMember{Addr: addr}
		want := highest
		if ref != nil { // the others must reach the reference's ends
			want = make([]int64, len(ref))
			for q := range ref {
				want[q] = ref[q].base + int64(len(ref[q].ids))
			}
		}
		qs, err := r.readMember(ctx, addr, want, &m)
		switch {
		case err != nil:
			m.Error = err.Error()
		case ref == nil:
			ref = qs
			r.checkReference(ref, res)
		default:
			for q := range qs {
				for j, d := range qs[q].digests {
					off := qs[q].base + int64(j)
					if k := off - ref[q].base; k >= 0 && k < int64(len(ref[q].digests)) && ref[q].digests[k] != d {
						m.Divergent++
					}
				}
			}
		}
		for _, a := range r.acks {
			if int(a.queue) < len(m.MaxOffsets) && a.offset >= m.MaxOffsets[a.queue] {
				m.Missing++
			}
		}
		res.Members = append(res.Members, m)
		fmt.Fprintf(stderr, "soak: member %s: read %d, ends %v, missing %d, divergent %d %s\n", addr, m.Read, m.MaxOffsets, m.Missing, m.Divergent, m.Error)
	}
	// A run that stored nothing, or whose members could not be read,
	// proves nothing.
	res.OK = ref != nil && res.Acked > 0 && res.Lost == 0 && res.Duplicates == 0 && res.Corrupt == 0 && res.RefusedStored == 0
	for _, m := range res.Members {
		res.OK = res.OK && m.Missing == 0 && m.Divergent == 0 && m.Error == ""
	}
	fmt.Fprintf(stderr, "soak: lost %d, duplicates %d, corrupt %d, unknown stored %d of %d, refused stored %d of %d: ok %v\n",
		res.Lost, res.Duplicates, res.Corrupt, res.UnknownStored, res.Unknown+res.OtherStatus, res.RefusedStored, res.Refused, res.OK)
}

// checkReference checks the acks against the first member's queues.
func (r *soakRun) checkReference(ref []soakQueue, res *SoakResult) {
	// stored[w] has a bit per seq the writer began.
	stored := make([][]uint64, r.o.writers)
	for w := range stored {
		stored[w] = make([]uint64, (r.attempts[w].Load()+63)/64)
	}
	for q := range ref {
		for _, id := range ref[q].ids {
			switch id.w {
			case soakForeign:
				res.Foreign++
				continue
			case soakCorrupt:
				res.Corrupt++
				continue
			}
			if int(id.w) >= len(stored) || id.seq >= int64(len(stored[id.w]))*64 {
				res.Corrupt++ // a put this run never began
				continue
			}
			word, bit := &stored[id.w][id.seq/64], uint64(1)<<(id.seq%64)
			if *word&bit != 0 {
				res.Duplicates++
			}
			*word |= bit
		}
	}
	has := func(id soakID) bool {
		return int(id.w) < len(stored) && id.seq < int64(len(stored[id.w]))*64 && stored[id.w][id.seq/64]&(1<<(id.seq%64)) != 0
	}
	for _, a := range r.acks {
		var k int64 = -1
		if a.queue >= 0 && int(a.queue) < len(ref) {
			k = a.offset - ref[a.queue].base
		}
		if k < 0 || k >= int64(len(ref[a.queue].ids)) || ref[a.queue].ids[k] != a.id {
			res.Lost++
			if len(res.LostExamples) < soakMaxExample {
				res.LostExamples = append(res.LostExamples, fmt.Sprintf("writer %d put %d acked at queue %d offset %d", a.id.w, a.id.seq, a.queue, a.offset))
			}
		}
	}
	for _, id := range r.unknown {
		if has(id) {
			res.UnknownStored++
		}
	}
	for _, id := range r.refused {
		if has(id) {
			res.RefusedStored++
		}
	}
}

// readMember waits until addr's queues reach want, then reads them whole;
// errors are retried, all within --verify-wait.
func (r *soakRun) readMember(ctx context.Context, addr string, want []int64, m *SoakMember) ([]soakQueue, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(dialRecvLimit)))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	c := storagedv1.NewMessageStoreServiceClient(cc)
	deadline := time.Now().Add(r.o.verifyWait)
	qs := make([]soakQueue, r.o.queues)
	m.MaxOffsets = make([]int64, r.o.queues)
	for q := range int32(r.o.queues) {
		var info *storagedv1.GetQueueInfoResponse
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			info, err = c.GetQueueInfo(cctx, &storagedv1.GetQueueInfoRequest{Topic: r.o.topic, QueueId: q})
			cancel()
			if err == nil && info.MaxOffset >= want[q] || !time.Now().Before(deadline) {
				break
			}
			if err := hold(ctx, soakRetryWait); err != nil {
				return qs, err
			}
		}
		if err != nil {
			if want[q] == 0 {
				continue // never written, and the topic may not exist here
			}
			return qs, fmt.Errorf("queue %d: %w", q, err)
		}
		m.MaxOffsets[q] = info.MaxOffset
		qs[q].base = info.MinOffset
		for next := info.MinOffset; next < info.MaxOffset; {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			p, err := c.PullMessages(cctx, &storagedv1.PullMessagesRequest{Topic: r.o.topic, QueueId: q, QueueOffset: next,
				MaxMessages: soakPullCount, MaxBytes: soakPullBytes, IncludeRaw: true})
			cancel()
			if err != nil {
				// A member restarting (another disruption, a rollout
				// still running) is read again until --verify-wait.
				if time.Now().Before(deadline) {
					if err := hold(ctx, soakRetryWait); err != nil {
						return qs, err
					}
					continue
				}
				return qs, fmt.Errorf("queue %d at %d: %w", q, next, err)
			}
			if len(p.Messages) == 0 {
				return qs, fmt.Errorf("queue %d at %d: nothing read below the end %d", q, next, info.MaxOffset)
			}
			for _, msg := range p.Messages {
				if msg.QueueOffset != next {
					return qs, fmt.Errorf("queue %d: offset %d where %d was expected", q, msg.QueueOffset, next)
				}
				if len(msg.Raw) == 0 {
					return qs, fmt.Errorf("queue %d at %d: no raw record in the answer", q, next)
				}
				sum := sha256.Sum256(msg.Raw)
				id := parseSoakBody(r.runID, msg.Body)
				qs[q].digests = append(qs[q].digests, binary.LittleEndian.Uint64(sum[:8]))
				qs[q].ids = append(qs[q].ids, id)
				m.Read++
				next++
				if next >= info.MaxOffset {
					break
				}
			}
		}
	}
	return qs, nil
}
