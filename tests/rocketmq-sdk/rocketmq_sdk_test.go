// Package rocketmqsdk runs Apache's official RocketMQ 5 Node.js SDK
// (npm rocketmq-client-nodejs, pinned by package-lock.json, installed by
// .ci/run) unchanged against a real storaged process, and checks what it
// reports against what storaged holds, read back through storaged.v1.
package rocketmqsdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
	"github.com/storaged/storaged/internal/testenv"
)

var binary string

func TestMain(m *testing.M) { proctest.Main(m, &binary) }

// sdkTimeout bounds one run of the SDK script (startup, ten sends with
// their retries, shutdown) on a loaded machine.
const sdkTimeout = 2 * time.Minute

// line is one line producer.js prints.
type line struct {
	Kind      string            `json:"kind"`
	Body      string            `json:"body"`
	Tag       string            `json:"tag"`
	Keys      []string          `json:"keys"`
	Group     string            `json:"group"`
	Props     map[string]string `json:"props"`
	MessageID string            `json:"messageId"`
	Offset    int64             `json:"offset"`
	Error     string            `json:"error"`
	Code      int               `json:"code"`
	Message   string            `json:"message"`
	// HARetries counts the sends producer.js repeated after
	// HA_NOT_AVAILABLE (a group's leader could not commit; nothing stored).
	HARetries int `json:"haRetries"`
	// Attempt is a delivery attempt consumer.js saw.
	Attempt int `json:"attempt"`
	// RecallHandle and DeliverAt (Unix ms) of a timer message; At is when
	// consumer.js received a message (Unix ms).
	RecallHandle string `json:"recallHandle"`
	DeliverAt    int64  `json:"deliverAt"`
	At           int64  `json:"at"`
}

// nodeSDK returns the node binary, after checking that the SDK is
// installed next to this test.
func nodeSDK(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	testenv.Need(t, err == nil, "node is not on PATH (Debian: apt-get install nodejs npm)")
	_, err = os.Stat(filepath.Join("node_modules", "rocketmq-client-nodejs", "package.json"))
	testenv.Need(t, err == nil, "tests/rocketmq-sdk/node_modules lacks rocketmq-client-nodejs: run npm ci in tests/rocketmq-sdk")
	return node
}

// runProducer runs producer.js against addr and returns what it printed.
func runProducer(t *testing.T, node, addr string, args ...string) []line {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), sdkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"producer.js", "--endpoints", addr}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("producer.js: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var lines []line
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("producer.js printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// TestNodeSDKProducer: the SDK's Producer starts against storaged (route
// of a topic that does not exist yet, settings over Telemetry), sends a
// normal, a tagged (tag, keys, user properties) and FIFO messages of two
// message groups, and sees three sends refused with the exceptions that
// say why. Every receipt's messageId is a stored record's msgId whose
// topic, body, tag, keys, properties, message group and queue offset are
// what was sent; each group's messages are in one queue in send order; and
// the topic holds exactly the messages with receipts.
func TestNodeSDKProducer(t *testing.T) {
	node := nodeSDK(t)
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: t.TempDir()})
	const topic = "SdkOrders"
	lines := runProducer(t, node, p.Addr(), "--topic", topic)
	for _, l := range lines {
		if l.HARetries != 0 {
			t.Errorf("%s %q: %d sends refused HA_NOT_AVAILABLE by a standalone store", l.Kind, l.Body, l.HARetries)
		}
	}
	checkProduced(t, storagedv1.NewMessageStoreServiceClient(p.Conn()), topic, lines)
}

