package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// longWait is the long-poll wait of tests that expect a message to arrive:
// a lost wake-up shows as a failure after it, never as a flaky pass.
const longWait = time.Minute

// ctxLong is a context that outlives longWait (the server ends a long poll
// shortly before the call's deadline).
func ctxLong(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*longWait)
	t.Cleanup(cancel)
	return ctx
}

func put(t *testing.T, client storagedv1.MessageStoreServiceClient, m *storagedv1.Message) *storagedv1.AppendResult {
	t.Helper()
	resp, err := client.PutMessage(ctxT(t), &storagedv1.PutMessageRequest{Message: m})
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	return resp.GetResult()
}

// pullWait pulls from queue offset off, waiting (long poll) until at least
// one message is there. Reads see a message once the store dispatched it,
// which is not necessarily when its put returned.
func pullWait(t *testing.T, client storagedv1.MessageStoreServiceClient, req *storagedv1.PullMessagesRequest) *storagedv1.PullMessagesResponse {
	t.Helper()
	req.Wait = durationpb.New(longWait)
	resp, err := client.PullMessages(ctxLong(t), req)
	if err != nil {
		t.Fatalf("pull %s/%d@%d: %v", req.GetTopic(), req.GetQueueId(), req.GetQueueOffset(), err)
	}
	if len(resp.GetMessages()) == 0 {
		t.Fatalf("pull %s/%d@%d: no message after %v (next %d, range [%d, %d))", req.GetTopic(), req.GetQueueId(),
			req.GetQueueOffset(), longWait, resp.GetNextOffset(), resp.GetMinOffset(), resp.GetMaxOffset())
	}
	return resp
}

// waitDispatched returns once the message at queue offset off is readable.
// Reads see a message once the store has dispatched it, shortly after its
// put returns; a pull beyond the dispatched end is OUT_OF_RANGE, so this
// follows the queue from its start, each pull waiting at the end.
func waitDispatched(t *testing.T, client storagedv1.MessageStoreServiceClient, topic string, qid int32, off int64) {
	t.Helper()
	for next := int64(0); next <= off; {
		next = pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: qid, QueueOffset: next, MaxMessages: MaxPullMessages}).GetNextOffset()
	}
}

// rawAt reads n bytes at a commitlog offset straight from the store's file.
func rawAt(t *testing.T, opts storage.Options, offset int64, n int) []byte {
	t.Helper()
	from := offset / opts.FileSize * opts.FileSize
	data, err := os.ReadFile(filepath.Join(opts.Dir, "commitlog", fmt.Sprintf("%020d", from)))
	if err != nil {
		t.Fatal(err)
	}
	return data[offset-from : offset-from+int64(n)]
}

