package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a settable clock for store timestamps and the busy watchdog.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func (c *fakeClock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }

func openTest(t testing.TB, mod func(*Options)) (*Store, Options) {
	t.Helper()
	o := Options{Dir: t.TempDir(), FileSize: 64 << 10, MaxMessageSize: 16 << 10}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, o
}

func msg(topic string, body string, props ...Property) *Message {
	return &Message{Topic: topic, Body: []byte(body), Properties: props, BornTimestamp: 1,
		BornHost: netip.MustParseAddrPort("10.0.0.2:5000")}
}

// readAt decodes the record at commitlog offset off straight from the file
// on disk, not through the store's memory.
func readAt(t testing.TB, dir string, fileSize, off int64) *Record {
	t.Helper()
	from := off - off%fileSize
	b, err := os.ReadFile(filepath.Join(dir, "commitlog", fileName(from)))
	if err != nil {
		t.Fatalf("read file: %v", err)
	}
	rec, _, err := DecodeRecordStrict(b[off-from:])
	if err != nil {
		t.Fatalf("decode at %d: %v", off, err)
	}
	return rec
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		o    Options
		want string
	}{
		{"no dir", Options{}, "Dir is required"},
		{"tiny file", Options{Dir: "x", FileSize: 100}, "FileSize"},
		{"bad delay table", Options{Dir: "x", DelayLevels: "1s 5x"}, "bad unit"},
		{"negative duration", Options{Dir: "x", SyncFlushTimeout: -1}, "negative"},
		{"bad mode", Options{Dir: "x", FlushMode: 7}, "FlushMode"},
		{"ok", Options{Dir: "x"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	levels, err := ParseDelayLevels(DefaultDelayLevels)
	if err != nil || len(levels) != 18 || levels[0] != time.Second || levels[17] != 2*time.Hour || levels[4] != time.Minute {
		t.Fatalf("default levels: %v %v", levels, err)
	}
	o := Options{Dir: "x"}
	d := o.withDefaults()
	if o.FileSize != 0 || d.FileSize != 1<<30 || d.MaxMessageSize != 4<<20 || d.FlushInterval != 500*time.Millisecond ||
		d.FlushLeastPages != 4 || d.FlushThoroughInterval != 10*time.Second || d.SyncFlushTimeout != 5*time.Second ||
		d.PageCacheBusyTimeout != time.Second {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestPutStatuses(t *testing.T) {
	s, _ := openTest(t, nil)
	bigProps := []Property{{Key: "k", Value: strings.Repeat("v", MaxPropertiesLength)}}
	cases := []struct {
		name   string
		m      *Message
		status PutStatus
		field  string
	}{
		{"ok", msg("TopicA", "hello"), PutOK, ""},
		{"empty topic", msg("", "x"), MessageIllegal, "topic"},
		{"topic 128 bytes", msg(strings.Repeat("a", 128), "x"), MessageIllegal, "topic"},
		{"topic 127 bytes", msg(strings.Repeat("a", 127), "x"), PutOK, ""},
		{"path traversal", msg("../etc", "x"), MessageIllegal, "topic"},
		{"slash", msg("a/b", "x"), MessageIllegal, "topic"},
		{"NUL", msg("a\x00b", "x"), MessageIllegal, "topic"},
		{"encoded dots", msg("%2e%2e", "x"), MessageIllegal, "topic"}, // the shared topic rule (topicrules.go), as the gRPC edge
		{"unicode lookalike", msg("Tоpic", "x"), MessageIllegal, "topic"},
		{"nil body", &Message{Topic: "T"}, MessageIllegal, "body"},
		{"body too large", msg("T", strings.Repeat("x", 16<<10+1)), MessageIllegal, "body"},
		{"negative queue", &Message{Topic: "T", Body: []byte("x"), QueueID: -1}, MessageIllegal, "queue_id"},
		{"properties too long", msg("T", "x", bigProps...), PropertiesSizeExceeded, "properties"},
		{"separator in value", msg("T", "x", Property{Key: "k", Value: "a\x02b"}), MessageIllegal, "properties"},
		{"empty value", msg("T", "x", Property{Key: "k", Value: ""}), MessageIllegal, "properties"},
		{"client crc property", msg("T", "x", Property{Key: PropertyCRC32, Value: "1"}), MessageIllegal, "properties"},
		{"inner num without flag", msg("T", "x", Property{Key: PropertyInnerNum, Value: "2"}), MessageIllegal, "properties"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.log.MaxOffset()
			res, err := s.PutMessage(context.Background(), c.m)
			if res.Status != c.status {
				t.Fatalf("status %v, want %v (err %v)", res.Status, c.status, err)
			}
			if c.status == PutOK {
				if err != nil || !res.Appended() {
					t.Fatalf("ok put: err %v appended %v", err, res.Appended())
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || verr.Field != c.field || !errors.Is(err, ErrIllegal) {
				t.Fatalf("err = %v, want ValidationError on %q", err, c.field)
			}
			if res.Appended() || s.log.MaxOffset() != before {
				t.Fatal("a rejected put changed the log")
			}
		})
	}
	st := s.Stats()
	if st.Puts["MESSAGE_ILLEGAL"] != 14 || st.Puts["PROPERTIES_SIZE_EXCEEDED"] != 1 || st.Puts["PUT_OK"] != 2 {
		t.Fatalf("stats by status: %v", st.Puts)
	}
}

func TestPropertiesLimitBoundary(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FileSize = 1 << 20 })
	// key(1) + 0x01 + value + 0x02 + CRC reserve(20) == 32767 exactly.
	v := strings.Repeat("v", MaxPropertiesLength-1-2-crcPropLen)
	if res, err := s.PutMessage(context.Background(), msg("T", "x", Property{Key: "k", Value: v})); err != nil || res.Status != PutOK {
		t.Fatalf("at the limit: %v %v", res.Status, err)
	}
	if res, _ := s.PutMessage(context.Background(), msg("T", "x", Property{Key: "k", Value: v + "v"})); res.Status != PropertiesSizeExceeded {
		t.Fatalf("one over: %v", res.Status)
	}
}

func TestServiceNotAvailable(t *testing.T) {
	slave, _ := openTest(t, func(o *Options) { o.Role = RoleSlave })
	res, err := slave.PutMessage(context.Background(), msg("T", "x"))
	if res.Status != ServiceNotAvailable || !errors.Is(err, ErrSlave) {
		t.Fatalf("slave: %v %v", res.Status, err)
	}
	s, _ := openTest(t, nil)
	s.fail(errors.New("injected EIO"))
	res, err = s.PutMessage(context.Background(), msg("T", "x"))
	if res.Status != ServiceNotAvailable || !errors.Is(err, ErrWriteFailed) || !strings.Contains(err.Error(), "injected EIO") {
		t.Fatalf("after a failed sync: %v %v", res.Status, err)
	}
	if s.Writable() {
		t.Fatal("store still writable after a failed sync")
	}
	c, _ := openTest(t, nil)
	c.Close()
	res, err = c.PutMessage(context.Background(), msg("T", "x"))
	if res.Status != ServiceNotAvailable || !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v %v", res.Status, err)
	}
	if _, err := c.PutMessages(context.Background(), &Batch{Topic: "T", Messages: []BatchMessage{{Body: []byte("x")}}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed batch: %v", err)
	}
}

func TestPageCacheBusy(t *testing.T) {
	clk := newFakeClock()
	s, _ := openTest(t, func(o *Options) { o.Clock = clk })
	// Simulate a put stuck in the lock: take it as a put would.
	release := s.log.Hold()
	s.log.SetLockedSince(clk.Now().UnixNano())
	clk.Advance(900 * time.Millisecond)
	if s.log.Busy(s.opts.PageCacheBusyTimeout) {
		t.Fatal("busy below the threshold")
	}
	clk.Advance(200 * time.Millisecond)
	res, err := s.PutMessage(context.Background(), msg("T", "x"))
	if res.Status != OSPageCacheBusy || !errors.Is(err, ErrBusy) {
		t.Fatalf("status %v err %v", res.Status, err)
	}
	s.log.SetLockedSince(0)
	release()
	if res, err := s.PutMessage(context.Background(), msg("T", "x")); res.Status != PutOK {
		t.Fatalf("after release: %v %v", res.Status, err)
	}
}

func TestStoreTimestampsMonotonic(t *testing.T) {
	clk := newFakeClock()
	s, _ := openTest(t, func(o *Options) { o.Clock = clk })
	r1, _ := s.PutMessage(context.Background(), msg("T", "a"))
	clk.Advance(-time.Hour) // the wall clock steps back
	r2, _ := s.PutMessage(context.Background(), msg("T", "b"))
	if r2.Append.StoreTimestamp < r1.Append.StoreTimestamp {
		t.Fatalf("store time went backwards: %d then %d", r1.Append.StoreTimestamp, r2.Append.StoreTimestamp)
	}
	if r1.Append.StoreTimestamp != time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli() {
		t.Fatalf("store time %d is not the injected clock's", r1.Append.StoreTimestamp)
	}
}

func TestRollsAndEndOfFile(t *testing.T) {
	const fileSize = 4096
	s, o := openTest(t, func(o *Options) { o.FileSize = fileSize; o.MaxMessageSize = 3000 })
	body := strings.Repeat("x", 1000) // ~1.1 KiB records: 3 per file, then a blank
	var results []AppendResult
	for i := 0; i < 10; i++ {
		res, err := s.PutMessage(context.Background(), msg("Roll", body+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res.Append)
	}
	for i, r := range results {
		if r.QueueOffset != int64(i) {
			t.Fatalf("message %d has queue offset %d", i, r.QueueOffset)
		}
		if r.WroteOffset/fileSize != (r.WroteOffset+int64(r.WroteBytes)-1)/fileSize {
			t.Fatalf("message %d crosses a file boundary", i)
		}
		if (r.WroteOffset%fileSize)+int64(r.WroteBytes)+BlankLen > fileSize {
			t.Fatalf("message %d ends closer than 8 bytes to the file end", i)
		}
		rec := readAt(t, o.Dir, fileSize, r.WroteOffset)
		if string(rec.Body) != body+strconv.Itoa(i) || rec.QueueOffset != int64(i) || rec.PhysicalOffset != r.WroteOffset {
			t.Fatalf("record %d on disk: %+v", i, rec)
		}
		if rec.MsgID() != r.MsgID() {
			t.Fatalf("msgId %s vs %s", rec.MsgID(), r.MsgID())
		}
	}
	// Every full file ends with a blank record that fills it.
	files, _ := os.ReadDir(filepath.Join(o.Dir, "commitlog"))
	if len(files) < 4 {
		t.Fatalf("only %d files for 10 records", len(files))
	}
	for _, r := range results {
		if r.WroteOffset%fileSize != 0 {
			continue
		}
		if r.WroteOffset == 0 {
			continue
		}
		prev := results[0]
		for _, q := range results {
			if q.WroteOffset < r.WroteOffset {
				prev = q
			}
		}
		end := prev.WroteOffset + int64(prev.WroteBytes)
		b, _ := os.ReadFile(filepath.Join(o.Dir, "commitlog", fileName(end-end%fileSize)))
		blank := b[end%fileSize:]
		if !IsBlank(blank) || int64(be32(blank)) != fileSize-end%fileSize {
			t.Fatalf("no blank of %d bytes at %d", fileSize-end%fileSize, end)
		}
	}
	if st := s.Stats(); st.Rolls < 4 {
		t.Fatalf("rolls %d", st.Rolls)
	}
}

func manySmall(n, size int) []BatchMessage {
	out := make([]BatchMessage, n)
	for i := range out {
		out[i].Body = make([]byte, size)
	}
	return out
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func TestMessageTooLargeForAnyFile(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FileSize = 4096; o.MaxMessageSize = 4096 })
	res, err := s.PutMessage(context.Background(), msg("T", strings.Repeat("x", 4096-91)))
	if res.Status != MessageIllegal || err == nil {
		t.Fatalf("status %v err %v", res.Status, err)
	}
	// The largest record that fits an empty file with its blank is taken.
	res, err = s.PutMessage(context.Background(), msg("T", strings.Repeat("x", 4096-8-91-1-crcPropLen)))
	if err != nil || res.Status != PutOK {
		t.Fatalf("largest record: %v %v", res.Status, err)
	}
}

func TestBatch(t *testing.T) {
	const fileSize = 8192
	s, o := openTest(t, func(o *Options) { o.FileSize = fileSize; o.MaxMessageSize = 6000 })
	if _, err := s.PutMessage(context.Background(), msg("B", strings.Repeat("y", 3000))); err != nil {
		t.Fatal(err)
	}
	b := &Batch{Topic: "B", QueueID: 2, Properties: []Property{{Key: PropertyUniqKey, Value: "batch-level"}}}
	for i := 0; i < 5; i++ {
		b.Messages = append(b.Messages, BatchMessage{Body: []byte(strings.Repeat("z", 900) + strconv.Itoa(i)),
			Properties: []Property{{Key: PropertyUniqKey, Value: "u" + strconv.Itoa(i)}}, Flag: int32(i)})
	}
	res, err := s.PutMessages(context.Background(), b)
	if err != nil || res.Status != PutOK {
		t.Fatalf("batch: %v %v", res.Status, err)
	}
	a := res.Append
	if a.MsgNum != 5 || len(a.Offsets) != 5 || a.QueueOffset != 0 || a.QueueID != 2 {
		t.Fatalf("append result %+v", a)
	}
	if a.WroteOffset%fileSize != 0 {
		t.Fatalf("batch of ~4.6 KiB after 3 KiB should have moved to a new file, at %d", a.WroteOffset)
	}
	ids := a.MsgIDs()
	for i, off := range a.Offsets {
		rec := readAt(t, o.Dir, fileSize, off)
		if rec.QueueOffset != int64(i) || rec.QueueID != 2 || rec.Flag != int32(i) || !strings.HasSuffix(string(rec.Body), strconv.Itoa(i)) {
			t.Fatalf("batch message %d: %+v", i, rec)
		}
		if u, _ := rec.Property(PropertyUniqKey); u != "u"+strconv.Itoa(i) {
			t.Fatalf("message %d UNIQ_KEY %q: batch-level properties must not be copied (#9416)", i, u)
		}
		if ids[i] != rec.MsgID() {
			t.Fatalf("msgId %d", i)
		}
	}
	// The same bodies again, keyed afresh (the same first UNIQ_KEY would be
	// a retry of the first batch: idempotent_test.go).
	again := []BatchMessage{{Body: b.Messages[0].Body}, {Body: b.Messages[1].Body, Properties: []Property{{Key: PropertyUniqKey, Value: "v1"}}}}
	res2, _ := s.PutMessages(context.Background(), &Batch{Topic: "B", QueueID: 2, Messages: again})
	if res2.Append.QueueOffset != 5 {
		t.Fatalf("next batch starts at queue offset %d, want 5", res2.Append.QueueOffset)
	}

	bad := []struct {
		name string
		b    *Batch
	}{
		{"empty", &Batch{Topic: "B"}},
		{"delay", &Batch{Topic: "B", Properties: []Property{{Key: PropertyDelayLevel, Value: "3"}}, Messages: b.Messages[:1]}},
		{"inner delay", &Batch{Topic: "B", Messages: []BatchMessage{{Body: []byte("x"), Properties: []Property{{Key: PropertyDelayLevel, Value: "1"}}}}}},
		{"transaction", &Batch{Topic: "B", SysFlag: TransactionPreparedType, Messages: b.Messages[:1]}},
		{"nil body", &Batch{Topic: "B", Messages: []BatchMessage{{}}}},
		{"too big for a file", &Batch{Topic: "B", Messages: manySmall(60, 100)}},
		{"bodies over the limit", &Batch{Topic: "B", Messages: []BatchMessage{{Body: make([]byte, 3100)}, {Body: make([]byte, 3000)}}}},
		{"bad topic", &Batch{Topic: "a/b", Messages: b.Messages[:1]}},
	}
	for _, c := range bad {
		before := s.log.MaxOffset()
		res, err := s.PutMessages(context.Background(), c.b)
		if res.Status != MessageIllegal || !errors.Is(err, ErrIllegal) || s.log.MaxOffset() != before {
			t.Errorf("%s: status %v err %v", c.name, res.Status, err)
		}
	}
}

func TestDelayDiversion(t *testing.T) {
	s, o := openTest(t, nil)
	cases := []struct {
		level     string
		wantQueue int32
		wantDelay string
	}{{"1", 0, "1"}, {"3", 2, "3"}, {"18", 17, "18"}, {"40", 17, "18"}}
	for _, c := range cases {
		m := msg("Orders", "d", Property{Key: PropertyDelayLevel, Value: c.level}, Property{Key: PropertyTags, Value: "t"})
		m.QueueID = 5
		res, err := s.PutMessage(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		if res.Append.Topic != ScheduleTopic || res.Append.QueueID != c.wantQueue {
			t.Fatalf("level %s went to %s/%d", c.level, res.Append.Topic, res.Append.QueueID)
		}
		rec := readAt(t, o.Dir, o.FileSize, res.Append.WroteOffset)
		rt, _ := rec.Property(PropertyRealTopic)
		rq, _ := rec.Property(PropertyRealQueueID)
		d, _ := rec.Property(PropertyDelayLevel)
		if rec.Topic != ScheduleTopic || rec.QueueID != c.wantQueue || rt != "Orders" || rq != "5" || d != c.wantDelay {
			t.Fatalf("level %s stored as %s/%d real=%s/%s delay=%s", c.level, rec.Topic, rec.QueueID, rt, rq, d)
		}
		if len(m.Properties) != 2 {
			t.Fatal("the caller's message was modified")
		}
	}
	// A prepared transactional message is a half message (transactions.go):
	// not delayed until its commit, and no queue offset of its topic.
	m := msg("Orders", "p", Property{Key: PropertyDelayLevel, Value: "2"})
	m.SysFlag = TransactionPreparedType
	res, _ := s.PutMessage(context.Background(), m)
	if res.Append.Topic != TransHalfTopic || res.Append.QueueOffset != 0 {
		t.Fatalf("prepared message: %+v", res.Append)
	}
	res, _ = s.PutMessage(context.Background(), msg("Orders", "n"))
	if res.Append.QueueOffset != 0 {
		t.Fatalf("a prepared message used a queue offset: next is %d", res.Append.QueueOffset)
	}
}

func TestReopenRecoversState(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, FileSize: 4096, MaxMessageSize: 2048}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var last AppendResult
	for i := 0; i < 20; i++ {
		res, err := s.PutMessage(context.Background(), msg("Re", strings.Repeat("r", 300)+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		last = res.Append
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	res, err := s2.PutMessage(context.Background(), msg("Re", "after"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Append.QueueOffset != 20 || res.Append.WroteOffset < last.NextOffset() || res.Append.StoreTimestamp < last.StoreTimestamp {
		t.Fatalf("after reopen: %+v (last %+v)", res.Append, last)
	}
	// No file beyond the last one in use is left behind.
	files, _ := os.ReadDir(filepath.Join(dir, "commitlog"))
	for _, f := range files {
		if from, ok := parseFileName(f.Name()); ok && from > res.Append.WroteOffset+4096 {
			t.Fatalf("stray file %s", f.Name())
		}
	}
}

// putN opens a store in dir, puts n messages and closes it cleanly.
func putN(t *testing.T, o Options, n int) []AppendResult {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var out []AppendResult
	for i := 0; i < n; i++ {
		r, err := s.PutMessage(context.Background(), msg("G", "m"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Append)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// setFlushed rewrites the checkpoint as if only [0, flushed) had been synced
// when it was last written, and leaves the abort marker as a crash would.
func setFlushed(t *testing.T, dir string, flushed int64) {
	t.Helper()
	cp, _, err := readCheckpoint(vfs.Default, dir)
	if err != nil {
		t.Fatal(err)
	}
	cp.Flushed, cp.Dispatched = flushed, min(cp.Dispatched, flushed)
	if err := writeCheckpoint(vfs.Default, dir, cp); err != nil {
		t.Fatal(err)
	}
	if err := createAbort(vfs.Default, dir); err != nil {
		t.Fatal(err)
	}
}

func TestRecoveryCutsTornTail(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, FileSize: 8192, MaxMessageSize: 4096}
	offs := putN(t, o, 5)
	last := offs[4]
	setFlushed(t, dir, last.WroteOffset) // the last record was not yet synced
	// Tear the last record and leave garbage after it.
	path := filepath.Join(dir, "commitlog", fileName(0))
	b, _ := os.ReadFile(path)
	b[last.WroteOffset+int64(last.WroteBytes)-5] ^= 0xff
	copy(b[last.NextOffset()+100:], "garbage that is not a record")
	os.WriteFile(path, b, 0o644)

	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := s2.log.MaxOffset(); got != last.WroteOffset {
		t.Fatalf("end after recovery %d, want %d (start of the torn record)", got, last.WroteOffset)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after[last.WroteOffset:], make([]byte, 8192-last.WroteOffset)) {
		t.Fatal("bytes after the recovered end were not zeroed")
	}
	broken, err := os.ReadFile(filepath.Join(dir, "commitlog", fileName(last.WroteOffset)+".broken"))
	if err != nil || !bytes.Contains(broken, []byte("garbage that is not a record")) {
		t.Fatalf("torn bytes not kept in a .broken file: %v", err)
	}
	if st := s2.Stats(); st.TornTails != 1 || st.TornBytes == 0 {
		t.Fatalf("torn tail not counted: %+v", st)
	}
	r, _ := s2.PutMessage(context.Background(), msg("G", "again"))
	if r.Append.QueueOffset != 4 || r.Append.WroteOffset != last.WroteOffset {
		t.Fatalf("next put %+v", r.Append)
	}
}

func TestRecoveryRefusesCorruptionBelowCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name string
		at   func(AppendResult) int64
	}{
		{"header bit", func(a AppendResult) int64 { return a.WroteOffset + 13 }},
		{"body bit", func(a AppendResult) int64 { return a.WroteOffset + 86 }},
		{"properties bit", func(a AppendResult) int64 { return a.NextOffset() - 3 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{Dir: dir, FileSize: 8192, MaxMessageSize: 4096}
			offs := putN(t, o, 5)
			victim := offs[2]
			path := filepath.Join(dir, "commitlog", fileName(0))
			b, _ := os.ReadFile(path)
			orig := bytes.Clone(b)
			b[c.at(victim)] ^= 0x10
			os.WriteFile(path, b, 0o644)
			_, err := Open(o)
			var cerr *CorruptionError
			if !errors.As(err, &cerr) || !errors.Is(err, ErrCorrupt) || cerr.Offset != victim.WroteOffset ||
				cerr.File != "commitlog/"+fileName(0) {
				t.Fatalf("open: %v, want a CorruptionError at %d", err, victim.WroteOffset)
			}
			after, _ := os.ReadFile(path)
			after[c.at(victim)] ^= 0x10
			if !bytes.Equal(after, orig) {
				t.Fatal("a refused open changed the commitlog")
			}
		})
	}
}

func TestRecoveryRebuildsConsumeQueues(t *testing.T) {
	for _, damage := range []string{"deleted", "truncated", "entries past the commitlog end"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{Dir: dir, FileSize: 8192, MaxMessageSize: 4096, ConsumeQueueEntries: 4}
			offs := putN(t, o, 11)
			q := filepath.Join(dir, "consumequeue", "G", "0")
			switch damage {
			case "deleted":
				os.RemoveAll(filepath.Join(dir, "consumequeue", "G"))
			case "truncated": // drop the last file and zero part of another
				os.Remove(filepath.Join(q, fileName(2*4*cqEntrySize)))
				b, _ := os.ReadFile(filepath.Join(q, fileName(4*cqEntrySize)))
				clear(b[cqEntrySize:])
				os.WriteFile(filepath.Join(q, fileName(4*cqEntrySize)), b, 0o644)
			case "entries past the commitlog end": // a bogus entry 11 pointing beyond the log
				p := filepath.Join(q, fileName(2*4*cqEntrySize))
				b, _ := os.ReadFile(p)
				b = append(b[:3*cqEntrySize:3*cqEntrySize], make([]byte, cqEntrySize)...)
				e := b[3*cqEntrySize:]
				be := offs[10].NextOffset() + 1000
				for i := 0; i < 8; i++ {
					e[i] = byte(be >> (56 - 8*i))
				}
				e[11] = 100
				os.WriteFile(p, b, 0o644)
			}
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "G", QueueID: 0, Offset: 0, MaxMessages: 100})
			if err != nil || len(res.Messages) != 11 || res.MaxOffset != 11 {
				t.Fatalf("pulled %d (max %d): %v", len(res.Messages), res.MaxOffset, err)
			}
			for i, m := range res.Messages {
				if m.PhysicalOffset != offs[i].WroteOffset || string(m.Body) != "m"+strconv.Itoa(i) {
					t.Fatalf("message %d wrong", i)
				}
			}
			r, _ := s.PutMessage(context.Background(), msg("G", "next"))
			if r.Append.QueueOffset != 11 {
				t.Fatalf("next queue offset %d, want 11", r.Append.QueueOffset)
			}
		})
	}
}

func TestDataDirLocked(t *testing.T) {
	s, o := openTest(t, nil)
	_ = s
	if _, err := Open(o); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
}

func TestOpenRejectsWrongFileSize(t *testing.T) {
	s, o := openTest(t, nil)
	s.PutMessage(context.Background(), msg("T", "x"))
	s.Close()
	o.FileSize = 128 << 10
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), "configured file size") {
		t.Fatalf("open with another file size: %v", err)
	}
}

func TestConcurrentPuts(t *testing.T) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			s, o := openTest(t, func(o *Options) { o.FileSize = 16 << 10; o.FlushMode = mode })
			const writers, each = 8, 60
			var wg sync.WaitGroup
			results := make([][]AppendResult, writers)
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						m := msg("C", fmt.Sprintf("w%d-%d", w, i))
						m.QueueID = int32(w % 2)
						res, err := s.PutMessage(context.Background(), m)
						if err != nil || res.Status != PutOK {
							t.Errorf("put: %v %v", res.Status, err)
							return
						}
						results[w] = append(results[w], res.Append)
					}
				}()
			}
			wg.Wait()
			seen := map[[2]int64]bool{}
			phys := map[int64]bool{}
			for w := range results {
				for i, r := range results[w] {
					k := [2]int64{int64(r.QueueID), r.QueueOffset}
					if seen[k] || phys[r.WroteOffset] {
						t.Fatalf("duplicate queue offset %v or physical offset %d", k, r.WroteOffset)
					}
					seen[k], phys[r.WroteOffset] = true, true
					if i > 0 && r.QueueOffset <= results[w][i-1].QueueOffset {
						t.Fatal("queue offsets of one writer not increasing")
					}
					rec := readAt(t, o.Dir, o.FileSize, r.WroteOffset)
					if string(rec.Body) != fmt.Sprintf("w%d-%d", w, i) || rec.QueueOffset != r.QueueOffset {
						t.Fatalf("record at %d: %q", r.WroteOffset, rec.Body)
					}
				}
			}
			for q := 0; q < 2; q++ { // dense: 0..n-1 per queue
				for off := 0; off < writers/2*each; off++ {
					if !seen[[2]int64{int64(q), int64(off)}] {
						t.Fatalf("queue %d misses offset %d", q, off)
					}
				}
			}
		})
	}
}

