package storage

import (
	"github.com/storaged/storaged/storage/record"

	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/storage/schedule"
	"github.com/storaged/storaged/storage/vfs"
)

// putRaw appends a message below the API: no topic rules, no topic table
// (appendRecords' delete check aside, which it skips by naming the
// schedule topic or a topic it adds to the table by hand). Tests use it to
// build data dirs the API now refuses to write, such as the one a client
// could write before the schedule topic was reserved.
func putRaw(t testing.TB, s *Store, topic string, qid int32, body string) AppendResult {
	t.Helper()
	m := msg(topic, body)
	m.QueueID = qid
	r, verr := s.prepare(m)
	if verr != nil {
		t.Fatal(verr)
	}
	if topic != ScheduleTopic {
		snap := s.topics.cur.Load().clone()
		snap.topics[topic] = math.MaxInt32 // every queue id "in range"
		s.topics.cur.Store(snap)
	}
	res, err := s.appendRecords(r.Topic, r.QueueID, r.SysFlag, []record.Spec{r}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.afterAppend(context.Background(), res, true); err != nil {
		t.Fatal(err)
	}
	return res
}

// logLines is a logger into a buffer and a counter of lines holding a
// substring.
type logLines struct{ buf bytes.Buffer }

func (l *logLines) logger() *zerolog.Logger {
	z := zerolog.New(&syncWriter{w: &l.buf})
	return &z
}

func (l *logLines) count(sub string) int { return strings.Count(l.buf.String(), sub) }

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func TestTopicRules(t *testing.T) {
	cases := []struct {
		topic           string
		name, send, sys bool // valid name, clients may send, system topic
	}{
		{"Orders", true, true, false},
		{"%RETRY%group", true, true, false}, // retry topics are writable, as in RocketMQ
		{"%DLQ%group", true, true, false},
		{"SCHEDULE_TOPIC_XXXX", true, false, true},
		{"SCHEDULE_TOPIC_XXXX_V2", true, false, true},
		{"RMQ_SYS_TRANS_HALF_TOPIC", true, false, true},
		{"RMQ_SYS_TRANS_OP_HALF_TOPIC", true, false, true},
		{"TRANS_CHECK_MAX_TIME_TOPIC", true, false, true},
		{"SELF_TEST_TOPIC", true, false, true},
		{"OFFSET_MOVED_EVENT", true, false, true},
		{"rmq_sys_wheel_timer", true, false, true},
		{"TBW102", true, true, true}, // system, but writable (RocketMQ)
		{"BenchmarkTest", true, true, true},
		{"RMQ_SYS_TRACE_TOPIC", true, true, true},
		{"schedule_topic_xxxx", true, true, false}, // names are case-sensitive
		{"", false, false, false},
		{"a/b", false, false, false},
		{"%2e%2e", false, false, false},
		{"%DLQ%ab12", true, true, false},   // a group named ab12: the prefix's % is no escape
		{"%RETRY%Cafe", true, true, false}, // %Ca would decode to a byte outside the set
		{"%DLQ%%2e%2e", false, false, false},
		{"%RETRY%a%2Fb", false, false, false},
		{"x%DLQ%ab", false, false, false},   // the prefix only counts at the start
		{"%DLQ%2Fetc", false, false, false}, // the prefix's % with the name's 2F is a "/"
		{"%RETRY%2e", false, false, false},  // … or a "."
		{"%DLQ%252Fx", false, false, false}, // decoded twice: "%DLQ%2Fx", then "/"
		{"%DLQ%c0%af", false, false, false}, // the name's own escape
		{strings.Repeat("a", 128), false, false, false},
	}
	for _, c := range cases {
		if got := TopicNameProblem(c.topic) == ""; got != c.name {
			t.Errorf("TopicNameProblem(%q) ok = %v, want %v", c.topic, got, c.name)
		}
		if got := SendTopicProblem(c.topic) == ""; got != c.send {
			t.Errorf("SendTopicProblem(%q) ok = %v, want %v", c.topic, got, c.send)
		}
		if c.name && SystemTopic(c.topic) != c.sys {
			t.Errorf("SystemTopic(%q) = %v, want %v", c.topic, !c.sys, c.sys)
		}
	}
}

// TestPutTopicStatuses: the put statuses of the topic table, for single
// puts and batches.
func TestPutTopicStatuses(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.MaxTopics = 3 })
	ctx := context.Background()
	put := func(topic string, qid int32, batch bool) (PutResult, error) {
		if batch {
			return s.PutMessages(ctx, &Batch{Topic: topic, QueueID: qid, Messages: manySmall(2, 8)})
		}
		m := msg(topic, "x")
		m.QueueID = qid
		return s.PutMessage(ctx, m)
	}
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			cases := []struct {
				topic  string
				qid    int32
				status PutStatus
				want   error  // errors.Is target; nil for PUT_OK or a ValidationError
				reason string // in the error message
			}{
				{"A", 7, PutOK, nil, ""},
				{"A", 8, MessageIllegal, ErrIllegal, "topic A has 8 queues"},
				{"A", math.MaxInt32, MessageIllegal, ErrIllegal, "has 8 queues"},
				{ScheduleTopic, 2, MessageIllegal, ErrIllegal, "reserved"},
				{ScheduleTopic, math.MaxInt32, MessageIllegal, ErrIllegal, "reserved"},
				{"RMQ_SYS_TRANS_HALF_TOPIC", 0, MessageIllegal, ErrIllegal, "reserved"},
				{"rmq_sys_x", 0, MessageIllegal, ErrIllegal, "reserved"},
				{"%RETRY%g", 0, PutOK, nil, ""},
			}
			for _, c := range cases {
				before := s.log.MaxOffset()
				res, err := put(c.topic, c.qid, batch)
				if res.Status != c.status || (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) ||
					!strings.Contains(fmt.Sprint(err), c.reason) {
					t.Fatalf("%s/%d: status %v err %v, want %v %v %q", c.topic, c.qid, res.Status, err, c.status, c.want, c.reason)
				}
				if c.status != PutOK && s.log.MaxOffset() != before {
					t.Fatalf("%s/%d: a refused put changed the log", c.topic, c.qid)
				}
			}
		})
	}
	// A, %RETRY%g exist; one more topic fits, the next does not.
	if res, err := put("B", 0, false); err != nil || res.Status != PutOK {
		t.Fatalf("third topic: %v %v", res.Status, err)
	}
	for _, batch := range []bool{false, true} {
		res, err := put("C", 0, batch)
		if !errors.Is(err, ErrTooManyTopics) || res.Status != LMQConsumeQueueNumExceeded {
			t.Fatalf("fourth topic: %v %v", res.Status, err)
		}
	}
	if _, err := s.CreateTopic("C", 1); !errors.Is(err, ErrTooManyTopics) {
		t.Fatalf("CreateTopic beyond the limit: %v", err)
	}
	if _, err := s.DeleteTopic("B"); err != nil {
		t.Fatal(err)
	}
	if res, err := put("C", 0, false); err != nil || res.Status != PutOK {
		t.Fatalf("after a delete: %v %v", res.Status, err)
	}
}