func TestGetMessageByOffsetAndID(t *testing.T) {
	client, _, opts := storeServer(t, nil)
	born := time.UnixMilli(1_700_000_000_123)
	body := []byte("read me back")
	r := put(t, client, &storagedv1.Message{
		Topic: "orders", QueueId: 2, Body: body, Flag: 9, Tags: "tagA", Keys: "k1 k2",
		BornTimestamp: timestamppb.New(born), Properties: map[string]string{"a": "1", "b": "2"},
	})
	waitDispatched(t, client, "orders", 2, r.GetQueueOffset())

	byOffset, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
		Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: r.GetWroteOffset()}})
	if err != nil {
		t.Fatalf("GetMessage by offset: %v", err)
	}
	byID, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
		Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: r.GetMsgId()}})
	if err != nil {
		t.Fatalf("GetMessage by msgId: %v", err)
	}
	for name, m := range map[string]*storagedv1.StoredMessage{"offset": byOffset.GetMessage(), "msgId": byID.GetMessage()} {
		t.Run(name, func(t *testing.T) {
			rec := readRecord(t, opts, r.GetWroteOffset())
			if m.GetTopic() != "orders" || m.GetQueueId() != 2 || m.GetQueueOffset() != r.GetQueueOffset() ||
				m.GetCommitLogOffset() != r.GetWroteOffset() || m.GetMsgId() != r.GetMsgId() || !bytes.Equal(m.GetBody(), body) ||
				m.GetFlag() != 9 || m.GetTags() != "tagA" || m.GetKeys() != "k1 k2" {
				t.Errorf("message fields: %v", m)
			}
			wantProps := map[string]string{"TAGS": "tagA", "KEYS": "k1 k2", "a": "1", "b": "2"}
			if len(m.GetProperties()) != len(wantProps) {
				t.Errorf("properties %v, want %v (no __CRC32#)", m.GetProperties(), wantProps)
			}
			for k, v := range wantProps {
				if m.GetProperties()[k] != v {
					t.Errorf("property %s = %q, want %q", k, m.GetProperties()[k], v)
				}
			}
			if got := m.GetBornTimestamp().AsTime(); !got.Equal(born) {
				t.Errorf("born timestamp %v, want %v", got, born)
			}
			if got := m.GetStoreTimestamp().AsTime().UnixMilli(); got != rec.StoreTimestamp || got != r.GetStoreTimestamp().AsTime().UnixMilli() {
				t.Errorf("store timestamp %d, record %d, put said %d", got, rec.StoreTimestamp, r.GetStoreTimestamp().AsTime().UnixMilli())
			}
			if m.GetBornHost() != rec.BornHost.String() || rec.BornHost.Addr().String() != "127.0.0.1" {
				t.Errorf("born host %q, record %v", m.GetBornHost(), rec.BornHost)
			}
			if m.GetStoreHost() != testStoreHost.String() {
				t.Errorf("store host %q, want %v", m.GetStoreHost(), testStoreHost)
			}
			if m.GetSysFlag() != rec.SysFlag || m.GetReconsumeTimes() != 0 || m.GetStoreSize() != r.GetWroteBytes() ||
				m.GetBodyCrc() != storage.BodyCRC(body) {
				t.Errorf("sys flag %d reconsume %d size %d (put wrote %d) body crc %d (want %d)", m.GetSysFlag(),
					m.GetReconsumeTimes(), m.GetStoreSize(), r.GetWroteBytes(), m.GetBodyCrc(), storage.BodyCRC(body))
			}
			if m.GetRaw() != nil {
				t.Errorf("raw set without include_raw")
			}
		})
	}
}

// TestRawIsTheStoredRecord: in sync mode, include_raw returns exactly the
// commitlog bytes, and they decode to the message.
func TestRawIsTheStoredRecord(t *testing.T) {
	client, _, opts := storeServer(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	var results []*storagedv1.AppendResult
	for i := range 5 {
		results = append(results, put(t, client, &storagedv1.Message{
			Topic: "raw", QueueId: 0, Body: bytes.Repeat([]byte{byte('a' + i)}, 10+i*100), Tags: "t" + strconv.Itoa(i),
			Properties: map[string]string{"i": strconv.Itoa(i)},
		}))
	}
	waitDispatched(t, client, "raw", 0, 4)
	pulled := pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: "raw", QueueId: 0, MaxMessages: 5, IncludeRaw: true})
	if len(pulled.GetMessages()) != 5 {
		t.Fatalf("pulled %d messages, want 5", len(pulled.GetMessages()))
	}
	for i, r := range results {
		resp, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
			Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: r.GetMsgId()}, IncludeRaw: true})
		if err != nil {
			t.Fatalf("GetMessage %d: %v", i, err)
		}
		for _, m := range []*storagedv1.StoredMessage{resp.GetMessage(), pulled.GetMessages()[i]} {
			want := rawAt(t, opts, r.GetWroteOffset(), int(r.GetWroteBytes()))
			if !bytes.Equal(m.GetRaw(), want) {
				t.Fatalf("message %d: raw differs from the commitlog bytes\n got %x\nwant %x", i, m.GetRaw(), want)
			}
			rec, n, err := storage.DecodeRecordStrict(m.GetRaw())
			if err != nil || n != len(m.GetRaw()) {
				t.Fatalf("message %d: DecodeRecordStrict(raw): %d bytes, %v", i, n, err)
			}
			if rec.PhysicalOffset != m.GetCommitLogOffset() || !bytes.Equal(rec.Body, m.GetBody()) || rec.Topic != m.GetTopic() ||
				rec.QueueOffset != m.GetQueueOffset() || rec.MsgID() != m.GetMsgId() {
				t.Errorf("message %d: raw decodes to %+v, message is %v", i, rec, m)
			}
		}
	}
}