func TestSyncModeAckIsDurable(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FlushMode = FlushSync })
	for i := 0; i < 20; i++ {
		res, err := s.PutMessage(context.Background(), msg("S", "x"))
		if err != nil || res.Status != PutOK {
			t.Fatal(res.Status, err)
		}
		if d := s.log.Flushed(); d < res.Append.NextOffset() {
			t.Fatalf("acked message ends at %d but only %d is synced", res.Append.NextOffset(), d)
		}
	}
	// WAIT=false returns without waiting; the flusher is only woken.
	res, err := s.PutMessage(context.Background(), msg("S", "nowait", Property{Key: PropertyWaitStoreOK, Value: "false"}))
	if err != nil || res.Status != PutOK {
		t.Fatal(res.Status, err)
	}
}

func TestSyncModeCancelledWait(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FlushMode = FlushSync })
	// Hold the sync lock so no sync can complete, then cancel the put.
	releaseSync := s.log.Files().HoldSync()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var res PutResult
	var err error
	go func() {
		defer close(done)
		res, err = s.PutMessage(ctx, msg("S", "x"))
	}()
	// Wait until the message is appended, then cancel.
	for s.log.MaxOffset() == 0 {
		select {
		case <-done:
			t.Fatal("put returned before a sync could have happened")
		default:
		}
		runtime.Gosched()
	}
	cancel()
	<-done
	releaseSync()
	if !errors.Is(err, context.Canceled) || res.Status != UnknownError || !res.Appended() {
		t.Fatalf("cancelled sync put: status %v err %v appended %v", res.Status, err, res.Appended())
	}
}