// checkProduced checks what producer.js printed for topic against what the
// store behind client holds (TestNodeSDKProducer says what).
func checkProduced(t *testing.T, client storagedv1.MessageStoreServiceClient, topic string, lines []line) {
	t.Helper()
	var kinds []string
	for _, l := range lines {
		kinds = append(kinds, l.Kind)
	}
	want := []string{"normal", "tagged", "fifo", "fifo", "fifo", "fifo", "fifo", "reserved-property", "bad-tag"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("producer.js printed kinds %v, want %v", kinds, want)
	}
	refused := map[string]struct {
		name string
		code int
	}{
		"reserved-property": {"BadRequestException", 40007}, // ILLEGAL_MESSAGE_PROPERTY_KEY
		"bad-tag":           {"BadRequestException", 40004}, // ILLEGAL_MESSAGE_TAG
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	groupQueue := map[string]int32{}
	groupNext := map[string]int64{}
	sent := map[string]bool{}
	for _, l := range lines {
		if r, ok := refused[l.Kind]; ok {
			if l.Error != r.name || l.Code != r.code || l.MessageID != "" {
				t.Errorf("%s: got error %q code %d (%s), want %s code %d", l.Kind, l.Error, l.Code, l.Message, r.name, r.code)
			}
			continue
		}
		if l.Error != "" || l.MessageID == "" {
			t.Fatalf("%s %q: not stored: %s %d %s", l.Kind, l.Body, l.Error, l.Code, l.Message)
		}
		sent[l.Body] = true
		res, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: l.MessageID}})
		if err != nil {
			t.Fatalf("%s %q: GetMessage(%s): %v", l.Kind, l.Body, l.MessageID, err)
		}
		m := res.GetMessage()
		if m.GetTopic() != topic || string(m.GetBody()) != l.Body || m.GetMsgId() != l.MessageID || m.GetQueueOffset() != l.Offset {
			t.Errorf("%s: stored %s %q msgId %s offset %d, sent %s %q, receipt %s offset %d", l.Kind,
				m.GetTopic(), m.GetBody(), m.GetMsgId(), m.GetQueueOffset(), topic, l.Body, l.MessageID, l.Offset)
		}
		if m.GetTags() != l.Tag || m.GetKeys() != strings.Join(l.Keys, " ") {
			t.Errorf("%s %q: stored tags %q keys %q, sent tag %q keys %q", l.Kind, l.Body, m.GetTags(), m.GetKeys(), l.Tag, l.Keys)
		}
		props := m.GetProperties()
		for k, v := range l.Props {
			if props[k] != v {
				t.Errorf("%s %q: property %s = %q, sent %q", l.Kind, l.Body, k, props[k], v)
			}
		}
		if props["__SHARDINGKEY"] != l.Group {
			t.Errorf("%s %q: __SHARDINGKEY %q, sent group %q", l.Kind, l.Body, props["__SHARDINGKEY"], l.Group)
		}
		if len(props["UNIQ_KEY"]) != 34 { // the SDK's message id: 17 bytes in hex
			t.Errorf("%s %q: UNIQ_KEY %q is not the SDK's message id", l.Kind, l.Body, props["UNIQ_KEY"])
		}
		if l.Group != "" {
			q, seen := groupQueue[l.Group]
			if seen && q != m.GetQueueId() {
				t.Errorf("group %s: %q in queue %d, earlier ones in %d", l.Group, l.Body, m.GetQueueId(), q)
			}
			if seen && m.GetQueueOffset() <= groupNext[l.Group] {
				t.Errorf("group %s: %q at offset %d, not after the previous one (%d)", l.Group, l.Body, m.GetQueueOffset(), groupNext[l.Group])
			}
			groupQueue[l.Group], groupNext[l.Group] = m.GetQueueId(), m.GetQueueOffset()
		}
	}

	// The topic holds exactly the messages with receipts: a refused send
	// (and the SDK's retries of it) stored nothing.
	stored := map[string]int{}
	for q := int32(0); q < 8; q++ { // the route of a new topic: storaged's default 8 queues
		if err := proctest.PullQueue(ctx, client, topic, q, func(m *storagedv1.StoredMessage) { stored[string(m.GetBody())]++ }); err != nil {
			t.Fatal(err)
		}
	}
	if len(stored) != len(sent) {
		t.Errorf("the topic holds %d distinct bodies, %d were sent with receipts: %v", len(stored), len(sent), stored)
	}
	for b, n := range stored {
		if !sent[b] || n != 1 {
			t.Errorf("stored %q %d times; sent with a receipt: %v", b, n, sent[b])
		}
	}
}

// runConsumer runs consumer.js against addr in mode and returns what it
// printed, failing unless it ended with {"kind":"done"}.
func runConsumer(t *testing.T, node, addr, topic, group, mode string, count int) []line {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), sdkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "consumer.js", "--endpoints", addr, "--topic", topic, "--group", group,
		"--mode", mode, "--count", fmt.Sprint(count))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var lines []line
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("consumer.js printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if err != nil || len(lines) == 0 || lines[len(lines)-1].Kind != "done" {
		t.Fatalf("consumer.js --mode %s: %v\nstdout:\n%s\nstderr:\n%s", mode, err, stdout.String(), stderr.String())
	}
	return lines[:len(lines)-1]
}