// TestRawRecordIPv6Hosts covers what a 127.0.0.1 client cannot: with IPv6
// born and store hosts (20-byte host fields) the raw bytes served are the
// stored bytes.
func TestRawRecordIPv6Hosts(t *testing.T) {
	for _, host := range []string{"[2001:db8::1]:10911", "[::ffff:10.0.0.1]:10911", "10.1.2.3:1"} {
		t.Run(host, func(t *testing.T) {
			st, opts := openStore(t, func(o *storage.Options) {
				o.StoreHost = netipMustParse(host)
				o.FlushMode = storage.FlushSync
			})
			res, err := st.PutMessage(ctxT(t), &storage.Message{Topic: "v6", Body: []byte("x"),
				BornHost: netipMustParse("[2001:db8::2]:4242"), BornTimestamp: 1})
			if err != nil {
				t.Fatal(err)
			}
			rec := getVisible(t, st, res.Append.WroteOffset)
			m, err := toStoredMessage(rec, true)
			if err != nil {
				t.Fatal(err)
			}
			raw := m.Raw
			if want := rawAt(t, opts, res.Append.WroteOffset, int(res.Append.WroteBytes)); !bytes.Equal(raw, want) {
				t.Fatalf("raw differs from the commitlog bytes\n got %x\nwant %x", raw, want)
			}
			if got, want := msgID(rec.StoreHost, rec.PhysicalOffset), res.Append.MsgID(); got != want {
				t.Errorf("msgID %s, store says %s", got, want)
			}
		})
	}
}

// getVisible reads a record from the store once the dispatcher has made it
// visible: a long poll on its queue waits for that.
func getVisible(t *testing.T, st *storage.Store, off int64) *storage.Record {
	t.Helper()
	for {
		rec, err := st.GetMessage(off)
		if err == nil {
			return rec
		}
		if !isOutOfRange(err) {
			t.Fatalf("GetMessage(%d): %v", off, err)
		}
		// Not dispatched yet: wait for the next arrival on any queue that has it.
		ctx, cancel := context.WithTimeout(t.Context(), longWait)
		_, perr := st.PullMessages(ctx, storage.PullRequest{Topic: "v6", Offset: 0, Wait: longWait})
		cancel()
		if perr != nil && !isNotFound(perr) {
			t.Fatalf("pull: %v", perr)
		}
	}
}

var zeroAddrPort netip.AddrPort

func netipMustParse(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func isOutOfRange(err error) bool { return errors.Is(err, storage.ErrOutOfRange) }
func isNotFound(err error) bool   { return errors.Is(err, storage.ErrQueueNotFound) }

func TestMsgIDMatchesStorage(t *testing.T) {
	for _, h := range []string{"127.0.0.1:10911", "10.0.0.255:65535", "[2001:db8::1]:80", "[::ffff:10.0.0.1]:1", "[::]:0", "0.0.0.0:0"} {
		host := netipMustParse(h)
		for _, off := range []int64{0, 1, 1 << 40, -1} {
			if got, want := msgID(host, off), storage.MsgID(host, off); got != want {
				t.Errorf("msgID(%v, %d) = %s, storage says %s", host, off, got, want)
			}
		}
	}
	if got, want := msgID(zeroAddrPort, 5), storage.MsgID(zeroAddrPort, 5); got != want {
		t.Errorf("msgID(zero, 5) = %s, storage says %s", got, want)
	}
}

func TestPullMessagesAcrossRolls(t *testing.T) {
	client, _, _ := storeServer(t, nil) // 64 KiB files
	const n = 300                       // ~900 bytes each: about four files, with END_OF_FILE blanks
	var results []*storagedv1.AppendResult
	for i := range n {
		body := fmt.Appendf(nil, "m%04d-%s", i, bytes.Repeat([]byte{'x'}, 700+i%150))
		results = append(results, put(t, client, &storagedv1.Message{Topic: "roll", QueueId: 3, Body: body}))
	}
	if last := results[n-1].GetWroteOffset(); last < 3*testFileSize {
		t.Fatalf("last offset %d: the log did not roll over several files", last)
	}
	var got []*storagedv1.StoredMessage
	for off := int64(0); off < n; {
		resp := pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: "roll", QueueId: 3, QueueOffset: off, MaxMessages: 7})
		if len(resp.GetMessages()) > 7 {
			t.Fatalf("pull returned %d messages, max 7", len(resp.GetMessages()))
		}
		if resp.GetNextOffset() != off+int64(len(resp.GetMessages())) || resp.GetMinOffset() != 0 {
			t.Fatalf("pull @%d: %d messages, next %d, min %d", off, len(resp.GetMessages()), resp.GetNextOffset(), resp.GetMinOffset())
		}
		got = append(got, resp.GetMessages()...)
		off = resp.GetNextOffset()
	}
	for i, m := range got {
		want := results[i]
		if m.GetQueueOffset() != int64(i) || m.GetCommitLogOffset() != want.GetWroteOffset() || m.GetMsgId() != want.GetMsgId() ||
			!bytes.HasPrefix(m.GetBody(), fmt.Appendf(nil, "m%04d-", i)) {
			t.Fatalf("message %d: queue offset %d, commitlog offset %d (want %d), body %.8q", i, m.GetQueueOffset(),
				m.GetCommitLogOffset(), want.GetWroteOffset(), m.GetBody())
		}
	}

	// max_bytes: the first message always comes, then whole records up to the bound.
	resp, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "roll", QueueId: 3, MaxBytes: 1})
	if err != nil || len(resp.GetMessages()) != 1 {
		t.Fatalf("pull max_bytes 1: %d messages, %v; want 1", len(resp.GetMessages()), err)
	}
	resp, err = client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "roll", QueueId: 3, MaxBytes: 3000})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, m := range resp.GetMessages() {
		total += int(m.GetStoreSize())
	}
	if len(resp.GetMessages()) < 2 || total > 3000 {
		t.Errorf("pull max_bytes 3000: %d messages, %d bytes", len(resp.GetMessages()), total)
	}
	info, err := client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "roll", QueueId: 3})
	if err != nil || info.GetMinOffset() != 0 || info.GetMaxOffset() != n {
		t.Errorf("GetQueueInfo: [%d, %d), %v; want [0, %d)", info.GetMinOffset(), info.GetMaxOffset(), err, n)
	}
}

