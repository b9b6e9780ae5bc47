package main

import (
	"bytes"
	"context"
	be "encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// bombDataDir writes a data dir holding one record on SCHEDULE_TOPIC_XXXX
// queue 2^31-1: what one PutMessage could store before the schedule topic
// was reserved (every later start then died allocating 16 GiB in the
// scheduler). The API refuses it now, so the record is written on a
// look-alike topic and patched in the file: same topic length, queue id at
// byte 12 of the record (RocketMQ layout: total size, magic, body CRC,
// queue id), then the whole-record CRC property (the record's last 20
// bytes: "__CRC32#", 0x01, ten digits least significant first, 0x02) is
// recomputed.
func bombDataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	const lookalike = "SCHEDULE_TOPIC_XXXY"
	st, err := storage.Open(storage.Options{Dir: dir, FileSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.PutMessage(context.Background(), &storage.Message{Topic: lookalike, Body: []byte("bomb")})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "commitlog", "00000000000000000000")
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	rec := b[res.Append.WroteOffset:]
	i := bytes.Index(rec, []byte(lookalike))
	if i < 0 {
		t.Fatal("topic not found in the record")
	}
	rec[i+len(lookalike)-1] = 'X'
	be.BigEndian.PutUint32(rec[12:], math.MaxInt32)
	total := int(be.BigEndian.Uint32(rec))
	crc := storage.BodyCRC(rec[:total-20]) // the record CRC uses the body CRC's polynomial
	digits := rec[total-20+len(storage.PropertyCRC32)+1:]
	for i := range 10 {
		digits[i] = byte('0' + crc%10)
		crc /= 10
	}
	if _, _, err := storage.DecodeRecordStrict(rec); err != nil {
		t.Fatalf("patched record: %v", err)
	}
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing else may name the look-alike: the store rebuilds its index
	// from the commitlog.
	for _, p := range []string{"consumequeue", "checkpoint", "config"} {
		os.RemoveAll(filepath.Join(dir, p))
	}
	return dir
}

// TestScheduleBombRestart: the real binary starts on a data dir holding a
// record on schedule queue 2^31-1, logs it once, serves, refuses to store
// another one (reserved topic), and the admin service answers on its own
// listener.
func TestScheduleBombRestart(t *testing.T) {
	dir := bombDataDir(t)
	p := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "127.0.0.1:0",
		"--data-dir", dir, "--file-size", "64KiB")
	listening := p.logs.waitFor(t, "listening")
	conn := dial(t, listening.str("grpc"))
	waitServing(t, conn)
	client := storagedv1.NewMessageStoreServiceClient(conn)
	ctx := t.Context()

	_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: storage.ScheduleTopic, QueueId: math.MaxInt32, Body: []byte("again")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "reserved") {
		t.Fatalf("put to the schedule topic: %v", err)
	}
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "Orders", Body: []byte("fine")}}); err != nil {
		t.Fatalf("put after the bomb: %v", err)
	}
	info, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: storage.ScheduleTopic, QueueId: math.MaxInt32})
	if err != nil || info.GetMaxOffset() != 1 {
		t.Fatalf("the bogus schedule queue: %v %v", info, err)
	}

	admin := storagedv1.NewAdminServiceClient(dial(t, listening.str("admin")))
	got, err := admin.GetTopic(ctx, &storagedv1.GetTopicRequest{Name: "Orders"})
	if err != nil || got.GetTopic().GetQueueCount() != storage.DefaultQueues || got.GetTopic().GetQueues()[0].GetMaxOffset() > 1 {
		t.Fatalf("GetTopic(Orders): %v %v", got, err)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, p.logs.String())
	}
	if n := strings.Count(p.logs.String(), "schedule queues beyond the delay level table"); n != 1 {
		t.Fatalf("%d log lines about the bogus schedule queue, want 1:\n%s", n, p.logs.String())
	}
	// The topic table survives the restart (real files).
	p = startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "127.0.0.1:0",
		"--data-dir", dir, "--file-size", "64KiB", "--auto-create-topics=false")
	listening = p.logs.waitFor(t, "listening")
	conn = dial(t, listening.str("grpc"))
	waitServing(t, conn)
	client = storagedv1.NewMessageStoreServiceClient(conn)
	if _, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "Orders", Body: []byte("kept")}}); err != nil {
		t.Fatalf("put to a topic created before the restart: %v", err)
	}
	_, err = client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "Unknown", Body: []byte("x")}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("put to an unknown topic with auto-creation off: %v", err)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, p.logs.String())
	}
}
