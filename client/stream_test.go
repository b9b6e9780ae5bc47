package client

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// PutMessageStream answers each message from the script (see scripted),
// on a goroutine of its own, after streamGate if set; it breaks the
// stream at breakAt unanswered messages; a hanging member reads and never
// answers.
func (s *scripted) PutMessageStream(stream grpc.BidiStreamingServer[storagedv1.PutMessageStreamRequest, storagedv1.PutMessageStreamResponse]) error {
	ctx := stream.Context()
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	var sendMu sync.Mutex
	var wg sync.WaitGroup
	unanswered := 0 // guarded by s.mu
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			wg.Wait() // every answer sent, then OK
			return nil
		}
		if err != nil {
			return err
		}
		resp, gate, brk := s.streamMessage(req, &unanswered)
		if brk {
			s.mu.Lock()
			ok := s.breakOK
			s.mu.Unlock()
			if ok {
				return nil // ended OK: the unanswered messages were not stored
			}
			return status.Error(codes.Unavailable, "scripted: connection reset")
		}
		if resp == nil {
			continue // hanging
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return
				}
			}
			s.mu.Lock()
			unanswered--
			s.mu.Unlock()
			sendMu.Lock()
			defer sendMu.Unlock()
			_ = stream.Send(resp)
		}()
	}
}

// streamMessage counts a stream message and makes its answer: nil when
// the member hangs; brk: break the stream now.
func (s *scripted) streamMessage(req *storagedv1.PutMessageStreamRequest, unanswered *int) (
	resp *storagedv1.PutMessageStreamResponse, gate chan struct{}, brk bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onPut != nil {
		defer s.onPut()
	}
	s.puts++
	s.keys = append(s.keys, req.GetMessage().GetProperties()[UniqKeyProperty])
	*unanswered++
	s.maxUnanswered = max(s.maxUnanswered, *unanswered)
	if s.streamSeen != nil {
		select {
		case s.streamSeen <- *unanswered:
		default:
		}
	}
	if s.breakAt > 0 && *unanswered >= s.breakAt {
		s.breakAt = 0
		return nil, nil, true
	}
	if s.hang {
		return nil, nil, false
	}
	var err error
	if len(s.script) > 0 {
		err = s.script[min(s.puts, len(s.script))-1]
	}
	resp = &storagedv1.PutMessageStreamResponse{RequestId: req.GetRequestId()}
	if err == nil {
		resp.Status = storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK
		resp.Result = &storagedv1.AppendResult{QueueOffset: int64(s.puts)}
		return resp, s.streamGate, false
	}
	st := status.Convert(err)
	resp.Code, resp.ErrorMessage = int32(st.Code()), st.Message()
	resp.Status = storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNKNOWN_ERROR
	for _, d := range st.Details() {
		if in, ok := d.(*errdetails.ErrorInfo); ok {
			resp.Reason = in.GetReason()
			if in.GetMetadata()["stored"] == "unknown" { // appended, durability unknown
				resp.Result = &storagedv1.AppendResult{QueueOffset: int64(s.puts)}
			}
		}
	}
	return resp, s.streamGate, false
}

func (s *scripted) streamCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

func newStream(t *testing.T, tr *LeaderTracker, opts StreamOptions) *Stream {
	t.Helper()
	st, err := tr.NewStream(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// streamPut puts one message on st (keyed by key unless empty), within
// 10 s: a hang, not a timing assertion.
func streamPut(st *Stream, key string) (*storagedv1.PutMessageResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := &storagedv1.Message{Topic: "T", Body: []byte("b")}
	if key != "" {
		m.Properties = map[string]string{UniqKeyProperty: key}
	}
	return st.Put(ctx, m)
}

// recv waits (10 s at most: a hang) for a value from ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10 s", what)
		panic("unreachable")
	}
}