func TestPullTagFilter(t *testing.T) {
	client, _, _ := storeServer(t, nil)
	tags := []string{"a", "b", "", "c", "a", "b"}
	for i, tag := range tags {
		put(t, client, &storagedv1.Message{Topic: "tags", Body: []byte(strconv.Itoa(i)), Tags: tag})
	}
	waitDispatched(t, client, "tags", 0, int64(len(tags)-1))

	for _, tc := range []struct {
		filter []string
		want   []string // bodies
	}{
		{nil, []string{"0", "1", "2", "3", "4", "5"}},
		{[]string{"a"}, []string{"0", "4"}},
		{[]string{"b", "c"}, []string{"1", "3", "5"}},
		{[]string{"zzz"}, nil},
	} {
		resp, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "tags", Tags: tc.filter})
		if err != nil {
			t.Fatalf("filter %v: %v", tc.filter, err)
		}
		var bodies []string
		for _, m := range resp.GetMessages() {
			bodies = append(bodies, string(m.GetBody()))
		}
		if fmt.Sprint(bodies) != fmt.Sprint(tc.want) {
			t.Errorf("filter %v: bodies %v, want %v", tc.filter, bodies, tc.want)
		}
		if resp.GetNextOffset() != int64(len(tags)) {
			t.Errorf("filter %v: next offset %d, want %d (past the skipped messages)", tc.filter, resp.GetNextOffset(), len(tags))
		}
	}
}

// pullSignal wraps the real store and reports each PullMessages call as it
// starts: the request the store got and when.
type pullSignal struct {
	*storage.Store
	started chan pullCall
}

// pullCall is one PullMessages call as the store got it.
type pullCall struct {
	req storage.PullRequest
	at  time.Time
}

func (p *pullSignal) PullMessages(ctx context.Context, req storage.PullRequest) (storage.PullResult, error) {
	p.started <- pullCall{req, time.Now()}
	return p.Store.PullMessages(ctx, req)
}

// drain forgets the pulls that started so far.
func (p *pullSignal) drain() {
	for {
		select {
		case <-p.started:
		default:
			return
		}
	}
}

// serveWithPullSignal serves a real store behind pullSignal.
func serveWithPullSignal(t *testing.T, opts ...Option) (storagedv1.MessageStoreServiceClient, *pullSignal, *Service) {
	t.Helper()
	st, _ := openStore(t, nil)
	ps := &pullSignal{Store: st, started: make(chan pullCall, 16)}
	svc := New(ps, zerolog.Nop(), opts...)
	srv := startServer(t, svc, GRPCConfig{})
	srv.SetServing(true)
	return storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil)), ps, svc
}

