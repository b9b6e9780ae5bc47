package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReadYourWrites: once a put (or a batch) is answered PUT_OK, in
// either flush mode, GetQueueInfo covers it and a pull at its queue offset
// returns it, for a queue that did not exist before the put, with several
// producers at once. (Before: NOT_FOUND or max_offset 0 for tens of ms.)
func TestReadYourWrites(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, _ := openTest(t, func(o *Options) { o.FlushMode = mode; o.ConsumeQueueEntries = 64 })
			const producers, iterations = 4, 60
			var wg sync.WaitGroup
			errs := make(chan error, producers)
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range iterations {
						if err := putThenRead(s, fmt.Sprintf("RYW%d-%d", p, i), int32(i%8), i%3 == 0); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// putThenRead puts one message (or a batch of two) to a new queue and
// reads it back at once.
func putThenRead(s *Store, topic string, qid int32, batch bool) error {
	ctx := context.Background()
	var (
		res PutResult
		err error
	)
	if batch {
		res, err = s.PutMessages(ctx, &Batch{Topic: topic, QueueID: qid, Messages: []BatchMessage{{Body: []byte("a")}, {Body: []byte("b")}}})
	} else {
		m := msg(topic, "x")
		m.QueueID = qid
		res, err = s.PutMessage(ctx, m)
	}
	if err != nil || res.Status != PutOK {
		return fmt.Errorf("put %s/%d: %v %v", topic, qid, res.Status, err)
	}
	last := res.Append.QueueOffset + int64(res.Append.MsgNum) - 1
	if _, hi, err := s.QueueInfo(topic, qid); err != nil || hi <= last {
		return fmt.Errorf("%s/%d right after PUT_OK: max offset %d, err %v; the put took queue offset %d", topic, qid, hi, err, last)
	}
	pr, err := s.PullMessages(ctx, PullRequest{Topic: topic, QueueID: qid, Offset: res.Append.QueueOffset})
	if err != nil || len(pr.Messages) != int(res.Append.MsgNum) || pr.Messages[0].PhysicalOffset != res.Append.WroteOffset {
		return fmt.Errorf("%s/%d right after PUT_OK: pull got %d messages, err %v", topic, qid, len(pr.Messages), err)
	}
	return nil
}

// TestSyncPutVisibleOnlyWhenDurable: a waiting sync-mode put is not
// readable while no sync can complete, and readable the moment its PUT_OK
// is answered (then durable).
func TestSyncPutVisibleOnlyWhenDurable(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FlushMode = FlushSync })
	releaseSync := s.log.Files().HoldSync() // no sync can complete
	type answer struct {
		res PutResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := s.PutMessage(context.Background(), msg("D", "x"))
		done <- answer{r, err}
	}()
	for s.log.MaxOffset() == 0 { // appended, waiting for its sync
		runtime.Gosched()
	}
	s.index.Run(s.visibleEnd()) // a dispatch round changes nothing either
	if _, hi, err := s.QueueInfo("D", 0); err == nil && hi > 0 {
		t.Fatal("an unsynced message is counted by QueueInfo")
	}
	if res, err := s.PullMessages(context.Background(), PullRequest{Topic: "D"}); len(res.Messages) != 0 {
		t.Fatalf("an unsynced message is pullable: %v", err)
	}
	releaseSync()
	a := <-done
	if a.err != nil || a.res.Status != PutOK {
		t.Fatal(a.res.Status, a.err)
	}
	if d := s.log.Flushed(); d < a.res.Append.NextOffset() {
		t.Fatalf("acked at %d, durable only to %d", a.res.Append.NextOffset(), d)
	}
	if err := putThenReadExisting(s, "D", a.res.Append); err != nil {
		t.Fatal(err)
	}
}