// putBodies stores one message per body in topic through storaged.v1 and
// returns each body's msgId.
func putBodies(t *testing.T, p *proctest.Process, topic string, bodies ...string) map[string]string {
	t.Helper()
	client := storagedv1.NewMessageStoreServiceClient(p.Conn())
	ids := map[string]string{}
	for i, b := range bodies {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: topic, QueueId: int32(i % 4), Body: []byte(b)}})
		cancel()
		if err != nil {
			t.Fatalf("put %s: %v", b, err)
		}
		ids[b] = res.GetResult().GetMsgId()
	}
	return ids
}

// TestNodeSDKSimpleConsumer: the SDK's SimpleConsumer against a storaged
// whose groups get 3 delivery attempts. It receives the six messages sent
// (attempt 1, the msgId they were stored with); acks s0 and s1, which are
// never delivered again; changes s2's invisible duration and sees it once
// more (attempt 2) before acking it; never acks s3-s5, and sees each again
// with attempts 2 and 3, never a fourth time; and a second SimpleConsumer
// reading %DLQ%<group> gets exactly s3-s5 (the store's DLQ topic holds
// them too, read back through storaged.v1).
func TestNodeSDKSimpleConsumer(t *testing.T) {
	node := nodeSDK(t)
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: t.TempDir(), Flags: []string{"--consumer-max-attempts", "3"}})
	const topic, group = "SdkSimple", "SdkGroup"
	ids := putBodies(t, p, topic, "s0", "s1", "s2", "s3", "s4", "s5")
	lines := runConsumer(t, node, p.Addr(), topic, group, "simple", 6)
	attempts := map[string][]int{}
	var dlq []string
	for _, l := range lines {
		switch l.Kind {
		case "received":
			attempts[l.Body] = append(attempts[l.Body], l.Attempt)
			if l.MessageID != ids[l.Body] {
				t.Errorf("%s attempt %d: messageId %s, stored as %s", l.Body, l.Attempt, l.MessageID, ids[l.Body])
			}
		case "dlq":
			dlq = append(dlq, l.Body)
			if l.MessageID == "" {
				t.Errorf("DLQ %s: no messageId", l.Body)
			}
		case "acked", "changed":
		default:
			t.Errorf("consumer.js printed %+v", l)
		}
	}
	want := map[string][]int{"s0": {1}, "s1": {1}, "s2": {1, 2}, "s3": {1, 2, 3}, "s4": {1, 2, 3}, "s5": {1, 2, 3}}
	for b, w := range want {
		if !slices.Equal(attempts[b], w) {
			t.Errorf("%s delivered with attempts %v, want %v", b, attempts[b], w)
		}
	}
	slices.Sort(dlq)
	if !slices.Equal(dlq, []string{"s3", "s4", "s5"}) {
		t.Errorf("the DLQ reader got %v, want [s3 s4 s5]", dlq)
	}
	var stored []string
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := proctest.PullQueue(ctx, storagedv1.NewMessageStoreServiceClient(p.Conn()), "%DLQ%"+group, 0,
		func(m *storagedv1.StoredMessage) { stored = append(stored, string(m.GetBody())) }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(stored)
	if !slices.Equal(stored, []string{"s3", "s4", "s5"}) {
		t.Errorf("%%DLQ%%%s holds %v, want [s3 s4 s5]", group, stored)
	}
}

// TestNodeSDKPushConsumer: the SDK's PushConsumer (QueryAssignment, then
// receives with auto_renew, acks after its listener) consumes the ten
// messages of a topic, each once, at its first attempt.
func TestNodeSDKPushConsumer(t *testing.T) {
	node := nodeSDK(t)
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: t.TempDir(), Flags: []string{"--max-pull-wait", "2s"}})
	const topic = "SdkPush"
	var bodies []string
	for i := range 10 {
		bodies = append(bodies, fmt.Sprintf("p%d", i))
	}
	ids := putBodies(t, p, topic, bodies...)
	lines := runConsumer(t, node, p.Addr(), topic, "SdkPushGroup", "push", len(bodies))
	seen := map[string]int{}
	for _, l := range lines {
		if l.Kind != "consumed" {
			t.Errorf("consumer.js printed %+v", l)
			continue
		}
		seen[l.Body]++
		if l.Attempt != 1 || l.MessageID != ids[l.Body] {
			t.Errorf("%s: attempt %d messageId %s (stored as %s)", l.Body, l.Attempt, l.MessageID, ids[l.Body])
		}
	}
	for _, b := range bodies {
		if seen[b] != 1 {
			t.Errorf("%s consumed %d times", b, seen[b])
		}
	}
}

