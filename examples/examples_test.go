package examples_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
	"github.com/storaged/storaged/internal/testenv"
)

// The binaries TestMain builds: storaged itself and the Go example.
var storagedBin, exampleGoBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "storaged-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	storagedBin, exampleGoBin = filepath.Join(dir, "storaged"), filepath.Join(dir, "example-go")
	race := []string{}
	if raceEnabled {
		race = []string{"-race"}
	}
	for _, b := range [][]string{
		append(append([]string{"build", "-o", storagedBin}, race...), "../cmd/storaged"),
		{"build", "-o", exampleGoBin, "./go"},
	} {
		build := exec.Command("go", b...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "go", strings.Join(b, " "), ":", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { os.RemoveAll(dir) }))
}

// Bounds on waits for external processes. Nothing sleeps: these bound waits
// on channels fed by the processes' output and exit.
const (
	startTimeout   = 60 * time.Second
	exitTimeout    = 90 * time.Second
	exampleTimeout = 2 * time.Minute
)

// TestClientExamples runs each client example (Go, Node, Python) against one
// real storaged, each on its own topic, and checks what it printed against
// what the store holds. A missing Node or Python prerequisite fails the test
// under CI=true (.ci/run installs them) and skips it otherwise.
func TestClientExamples(t *testing.T) {
	addr := startStoraged(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() }) // after the parallel subtests
	client := storagedv1.NewMessageStoreServiceClient(conn)

	t.Run("go", func(t *testing.T) {
		t.Parallel()
		runExample(t, client, addr, "ExampleGo", "go", exampleGoBin, "-addr", addr, "-topic", "ExampleGo")
	})
	t.Run("node", func(t *testing.T) {
		t.Parallel()
		node, err := exec.LookPath("node")
		testenv.Need(t, err == nil, "node is not on PATH (Debian: apt-get install nodejs npm)")
		for _, pkg := range []string{"@grpc/grpc-js", "@grpc/proto-loader", "protobufjs", "google-proto-files"} {
			_, err := os.Stat(filepath.Join("node", "node_modules", pkg, "package.json"))
			testenv.Need(t, err == nil, "examples/node/node_modules lacks "+pkg+": run npm ci in examples/node")
		}
		runExample(t, client, addr, "ExampleNode", "node", node, "node/example.js", "--addr", addr, "--topic", "ExampleNode")
	})
	t.Run("python", func(t *testing.T) {
		t.Parallel()
		// Debian's python3, not whatever python3 is first on PATH: the
		// grpc and protobuf modules are Debian packages.
		const python = "/usr/bin/python3"
		const pkgs = "apt-get install python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc libprotobuf-dev golang-github-gogo-googleapis-dev"
		_, err := os.Stat(python)
		testenv.Need(t, err == nil, python+" is missing: "+pkgs)
		out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput()
		testenv.Need(t, err == nil, fmt.Sprintf("%s lacks grpc or protobuf (%s): %s", python, bytes.TrimSpace(out), pkgs))
		for _, tool := range []string{"protoc", "grpc_python_plugin"} {
			_, err := exec.LookPath(tool)
			testenv.Need(t, err == nil, tool+" is not on PATH: "+pkgs)
		}
		_, err = os.Stat("/usr/share/gocode/src/github.com/gogo/googleapis/google/rpc/error_details.proto")
		testenv.Need(t, err == nil, "googleapis' google/rpc protos are missing: "+pkgs)
		runExample(t, client, addr, "ExamplePython", "python", python, "python/example.py", "--addr", addr, "--topic", "ExamplePython")
	})
}