func putThenReadExisting(s *Store, topic string, a AppendResult) error {
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: a.QueueID, Offset: a.QueueOffset})
	if err != nil || len(res.Messages) != 1 || res.Messages[0].PhysicalOffset != a.WroteOffset {
		return fmt.Errorf("pull right after PUT_OK: %d messages, %v", len(res.Messages), err)
	}
	return nil
}

// TestPutWaitsForRunningRound: while a round (or checkpoint) holds runMu
// a put does not answer; once runMu is released it is indexed (by the
// put itself or the dispatcher) and answers readable.
func TestPutWaitsForRunningRound(t *testing.T) {
	s, _ := openTest(t, nil)
	resume := s.index.HoldRounds() // a round (or checkpoint) in progress
	done := make(chan PutResult, 1)
	go func() {
		r, _ := s.PutMessage(context.Background(), msg("B", "x"))
		done <- r
	}()
	for s.index.Waiting() == 0 { // the put waits for the round
		runtime.Gosched()
	}
	select {
	case <-done:
		t.Fatal("put answered while its record could not be indexed")
	default:
	}
	resume()
	r := <-done
	if r.Status != PutOK {
		t.Fatal(r.Status)
	}
	if err := putThenReadExisting(s, "B", r.Append); err != nil {
		t.Fatal(err)
	}
}

// TestReadCoversVisible: a read covers every record visible when it was
// called, also one nobody waits to index (a WAIT=false put here; in a
// group, a commit whose putter went away): while a round holds the index,
// QueueInfo, a pull and GetOffsetByTime do not answer; once it ends they
// answer with the record. (Before, they answered from what was indexed, up to the
// dispatcher's pause behind: the group scenarios' readback once found a
// leader's queue 18 records short of its followers', all committed.)
func TestReadCoversVisible(t *testing.T) {
	s, _ := openTest(t, nil)
	resume := sync.OnceFunc(s.index.HoldRounds())
	t.Cleanup(resume) // before Close, on a failure
	r, err := s.PutMessage(context.Background(), msg("C", "x", Property{Key: PropertyWaitStoreOK, Value: "false"}))
	if err != nil || r.Status != PutOK {
		t.Fatal(r.Status, err)
	}
	got := heldReads(t, s, resume, map[string]func() readAnswer{
		"QueueInfo": func() readAnswer { _, hi, err := s.QueueInfo("C", 0); return readAnswer{max: hi, err: err} },
		"a pull":    func() readAnswer { return pullAnswer(s, PullRequest{Topic: "C"}) },
		"GetOffsetByTime": func() readAnswer { // past every store time: the queue's max
			off, err := s.GetOffsetByTime("C", 0, time.Now().Add(time.Hour))
			return readAnswer{max: off, err: err}
		},
	})
	if a := got["QueueInfo"]; a.err != nil || a.max != 1 {
		t.Errorf("QueueInfo: max offset %d, %v; want 1", a.max, a.err)
	}
	if a := got["a pull"]; a.err != nil || a.max != 1 || !slices.Equal(a.bodies, []string{"x"}) {
		t.Errorf("pull: %q, max offset %d, %v; want [x] and 1", a.bodies, a.max, a.err)
	}
	if a := got["GetOffsetByTime"]; a.err != nil || a.max != 1 {
		t.Errorf("GetOffsetByTime: %d, %v; want 1", a.max, a.err)
	}
}

// readAnswer is what one read of heldReads answered.
type readAnswer struct {
	max    int64    // the max offset, or the offset GetOffset answered
	bodies []string // a pull's messages
	err    error
}

// pullAnswer pulls with req and keeps what a test of heldReads checks.
func pullAnswer(s *Store, req PullRequest) readAnswer {
	r, err := s.PullMessages(context.Background(), req)
	a := readAnswer{max: r.MaxOffset, err: err}
	for _, m := range r.Messages {
		a.bodies = append(a.bodies, string(m.Body))
	}
	return a
}