// TestNodeSDKConsumerKill: a SimpleConsumer receives k0 and k1 and acks
// k0 only; storaged is killed (SIGKILL) before k1 is acked and restarted
// on its data dir. A new consumer of the group then gets k1 again, at
// attempt 2 with its msgId, and k0 not: both were in flight with the same
// invisible deadline, so a k0 not acked would have come back in the same
// receive.
func TestNodeSDKConsumerKill(t *testing.T) {
	node := nodeSDK(t)
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: t.TempDir()})
	const topic, group = "SdkKill", "SdkKillGroup"
	ids := putBodies(t, p, topic, "k0", "k1")
	first := runConsumer(t, node, p.Addr(), topic, group, "receive", 2)
	acked := 0
	for _, l := range first {
		if l.Kind == "acked" {
			acked++
		}
	}
	if len(first) != 3 || acked != 1 {
		t.Fatalf("first consumer printed %+v, want two receives and the ack of k0", first)
	}
	p.Kill(t)
	p.Restart(t)
	again := runConsumer(t, node, p.Addr(), topic, group, "drain", 0)
	if len(again) != 2 || again[0].Kind != "received" || again[0].Body != "k1" || again[0].Attempt != 2 || again[0].MessageID != ids["k1"] {
		t.Fatalf("after the restart the consumer printed %+v, want k1 alone at attempt 2 with msgId %s", again, ids["k1"])
	}
}

// TestNodeSDKProducerGroup: the SDK is given a follower of a 3-member
// replication group as its endpoint. The follower's route names the
// leader's client address, so the SDK sends there, and every send is
// acknowledged as committed by the group and read back from the leader
// exactly as in TestNodeSDKProducer.
func TestNodeSDKProducerGroup(t *testing.T) {
	node := nodeSDK(t)
	nodes := startGroup(t, 3)
	leader := waitLeader(t, nodes)
	var follower *proctest.Process
	for _, p := range nodes {
		if p != leader {
			follower = p
			break
		}
	}
	// The follower routes to the leader once it knows the leader's client
	// address (the peers exchange them); before that it would route to
	// itself and refuse the sends.
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		ri, err := storagedv1.NewMessageStoreServiceClient(follower.Conn()).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
		cancel()
		if err == nil && ri.GetLeaderAddr() == leader.Addr() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower does not name the leader's address %s within 60 s: %v %v", leader.Addr(), ri, err)
		}
		<-tick.C
	}
	const topic = "SdkGroupOrders"
	lines := runProducer(t, node, follower.Addr(), "--topic", topic)
	for _, l := range lines {
		if l.HARetries > 0 { // a loaded machine: a follower fell behind for a moment
			t.Logf("%s %q: sent again %d times after HA_NOT_AVAILABLE", l.Kind, l.Body, l.HARetries)
		}
	}
	checkProduced(t, storagedv1.NewMessageStoreServiceClient(leader.Conn()), topic, lines)
}