// startStoraged starts the real binary on 127.0.0.1:0 with a fresh data dir,
// waits until it serves, and returns its gRPC address. When the test ends it
// is stopped with SIGTERM and must exit 0.
func startStoraged(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(storagedBin, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", "",
		"--data-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer // written by the reader goroutine until done is closed
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logs.Write(sc.Bytes())
			logs.WriteByte('\n')
			var l struct{ Message, GRPC string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "listening" {
				select {
				case listening <- l.GRPC:
				default:
				}
			}
		}
		done <- cmd.Wait()
	}()
	var exited error
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case exited = <-done:
		case <-time.After(exitTimeout):
			cmd.Process.Kill()
			<-done
			t.Errorf("storaged did not exit within %v of SIGTERM:\n%s", exitTimeout, logs.String())
			return
		}
		if exited != nil {
			t.Errorf("storaged: %v\n%s", exited, logs.String())
		}
	}

	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("storaged exited before listening (%v):\n%s", err, logs.String())
	case <-time.After(startTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("storaged did not listen within %v:\n%s", startTimeout, logs.String())
	}
	t.Cleanup(stop)

	// Serving once the store is open: a health Watch says so.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	if err := proctest.WaitServing(ctx, conn, proctest.StoreService); err != nil {
		t.Fatal(err)
	}
	return addr
}