func TestCheckAndRepair(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, FileSize: 8192, MaxMessageSize: 4096}
	offs := putN(t, o, 30) // several files
	rep, err := Check(o)
	if err != nil || rep.Damage != "" || rep.Records != 30 || rep.End != offs[29].NextOffset() {
		t.Fatalf("clean check: %+v %v", rep, err)
	}
	victim := offs[12]
	path := filepath.Join(dir, "commitlog", fileName(victim.WroteOffset-victim.WroteOffset%8192))
	b, _ := os.ReadFile(path)
	b[victim.WroteOffset%8192+90] ^= 1
	os.WriteFile(path, b, 0o644)
	rep, err = Check(o)
	if err != nil || rep.DamageOffset != victim.WroteOffset || !rep.BelowCheckpoint || rep.Records != 12 {
		t.Fatalf("damaged check: %+v %v", rep, err)
	}
	if _, err := Open(o); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open of a damaged log: %v", err)
	}
	if err := Repair(o, victim.WroteOffset+1); err == nil {
		t.Fatal("repair accepted an offset inside a record")
	}
	if err := Repair(o, victim.WroteOffset); err != nil {
		t.Fatal(err)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open after repair: %v", err)
	}
	defer s.Close()
	res, err := s.PullMessages(context.Background(), PullRequest{Topic: "G", MaxMessages: 100})
	if err != nil || len(res.Messages) != 12 {
		t.Fatalf("after repair: %d messages %v", len(res.Messages), err)
	}
	r, _ := s.PutMessage(context.Background(), msg("G", "new"))
	if r.Append.QueueOffset != 12 || r.Append.WroteOffset != victim.WroteOffset {
		t.Fatalf("put after repair: %+v", r.Append)
	}
}

// TestPutAllocatesNothing: a standalone async put of a message with tags
// and keys allocates nothing (issue 16: "0 allocations"). It broke once
// unnoticed: the stamping step held the put's one spec in a struct that
// escape analysis sent to the heap (208 B a put).
func TestPutAllocatesNothing(t *testing.T) {
	s, _ := openTest(t, func(o *Options) { o.FileSize = 8 << 20 })
	m := msg("T", strings.Repeat("x", 1024), Property{Key: PropertyTags, Value: "TagA"}, Property{Key: PropertyKeys, Value: "k1 k2"})
	ctx := context.Background()
	if _, err := s.PutMessage(ctx, m); err != nil { // creates the queue and its first file
		t.Fatal(err)
	}
	if got := testing.AllocsPerRun(200, func() {
		if _, err := s.PutMessage(ctx, m); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("%v allocations a put, want 0", got)
	}
}
