package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/record"
)

// waitVisible long-polls until queue topic/qid holds n messages.
func waitVisible(t *testing.T, s *Store, topic string, qid int32, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, hi, err := s.QueueInfo(topic, qid)
		if err == nil && hi >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s/%d has %d messages after 10 s, want %d (%v)", topic, qid, hi, n, err)
		}
		// Returns as soon as anything is dispatched.
		s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: qid, Offset: hi, Wait: time.Second})
	}
}

func TestReadRoundTrip(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, _ := openTest(t, func(o *Options) { o.FileSize = 4096; o.MaxMessageSize = 2048; o.FlushMode = mode })
			var sent []AppendResult
			for i := 0; i < 12; i++ { // ~600-byte records: rolls and blanks
				tag := "odd"
				if i%2 == 0 {
					tag = "even"
				}
				r, err := s.PutMessage(context.Background(), msg("R", strings.Repeat("b", 500)+strconv.Itoa(i), Property{Key: PropertyTags, Value: tag}))
				if err != nil {
					t.Fatal(err)
				}
				sent = append(sent, r.Append)
			}
			b := &Batch{Topic: "R", Messages: []BatchMessage{{Body: []byte("b0"), Properties: []Property{{Key: PropertyTags, Value: "even"}}}, {Body: []byte("b1")}}}
			br, err := s.PutMessages(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			waitVisible(t, s, "R", 0, 14)
			all, err := s.PullMessages(context.Background(), PullRequest{Topic: "R", MaxMessages: 100})
			if err != nil || len(all.Messages) != 14 || all.NextOffset != 14 || all.MaxOffset != 14 || all.MinOffset != 0 {
				t.Fatalf("pull all: %d msgs next %d max %d: %v", len(all.Messages), all.NextOffset, all.MaxOffset, err)
			}
			for i, m := range all.Messages[:12] {
				if m.PhysicalOffset != sent[i].WroteOffset || !strings.HasSuffix(string(m.Body), strconv.Itoa(i)) || m.QueueOffset != int64(i) {
					t.Fatalf("message %d: %d %q", i, m.PhysicalOffset, m.Body)
				}
				byID, err := s.GetMessageByID(sent[i].MsgID())
				if err != nil || string(byID.Body) != string(m.Body) {
					t.Fatalf("by msgId: %v", err)
				}
			}
			if string(all.Messages[12].Body) != "b0" || all.Messages[13].PhysicalOffset != br.Append.Offsets[1] {
				t.Fatal("batch messages not in the queue")
			}
			even, _ := s.PullMessages(context.Background(), PullRequest{Topic: "R", MaxMessages: 100, Tags: []string{"even"}})
			if len(even.Messages) != 7 || even.NextOffset != 14 {
				t.Fatalf("tag filter: %d messages, next %d", len(even.Messages), even.NextOffset)
			}
			for _, m := range even.Messages {
				if tg, _ := m.Property(PropertyTags); tg != "even" {
					t.Fatalf("tag filter let %q through", tg)
				}
			}
			few, _ := s.PullMessages(context.Background(), PullRequest{Topic: "R", Offset: 2, MaxMessages: 3})
			if len(few.Messages) != 3 || few.NextOffset != 5 {
				t.Fatalf("max messages: %d next %d", len(few.Messages), few.NextOffset)
			}
			bytesBound, _ := s.PullMessages(context.Background(), PullRequest{Topic: "R", MaxBytes: 1300})
			if len(bytesBound.Messages) != 2 {
				t.Fatalf("max bytes 1300 over ~620-byte records gave %d", len(bytesBound.Messages))
			}
			if lo, hi, err := s.QueueInfo("R", 0); err != nil || lo != 0 || hi != 14 {
				t.Fatalf("queue info %d %d %v", lo, hi, err)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	s, _ := openTest(t, nil)
	r, _ := s.PutMessage(context.Background(), msg("E", "x"))
	waitVisible(t, s, "E", 0, 1)
	var rerr *RangeError
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "E", Offset: 2}); !errors.As(err, &rerr) || rerr.Max != 1 || rerr.Min != 0 {
		t.Fatalf("past the end: %v", err)
	}
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "E", Offset: -1}); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("negative: %v", err)
	}
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "Nope"}); !errors.Is(err, ErrQueueNotFound) {
		t.Fatalf("unknown queue: %v", err)
	}
	if _, _, err := s.QueueInfo("E", 7); !errors.Is(err, ErrQueueNotFound) {
		t.Fatalf("unknown queue info: %v", err)
	}
	if _, err := s.GetMessage(r.Append.NextOffset() + 100); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("offset past the end: %v", err)
	}
	if _, err := s.GetMessage(r.Append.WroteOffset + 4); !errors.Is(err, ErrNoRecord) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("offset inside a record: %v", err)
	}
	if _, err := s.GetMessageByID("nothex"); !errors.Is(err, ErrIllegal) {
		t.Fatalf("bad msgId: %v", err)
	}
	// At the end with no wait: empty, no error.
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: "E", Offset: 1})
	if err != nil || len(res.Messages) != 0 || res.NextOffset != 1 {
		t.Fatalf("at the end: %v %+v", err, res)
	}
}