// TestStreamAnswers: each message's answer comes back as the unary put's
// would: code 0 as the response, another code as a status error with
// that code and reason (NothingStored only for 14), a refusal (14) sent
// again on a new stream up to MaxAttempts, an unknown outcome sent again
// for a keyed message only.
func TestStreamAnswers(t *testing.T) {
	unknown := statusErr(codes.DeadlineExceeded, info("FLUSH_SLAVE_TIMEOUT", map[string]string{"outcome": "unknown"}))
	busy := statusErr(codes.Unavailable, info("OS_PAGE_CACHE_BUSY", nil))
	for _, tc := range []struct {
		name    string
		key     string
		script  []error
		puts    int
		streams int
		code    codes.Code
		reason  string
	}{
		{"OK", "", []error{nil}, 1, 1, codes.OK, ""},
		{"illegal", "", []error{statusErr(codes.InvalidArgument, info("MESSAGE_ILLEGAL", nil))}, 1, 1, codes.InvalidArgument, "MESSAGE_ILLEGAL"},
		{"internal, appended", "", []error{statusErr(codes.Internal, info("UNKNOWN_ERROR", map[string]string{"stored": "unknown"}))},
			1, 1, codes.Internal, "UNKNOWN_ERROR"},
		{"replication timeout, unkeyed", "", []error{unknown, nil}, 1, 1, codes.DeadlineExceeded, "FLUSH_SLAVE_TIMEOUT"},
		{"replication timeout, keyed, then OK", "k", []error{unknown, nil}, 2, 2, codes.OK, ""},
		{"busy, then OK", "", []error{busy, nil}, 2, 2, codes.OK, ""},
		{"busy until the attempts run out", "", []error{busy}, 3, 3, codes.Unavailable, "OS_PAGE_CACHE_BUSY"},
		// Once a send's outcome was unknown, the error says so (and first).
		{"replication timeout, keyed, then busy", "k", []error{unknown, busy}, 3, 3, codes.DeadlineExceeded, "FLUSH_SLAVE_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScripted(t)
			s.set(leader, true, 1, tc.script...)
			s.window = 10 * time.Minute
			tr := newTracker(t, Options{MaxAttempts: 3}, s)
			st := newStream(t, tr, StreamOptions{})
			resp, err := streamPut(st, tc.key)
			if status.Code(err) != tc.code || s.putCount() != tc.puts || s.streamCount() != tc.streams {
				t.Fatalf("put: %v after %d sends on %d streams, want %v after %d on %d", err, s.putCount(), s.streamCount(),
					tc.code, tc.puts, tc.streams)
			}
			if err == nil {
				if resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK || resp.GetResult().GetQueueOffset() != int64(tc.puts) {
					t.Fatalf("response %v, want PUT_OK at queue offset %d", resp, tc.puts)
				}
				return
			}
			v := Classify(err)
			if v.NothingStored != (tc.code == codes.Unavailable) || v.Reason != tc.reason {
				t.Fatalf("Classify(%v) = %+v, want NothingStored %v, reason %s", err, v, tc.code == codes.Unavailable, tc.reason)
			}
		})
	}
}