type pullOutcome struct {
	resp    *storagedv1.PullMessagesResponse
	err     error
	elapsed time.Duration
}

func startPull(t *testing.T, client storagedv1.MessageStoreServiceClient, req *storagedv1.PullMessagesRequest) <-chan pullOutcome {
	out := make(chan pullOutcome, 1)
	ctx := ctxLong(t)
	go func() {
		start := time.Now()
		resp, err := client.PullMessages(ctx, req)
		out <- pullOutcome{resp, err, time.Since(start)}
	}()
	return out
}

// TestPullLongPollWakesOnArrival: a pull waiting at the end of a queue (and
// one on a queue that does not exist yet) returns the message put after it
// started, long before its wait ends.
func TestPullLongPollWakesOnArrival(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prefill bool
	}{{"existing queue", true}, {"new queue", false}} {
		t.Run(tc.name, func(t *testing.T) {
			client, ps, _ := serveWithPullSignal(t)
			var from int64
			if tc.prefill {
				put(t, client, &storagedv1.Message{Topic: "poll", Body: []byte("old")})
				<-startPull(t, client, &storagedv1.PullMessagesRequest{Topic: "poll", Wait: durationpb.New(longWait)})
				<-ps.started
				from = 1
			}
			out := startPull(t, client, &storagedv1.PullMessagesRequest{Topic: "poll", QueueOffset: from, Wait: durationpb.New(longWait)})
			<-ps.started // the pull is in the store (waiting, or about to look)
			put(t, client, &storagedv1.Message{Topic: "poll", Body: []byte("new")})
			o := <-out
			if o.err != nil {
				t.Fatalf("pull: %v", o.err)
			}
			if len(o.resp.GetMessages()) != 1 || string(o.resp.GetMessages()[0].GetBody()) != "new" {
				t.Fatalf("pull returned %v after %v, want the new message", o.resp.GetMessages(), o.elapsed)
			}
			if o.elapsed > longWait/2 {
				t.Errorf("pull took %v: it did not wake on arrival", o.elapsed)
			}
		})
	}
}

// TestPullWaitEnds: a pull with nothing to return answers OK and empty when
// its wait ends; the server caps the wait (at its maximum, and
// pullDeadlineMargin before the call's deadline), and Drain ends it at
// once.
func TestPullWaitEnds(t *testing.T) {
	t.Run("short wait", func(t *testing.T) {
		client, _, _ := storeServer(t, nil)
		put(t, client, &storagedv1.Message{Topic: "w", Body: []byte("x")})
		pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: "w"})
		resp, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "w", QueueOffset: 1, Wait: durationpb.New(20 * time.Millisecond)})
		if err != nil || len(resp.GetMessages()) != 0 || resp.GetNextOffset() != 1 || resp.GetMaxOffset() != 1 {
			t.Fatalf("pull at the end: %v, %v; want no messages, next 1, max 1", resp, err)
		}
	})
	t.Run("capped", func(t *testing.T) {
		client, _, _ := serveWithPullSignal(t, WithMaxPullWait(20*time.Millisecond))
		o := <-startPull(t, client, &storagedv1.PullMessagesRequest{Topic: "nothing", Wait: durationpb.New(longWait)})
		if codeOf(o.err) != codes.NotFound || o.elapsed > longWait/2 {
			t.Fatalf("capped pull of an unknown queue: %v after %v; want NOT_FOUND at once", o.err, o.elapsed)
		}
	})
	// The wait the store gets ends pullDeadlineMargin before the call's
	// deadline. Checked on the wait itself, not by letting it run out: an
	// empty answer that must cross back within the margin would fail on a
	// slow machine. The server's deadline is the client's, counted from
	// when the call arrived (grpc sends the time left, rounded up to the
	// microsecond at this size), so the wait is bounded by times the test
	// reads: at most the timeout less the margin, at least that less the
	// time from before the call until the store got it, however slowly the
	// call travelled. A put then ends the wait, long before the deadline.
	t.Run("deadline", func(t *testing.T) {
		const timeout = longWait / 2 // the deadline, not the wait asked for, caps it
		const rounding = time.Millisecond
		client, ps, _ := serveWithPullSignal(t, WithMaxPullWait(longWait))
		put(t, client, &storagedv1.Message{Topic: "w", Body: []byte("x")})
		pullWait(t, client, &storagedv1.PullMessagesRequest{Topic: "w"})
		ps.drain()
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		out := make(chan pullOutcome, 1)
		go func() {
			resp, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "w", QueueOffset: 1, Wait: durationpb.New(longWait)})
			out <- pullOutcome{resp: resp, err: err}
		}()
		var waiting pullCall // the store's call that waits (the first look does not)
		for waiting.req.Wait == 0 {
			select {
			case waiting = <-ps.started:
			case o := <-out:
				t.Fatalf("pull with a deadline answered %v, %v without waiting", o.resp, o.err)
			}
		}
		w, took := waiting.req.Wait, waiting.at.Sub(start)
		if hi := timeout - pullDeadlineMargin + rounding; w > hi {
			t.Errorf("store waits %v under a %v deadline: over %v, it may not end %v before the deadline", w, timeout, hi, pullDeadlineMargin)
		}
		if lo := timeout - pullDeadlineMargin - took; w < lo {
			t.Errorf("store waits %v under a %v deadline, %v after the call began: under %v", w, timeout, took, lo)
		}
		put(t, client, &storagedv1.Message{Topic: "w", Body: []byte("y")})
		if o := <-out; o.err != nil || len(o.resp.GetMessages()) != 1 || string(o.resp.GetMessages()[0].GetBody()) != "y" {
			t.Fatalf("pull with a deadline: %v, %v; want the message put while it waited", o.resp, o.err)
		}
	})
	t.Run("drain", func(t *testing.T) {
		client, ps, svc := serveWithPullSignal(t)
		put(t, client, &storagedv1.Message{Topic: "d", Body: []byte("x")})
		waitDispatched(t, client, "d", 0, 0)
		ps.drain()
		out := startPull(t, client, &storagedv1.PullMessagesRequest{Topic: "d", QueueOffset: 1, Wait: durationpb.New(longWait)})
		<-ps.started
		svc.Drain()
		o := <-out
		if o.err != nil || len(o.resp.GetMessages()) != 0 || o.elapsed > longWait/2 {
			t.Fatalf("pull during drain: %v, %v after %v; want an empty answer at once", o.resp, o.err, o.elapsed)
		}
	})
}