// TestAutoCreateOff: an unknown topic is refused (TOPIC_NOT_EXIST) until
// CreateTopic creates it; a delayed put names the real topic.
func TestAutoCreateOff(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.NoAutoCreateTopics = true })
	ctx := context.Background()
	delayed := msg("Orders", "later", Property{Key: PropertyDelayLevel, Value: "1"})
	for _, m := range []*Message{msg("Orders", "x"), delayed} {
		if res, err := s.PutMessage(ctx, m); !errors.Is(err, ErrTopicNotFound) || res.Status != MessageIllegal || res.Appended() {
			t.Fatalf("put to an unknown topic: %v %v", res.Status, err)
		}
	}
	if _, err := s.PutMessages(ctx, &Batch{Topic: "Orders", Messages: manySmall(1, 4)}); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("batch to an unknown topic: %v", err)
	}
	if _, err := s.CreateTopic("Orders", 2); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Message{msg("Orders", "x"), delayed} {
		if res, err := s.PutMessage(ctx, m); err != nil || res.Status != PutOK {
			t.Fatalf("put after CreateTopic: %v %v", res.Status, err)
		}
	}
	m := msg("Orders", "x")
	m.QueueID = 2
	if _, err := s.PutMessage(ctx, m); !errors.Is(err, ErrIllegal) || !strings.Contains(err.Error(), "2 queues") {
		t.Fatalf("queue 2 of 2: %v", err)
	}
}