// TestStreamRefusalFollowsLeader: the leader refuses a message (not the
// leader any more, nothing stored) and another member is elected: the
// message, stamped with a key in a copy, is sent again with that key to
// the new leader, where the next messages go too, on one stream.
func TestStreamRefusalFollowsLeader(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5, statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER"})))
	a.onPut = func() {
		a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
		b.set(leader, true, 6)
	}
	tr := newStampedTracker(t, Options{LookupInterval: time.Millisecond}, a, b)
	st := newStream(t, tr, StreamOptions{})
	m := &storagedv1.Message{Topic: "T", Body: []byte("b")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if _, err := st.Put(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	ka, kb := a.putKeys(), b.putKeys()
	if len(ka) != 1 || len(kb) != 3 || kb[0] != ka[0] || len(ka[0]) != 32 || kb[1] == kb[0] || kb[2] == kb[1] {
		t.Fatalf("keys at the old leader %q, at the new %q: want the refused key sent again first, then two others", ka, kb)
	}
	if len(m.Properties) != 0 {
		t.Fatalf("the caller's message changed: %v", m)
	}
	if a.streamCount() != 1 || b.streamCount() != 1 {
		t.Fatalf("streams a=%d b=%d, want 1 and 1", a.streamCount(), b.streamCount())
	}
}

// TestStreamBreak: the stream breaks (a bare UNAVAILABLE: not ended OK)
// with a keyed and an unkeyed message unanswered on it, and another
// member leads: the keyed one is sent again there with its key, when the
// new leader's dedup window covers it, and stored; the unkeyed one (and
// the keyed one without deduplication) fails with an unknown outcome.
func TestStreamBreak(t *testing.T) {
	for _, window := range []time.Duration{10 * time.Minute, 0} {
		t.Run(window.String(), func(t *testing.T) {
			a, b := startScripted(t), startScripted(t)
			a.set(leader, true, 5)
			a.window, b.window = window, window
			a.streamGate = make(chan struct{}) // never opened: nothing answered before the break
			a.breakAt = 2
			a.onPut = func() {
				if a.puts == 2 {
					a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
					b.set(leader, true, 6)
				}
			}
			tr := newTracker(t, Options{LookupInterval: time.Millisecond}, a, b)
			st := newStream(t, tr, StreamOptions{})
			keyedErr, unkeyedErr := make(chan error, 1), make(chan error, 1)
			go func() {
				_, err := streamPut(st, "k")
				keyedErr <- err
			}()
			go func() {
				_, err := streamPut(st, "")
				unkeyedErr <- err
			}()
			err := recv(t, unkeyedErr, "unkeyed put's end")
			if err == nil || Classify(err).NothingStored || errors.Is(err, ErrClosed) || status.Code(err) != codes.Unavailable {
				t.Fatalf("unkeyed put on a broken stream: %v, want an unknown outcome (UNAVAILABLE, not NothingStored)", err)
			}
			err = recv(t, keyedErr, "keyed put's end")
			if window > 0 && err != nil {
				t.Fatalf("keyed put on a broken stream: %v", err)
			}
			if window == 0 && (err == nil || Classify(err).NothingStored) {
				t.Fatalf("keyed put on a broken stream without deduplication: %v, want an unknown outcome", err)
			}
			ka, kb := a.putKeys(), b.putKeys()
			slices.Sort(ka)
			wantB := []string{"k"}
			if window == 0 {
				wantB = nil
			}
			if !slices.Equal(ka, []string{"", "k"}) || !slices.Equal(kb, wantB) {
				t.Fatalf("keys at the old leader %q, at the new %q; want both, and %q", ka, kb, wantB)
			}
		})
	}
}

// TestStreamEndedOK: the server ends the stream OK with messages
// unanswered (as storaged does before its connection's age limit): they
// were not stored, and are sent again, keyed or not, on a new stream.
func TestStreamEndedOK(t *testing.T) {
	s := startScripted(t)
	s.set(leader, true, 5)
	gate := make(chan struct{})
	s.streamGate = gate // nothing answered before the end
	s.breakAt, s.breakOK = 2, true
	s.onPut = func() {
		if s.puts == 2 {
			s.streamGate = nil // the messages sent again are answered
		}
	}
	defer close(gate)
	tr := newTracker(t, Options{}, s)
	st := newStream(t, tr, StreamOptions{})
	errs := make(chan error, 2)
	for _, key := range []string{"k", ""} {
		go func() {
			_, err := streamPut(st, key)
			errs <- err
		}()
	}
	for range 2 {
		if err := recv(t, errs, "Put's end"); err != nil {
			t.Fatalf("a Put on a stream that ended OK: %v", err)
		}
	}
	keys := s.putKeys()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"", "", "k", "k"}) || s.streamCount() != 2 {
		t.Fatalf("keys sent %q on %d streams, want each message twice, on 2 streams", keys, s.streamCount())
	}
}

// TestStreamCallerDeadline: an unkeyed message unanswered when its Put's
// ctx ends is an unknown outcome; the stream is left (the member doubted)
// and the next Put opens another. The test ends the ctx once the message
// is at the server: a short deadline could end it during the lookup or
// before the message was sent, another case (nothing sent).
func TestStreamCallerDeadline(t *testing.T) {
	s := startScripted(t)
	s.set(leader, true, 5)
	s.streamGate = make(chan struct{}) // never opened: the first stream answers nothing
	seen := make(chan int, 10)
	s.streamSeen = seen
	tr := newTracker(t, Options{}, s)
	st := newStream(t, tr, StreamOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		_, err := st.Put(ctx, &storagedv1.Message{Topic: "T", Body: []byte("b")})
		errs <- err
	}()
	recv(t, seen, "the message at the server")
	cancel()
	if err := recv(t, errs, "the Put's end"); status.Code(err) != codes.Canceled || Classify(err).NothingStored || NothingStored(err) {
		t.Fatalf("a Put whose ctx ended unanswered: %v, want an unknown outcome (CANCELLED)", err)
	}
	s.mu.Lock()
	s.streamGate = nil
	s.mu.Unlock()
	if _, err := streamPut(st, ""); err != nil {
		t.Fatal(err)
	}
	if s.streamCount() != 2 || s.putCount() != 2 {
		t.Fatalf("%d messages on %d streams, want 2 on 2", s.putCount(), s.streamCount())
	}
}