// event is one line an example prints (examples/README.md, "Output").
type event struct {
	Event           string            `json:"event,omitempty"`
	Via             string            `json:"via,omitempty"`
	Status          string            `json:"status,omitempty"`
	RequestID       uint64            `json:"request_id,omitempty"`
	Topic           string            `json:"topic,omitempty"`
	QueueID         int32             `json:"queue_id,omitempty"`
	QueueOffset     int64             `json:"queue_offset,omitempty"`
	MsgID           string            `json:"msg_id,omitempty"`
	WroteOffset     int64             `json:"wrote_offset,omitempty"`
	WroteBytes      int32             `json:"wrote_bytes,omitempty"`
	StoreMs         int64             `json:"store_ms,omitempty"`
	BornMs          int64             `json:"born_ms,omitempty"`
	Body            string            `json:"body,omitempty"`
	Tags            string            `json:"tags,omitempty"`
	Keys            string            `json:"keys,omitempty"`
	Properties      map[string]string `json:"properties,omitempty"`
	MessageCount    int32             `json:"message_count,omitempty"`
	MsgIDs          []string          `json:"msg_ids,omitempty"`
	Bodies          []string          `json:"bodies,omitempty"`
	CommitLogOffset int64             `json:"commit_log_offset,omitempty"`
	BornHost        string            `json:"born_host,omitempty"`
	StoreHost       string            `json:"store_host,omitempty"`
	StoreSize       int32             `json:"store_size,omitempty"`
	RawHex          string            `json:"raw_hex,omitempty"`
	Count           int               `json:"count,omitempty"`
	NextOffset      int64             `json:"next_offset,omitempty"`
	MinOffset       int64             `json:"min_offset,omitempty"`
	MaxOffset       int64             `json:"max_offset,omitempty"`
	Call            string            `json:"call,omitempty"`
	Code            int32             `json:"code,omitempty"`
	Reason          string            `json:"reason,omitempty"`
	Domain          string            `json:"domain,omitempty"`
	Message         string            `json:"message,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	FieldViolations []string          `json:"field_violations,omitempty"`
	RetryDelayMs    int64             `json:"retry_delay_ms,omitempty"`
	Stored          int               `json:"stored,omitempty"`
}

// String is the event as JSON, without its zero fields.
func (e event) String() string {
	b, err := json.Marshal(e)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// runExample runs one example to completion and checks its output.
func runExample(t *testing.T, client storagedv1.MessageStoreServiceClient, addr, topic, lang string, name string, args ...string) {
	ctx, cancel := context.WithTimeout(t.Context(), exampleTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("%s example stderr:\n%s", lang, stderr.String())
	}
	if err != nil {
		t.Fatalf("%s example: %v\nstdout:\n%s", lang, err, stdout.String())
	}
	var events []event
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields() // a misspelt field is a failure, not a zero value
	for {
		var ev event
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s example output: %v", lang, err)
		}
		events = append(events, ev)
	}
	checkScenario(t, client, addr, topic, lang, events)
}

// The scenario every example runs (examples/README.md): two single puts, a
// batch of three, a stream of five with the fourth refused, a late put
// caught by the long poll.
const (
	batchSize   = 3
	streamSent  = 5
	streamBadID = 4
	stored      = 2 + batchSize + (streamSent - 1) + 1
)

var msgIDPattern = regexp.MustCompile(`^[0-9A-F]{32}$`)

// checkScenario checks an example's events against each other and against
// the store, read here through the Go client.
func checkScenario(t *testing.T, client storagedv1.MessageStoreServiceClient, addr, topic, lang string, events []event) {
	ctx := t.Context()
	by := func(kind, via string) []event {
		var r []event
		for _, ev := range events {
			if ev.Event == kind && (via == "" || ev.Via == via) {
				r = append(r, ev)
			}
		}
		return r
	}
	if len(events) == 0 || events[len(events)-1].Event != "done" || events[len(events)-1].Stored != stored {
		t.Fatalf("output does not end with {done, stored %d}: %+v", stored, events)
	}

	// What the store holds: the whole queue, read by Go.
	info, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetMinOffset() != 0 || info.GetMaxOffset() != stored {
		t.Errorf("queue %s/0 holds [%d, %d), want [0, %d): stored messages the example did not report, or lost some",
			topic, info.GetMinOffset(), info.GetMaxOffset(), stored)
	}
	pulled, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic, MaxMessages: 2 * stored})
	if err != nil {
		t.Fatal(err)
	}
	inStore := map[int64]*storagedv1.StoredMessage{}
	for _, m := range pulled.GetMessages() {
		inStore[m.GetQueueOffset()] = m
	}

	// Every put the example reports is the message in the store at that
	// queue offset, each offset reported once.
	reported := map[int64]string{} // queue offset -> msgId
	report := func(offset int64, msgID string) {
		if prev, dup := reported[offset]; dup {
			t.Errorf("queue offset %d reported twice (%s, %s)", offset, prev, msgID)
		}
		reported[offset] = msgID
	}
	singles, streamed := by("put", "PutMessage"), by("put", "PutMessageStream")
	if len(singles) != 3 || len(streamed) != streamSent-1 || len(by("put", "")) != len(singles)+len(streamed) {
		t.Fatalf("puts: %d PutMessage (want 3), %d PutMessageStream (want %d), %d in all",
			len(singles), len(streamed), streamSent-1, len(by("put", "")))
	}
	for _, ev := range append(slices.Clone(singles), streamed...) {
		if ev.Status != "PUT_MESSAGE_STATUS_PUT_OK" || ev.Topic != topic || ev.QueueID != 0 || ev.Tags != "example" ||
			ev.Keys != "k1 k2" || !maps.Equal(ev.Properties, map[string]string{"lang": lang}) {
			t.Errorf("put event: %+v", ev)
		}
		checkMsgID(t, addr, ev.MsgID, ev.WroteOffset)
		m := getMessage(t, client, ev.MsgID)
		if m.GetQueueOffset() != ev.QueueOffset || m.GetCommitLogOffset() != ev.WroteOffset ||
			m.GetStoreSize() != ev.WroteBytes || string(m.GetBody()) != ev.Body || m.GetTags() != ev.Tags ||
			m.GetKeys() != ev.Keys || m.GetProperties()["lang"] != lang ||
			m.GetBornTimestamp().AsTime().UnixMilli() != ev.BornMs || m.GetStoreTimestamp().AsTime().UnixMilli() != ev.StoreMs {
			t.Errorf("put event %+v\nbut the store holds %v", ev, m)
		}
		report(ev.QueueOffset, ev.MsgID)
	}
	if a, b := singles[0], singles[1]; b.QueueOffset != a.QueueOffset+1 || b.WroteOffset < a.WroteOffset+int64(a.WroteBytes) {
		t.Errorf("two puts in a row: queue offsets %d, %d; records at %d (+%d), %d",
			a.QueueOffset, b.QueueOffset, a.WroteOffset, a.WroteBytes, b.WroteOffset)
	}

	batches := by("batch", "")
	if len(batches) != 1 {
		t.Fatalf("%d batch events, want 1", len(batches))
	}
	b := batches[0]
	if b.Status != "PUT_MESSAGE_STATUS_PUT_OK" || b.Topic != topic || b.MessageCount != batchSize ||
		len(b.MsgIDs) != batchSize || len(b.Bodies) != batchSize || b.MsgIDs[0] != b.MsgID {
		t.Fatalf("batch event: %+v", b)
	}
	prevEnd, size := b.WroteOffset, int32(0)
	for i, id := range b.MsgIDs {
		m := getMessage(t, client, id)
		checkMsgID(t, addr, id, m.GetCommitLogOffset())
		if m.GetQueueOffset() != b.QueueOffset+int64(i) || string(m.GetBody()) != b.Bodies[i] ||
			m.GetCommitLogOffset() != prevEnd || m.GetStoreTimestamp().AsTime().UnixMilli() != b.StoreMs {
			t.Errorf("batch entry %d (%s): the store holds %v", i, id, m)
		}
		prevEnd, size = m.GetCommitLogOffset()+int64(m.GetStoreSize()), size+m.GetStoreSize()
		report(m.GetQueueOffset(), id)
	}
	if size != b.WroteBytes {
		t.Errorf("batch wrote_bytes %d, its records are %d bytes", b.WroteBytes, size)
	}
	for off := range int64(stored) {
		if _, ok := reported[off]; !ok {
			t.Errorf("queue offset %d: no put reported it", off)
		}
	}

	// The stream answered each request_id once, the bad one with its code
	// and reason.
	ids := map[uint64]int{}
	for _, ev := range streamed {
		ids[ev.RequestID]++
	}
	bad := by("stream_error", "")
	for _, ev := range bad {
		ids[ev.RequestID]++
		if ev.RequestID != streamBadID || ev.Code != 3 || ev.Reason != "MESSAGE_ILLEGAL" || ev.Message == "" {
			t.Errorf("stream_error event: %+v, want request %d answered code 3 MESSAGE_ILLEGAL", ev, streamBadID)
		}
	}
	for id := uint64(1); id <= streamSent; id++ {
		if ids[id] != 1 {
			t.Errorf("stream request %d answered %d times", id, ids[id])
		}
	}

	// Every message the example read is the one in the store, field by
	// field, as the Go client decodes it.
	for _, ev := range by("message", "") {
		m := inStore[ev.QueueOffset]
		if m == nil {
			t.Errorf("message event at queue offset %d, which the store does not hold", ev.QueueOffset)
			continue
		}
		if ev.Topic != m.GetTopic() || ev.QueueID != m.GetQueueId() || ev.CommitLogOffset != m.GetCommitLogOffset() ||
			ev.MsgID != m.GetMsgId() || ev.Body != string(m.GetBody()) || ev.Tags != m.GetTags() || ev.Keys != m.GetKeys() ||
			!maps.Equal(ev.Properties, m.GetProperties()) || ev.BornMs != m.GetBornTimestamp().AsTime().UnixMilli() ||
			ev.StoreMs != m.GetStoreTimestamp().AsTime().UnixMilli() || ev.BornHost != m.GetBornHost() ||
			ev.StoreHost != m.GetStoreHost() || ev.StoreSize != m.GetStoreSize() {
			t.Errorf("%s read %+v\nbut the store holds %v", ev.Via, ev, m)
		}
		if ev.StoreHost != addr || !strings.HasPrefix(ev.BornHost, "127.0.0.1:") {
			t.Errorf("message at %d: store_host %q (want %s), born_host %q", ev.QueueOffset, ev.StoreHost, addr, ev.BornHost)
		}
		if _, ok := ev.Properties["__CRC32#"]; ok {
			t.Errorf("message at %d shows the store's own __CRC32# property", ev.QueueOffset)
		}
	}

	// GetMessage by the first put's msgId, with the record's bytes.
	got := by("message", "GetMessage")
	if len(got) != 1 || got[0].MsgID != singles[0].MsgID {
		t.Fatalf("GetMessage events %+v, want one for %s", got, singles[0].MsgID)
	}
	raw, err := hex.DecodeString(got[0].RawHex)
	want := getMessage(t, client, got[0].MsgID).GetRaw()
	if err != nil || !bytes.Equal(raw, want) || len(raw) != int(got[0].StoreSize) || len(raw) < 8 || !bytes.Equal(raw[4:8], []byte{0xDA, 0xA3, 0x20, 0xA7}) {
		t.Errorf("GetMessage raw %q (%v), want the %d stored bytes with RocketMQ's magic code: %x", got[0].RawHex, err, got[0].StoreSize, want)
	}

	// The consumer followed next_offset from the first offset through every
	// message stored before the late one, in order, each once.
	pulls, msgs := by("pull", "PullMessages"), by("message", "PullMessages")
	next, count := int64(0), 0
	for _, p := range pulls {
		if p.QueueOffset != next || p.Count > 4 || p.NextOffset > p.MaxOffset || p.MinOffset != 0 {
			t.Errorf("pull %+v: want queue_offset %d (the previous next_offset), at most 4 messages", p, next)
		}
		next, count = p.NextOffset, count+p.Count
	}
	if next != stored-1 || count != stored-1 || len(msgs) != count {
		t.Errorf("consumer: ended at next_offset %d with %d messages (%d printed), want %d", next, count, len(msgs), stored-1)
	}
	for i, m := range msgs {
		if m.QueueOffset != int64(i) {
			t.Errorf("consumer message %d is at queue offset %d", i, m.QueueOffset)
		}
	}

	// The pull past the end: OUT_OF_RANGE with the readable bounds.
	errs := by("error", "")
	if len(errs) != 2 {
		t.Fatalf("%d error events, want 2: %+v", len(errs), errs)
	}
	oor := errs[0]
	if oor.Call != "PullMessages" || oor.Code != 11 || oor.Reason != "OFFSET_OUT_OF_RANGE" || oor.Domain != "storaged" ||
		!maps.Equal(oor.Metadata, map[string]string{"offset": "1000000", "min_offset": "0", "max_offset": strconv.Itoa(stored - 1)}) {
		t.Errorf("pull past the end: %+v, want code 11 (OUT_OF_RANGE), ErrorInfo OFFSET_OUT_OF_RANGE with the bounds", oor)
	}

	// The long poll started where the ErrorInfo said and returned the late
	// message.
	polls, late := by("pull", "long poll"), by("message", "long poll")
	if len(polls) == 0 || polls[0].QueueOffset != stored-1 || polls[len(polls)-1].Count != 1 || polls[len(polls)-1].NextOffset != stored {
		t.Errorf("long polls %+v: want the first at %d (max_offset of the error), the last returning 1 message", polls, stored-1)
	}
	if len(late) != 1 || late[0].MsgID != singles[2].MsgID || late[0].Body != singles[2].Body {
		t.Errorf("long poll returned %+v, want the late put %s", late, singles[2].MsgID)
	}

	// The refused put: INVALID_ARGUMENT, ErrorInfo and BadRequest.
	ill := errs[1]
	if ill.Call != "PutMessage" || ill.Code != 3 || ill.Reason != "MESSAGE_ILLEGAL" || ill.Domain != "storaged" ||
		!slices.Equal(ill.FieldViolations, []string{"message.topic"}) || ill.Message == "" {
		t.Errorf("refused put: %+v, want code 3 (INVALID_ARGUMENT), ErrorInfo MESSAGE_ILLEGAL, BadRequest message.topic", ill)
	}
}

// checkMsgID checks an offset msgId: 32 upper-case hex characters, the
// store's IPv4 address and port, then the commitlog offset.
func checkMsgID(t *testing.T, addr, msgID string, wroteOffset int64) {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	p, _ := strconv.Atoi(port)
	if want := fmt.Sprintf("7F000001%08X%016X", p, wroteOffset); !msgIDPattern.MatchString(msgID) || msgID != want {
		t.Errorf("msgId %q, want %q (127.0.0.1, port %d, offset %d)", msgID, want, p, wroteOffset)
	}
}

func getMessage(t *testing.T, client storagedv1.MessageStoreServiceClient, msgID string) *storagedv1.StoredMessage {
	t.Helper()
	resp, err := client.GetMessage(t.Context(), &storagedv1.GetMessageRequest{
		Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: msgID}, IncludeRaw: true,
	})
	if err != nil {
		t.Fatalf("GetMessage %s: %v", msgID, err)
	}
	return resp.GetMessage()
}