func TestReadErrors(t *testing.T) {
	client, _, _ := storeServer(t, nil)
	r := put(t, client, &storagedv1.Message{Topic: "e", QueueId: 1, Body: []byte("x")})
	put(t, client, &storagedv1.Message{Topic: "e", QueueId: 1, Body: []byte("y")})
	waitDispatched(t, client, "e", 1, 1)
	end := r.GetWroteOffset() + 2*int64(r.GetWroteBytes()) // both records are the same size

	outOfRange := func(t *testing.T, err error, offset, lo, hi int64) {
		t.Helper()
		d := details(t, err)
		d.want(t, codes.OutOfRange, ReasonOffsetOutOfRange, false)
		md := d.info.GetMetadata()
		if md["offset"] != strconv.FormatInt(offset, 10) || md["min_offset"] != strconv.FormatInt(lo, 10) ||
			md["max_offset"] != strconv.FormatInt(hi, 10) {
			t.Errorf("metadata %v, want offset %d min %d max %d", md, offset, lo, hi)
		}
	}
	t.Run("commitlog offset past the end", func(t *testing.T) {
		_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
			Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: end + 100}})
		outOfRange(t, err, end+100, 0, end)
	})
	t.Run("queue offset past the end", func(t *testing.T) {
		_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "e", QueueId: 1, QueueOffset: 3})
		outOfRange(t, err, 3, 0, 2)
	})
	t.Run("offset inside a record", func(t *testing.T) {
		_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
			Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: r.GetWroteOffset() + 1}})
		details(t, err).want(t, codes.NotFound, ReasonNoRecord, false) // a wrong offset is not data loss
	})
	t.Run("unknown queue", func(t *testing.T) {
		_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "e", QueueId: 7})
		details(t, err).want(t, codes.NotFound, ReasonQueueNotFound, false)
		_, err = client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "nope"})
		details(t, err).want(t, codes.NotFound, ReasonQueueNotFound, false)
	})
	for name, call := range map[string]func() error{
		"bad msgId": func() error {
			_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: "xyz"}})
			return err
		},
		"no locator": func() error {
			_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{})
			return err
		},
		"negative commitlog offset": func() error {
			_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
				Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: -1}})
			return err
		},
		"bad topic": func() error {
			_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "../x"})
			return err
		},
		"negative queue offset": func() error {
			_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "e", QueueOffset: -1})
			return err
		},
		"negative wait": func() error {
			_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "e", Wait: durationpb.New(-time.Second)})
			return err
		},
		"empty tag": func() error {
			_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "e", Tags: []string{""}})
			return err
		},
		"queue info negative queue": func() error {
			_, err := client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "e", QueueId: -1})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := details(t, call())
			d.want(t, codes.InvalidArgument, ReasonInvalidRequest, false)
			if len(d.badRequest.GetFieldViolations()) != 1 {
				t.Errorf("BadRequest %v, want one field violation", d.badRequest)
			}
		})
	}
}

