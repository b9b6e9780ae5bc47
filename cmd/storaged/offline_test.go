package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// runBinary runs the storaged binary to completion and returns its exit
// status, stdout and stderr.
func runBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), exitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("storaged %v: %v\n%s", args, err, stderr.String())
	return -1, "", ""
}

// serveData starts the binary on dir (64 KiB files, sync flush) and returns
// the process and a client once it is SERVING.
func serveData(t *testing.T, dir string) (*proc, storagedv1.MessageStoreServiceClient) {
	t.Helper()
	p := startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir,
		"--flush-mode", "sync", "--file-size", "64KiB", "--max-message-size", "16KiB")
	conn := dial(t, p.logs.waitFor(t, "listening").str("grpc"))
	waitServing(t, conn)
	return p, storagedv1.NewMessageStoreServiceClient(conn)
}

func stop(t *testing.T, p *proc) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("storaged exited %d after SIGTERM:\n%s", code, p.logs.String())
	}
}

// TestCheckAndRepair: a clean data dir checks clean; one flipped byte in an
// acknowledged record makes check exit 1 naming the offset, the server
// refuse to start naming file and offset and the commands, repair cut the
// log there, and the server then serve every message before the cut.
func TestCheckAndRepair(t *testing.T) {
	dir := t.TempDir()
	dirArgs := []string{"--data-dir", dir, "--file-size", "64KiB"}
	p, client := serveData(t, dir)

	if code, _, stderr := runBinary(t, append([]string{"check"}, dirArgs...)...); code != exitCantRead || !strings.Contains(stderr, "in use by a running storaged") {
		t.Errorf("check on a running server's data dir: exit %d, %q; want %d and a hint", code, stderr, exitCantRead)
	}

	const n = 150 // ~1 KiB each: three files
	var results []*storagedv1.AppendResult
	for i := range n {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
			Topic: "cr", Body: fmt.Appendf(nil, "m%03d-%s", i, strings.Repeat("x", 900))}})
		cancel()
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		results = append(results, resp.GetResult())
	}
	stop(t, p)

	code, out, _ := runBinary(t, append([]string{"check"}, dirArgs...)...)
	var rep checkOutput
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("check output is not JSON: %v\n%s", err, out)
	}
	if code != 0 || rep.Damaged || rep.Records != n || rep.Files < 3 || rep.End != rep.Flushed {
		t.Fatalf("check of a clean data dir: exit %d, %+v", code, rep)
	}

	// Flip a body byte of an acknowledged message in the last file: recovery
	// scans from the file holding the flushed checkpoint, so Open sees it.
	// (check sees damage anywhere.)
	const fileSize = 64 << 10
	lastFile := results[n-1].GetWroteOffset() / fileSize * fileSize
	cut := 0
	for results[cut].GetWroteOffset() < lastFile+1000 {
		cut++
	}
	victim := results[cut]
	fileName := fmt.Sprintf("commitlog/%020d", lastFile)
	file := filepath.Join(dir, fileName)
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'#'}, victim.GetWroteOffset()-lastFile+int64(victim.GetWroteBytes())-100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	code, out, stderr := runBinary(t, append([]string{"check"}, dirArgs...)...)
	rep = checkOutput{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("check output is not JSON: %v\n%s", err, out)
	}
	off := victim.GetWroteOffset()
	if code != exitDamage || !rep.Damaged || rep.DamageOffset == nil || *rep.DamageOffset != off ||
		rep.DamageFile != fileName || !rep.BelowCheckpoint ||
		!strings.Contains(rep.Repair, "--truncate-at "+strconv.FormatInt(off, 10)) ||
		!strings.Contains(stderr, strconv.FormatInt(off, 10)) {
		t.Fatalf("check of the damaged dir: exit %d, %+v\nstderr: %s", code, rep, stderr)
	}

	// The server refuses to start, and says why and what to do.
	p = startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir, "--file-size", "64KiB")
	if code := p.exitCode(t); code != 1 {
		t.Fatalf("start on damaged data: exit %d, want 1\n%s", code, p.logs.String())
	}
	logs := p.logs.String()
	for _, want := range []string{`"file":"` + fileName + `"`, fmt.Sprintf(`"offset":%d`, off),
		"storaged check --data-dir", fmt.Sprintf("storaged repair --data-dir %s --file-size 64KiB --truncate-at %d", dir, off),
		fmt.Sprintf("storaged: damaged record in %s at commitlog offset %d", fileName, off)} {
		if !strings.Contains(logs, want) {
			t.Errorf("start on damaged data: output lacks %q:\n%s", want, logs)
		}
	}

	if code, _, stderr := runBinary(t, append([]string{"repair"}, dirArgs...)...); code != exitUsage || !strings.Contains(stderr, "--truncate-at OFFSET is required") {
		t.Errorf("repair without --truncate-at: exit %d, %q; want %d", code, stderr, exitUsage)
	}
	if code, _, stderr := runBinary(t, append([]string{"repair", "--truncate-at", strconv.FormatInt(off-1, 10)}, dirArgs...)...); code != exitDamage ||
		!strings.Contains(stderr, "not a record boundary") {
		t.Errorf("repair inside a record: exit %d, %q; want %d", code, stderr, exitDamage)
	}
	code, out, stderr = runBinary(t, append([]string{"repair", "--truncate-at", strconv.FormatInt(off, 10)}, dirArgs...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("cut the commitlog at offset %d", off)) || !strings.Contains(out, "no damage") {
		t.Fatalf("repair: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if code, out, _ := runBinary(t, append([]string{"check"}, dirArgs...)...); code != 0 {
		t.Fatalf("check after repair: exit %d\n%s", code, out)
	}
	broken, _ := filepath.Glob(filepath.Join(dir, "commitlog", "*.broken"))
	if len(broken) == 0 {
		t.Errorf("no .broken file keeps the cut bytes")
	}

	// The server starts; messages before the cut are served, the queue ends there.
	p, client = serveData(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var pulled []*storagedv1.StoredMessage
	for next := int64(0); next < int64(cut); {
		resp, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "cr", QueueOffset: next,
			MaxMessages: 100, Wait: durationpb.New(30 * time.Second)})
		if err != nil {
			t.Fatalf("pull after repair: %v", err)
		}
		pulled = append(pulled, resp.GetMessages()...)
		next = resp.GetNextOffset()
	}
	if len(pulled) != cut {
		t.Fatalf("pulled %d messages after the repair, want the %d before the cut", len(pulled), cut)
	}
	for i, m := range pulled {
		if m.GetMsgId() != results[i].GetMsgId() || !bytes.HasPrefix(m.GetBody(), fmt.Appendf(nil, "m%03d-", i)) {
			t.Fatalf("message %d after repair: %s %.5q", i, m.GetMsgId(), m.GetBody())
		}
	}
	info, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "cr"})
	if err != nil || info.GetMaxOffset() != int64(cut) {
		t.Fatalf("queue info after repair: %v, %v; want max %d", info, err, cut)
	}
	resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "cr", Body: []byte("after")}})
	if err != nil || resp.GetResult().GetWroteOffset() != off || resp.GetResult().GetQueueOffset() != int64(cut) {
		t.Fatalf("put after repair: %v, %v; want offset %d, queue offset %d", resp, err, off, cut)
	}
	stop(t, p)
}

func TestOfflineUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check", "--nope"}, exitUsage, "flag provided but not defined"},
		{[]string{"check", "extra"}, exitUsage, "unexpected arguments"},
		{[]string{"repair", "--truncate-at", "-5"}, exitUsage, "non-negative"},
		{[]string{"repair", "--truncate-at", "x"}, exitUsage, "non-negative"},
		{[]string{"check", "-h"}, exitOK, "Usage: storaged check"},
		{[]string{"repair", "-h"}, exitOK, "Usage: storaged repair"},
		{[]string{"replica"}, exitUsage, "Usage: storaged replica repair"},
		{[]string{"replica", "mend"}, exitUsage, "Usage: storaged replica repair"},
		{[]string{"replica", "repair", "-h"}, exitOK, "Usage: storaged replica repair"},
		{[]string{"replica", "repair", "--data-dir", t.TempDir()}, exitUsage, "--from ID=HOST:PORT is required"},
		{[]string{"replica", "repair", "--from", "2"}, exitUsage, "want id=host:port"},
		{[]string{"replica", "repair", "--from", "2=127.0.0.1:1", "--peer-tls-cert", "c.pem"}, exitUsage, "go together"},
		{[]string{"replica", "repair", "--data-dir", t.TempDir(), "--from", "2=127.0.0.1:1"}, exitCantRead, "not a replication group member's"},
	} {
		code, _, stderr := runBinary(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("storaged %v: exit %d, %q; want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
	// A directory without a commitlog is not a data dir: could not check.
	code, _, stderr := runBinary(t, "check", "--data-dir", t.TempDir())
	if code != exitCantRead || !strings.Contains(stderr, "no commitlog") {
		t.Errorf("check of an empty dir: exit %d, %q; want %d", code, stderr, exitCantRead)
	}
}

// TestCorruptCheckpoint: after a clean stop, more puts and a kill -9, a
// checkpoint that fails its CRC
// makes the server refuse to start naming the file and the exact repair
// command, check exit 4 naming it, repair --rebuild-checkpoint set it
// aside and write a new one, and the next start serve every acknowledged
// message (singles and batches) at its offsets, and take new ones after
// them.
func TestCorruptCheckpoint(t *testing.T) {
	dir := t.TempDir()
	dirArgs := []string{"--data-dir", dir, "--file-size", "64KiB"}
	p, client := serveData(t, dir)
	type ackd struct {
		msgID string
		qoff  int64
	}
	var acks []ackd
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 40 {
		if i == 20 { // a clean stop writes a checkpoint; the rest is after it
			stop(t, p)
			p, client = serveData(t, dir)
		}
		if i%4 == 3 { // a batch of 5 every fourth put
			req := &storagedv1.PutMessagesRequest{Topic: "cp"}
			for j := range 5 {
				req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: fmt.Appendf(nil, "b%02d-%d-%s", i, j, strings.Repeat("y", 700))})
			}
			resp, err := client.PutMessages(ctx, req)
			if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
				t.Fatalf("put batch %d: %v %v", i, resp, err)
			}
			for j, id := range resp.GetResult().GetMsgIds() {
				acks = append(acks, ackd{id, resp.GetResult().GetQueueOffset() + int64(j)})
			}
			continue
		}
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
			Topic: "cp", Body: fmt.Appendf(nil, "m%02d-%s", i, strings.Repeat("x", 900))}})
		if err != nil || resp.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Fatalf("put %d: %v %v", i, resp, err)
		}
		acks = append(acks, ackd{resp.GetResult().GetMsgId(), resp.GetResult().GetQueueOffset()})
	}
	p.signal(t, syscall.SIGKILL)
	p.exitCode(t)

	cpFile := filepath.Join(dir, "checkpoint")
	b, err := os.ReadFile(cpFile)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x20 // one flipped bit in the JSON
	if err := os.WriteFile(cpFile, b, 0o644); err != nil {
		t.Fatal(err)
	}

	p = startProc(t, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir, "--file-size", "64KiB")
	if code := p.exitCode(t); code != 1 {
		t.Fatalf("start with a corrupt checkpoint: exit %d, want 1\n%s", code, p.logs.String())
	}
	rebuild := fmt.Sprintf("storaged repair --data-dir %s --file-size 64KiB --rebuild-checkpoint", dir)
	logs := p.logs.String()
	for _, want := range []string{"storaged: the checkpoint file " + cpFile + " is corrupt", "`" + rebuild + "`",
		`"file":"` + cpFile + `"`, "storaged check --data-dir " + dir} {
		if !strings.Contains(logs, want) {
			t.Errorf("start with a corrupt checkpoint: output lacks %q:\n%s", want, logs)
		}
	}

	code, out, stderr := runBinary(t, append([]string{"check"}, dirArgs...)...)
	var rep checkOutput
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("check output is not JSON: %v\n%s", err, out)
	}
	if code != exitCheckpoint || rep.Damaged || rep.CheckpointDamage == "" || rep.CheckpointFile != cpFile ||
		rep.Repair != rebuild || rep.Records != int64(len(acks)) || !strings.Contains(stderr, rebuild) {
		t.Fatalf("check with a corrupt checkpoint: exit %d, %+v\nstderr: %s", code, rep, stderr)
	}

	code, out, stderr = runBinary(t, append([]string{"repair", "--rebuild-checkpoint"}, dirArgs...)...)
	if code != 0 || !strings.Contains(out, "set the old checkpoint aside as checkpoint.corrupt-") || !strings.Contains(out, "nothing was cut") {
		t.Fatalf("repair --rebuild-checkpoint: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "checkpoint.corrupt-*")); len(aside) != 1 {
		t.Errorf("the corrupt checkpoint is not kept: %v", aside)
	}
	if code, out, _ := runBinary(t, append([]string{"check"}, dirArgs...)...); code != 0 {
		t.Fatalf("check after the rebuild: exit %d\n%s", code, out)
	}

	p, client = serveData(t, dir)
	var pulled []*storagedv1.StoredMessage
	for next := int64(0); next < int64(len(acks)); {
		resp, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "cp", QueueOffset: next,
			MaxMessages: 100, Wait: durationpb.New(30 * time.Second)})
		if err != nil {
			t.Fatalf("pull after the rebuild: %v", err)
		}
		pulled = append(pulled, resp.GetMessages()...)
		next = resp.GetNextOffset()
	}
	if len(pulled) != len(acks) {
		t.Fatalf("pulled %d messages after the rebuild, want every one of the %d acknowledged", len(pulled), len(acks))
	}
	for i, m := range pulled {
		if m.GetMsgId() != acks[i].msgID || m.GetQueueOffset() != acks[i].qoff {
			t.Fatalf("message %d after the rebuild: %s at %d, acknowledged %s at %d", i, m.GetMsgId(), m.GetQueueOffset(), acks[i].msgID, acks[i].qoff)
		}
	}
	resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "cp", Body: []byte("after")}})
	if err != nil || resp.GetResult().GetQueueOffset() != int64(len(acks)) {
		t.Fatalf("put after the rebuild: %v, %v; want queue offset %d", resp, err, len(acks))
	}
	stop(t, p)
}