// heldReads runs each read on a goroutine of its own while s's index
// rounds are held, and fails t if any answers before all of them wait for
// the round (a read that covers what is visible cannot answer yet). Then
// it releases the rounds (resume) and returns the answers by name.
func heldReads(t *testing.T, s *Store, resume func(), reads map[string]func() readAnswer) map[string]readAnswer {
	t.Helper()
	type named struct {
		name string
		a    readAnswer
	}
	answers := make(chan named, len(reads))
	for name, read := range reads {
		go func() { answers <- named{name, read()} }()
	}
	for s.index.Waiting() < int32(len(reads)) {
		select {
		case a := <-answers:
			t.Fatalf("%s answered while a visible record could not be indexed: %+v", a.name, a.a)
		default:
			runtime.Gosched()
		}
	}
	resume()
	got := make(map[string]readAnswer, len(reads))
	for range reads {
		a := <-answers
		got[a.name] = a.a
	}
	return got
}

// TestPutCancelledWhileIndexing: a put whose ctx ends while it waits for
// the index answers UNKNOWN_ERROR with ctx's error, appended.
func TestPutCancelledWhileIndexing(t *testing.T) {
	s, _ := openTest(t, nil)
	resume := s.index.HoldRounds()
	ctx, cancel := context.WithCancel(context.Background())
	type answer struct {
		res PutResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := s.PutMessage(ctx, msg("C", "x"))
		done <- answer{r, err}
	}()
	for s.index.Waiting() == 0 {
		runtime.Gosched()
	}
	cancel()
	a := <-done
	resume()
	if !errors.Is(a.err, context.Canceled) || a.res.Status != UnknownError || !a.res.Appended() {
		t.Fatalf("cancelled while indexing: %v %v appended %v", a.res.Status, a.err, a.res.Appended())
	}
}

// TestPutAnsweredWhenIndexingFails: a dispatch round that fails does not
// hang the put: the message is stored and the answer is PUT_OK.
func TestPutAnsweredWhenIndexingFails(t *testing.T) {
	s, _ := openTest(t, nil)
	// The next round stops at a record the dispatcher cannot parse: a
	// commitlog offset no file holds.
	s.index.SetNext(-1)
	r, err := s.PutMessage(context.Background(), msg("F", "x"))
	if err != nil || r.Status != PutOK {
		t.Fatalf("put with a failing index: %v %v", r.Status, err)
	}
	if !s.index.Stalled() {
		t.Fatal("the failed round is not recorded")
	}
}

// waitPolls spins until n polls are registered with the notifier.
func waitPolls(t *testing.T, s *Store, n int64) {
	t.Helper()
	for s.index.PollsWaiting() != n {
		runtime.Gosched()
	}
}