// TestReadCorruptionIsDataLoss flips one body byte of a stored record under
// the running store (the mapping shares the page cache with the file):
// every read of it is DATA_LOSS, never the wrong bytes.
func TestReadCorruptionIsDataLoss(t *testing.T) {
	client, _, opts := storeServer(t, nil)
	good := put(t, client, &storagedv1.Message{Topic: "c", Body: []byte("good")})
	bad := put(t, client, &storagedv1.Message{Topic: "c", Body: []byte("precious bytes")})
	waitDispatched(t, client, "c", 0, 1)

	raw := rawAt(t, opts, bad.GetWroteOffset(), int(bad.GetWroteBytes()))
	pos := bytes.Index(raw, []byte("precious"))
	from := bad.GetWroteOffset() / opts.FileSize * opts.FileSize
	f, err := os.OpenFile(filepath.Join(opts.Dir, "commitlog", fmt.Sprintf("%020d", from)), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'P'}, bad.GetWroteOffset()-from+int64(pos)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	_, err = client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: bad.GetMsgId()}})
	details(t, err).want(t, codes.DataLoss, ReasonDataCorrupted, false)
	_, err = client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "c", QueueOffset: 1})
	details(t, err).want(t, codes.DataLoss, ReasonDataCorrupted, false)
	_, err = client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "c", MaxMessages: 2, IncludeRaw: true})
	details(t, err).want(t, codes.DataLoss, ReasonDataCorrupted, false)

	// The undamaged record still reads.
	resp, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{
		Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: good.GetWroteOffset()}})
	if err != nil || string(resp.GetMessage().GetBody()) != "good" {
		t.Fatalf("undamaged record: %v, %v", resp, err)
	}
}

// TestReadsWhileStarting: before the store is open every read is
// UNAVAILABLE with RetryInfo; once it is set they go through.
func TestReadsWhileStarting(t *testing.T) {
	var d DeferredStore
	srv := startServer(t, New(&d, zerolog.Nop()), GRPCConfig{})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	calls := map[string]func() error{
		"GetMessage": func() error {
			_, err := client.GetMessage(ctxT(t), &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_CommitLogOffset{}})
			return err
		},
		"PullMessages": func() error {
			_, err := client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "s"})
			return err
		},
		"GetQueueInfo": func() error {
			_, err := client.GetQueueInfo(ctxT(t), &storagedv1.GetQueueInfoRequest{Topic: "s"})
			return err
		},
	}
	for _, call := range calls {
		details(t, call()).want(t, codes.Unavailable, ReasonUnavailable, true)
	}
	st, _ := openStore(t, nil)
	d.Set(st)
	for name, call := range calls {
		if err := call(); codeOf(err) != codes.NotFound && codeOf(err) != codes.OutOfRange {
			t.Errorf("%s on an empty open store: %v, want NOT_FOUND or OUT_OF_RANGE", name, err)
		}
	}
}

// TestReadErrorMapping covers the mapping cases a real store does not
// produce on demand.
func TestReadErrorMapping(t *testing.T) {
	svc := New(&fakeStore{}, zerolog.Nop())
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{storage.ErrClosed, codes.Unavailable, ReasonUnavailable},
		{context.Canceled, codes.Canceled, ReasonCancelled},
		{context.DeadlineExceeded, codes.DeadlineExceeded, ReasonDeadline},
		{fmt.Errorf("commitlog offset 5: %w", storage.ErrCorrupt), codes.DataLoss, ReasonDataCorrupted},
		{errTest, codes.Internal, ReasonInternal},
	} {
		d := details(t, svc.readError(methodGetMessage, tc.err))
		d.want(t, tc.code, tc.reason, tc.code == codes.Unavailable)
	}
}
