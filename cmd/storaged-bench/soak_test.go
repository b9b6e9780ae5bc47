package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// ackGate lets a test wait for a soak run's acks to reach a count.
type ackGate struct {
	mu      sync.Mutex
	n, want int64
	reached chan struct{}
}

// onAck is the run's hook.
func (g *ackGate) onAck(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n = max(g.n, n)
	if g.reached != nil && g.n >= g.want {
		close(g.reached)
		g.reached = nil
	}
}

// after returns a channel closed once more acks than now have come.
func (g *ackGate) after(more int64) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := make(chan struct{})
	g.want, g.reached = g.n+more, c
	return c
}

type soakOutcome struct {
	res *SoakResult
	err error
}

// await waits for c, failing the test if the run ends first.
func await(t *testing.T, c <-chan struct{}, done <-chan soakOutcome, stderr fmt.Stringer) {
	t.Helper()
	select {
	case <-c:
	case r := <-done:
		t.Fatalf("the run ended early: %v\n%s", r.err, stderr)
	}
}

// TestSoakAgainstGroup runs the soak subcommand's writers against a local
// group of three real storaged processes, kills the leader with SIGKILL
// mid-run, starts it again on its data dir, and checks every ack on every
// member: nothing lost, missing or divergent, no duplicate, and the
// stretches without acks reported whole.
func TestSoakAgainstGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts storaged")
	}
	dir := t.TempDir()
	bin := buildStoraged(t, dir)
	var logs bytes.Buffer
	g, err := startGroup(context.Background(), bin, dir, "--file-size 4MiB", &lockedWriter{w: &logs})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	defer g.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := soakOptions{targets: g.addrs(), members: g.addrs(), topic: "SoakTest", queues: 3, writers: 8, bodySize: 200,
		duration: 5 * time.Minute, gap: 50 * time.Millisecond, verifyWait: time.Minute}
	gate := &ackGate{}
	first := gate.after(300)
	stderr := &lockedWriter{w: &bytes.Buffer{}}
	done := make(chan soakOutcome, 1)
	go func() {
		res, err := runSoak(ctx, o, stderr, gate.onAck)
		done <- soakOutcome{res, err}
	}()
	// 300 acks, the leader killed; 300 more (a new leader takes puts);
	// the killed member started again; 300 more; the end.
	await(t, first, done, stderr)
	lead, err := g.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.members[lead].kill()
	await(t, gate.after(300), done, stderr)
	if err := g.start(ctx, lead); err != nil {
		t.Fatal(err)
	}
	await(t, gate.after(300), done, stderr)
	cancel()
	r := <-done
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, stderr)
	}
	res := r.res
	if !res.OK || res.Lost != 0 || res.Duplicates != 0 || res.Corrupt != 0 || res.RefusedStored != 0 {
		t.Errorf("checks failed: %+v\n%s", res, stderr)
	}
	if res.Acked < 900 || len(res.Members) != 3 {
		t.Errorf("acked %d, members %d: want at least 900 and 3", res.Acked, len(res.Members))
	}
	for _, m := range res.Members {
		if m.Missing != 0 || m.Divergent != 0 || m.Error != "" || m.Read < res.Acked {
			t.Errorf("member %+v: want everything acked read back (%d), nothing missing or divergent", m, res.Acked)
		}
	}
	// How long the kill left writers without an ack is the group's speed,
	// not something to assert (it has been under 50 ms); TestSoakNoteAck
	// shows the stretches are measured. Here the report is only checked
	// to be whole: each listed stretch at least --gap and at most the
	// longest.
	if res.LongestGapMs <= 0 {
		t.Errorf("longest without an ack %v ms after a kill", res.LongestGapMs)
	}
	for _, g := range res.Gaps {
		if g.Ms < res.GapMs || g.Ms > res.LongestGapMs {
			t.Errorf("gap %+v outside [%v, %v] ms", g, res.GapMs, res.LongestGapMs)
		}
	}
}

// TestSoakNoteAck: the soak lists every stretch of at least --gap between
// consecutive acks (from the start of writing) and keeps the longest of
// all, listed or not.
func TestSoakNoteAck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Millisecond) }
	for _, tc := range []struct {
		name    string
		acks    []int // ms after the start of writing, in order
		gaps    [][2]int
		longest float64
	}{
		{"steady", []int{1, 2, 3, 4}, nil, 1},
		{"a hole at the start", []int{60, 61}, [][2]int{{0, 60}}, 60},
		{"exactly the gap", []int{10, 60, 61}, [][2]int{{10, 50}}, 50},
		{"just under", []int{10, 59, 60}, nil, 49},
		{"two holes, the later longer", []int{1, 80, 81, 300}, [][2]int{{1, 79}, {81, 219}}, 219},
	} {
		r := &soakRun{o: soakOptions{gap: 50 * time.Millisecond}, lastAck: t0}
		for _, m := range tc.acks {
			r.noteAck(at(m))
		}
		var want []SoakGap
		for _, g := range tc.gaps {
			want = append(want, SoakGap{Start: at(g[0]).UTC().Format(time.RFC3339Nano), Ms: float64(g[1])})
		}
		if !slices.Equal(r.gaps, want) || ms(r.longest) != tc.longest {
			t.Errorf("%s: gaps %v longest %v, want %v longest %v", tc.name, r.gaps, ms(r.longest), want, tc.longest)
		}
	}
}