// TestTopicAdmin: create, update (raise only), get, list (paged), delete,
// and that the table survives a restart (real files).
func TestTopicAdmin(t *testing.T) {
	s, o := openTest(t, nil)
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		queues int32
		want   error
	}{
		{"T1", 4, nil},
		{"T1", 4, ErrTopicExists},
		{"T2", 0, ErrIllegal},
		{"T2", MaxQueues + 1, ErrIllegal},
		{"T2", math.MaxInt32, ErrIllegal},
		{"T2", MaxQueues, nil},
		{ScheduleTopic, 4, ErrIllegal},
		{"TBW102", 4, ErrIllegal},
		{"bad/name", 4, ErrIllegal},
	} {
		if _, err := s.CreateTopic(c.name, c.queues); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Fatalf("CreateTopic(%s, %d) = %v, want %v", c.name, c.queues, err, c.want)
		}
	}
	if _, err := s.UpdateTopic("T1", 3); !errors.Is(err, ErrQueuesLowered) {
		t.Fatalf("lowering: %v", err)
	}
	if _, err := s.UpdateTopic("nope", 3); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
	if _, err := s.UpdateTopic("T1", 6); err != nil {
		t.Fatal(err)
	}
	m := msg("T1", "x")
	m.QueueID = 5
	if _, err := s.PutMessage(ctx, m); err != nil {
		t.Fatal(err)
	}
	settle(t, s)
	info, err := s.Topic("T1")
	if err != nil || info.Queues != 6 || len(info.Offsets) != 6 || info.Offsets[5] != (QueueOffsets{QueueID: 5, Min: 0, Max: 1}) {
		t.Fatalf("Topic(T1) = %+v, %v", info, err)
	}
	if _, err := s.Topic("nope"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("Topic(nope): %v", err)
	}
	for i := range 5 {
		if _, err := s.CreateTopic(fmt.Sprintf("P%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	after := ""
	for {
		page, more, err := s.Topics(after, 3)
		if err != nil || len(page) > 3 {
			t.Fatalf("Topics: %d, %v", len(page), err)
		}
		for _, p := range page {
			names = append(names, p.Name)
		}
		if !more {
			break
		}
		after = page[len(page)-1].Name
	}
	if got := strings.Join(names, ","); got != "P0,P1,P2,P3,P4,T1,T2" {
		t.Fatalf("listed %s", got)
	}
	if _, err := s.DeleteTopic(ScheduleTopic); !errors.Is(err, ErrIllegal) {
		t.Fatalf("deleting the schedule topic: %v", err)
	}
	if _, err := s.DeleteTopic("P0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteTopic("P0"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	s.Close()

	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	page, _, _ := s2.Topics("", 0)
	got := []string{}
	for _, p := range page {
		got = append(got, fmt.Sprintf("%s:%d", p.Name, p.Queues))
	}
	if strings.Join(got, ",") != "P1:1,P2:1,P3:1,P4:1,T1:6,T2:1024" {
		t.Fatalf("after restart: %v", got)
	}
	if info, _ := s2.Topic("T1"); info.Offsets[5].Max != 1 {
		t.Fatalf("offsets after restart: %+v", info)
	}
}

// TestDeleteTopicNoResurrection: a deleted topic's records are never
// indexed again, not by a consume-queue rebuild from the start of the log,
// and a topic re-created under the same name starts at queue offset 0
// without colliding with them.
func TestDeleteTopicNoResurrection(t *testing.T) {
	o := Options{Dir: t.TempDir(), FileSize: 64 << 10, MaxMessageSize: 16 << 10}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		if _, err := s.PutMessage(ctx, msg("T", fmt.Sprint("old", i))); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, s)
	if _, err := s.DeleteTopic("T"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.QueueInfo("T", 0); !errors.Is(err, ErrQueueNotFound) {
		t.Fatalf("queue of a deleted topic: %v", err)
	}
	if _, err := os.Stat(filepath.Join(o.Dir, "consumequeue", "T")); !os.IsNotExist(err) {
		t.Fatalf("consume queue files of a deleted topic: %v", err)
	}
	for i := range 2 {
		res, err := s.PutMessage(ctx, msg("T", fmt.Sprint("new", i)))
		if err != nil || res.Append.QueueOffset != int64(i) {
			t.Fatalf("put to the re-created topic: offset %d, %v", res.Append.QueueOffset, err)
		}
	}
	settle(t, s)
	s.Close()
	want := []string{"new0", "new1"}
	for _, damage := range []string{"none", "consume queues deleted"} {
		if damage != "none" {
			os.RemoveAll(filepath.Join(o.Dir, "consumequeue"))
		}
		s, err := Open(o)
		if err != nil {
			t.Fatalf("%s: %v", damage, err)
		}
		recs := pullAll(t, s, "T", 0)
		var bodies []string
		for _, r := range recs {
			bodies = append(bodies, string(r.Body))
		}
		if strings.Join(bodies, ",") != strings.Join(want, ",") {
			t.Fatalf("%s: topic T serves %v, want %v", damage, bodies, want)
		}
		if res, err := s.PutMessage(ctx, msg("T", "next")); err != nil || res.Append.QueueOffset != int64(len(want)) {
			t.Fatalf("%s: next offset %d, %v", damage, res.Append.QueueOffset, err)
		}
		want = append(want, "next")
		s.Close()
	}
}

// TestDeleteTopicCrashBeforeCheckpoint: the process dies after a delete
// and before the next checkpoint (which still names the deleted topic's
// queues): Open neither resurrects the topic nor refuses to start.
func TestDeleteTopicCrashBeforeCheckpoint(t *testing.T) {
	for _, indexed := range []bool{false, true} { // the re-created topic's put indexed before the crash
		t.Run(fmt.Sprintf("indexed=%v", indexed), func(t *testing.T) { deleteCrash(t, indexed) })
	}
}

func deleteCrash(t *testing.T, indexed bool) {
	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 16 << 10, StatDisk: func(string) (DiskUsage, error) {
		return DiskUsage{Size: 100 << 30, Used: 10 << 30, Avail: 90 << 30}, nil
	}}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		s.PutMessage(ctx, msg("T", fmt.Sprint("old", i)))
	}
	settle(t, s)
	if err := s.index.Checkpoint(); err != nil { // names T/0 with 3 entries
		t.Fatal(err)
	}
	if _, err := s.DeleteTopic("T"); err != nil {
		t.Fatal(err)
	}
	if res, err := s.PutMessage(ctx, msg("T", "new0")); err != nil || res.Append.QueueOffset != 0 {
		t.Fatalf("re-created: %v %v", res.Append.QueueOffset, err)
	}
	if indexed {
		settle(t, s)
	}
	s.log.Sync(0)
	resume := s.pause()
	img := fs.Crash(rand.New(rand.NewPCG(3, 4)))
	resume()
	s.Close()
	o.FS = img
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if recs := pullAll(t, s2, "T", 0); len(recs) != 1 || string(recs[0].Body) != "new0" {
		t.Fatalf("after the crash topic T serves %d records", len(recs))
	}
}

// TestTopicConfigCrashImages: a crash at any step of a persist leaves the
// old table or the new one, never a torn or missing one.
func TestTopicConfigCrashImages(t *testing.T) {
	newTable := func(fs vfs.FS) *topicTable {
		return newTopicTable(Options{Dir: "/d", FS: fs, DefaultQueues: 8, MaxTopics: 100}.withDefaults())
	}
	for step, op := range []vfs.Op{vfs.OpWriteFile, vfs.OpRename, vfs.OpSyncDir, -1} {
		fs := vfs.NewMem()
		fs.MkdirAll("/d")
		tb := newTable(fs)
		if _, err := tb.create("Old", 2, false); err != nil {
			t.Fatal(err)
		}
		if op >= 0 {
			// The crash happens just before op: it and what follows never run.
			fs.SetInjector(vfs.OnCall(op, 1, vfs.ErrInjected, true))
		}
		_, err := tb.create("New", 3, false)
		if (op >= 0) != (err != nil) {
			t.Fatalf("step %d: create: %v", step, err)
		}
		fs.SetInjector(nil)
		for seed := range uint64(8) {
			img := fs.Crash(rand.New(rand.NewPCG(seed, uint64(step))))
			got := newTable(img)
			if _, err := got.load(); err != nil {
				t.Fatalf("step %d seed %d: %v", step, seed, err)
			}
			_, hasOld := got.get("Old")
			n, hasNew := got.get("New")
			if !hasOld || (hasNew && n != 3) {
				t.Fatalf("step %d seed %d: table %+v", step, seed, got.cur.Load().topics)
			}
			if op < 0 && !hasNew {
				t.Fatalf("a completed persist was lost (seed %d)", seed)
			}
		}
	}
	// A damaged file is reported, with the remedy.
	fs := vfs.NewMem()
	fs.MkdirAll("/d")
	tb := newTable(fs)
	tb.create("A", 1, false)
	b, _ := fs.ReadFile("/d/config/" + topicsName)
	b[3] ^= 0x20
	fs.WriteFile("/d/config/"+topicsName, b)
	if _, err := newTable(fs).load(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "move it away") {
		t.Fatalf("damaged file: %v", err)
	}
}

// TestTopicConfigPersistFailureNotSticky: a put that needs an auto-create
// while the table cannot be written is refused (nothing appended, a
// retriable error), and the same put goes through once the cause clears;
// puts to existing topics never notice.
func TestTopicConfigPersistFailureNotSticky(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 16 << 10, StatDisk: func(string) (DiskUsage, error) {
		return DiskUsage{Size: 100 << 30, Used: 10 << 30, Avail: 90 << 30}, nil
	}}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.PutMessage(ctx, msg("Old", "x")); err != nil {
		t.Fatal(err)
	}
	enospc := fmt.Errorf("%w (ENOSPC)", vfs.ErrNoSpace)
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpWriteFile && strings.Contains(path, topicsName) {
			return enospc
		}
		return nil
	})
	before := s.log.MaxOffset()
	res, err := s.PutMessage(ctx, msg("New", "x"))
	if !errors.Is(err, ErrTopicConfig) || res.Status != ServiceNotAvailable || s.log.MaxOffset() != before {
		t.Fatalf("put needing a create while the disk is full: %v %v", res.Status, err)
	}
	if _, err := s.CreateTopic("New2", 1); !errors.Is(err, ErrTopicConfig) {
		t.Fatalf("CreateTopic while the disk is full: %v", err)
	}
	if _, err := s.DeleteTopic("Old"); !errors.Is(err, ErrTopicConfig) {
		t.Fatalf("DeleteTopic while the disk is full: %v", err)
	}
	if res, err := s.PutMessage(ctx, msg("Old", "y")); err != nil || res.Append.QueueOffset != 1 {
		t.Fatalf("put to an existing topic (after the failed delete): %v %v", res.Append.QueueOffset, err)
	}
	if _, ok := s.topics.get("New"); ok || !s.Writable() {
		t.Fatal("a failed persist changed the table or the store")
	}
	fs.SetInjector(nil)
	if res, err := s.PutMessage(ctx, msg("New", "x")); err != nil || res.Status != PutOK {
		t.Fatalf("after the disk cleared: %v %v", res.Status, err)
	}
}