// startGroup starts n storaged processes as one replication group on
// loopback (ids 1..n), each with flags added.
func startGroup(t *testing.T, n int, flags ...string) []*proctest.Process {
	t.Helper()
	var peerAddrs []string
	var ls []net.Listener
	for range n { // reserve the peer ports: every member must know them all before any starts
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		peerAddrs = append(peerAddrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	var peers []string
	for i, a := range peerAddrs {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	dir := t.TempDir()
	var nodes []*proctest.Process
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		nodes = append(nodes, proctest.Start(t, proctest.Options{Binary: binary, Name: name, DataDir: filepath.Join(dir, name),
			Flags: append([]string{"--raft-id", fmt.Sprint(i + 1), "--raft-peers", strings.Join(peers, ","), "--peer-listen", peerAddrs[i]}, flags...)}))
	}
	return nodes
}

// waitLeader polls the members' GetReplicaInfo (60 s at most) until one
// reports itself the ready leader with every other member recently active:
// before that a put may be refused IN_SYNC_REPLICAS_NOT_ENOUGH
// (HA_NOT_AVAILABLE), which the Node SDK retries at once, three times
// within a millisecond.
func waitLeader(t *testing.T, nodes []*proctest.Process) *proctest.Process {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range nodes {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			ri, err := storagedv1.NewMessageStoreServiceClient(p.Conn()).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
			cancel()
			if err == nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady() {
				active := 0
				for _, pp := range ri.GetPeers() {
					if pp.GetId() != ri.GetId() && pp.GetRecentActive() {
						active++
					}
				}
				if active == len(nodes)-1 {
					return p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready leader within 60 s")
		}
		<-tick.C
	}
}

// TestNodeSDKTimer: the SDK sends timer messages (deliveryTimestamp) and
// gets recall handles; storaged holds them on its timer topic and puts
// them to their topic only once their time has come, never before (a
// real storaged process on the wall clock); the one the SDK recalled (the
// recall answered OK, a second recall refused) never arrives, although it
// was due before the other. The SDK's SimpleConsumer (consumer.js --mode
// drain, started as soon as the producer is done) receives timer-0 no
// earlier than its time, with its delivery timestamp; storaged.v1 pulls
// then check the topic holds it, stored at its time or later, and not the
// recalled one.
func TestNodeSDKTimer(t *testing.T) {
	node := nodeSDK(t)
	p := proctest.Start(t, proctest.Options{Binary: binary, DataDir: t.TempDir()})
	const topic, delay = "SdkTimers", 4000
	lines := runProducer(t, node, p.Addr(), "--topic", topic, "--timers", fmt.Sprint(delay))
	var kinds []string
	for _, l := range lines {
		kinds = append(kinds, l.Kind)
	}
	if !slices.Equal(kinds, []string{"timer", "timer", "recall", "recall"}) {
		t.Fatalf("producer.js printed %+v", lines)
	}
	timer, recalled := lines[0], lines[1]
	for _, l := range lines[:2] {
		if l.Error != "" || l.MessageID == "" || l.RecallHandle == "" || l.DeliverAt == 0 {
			t.Fatalf("timer send %q: %+v", l.Body, l)
		}
	}
	if lines[2].Error != "" || lines[2].MessageID != recalled.MessageID {
		t.Fatalf("recall: %+v, want message id %s", lines[2], recalled.MessageID)
	}
	if lines[3].Error == "" || !strings.Contains(lines[3].Message, "40401") {
		t.Fatalf("second recall: %+v, want MESSAGE_NOT_FOUND (40401)", lines[3])
	}
	got := runConsumer(t, node, p.Addr(), topic, "SdkTimerGroup", "drain", 0)
	if len(got) != 2 || got[0].Kind != "received" || got[0].Body != "timer-0" || got[1].Kind != "acked" {
		t.Fatalf("the SimpleConsumer got %+v, want timer-0 alone", got)
	}
	if got[0].At < timer.DeliverAt || got[0].DeliverAt != timer.DeliverAt {
		t.Fatalf("the SimpleConsumer got timer-0 at %d with delivery timestamp %d; it is due at %d", got[0].At, got[0].DeliverAt, timer.DeliverAt)
	}
	client := storagedv1.NewMessageStoreServiceClient(p.Conn())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: timer.MessageID}})
	if err != nil {
		t.Fatal(err)
	}
	if m := res.GetMessage(); m.GetTopic() != "rmq_sys_wheel_timer" || m.GetProperties()["REAL_TOPIC"] != topic ||
		m.GetProperties()["TIMER_OUT_MS"] != fmt.Sprint(timer.DeliverAt) {
		t.Fatalf("the timer message is stored as %s %v", m.GetTopic(), m.GetProperties())
	}
	// Poll the topic until timer-0 arrives: every look before its time
	// finds nothing, and what arrives was stored at its time or later.
	arrived := map[string]*storagedv1.StoredMessage{}
	for len(arrived) == 0 || arrived["timer-0"] == nil {
		if ctx.Err() != nil {
			t.Fatalf("timer-0 (due %d) not delivered within a minute; arrived %v", timer.DeliverAt, arrived)
		}
		for q := int32(0); q < 8; q++ {
			if err := proctest.PullQueue(ctx, client, topic, q, func(m *storagedv1.StoredMessage) { arrived[string(m.GetBody())] = m }); err != nil {
				t.Fatal(err)
			}
		}
		pulledBy := time.Now().UnixMilli()
		if m := arrived["timer-0"]; m == nil && len(arrived) > 0 || m != nil && pulledBy < timer.DeliverAt {
			t.Fatalf("readable by %d, before the delivery time %d: %v", pulledBy, timer.DeliverAt, arrived)
		}
		<-time.After(50 * time.Millisecond) // a poll interval, not a wait for the outcome
	}
	m := arrived["timer-0"]
	if st := m.GetStoreTimestamp().AsTime().UnixMilli(); st < timer.DeliverAt || m.GetProperties()["TIMER_OUT_MS"] != fmt.Sprint(timer.DeliverAt) {
		t.Fatalf("timer-0 stored at %d, due %d: %v", st, timer.DeliverAt, m.GetProperties())
	}
	if len(arrived) != 1 {
		t.Fatalf("arrived %v: the recalled message (due %d, before timer-0) was delivered", arrived, recalled.DeliverAt)
	}
}