// String returns what was written to a lockedWriter over a
// bytes.Buffer, safe beside the writers (a test's failure message).
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.w.(fmt.Stringer); ok {
		return b.String()
	}
	return ""
}

// TestSoakChecksCatch shows that each check of the soak subcommand can
// fail: a run against a real storaged is checked clean, then the store
// or the run's records are made wrong one way at a time (an ack naming
// another put's offset, a put stored twice, a body of the run damaged,
// a second member holding other records) and the check concerned counts
// it; another writer's message on the topic is counted, not failed.
func TestSoakChecksCatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts storaged")
	}
	dir := t.TempDir()
	bin := buildStoraged(t, dir)
	logs := &lockedWriter{w: &bytes.Buffer{}}
	start := func(name string) *proc {
		d := t.TempDir()
		p, err := startProc(context.Background(), name, bin, storagedArgs(bin, d, "--file-size 4MiB --flush-mode sync"), logs, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, logs.String())
		}
		t.Cleanup(func() { p.Stop() })
		return p
	}
	a, b := start("a"), start("b")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := soakOptions{targets: []string{a.grpc}, members: []string{a.grpc}, topic: "SoakChecks", queues: 2, writers: 4, bodySize: 128,
		duration: 5 * time.Minute, gap: time.Minute, verifyWait: 5 * time.Second}
	gate := &ackGate{}
	enough := gate.after(200)
	go func() {
		<-enough
		cancel()
	}()
	r, res, err := soakWrite(ctx, o, io.Discard, gate.onAck)
	if err != nil {
		t.Fatal(err)
	}
	check := func() SoakResult {
		t.Helper()
		c := *res
		c.Members = nil
		r.verify(context.Background(), &c, io.Discard)
		return c
	}
	if c := check(); !c.OK || c.Lost != 0 || c.Members[0].Read != res.Acked+c.UnknownStored {
		t.Fatalf("a clean run checked: %+v", c)
	}

	// An ack naming the offset of another put.
	saved := r.acks[0]
	r.acks[0].offset = r.acks[1].offset
	r.acks[0].queue = r.acks[1].queue
	if c := check(); c.OK || c.Lost != 1 {
		t.Errorf("an ack at another put's offset: lost %d, ok %v; want 1, false", c.Lost, c.OK)
	}
	r.acks[0] = saved

	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	put := func(c storagedv1.MessageStoreServiceClient, q int32, body []byte) {
		t.Helper()
		resp, err := c.PutMessage(context.Background(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: o.topic, QueueId: q, Body: body}})
		if err != nil || resp.Status != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("put: %v %v", resp, err)
		}
	}
	ca := storagedv1.NewMessageStoreServiceClient(conn)

	// Another writer's message: counted, not a failure.
	put(ca, 0, []byte("not the run's"))
	if c := check(); !c.OK || c.Foreign != 1 {
		t.Errorf("another writer's message: foreign %d, ok %v; want 1, true", c.Foreign, c.OK)
	}
	// A put stored twice.
	put(ca, 1, soakBody(r.runID, 0, 0, o.bodySize))
	if c := check(); c.OK || c.Duplicates != 1 {
		t.Errorf("a put stored twice: duplicates %d, ok %v; want 1, false", c.Duplicates, c.OK)
	}
	// A body that names the run but is not one of its puts.
	damaged := soakBody(r.runID, 1, 0, o.bodySize)
	damaged[len(damaged)-1] ^= 1
	put(ca, 0, damaged)
	if c := check(); c.OK || c.Corrupt != 1 {
		t.Errorf("a damaged body: corrupt %d, ok %v; want 1, false", c.Corrupt, c.OK)
	}

	// A second member with the same bodies at the same offsets, but its
	// own records (its own store host and times): every offset diverges.
	connB, err := grpc.NewClient(b.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close()
	cb := storagedv1.NewMessageStoreServiceClient(connB)
	var copied int64
	for q := range int32(o.queues) {
		err := proctest.PullQueue(context.Background(), ca, o.topic, q, func(m *storagedv1.StoredMessage) {
			put(cb, q, m.Body)
			copied++
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	o2 := o
	o2.members = []string{a.grpc, b.grpc}
	r.o = o2
	c := check()
	if c.OK || len(c.Members) != 2 || c.Members[1].Divergent != copied || c.Members[1].Missing != 0 {
		t.Errorf("a member with other records: %+v; want all %d offsets divergent, none missing", c.Members, copied)
	}

	// A member that cannot be read: it fails the run, and the next one is
	// the reference the acks are checked against.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneAddr := gone.Addr().String()
	gone.Close()
	o2.members, o2.verifyWait = []string{goneAddr, a.grpc}, time.Second
	r.o = o2
	c = check()
	if c.OK || c.Members[0].Error == "" || c.Members[1].Error != "" || c.Lost != 0 || c.Duplicates != 1 {
		t.Errorf("an unreadable first member: %+v, lost %d, duplicates %d; want it failed, the second checked (the put stored twice found)",
			c.Members, c.Lost, c.Duplicates)
	}
}