// TestScheduleQueueBomb: a data dir holding records on schedule queues
// 5,000,000 and 2^31-1 (a client could put them before the schedule topic
// was reserved) opens, logs them once, serves only the delay table's
// levels, and stays usable; its memory is not sized by the queue ids.
func TestScheduleQueueBomb(t *testing.T) {
	var logs logLines
	s, o := openTest(t, func(o *Options) { o.Logger = logs.logger() })
	putRaw(t, s, ScheduleTopic, 5000000, "bomb")
	putRaw(t, s, ScheduleTopic, math.MaxInt32, "bomb")
	putRaw(t, s, "Old", MaxQueues+7, "bogus") // a topic queue beyond the bound
	s.Close()
	for _, damage := range []string{"none", "consume queues and topic config deleted"} {
		if damage != "none" {
			os.RemoveAll(filepath.Join(o.Dir, "consumequeue"))
			os.Remove(filepath.Join(o.Dir, "config", topicsName))
		}
		logs.buf.Reset()
		s, err := Open(o)
		if err != nil {
			t.Fatalf("%s: %v", damage, err)
		}
		if n := len(s.Stats().Schedule.Levels); n != 18 {
			t.Fatalf("%s: scheduler serves %d levels, want the 18 of the delay table", damage, n)
		}
		if n := logs.count("schedule queues beyond the delay level table"); n != 1 {
			t.Fatalf("%s: %d log lines about the schedule queues, want 1:\n%s", damage, n, logs.buf.String())
		}
		if damage != "none" {
			if n := logs.count("at or above the queue bound"); n != 1 {
				t.Fatalf("%d log lines about the bogus queue, want 1:\n%s", n, logs.buf.String())
			}
			if n, _ := s.topics.get("Old"); n != MaxQueues {
				t.Fatalf("adopted Old with %d queues, want %d", n, MaxQueues)
			}
		}
		if recs := pullAll(t, s, ScheduleTopic, math.MaxInt32); len(recs) != 1 {
			t.Fatalf("%s: the bogus schedule record is not readable (%d)", damage, len(recs))
		}
		if res, err := s.PutMessage(context.Background(), msg("Fresh", "x")); err != nil || res.Status != PutOK {
			t.Fatalf("%s: put after the bomb: %v %v", damage, res.Status, err)
		}
		s.Close()
	}
}