// TestLongPollWakesOnlyForItsQueue: a long poll on a queue that does not
// exist yet is not woken by puts to another queue, and is woken (with the
// message) by the first put to its own.
func TestLongPollWakesOnlyForItsQueue(t *testing.T) {
	s, _ := openTest(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan PullResult, 1)
	go func() {
		res, _ := s.PullMessages(ctx, PullRequest{Topic: "A", QueueID: 3, Wait: time.Hour})
		got <- res
	}()
	waitPolls(t, s, 1)
	for i := range 50 {
		if _, err := s.PutMessage(context.Background(), msg("B", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	m := msg("A", "other queue id")
	m.QueueID = 4
	if _, err := s.PutMessage(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if n := s.index.WokenPolls(); n != 0 {
		t.Fatalf("puts to other queues woke the poll %d times", n)
	}
	select {
	case <-got:
		t.Fatal("the poll returned before its queue had a message")
	default:
	}
	m = msg("A", "mine")
	m.QueueID = 3
	if _, err := s.PutMessage(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if len(res.Messages) != 1 || string(res.Messages[0].Body) != "mine" {
		t.Fatalf("woken poll: %d messages", len(res.Messages))
	}
	if n := s.index.WokenPolls(); n != 1 {
		t.Fatalf("woken %d times, want 1", n)
	}
	if s.index.PollsWaiting() != 0 || s.index.Registrations() != 0 {
		t.Fatal("the notifier keeps a registration after the poll ended")
	}
}

// TestFilteredLongPollDoesNotRescan: a long poll whose filter matches
// nothing reads each entry once, however many times it is woken, and
// returns the first match.
func TestFilteredLongPollDoesNotRescan(t *testing.T) {
	s, _ := openTest(t, nil)
	putTagged := func(n int, tag string) {
		t.Helper()
		for range n {
			if _, err := s.PutMessage(context.Background(), msg("F", "x", Property{Key: PropertyTags, Value: tag})); err != nil {
				t.Fatal(err)
			}
		}
	}
	putTagged(300, "other")
	before := s.pulls.scanned.Load()
	got := make(chan PullResult, 1)
	go func() {
		res, _ := s.PullMessages(context.Background(), PullRequest{Topic: "F", Tags: []string{"want"}, Wait: time.Hour})
		got <- res
	}()
	waitPolls(t, s, 1)
	for i := range 100 { // each put wakes the poll
		putTagged(1, "other")
		for s.pulls.scanned.Load()-before < uint64(301+i) || s.index.PollsWaiting() != 1 {
			runtime.Gosched() // the poll reads the new entry and waits again
		}
	}
	if n := s.pulls.scanned.Load() - before; n != 400 {
		t.Fatalf("the poll read %d entries for 400 in the queue", n)
	}
	putTagged(1, "want")
	res := <-got
	if len(res.Messages) != 1 || res.Messages[0].QueueOffset != 400 || res.NextOffset != 401 {
		t.Fatalf("match: %d messages, next %d", len(res.Messages), res.NextOffset)
	}
	if n := s.pulls.scanned.Load() - before; n != 401 {
		t.Fatalf("the poll read %d entries for 401 in the queue", n)
	}
}

// TestPullScanBound: a pull reads at most MaxPullScan entries and answers
// with next_offset past them, with or without matches, waiting or not.
func TestPullScanBound(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FileSize = 1 << 20 })
	const total = MaxPullScan + 904
	for range total / 100 {
		b := &Batch{Topic: "S", Messages: make([]BatchMessage, 100)}
		for i := range b.Messages {
			b.Messages[i] = BatchMessage{Body: []byte("x"), Properties: []Property{{Key: PropertyTags, Value: "other"}}}
		}
		if _, err := s.PutMessages(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		req  PullRequest
		n    int
		next int64
	}{
		{"filtered", PullRequest{Tags: []string{"want"}}, 0, MaxPullScan},
		{"filtered from the bound", PullRequest{Offset: MaxPullScan, Tags: []string{"want"}}, 0, total},
		{"filtered long poll", PullRequest{Tags: []string{"want"}, Wait: 5 * time.Second}, 0, MaxPullScan},
		{"unfiltered", PullRequest{MaxMessages: 2 * total}, MaxPullScan, MaxPullScan},
		{"matching filter", PullRequest{Offset: 10, MaxMessages: 2 * total, Tags: []string{"other"}}, MaxPullScan, 10 + MaxPullScan},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Topic = "S"
			before := s.pulls.scanned.Load()
			res, err := s.PullMessages(context.Background(), tc.req)
			if err != nil || len(res.Messages) != tc.n || res.NextOffset != tc.next || res.MaxOffset != total {
				t.Fatalf("%d messages, next %d, max %d, %v; want %d messages, next %d", len(res.Messages), res.NextOffset, res.MaxOffset, err, tc.n, tc.next)
			}
			if n := s.pulls.scanned.Load() - before; n > MaxPullScan {
				t.Fatalf("read %d entries", n)
			}
		})
	}
}

// TestEntryDisagreesWithRecord: a consume-queue entry whose size or tags
// code is not its record's is ErrCorrupt naming the queue and entry, for
// entries a tag filter returns and for those it skips; never a silent skip.
// (Before: a flipped code made the filtered pull skip the message.)
func TestEntryDisagreesWithRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64 // where in entry 1 (message tagged "want") to write
		b    func(size int32, code int64) []byte
		tags []string
	}{
		{"flipped tags code hides the message", 12, flipCode, []string{"want"}},
		{"tags code of another tag", 12, func(int32, int64) []byte { return be64(TagsCode("other")) }, []string{"other"}},
		{"flipped tags code, no filter", 12, flipCode, nil},
		{"size, filter skips it", 8, flipSize, []string{"nothing"}},
		{"size, filter returns it", 8, flipSize, []string{"want"}},
		{"size, no filter", 8, flipSize, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Damage the entry in its file with the store closed: a
			// running store may hold the queue's tail in memory.
			s, o := openTest(t, nil)
			for i, tag := range []string{"other", "want", "other"} {
				if _, err := s.PutMessage(context.Background(), msg("E", fmt.Sprint(i), Property{Key: PropertyTags, Value: tag})); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			flipEntry(t, o.Dir, "E", 1, tc.at, tc.b)
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "E", Tags: tc.tags})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "consume queue E/0 entry 1") {
				t.Fatalf("pull over a damaged entry: %d messages, %v", len(res.Messages), err)
			}
		})
	}
}