func TestReadDetectsCorruption(t *testing.T) {
	s, o := openTest(t, nil)
	r, _ := s.PutMessage(context.Background(), msg("C", "payload"))
	waitVisible(t, s, "C", 0, 1)
	// Flip a body byte in the file under the running store (the same page
	// cache the mapping sees).
	path := filepath.Join(o.Dir, "commitlog", fileName(0))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'P'}, r.Append.WroteOffset+88)
	f.Close()
	if _, err := s.GetMessage(r.Append.WroteOffset); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt record read: %v", err)
	}
	if _, err := s.PullMessages(context.Background(), PullRequest{Topic: "C"}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt record pulled: %v", err)
	}
}

func TestLongPollWakesOnArrival(t *testing.T) {
	s, _ := openTest(t, nil)
	s.PutMessage(context.Background(), msg("L", "first"))
	waitVisible(t, s, "L", 0, 1)
	got := make(chan PullResult, 1)
	go func() {
		res, _ := s.PullMessages(context.Background(), PullRequest{Topic: "L", Offset: 1, Wait: time.Hour})
		got <- res
	}()
	s.PutMessage(context.Background(), msg("L", "second"))
	res := <-got // would block for an hour if arrival did not wake it
	if len(res.Messages) != 1 || string(res.Messages[0].Body) != "second" {
		t.Fatalf("long poll returned %+v", res)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.PullMessages(ctx, PullRequest{Topic: "L", Offset: 2, Wait: time.Hour})
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled long poll: %v", err)
	}
}

// TestSyncVisibilityFollowsDurability: in sync mode nothing is readable
// before the msync that covers it (RocketMQ #8239).
func TestSyncVisibilityFollowsDurability(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FlushMode = FlushSync })
	releaseSync := s.log.Files().HoldSync() // no sync can complete
	r, err := s.PutMessage(context.Background(), msg("V", "x", Property{Key: PropertyWaitStoreOK, Value: "false"}))
	if err != nil {
		t.Fatal(err)
	}
	s.index.Wake()
	if s.visibleEnd() >= r.Append.NextOffset() {
		t.Fatalf("visible end %d covers an unflushed record ending at %d", s.visibleEnd(), r.Append.NextOffset())
	}
	if _, err := s.GetMessage(r.Append.WroteOffset); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("unflushed message readable by offset: %v", err)
	}
	if res, err := s.PullMessages(context.Background(), PullRequest{Topic: "V"}); !errors.Is(err, ErrQueueNotFound) || len(res.Messages) != 0 {
		t.Fatalf("unflushed message pullable: %v %d", err, len(res.Messages))
	}
	releaseSync()
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: "V", Wait: 10 * time.Second})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("after the sync: %v %d", err, len(res.Messages))
	}
	if s.log.Flushed() < r.Append.NextOffset() {
		t.Fatal("readable before durable")
	}
}

func TestTagsCodeMatchesJava(t *testing.T) {
	// Values of Java's "…".hashCode().
	for tag, want := range map[string]int64{"": 0, "TagA": 2598919, "a": 97, "hello world": 1794106052, "日本": 835047} {
		if got := TagsCode(tag); got != want {
			t.Errorf("TagsCode(%q) = %d, want %d", tag, got, want)
		}
	}
	if TagsCode("polygenelubricants") != -2147483648 { // the classic Integer.MIN_VALUE hash
		t.Errorf("overflowing hash: %d", TagsCode("polygenelubricants"))
	}
}

func TestTagsCodeBytesMatches(t *testing.T) {
	for _, s := range []string{"", "TagA", "日本", "emoji 😀 tag", "polygenelubricants", "bad\xffutf8"} {
		if TagsCode(s) != tagsCodeBytes([]byte(s)) {
			t.Errorf("%q: %d vs %d", s, TagsCode(s), tagsCodeBytes([]byte(s)))
		}
	}
	// A supplementary character hashes as its two UTF-16 surrogates.
	if got, want := TagsCode("😀"), int64(31*0xD83D+0xDE00); got != want {
		t.Errorf("surrogates: %d want %d", got, want)
	}
}