// TestAdoptTopicsFromOldDataDir: a data dir with consume queues and no
// topic config (written before it existed) adopts its topics with queue
// counts covering the queues found, at least the default.
func TestAdoptTopicsFromOldDataDir(t *testing.T) {
	s, o := openTest(t, nil)
	putRaw(t, s, "Wide", 20, "x")
	putRaw(t, s, "Narrow", 0, "x")
	s.Close()
	os.RemoveAll(filepath.Join(o.Dir, "config"))
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for name, want := range map[string]int32{"Wide": 21, "Narrow": DefaultQueues} {
		if n, ok := s2.topics.get(name); !ok || n != want {
			t.Fatalf("adopted %s with %d queues (%v), want %d", name, n, ok, want)
		}
	}
	if _, err := os.Stat(filepath.Join(o.Dir, "config", topicsName)); err != nil {
		t.Fatalf("adopted table not persisted: %v", err)
	}
}

// TestScheduleRePutRefusedByTopicConfig: a delayed message whose real
// topic was deleted (auto-creation off) is skipped, not retried forever.
func TestScheduleRePutRefusedByTopicConfig(t *testing.T) {
	s, _, clock := openSched(t, FlushAsync, func(o *Options) { o.NoAutoCreateTopics = true })
	haltScheduler(s)
	if _, err := s.CreateTopic("Real", 1); err != nil {
		t.Fatal(err)
	}
	putDelayed(t, s, "Real", 0, 1, "gone")
	putDelayed(t, s, "Real", 0, 1, "gone too")
	settle(t, s)
	if _, err := s.DeleteTopic("Real"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(schedule.PollInterval * 20)
	runRounds(s)
	if st := s.Stats().Schedule; st.Skipped != 2 || st.Refused != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// BenchmarkTopicAdmit is what the topic table adds to a put: admit before
// the put lock, has under it, for an existing topic.
func BenchmarkTopicAdmit(b *testing.B) {
	tb := newTopicTable(Options{Dir: b.TempDir(), FS: vfs.NewMem()}.withDefaults())
	tb.fs.MkdirAll(b.TempDir())
	tb.cur.Store(&topicSnapshot{topics: map[string]int32{"TopicTest": 8}, deleted: map[string]int64{}})
	for i := range 1000 {
		tb.cur.Load().topics[fmt.Sprint("T", i)] = 8
	}
	b.ReportAllocs()
	for b.Loop() {
		if tb.admit("TopicTest", 3) != nil || !tb.has("TopicTest", 3) {
			b.Fatal("refused")
		}
	}
}

// TestTopicCreatesGroupCommitted: concurrent creates share persists, the
// topic limit holds exactly under concurrency, racing creates of one name
// agree on its queue count, and a failed round fails every create it
// carried, changing nothing.
func TestTopicCreatesGroupCommitted(t *testing.T) {
	fs := vfs.NewMem()
	var writes atomic.Int64
	var fail atomic.Bool
	fs.SetInjector(func(op vfs.Op, path string) error {
		if op == vfs.OpWriteFile && strings.Contains(path, topicsName) {
			writes.Add(1)
			if fail.Load() {
				return vfs.ErrNoSpace
			}
		}
		return nil
	})
	fs.MkdirAll("/d")
	tb := newTopicTable(Options{Dir: "/d", FS: fs, MaxTopics: 40}.withDefaults())
	const n = 60
	var wg sync.WaitGroup
	errs := make([]error, n)
	counts := make([]int32, n)
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprint("T", i)
			if i >= 50 {
				name = "Same" // ten creates of one name
			}
			counts[i], errs[i] = tb.create(name, int32(1+i%3), true)
		})
	}
	wg.Wait()
	ok, full := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrTooManyTopics):
			full++
		default:
			t.Fatalf("create %d: %v", i, err)
		}
	}
	topics := len(tb.cur.Load().topics)
	if topics != 40 || full == 0 {
		t.Fatalf("%d topics (%d ok, %d refused), want exactly the limit of 40", topics, ok, full)
	}
	if same, ok := tb.get("Same"); ok {
		for i := 50; i < n; i++ {
			if errs[i] == nil && counts[i] != same {
				t.Fatalf("create %d of Same answered %d queues, the table has %d", i, counts[i], same)
			}
		}
	}
	t.Logf("%d creates, %d persists", ok, writes.Load())
	reloaded := newTopicTable(Options{Dir: "/d", FS: fs, MaxTopics: 40}.withDefaults())
	if _, err := reloaded.load(); err != nil || len(reloaded.cur.Load().topics) != 40 {
		t.Fatalf("reloaded %d topics: %v", len(reloaded.cur.Load().topics), err)
	}

	// A failing round: every create it carries fails, nothing changes.
	tb = newTopicTable(Options{Dir: "/d2", FS: fs}.withDefaults())
	fail.Store(true)
	for i := range 10 {
		wg.Go(func() {
			if _, err := tb.create(fmt.Sprint("F", i), 1, true); !errors.Is(err, ErrTopicConfig) {
				t.Errorf("create during ENOSPC: %v", err)
			}
		})
	}
	wg.Wait()
	if len(tb.cur.Load().topics) != 0 {
		t.Fatalf("a failed round changed the table: %v", tb.cur.Load().topics)
	}
	fail.Store(false)
	if _, err := tb.create("F0", 1, true); err != nil {
		t.Fatalf("after ENOSPC cleared: %v", err)
	}
}