// TestStreamAttemptTimeout: the leader stops answering (a paused
// process): a keyed message unanswered for AttemptTimeout cuts the
// stream, and is sent again with its key to the member that leads then.
// AttemptTimeout bounds the message at the new leader too (answered late
// on a loaded machine, it is sent again there with its key: the behaviour
// under test), so repeats there are compacted; it is 1 s, not a few ms, so
// that the put does not run out of attempts, and the leader check is off
// (after its default 500 ms it would cut the stream first).
func TestStreamAttemptTimeout(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5)
	a.hang = true
	a.window, b.window = 10*time.Minute, 10*time.Minute
	a.onPut = func() {
		a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
		b.set(leader, true, 6)
	}
	tr := newTracker(t, Options{AttemptTimeout: time.Second, LeaderCheckAfter: -1, LookupInterval: time.Millisecond}, a, b)
	st := newStream(t, tr, StreamOptions{})
	if _, err := streamPut(st, "k"); err != nil {
		t.Fatalf("keyed put to a hanging leader: %v", err)
	}
	if ka, kb := a.putKeys(), slices.Compact(b.putKeys()); !slices.Equal(ka, []string{"k"}) || !slices.Equal(kb, []string{"k"}) {
		t.Fatalf("keys at the old leader %q, at the new %q (repeats compacted); want k at both", ka, kb)
	}
}

// TestStreamMaxInFlight: with MaxInFlight n and 2n Puts at once, the
// server holds n messages unanswered and the other Puts wait for room,
// sending nothing; once answers flow every Put succeeds, the server never
// having more than n unanswered.
func TestStreamMaxInFlight(t *testing.T) {
	const n = 4
	s := startScripted(t)
	s.set(leader, true, 1)
	gate := make(chan struct{})
	s.streamGate = gate
	seen := make(chan int, 100)
	s.streamSeen = seen
	tr := newTracker(t, Options{}, s)
	st := newStream(t, tr, StreamOptions{MaxInFlight: n})
	waiting := make(chan struct{}, 100)
	st.roomWait = func() { waiting <- struct{}{} }
	errs := make(chan error, 2*n)
	for range 2 * n {
		go func() {
			_, err := streamPut(st, "")
			errs <- err
		}()
	}
	for recv(t, seen, "message at the server") < n {
	}
	for range n {
		recv(t, waiting, "Put waiting for room")
	}
	s.mu.Lock()
	got := s.puts
	s.streamGate = nil // the next messages are answered at once
	s.mu.Unlock()
	if got != n {
		t.Fatalf("the server received %d messages with %d Puts waiting for room, want %d", got, n, n)
	}
	close(gate)
	for range 2 * n {
		if err := recv(t, errs, "Put's end"); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.puts != 2*n || s.maxUnanswered != n {
		t.Fatalf("the server received %d messages, at most %d unanswered; want %d and %d", s.puts, s.maxUnanswered, 2*n, n)
	}
}

// TestStreamClose: Close ends a Put waiting for its answer (an unknown
// outcome) and one waiting for room, both with ErrClosed, and every Put
// after it; goleak (TestMain) checks its goroutines ended.
func TestStreamClose(t *testing.T) {
	s := startScripted(t)
	s.set(leader, true, 1)
	s.streamGate = make(chan struct{}) // never opened
	seen := make(chan int, 10)
	s.streamSeen = seen
	tr := newTracker(t, Options{}, s)
	st, err := tr.NewStream(StreamOptions{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{}, 10)
	st.roomWait = func() { waiting <- struct{}{} }
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := streamPut(st, "")
			errs <- err
		}()
	}
	recv(t, seen, "message at the server")
	recv(t, waiting, "Put waiting for room")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// The message sent (unanswered) may be stored; the one waiting for
	// room was never sent (NothingStored tells them apart).
	sentOrNot := map[bool]int{}
	for range 2 {
		err := recv(t, errs, "Put's end after Close")
		if !errors.Is(err, ErrClosed) || Classify(err).NothingStored {
			t.Fatalf("a Put waiting at Close: %v, want ErrClosed, not NothingStored", err)
		}
		sentOrNot[NothingStored(err)]++
	}
	if sentOrNot[true] != 1 || sentOrNot[false] != 1 {
		t.Fatalf("NothingStored of the two Puts cut by Close: %v, want one of each", sentOrNot)
	}
	if _, err := streamPut(st, ""); !errors.Is(err, ErrClosed) || !NothingStored(err) {
		t.Fatalf("a Put after Close: %v, want ErrClosed, NothingStored", err)
	}
	if s.putCount() != 1 {
		t.Fatalf("the server received %d messages, want 1", s.putCount())
	}
}