// TestGetMessageRefusesForgedRecord hides a well-formed record (valid
// CRCs, the right physical offset) inside another message's body: reading
// at that offset must be ErrNoRecord, because no record of the store starts
// there, whether the forged record names a queue that does not exist
// (forge/0 offset 4242) or a real entry (which points elsewhere). Pulls
// still serve the carrier, and not-yet-dispatched records are still found
// (the record-chain proof).
func TestGetMessageRefusesForgedRecord(t *testing.T) {
	for _, tc := range []struct {
		name   string
		topic  string
		offset int64
	}{
		{"unknown queue", "forge", 4242},
		{"entry of another record", "F", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openTest(t, nil)
			first, err := s.PutMessage(context.Background(), msg("F", "first"))
			if err != nil {
				t.Fatal(err)
			}
			carrierAt := first.Append.NextOffset()
			bodyAt := carrierAt + posBornHost + 8 + 8 + 8 + 4 + 8 + 4 // IPv4 hosts
			forged := record.Spec{Topic: tc.topic, Body: []byte("evil"), BodyCRC: BodyCRC([]byte("evil")), PropCRC: true}
			if verr := forged.Size(); verr != nil {
				t.Fatal(verr)
			}
			raw := make([]byte, forged.Total)
			forged.Encode(raw, tc.offset, bodyAt, 1)
			carrier, err := s.PutMessage(context.Background(), &Message{Topic: "F", Body: raw, BornTimestamp: 1,
				BornHost: first.Append.StoreHost})
			if err != nil || carrier.Append.WroteOffset != carrierAt {
				t.Fatalf("carrier at %d, want %d: %v", carrier.Append.WroteOffset, carrierAt, err)
			}
			if got := readAt(t, s.opts.Dir, s.opts.FileSize, bodyAt); got.Topic != tc.topic || got.QueueOffset != tc.offset {
				t.Fatalf("the forged bytes do not decode as a record: %+v", got)
			}
			waitVisible(t, s, "F", 0, 2)
			if rec, err := s.GetMessage(bodyAt); !errors.Is(err, ErrNoRecord) || errors.Is(err, ErrCorrupt) {
				t.Fatalf("GetMessage inside a body: %+v, %v; want ErrNoRecord", rec, err)
			}
			if _, err := s.GetMessageByID(MsgID(carrier.Append.StoreHost, bodyAt)); !errors.Is(err, ErrNoRecord) {
				t.Fatalf("GetMessageByID inside a body: %v; want ErrNoRecord", err)
			}
			if rec, err := s.GetMessage(carrierAt); err != nil || rec.QueueOffset != 1 {
				t.Fatalf("the carrier: %v", err)
			}
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "F"})
			if err != nil || len(res.Messages) != 2 {
				t.Fatalf("pull: %d messages, %v", len(res.Messages), err)
			}
		})
	}
}

// TestGetMessageBeforeDispatch reads records the dispatcher has not
// indexed yet (it is paused): they are proven by the record chain from the
// dispatch position, and an offset inside one of them is still refused.
func TestGetMessageBeforeDispatch(t *testing.T) {
	s, _ := openTest(t, nil)
	r0, _ := s.PutMessage(context.Background(), msg("D", "zero"))
	waitVisible(t, s, "D", 0, 1)
	resume := s.index.HoldRounds() // no dispatch round from here on
	defer resume()
	var offs []int64
	for i := 0; i < 3; i++ { // WAIT=false: a waiting put would wait out the index's bound
		r, err := s.PutMessage(context.Background(), msg("D", strings.Repeat("x", 100+i), Property{Key: PropertyWaitStoreOK, Value: "false"}))
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, r.Append.WroteOffset)
	}
	if d := s.index.Dispatched(); d > offs[0] {
		t.Fatalf("dispatched %d already covers %d", d, offs[0])
	}
	for _, off := range append([]int64{r0.Append.WroteOffset}, offs...) {
		if rec, err := s.GetMessage(off); err != nil || rec.PhysicalOffset != off {
			t.Fatalf("GetMessage(%d): %v", off, err)
		}
	}
	if _, err := s.GetMessage(offs[1] + 4); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("inside an undispatched record: %v", err)
	}
}