func be64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

func flipCode(_ int32, code int64) []byte { return be64(code ^ 1) }

func flipSize(size int32, _ int64) []byte { return binary.BigEndian.AppendUint32(nil, uint32(size^1)) }

// flipEntry rewrites the bytes of consume-queue entry off of topic/0 from
// byte at of the entry (8: size, 12: tags code) with change(size, code),
// in its file.
func flipEntry(t *testing.T, dir, topic string, off, at int64, change func(size int32, code int64) []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "consumequeue", topic, "0", fileName(0)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var e [cqEntrySize]byte
	if _, err := f.ReadAt(e[:], off*cqEntrySize); err != nil {
		t.Fatal(err)
	}
	_, size, code := decodeCQ(e[:])
	if _, err := f.WriteAt(change(size, code), off*cqEntrySize+at); err != nil {
		t.Fatal(err)
	}
}

// TestPutNotHeldByCheckpointSync: a checkpoint holds runMu only for its
// snapshot, so a put that waits to read its write is answered, indexed,
// while the checkpoint's syncs are still running (here: its commitlog sync
// held up). Before, the checkpoint held runMu through every sync, and the
// put waited SyncFlushTimeout and was answered before it was readable.
func TestPutNotHeldByCheckpointSync(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), FileSize: 1 << 20, MaxMessageSize: 1024,
		CheckpointInterval: time.Hour, SyncFlushTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.PutMessage(context.Background(), msg("Old", "before")); err != nil {
		t.Fatal(err)
	}
	snapped := make(chan struct{})
	var once sync.Once
	s.index.SetAfterSnapshot(func() { once.Do(func() { close(snapped) }) })
	releaseSync := s.log.Files().HoldSync() // the checkpoint's commitlog sync waits here
	cpDone := make(chan error, 1)
	go func() { cpDone <- s.index.Checkpoint() }()
	<-snapped
	res, err := s.PutMessage(context.Background(), msg("New", "during the checkpoint"))
	if err != nil || res.Status != PutOK {
		releaseSync()
		t.Fatalf("put during the checkpoint: %v %v", res.Status, err)
	}
	_, hi, qerr := s.QueueInfo("New", 0)
	releaseSync()
	if qerr != nil || hi != 1 {
		t.Fatalf("put answered PUT_OK during the checkpoint's sync but not readable: max %d, %v", hi, qerr)
	}
	if err := <-cpDone; err != nil {
		t.Fatal(err)
	}
}