func TestStreamOptions(t *testing.T) {
	s := startScripted(t)
	tr := newTracker(t, Options{}, s)
	for _, n := range []int{-1, MaxStreamInFlight + 1} {
		if _, err := tr.NewStream(StreamOptions{MaxInFlight: n}); err == nil || !strings.Contains(err.Error(), "MaxInFlight") {
			t.Errorf("MaxInFlight %d: %v", n, err)
		}
	}
	st := newStream(t, tr, StreamOptions{})
	if cap(st.room) != DefaultStreamInFlight {
		t.Fatalf("default MaxInFlight %d", cap(st.room))
	}
}

// TestStreamLeaderCheck: a keyed message waits on a stream to a leader
// that stopped answering (no AttemptTimeout here); once the leader check
// finds another member leading in a later term, the stream is cut and
// the message sent there with its key.
func TestStreamLeaderCheck(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5)
	a.hang = true
	a.window, b.window = 10*time.Minute, 10*time.Minute
	a.onPut = func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		base := b.probes
		b.onProbe = func(s *scripted) {
			if s.probes-base > 2 { // a few checks first find it following
				s.role, s.ready, s.term = leader, true, 6
			}
		}
	}
	tr := newTracker(t, Options{AttemptTimeout: -1, LeaderCheckAfter: 10 * time.Millisecond, LookupInterval: time.Millisecond}, a, b)
	st := newStream(t, tr, StreamOptions{})
	if _, err := streamPut(st, "k"); err != nil {
		t.Fatalf("keyed put to a hanging leader: %v", err)
	}
	if ka, kb := a.putKeys(), b.putKeys(); !slices.Equal(ka, []string{"k"}) || !slices.Equal(kb, []string{"k"}) {
		t.Fatalf("keys at the old leader %q, at the new %q; want k at both", ka, kb)
	}
	if b.probeCount() < 3 || tr.Leader() != b.addr {
		t.Fatalf("b probed %d times, leader %q", b.probeCount(), tr.Leader())
	}
}

// TestStreamCallOptions: StreamOptions.CallOptions go to each gRPC
// stream the Stream opens (grpc.OnFinish observes each one's end: one per
// stream, the refused one's and the one to the new leader).
func TestStreamCallOptions(t *testing.T) {
	a, b := startScripted(t), startScripted(t)
	a.set(leader, true, 5, statusErr(codes.Unavailable, info("SERVICE_NOT_AVAILABLE", map[string]string{"cause": "NOT_LEADER"})))
	a.onPut = func() {
		a.role, a.ready = storagedv1.ReplicaRole_REPLICA_ROLE_FOLLOWER, false
		b.set(leader, true, 6)
	}
	finished := make(chan error, 4)
	tr := newTracker(t, Options{LookupInterval: time.Millisecond}, a, b)
	st := newStream(t, tr, StreamOptions{CallOptions: []grpc.CallOption{grpc.OnFinish(func(err error) { finished <- err })}})
	if _, err := streamPut(st, "k"); err != nil {
		t.Fatal(err)
	}
	recv(t, finished, "the refused stream's end") // half-closed after the refusal
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	recv(t, finished, "the second stream's end")
	select {
	case err := <-finished:
		t.Fatalf("a third stream ended (%v): want 2", err)
	default:
	}
}