// TestRouteQueues: an existing topic answers its own queue count; an
// unknown one the count its first put creates it with while auto-creation
// is on (and that put then creates exactly that many), ErrTopicNotFound
// while it is off; a closed store ErrClosed.
func TestRouteQueues(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.DefaultQueues = 3 })
	if _, err := s.CreateTopic("Made", 5); err != nil {
		t.Fatal(err)
	}
	if n, exists, err := s.RouteQueues("Made"); err != nil || !exists || n != 5 {
		t.Fatalf("existing topic: %d %v %v", n, exists, err)
	}
	n, exists, err := s.RouteQueues("Later")
	if err != nil || exists || n != 3 {
		t.Fatalf("unknown topic, auto-creation on: %d %v %v", n, exists, err)
	}
	m := msg("Later", "x")
	m.QueueID = n - 1
	if _, err := s.PutMessage(context.Background(), m); err != nil {
		t.Fatalf("put to the last routed queue: %v", err)
	}
	if got, exists, err := s.RouteQueues("Later"); err != nil || !exists || got != n {
		t.Fatalf("after the creating put: %d %v %v", got, exists, err)
	}

	off, _ := openTest(t, func(o *Options) { o.NoAutoCreateTopics = true })
	if _, _, err := off.RouteQueues("Later"); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("unknown topic, auto-creation off: %v", err)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := off.RouteQueues("Later"); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed store: %v", err)
	}
}
