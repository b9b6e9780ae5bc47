package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// commitlogFiles lists p's commitlog files by start offset.
func commitlogFiles(t *testing.T, p *proctest.Process) []int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(p.DataDir(), "commitlog"))
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, e := range ents {
		if n, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && len(e.Name()) == 20 {
			out = append(out, n)
		}
	}
	return out
}

// installedSnapshots returns what p's log says of the snapshots it
// installed: one entry per "storage: snapshot installed" line.
func installedSnapshots(t *testing.T, p *proctest.Process) []struct {
	Index uint64 `json:"index"`
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
} {
	t.Helper()
	f, err := os.Open(p.StderrPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []struct {
		Index uint64 `json:"index"`
		Bytes int64  `json:"bytes"`
		Files int    `json:"files"`
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(`"storage: snapshot installed"`)) {
			continue
		}
		var l struct {
			Index uint64 `json:"index"`
			Bytes int64  `json:"bytes"`
			Files int    `json:"files"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// readKept pulls queue 0 of the test topic from p, from its first offset
// still kept (retention moves it up), checking the offsets are dense.
func readKept(p *proctest.Process) (map[int64]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := p.Conn() // once: a reader beside a nemesis can see p stop between two calls
	if conn == nil {
		return nil, fmt.Errorf("%s is not running", p.DataDir())
	}
	c := storagedv1.NewMessageStoreServiceClient(conn)
	qi, err := c.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: "Group"})
	if err != nil {
		return nil, err
	}
	got := map[int64]string{}
	for next := qi.GetMinOffset(); next < qi.GetMaxOffset(); {
		res, err := c.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "Group", QueueOffset: next, MaxMessages: 1000})
		if err != nil {
			return nil, fmt.Errorf("pull at %d: %w", next, err)
		}
		if len(res.GetMessages()) == 0 {
			return nil, fmt.Errorf("nothing at %d below the max offset %d", next, qi.GetMaxOffset())
		}
		for _, m := range res.GetMessages() {
			if m.GetQueueOffset() != next {
				return nil, fmt.Errorf("offset %d where %d was expected (not dense)", m.GetQueueOffset(), next)
			}
			got[next] = string(m.GetBody())
			next++
		}
	}
	return got, nil
}

// TestGroupSnapshotRejoin (issue 13, design §3.5 and §7 acceptance 5): a
// follower is down while time-based retention (--file-reserved-time 3s,
// --raft-catchup-window 64KiB) deletes the leader's commitlog files past
// everything the follower holds. Restarted, it cannot catch up from the
// leader's raft log (compacted to what retention deleted): it gets a
// snapshot, installs it, and catches up. Its commitlog files are then
// byte-identical to the leader's over the committed range both still
// hold, it serves every acknowledged message it holds at its offset, and
// no member ever served a body other than the acknowledged one. The test
// log reports the snapshot's bytes and the seconds from the restart to
// the follower's commit end reaching the leader's.
func TestGroupSnapshotRejoin(t *testing.T) {
	const fileSize = 256 << 10
	g := newGroup(t, "--file-reserved-time", "3s", "--delete-when", "*", "--disk-check-interval", "200ms",
		"--raft-catchup-window", "64KiB")
	acked := map[int64]string{}
	rc := newReadCheck()
	stopReads := rc.run(g)
	t.Cleanup(func() { stopReads() })
	put := func(body string) { t.Helper(); rc.put(t, g, acked, body) }
	body := strings.Repeat("s", 4000)
	for k := range 20 {
		put(fmt.Sprintf("snap-%04d-%s", k, body))
	}
	leader := g.Leader(t)
	var follower *proctest.Process
	for _, p := range g.nodes {
		if p != leader {
			follower = p
			break
		}
	}
	name := g.Name(follower)
	waitAcked(t, name, follower, acked)
	followerEnd := mustReplicaInfo(t, follower).GetCommitEnd()
	follower.Kill(t)

	for k := 20; k < 400; k++ {
		put(fmt.Sprintf("snap-%04d-%s", k, body))
	}
	leader = g.Leader(t)
	waitFor(t, 60*time.Second, "the leader's retention deleting files past the stopped follower's commit end", func() bool {
		files := commitlogFiles(t, leader)
		return len(files) > 0 && files[0] > followerEnd
	})
	leaderMin := commitlogFiles(t, leader)[0]

	start := time.Now()
	follower.Restart(t)
	put("after-restart")
	var end int64
	waitFor(t, 60*time.Second, "the follower's commit end reaching the leader's", func() bool {
		li, err := replicaInfo(g.Leader(t))
		if err != nil {
			return false
		}
		fi, err := replicaInfo(follower)
		end = li.GetCommitEnd()
		return err == nil && fi.GetCommitEnd() == end
	})
	took := time.Since(start)
	snaps := installedSnapshots(t, follower)
	if len(snaps) == 0 {
		t.Fatalf("%s caught up without installing a snapshot (its commit end was %d, the leader's oldest file starts at %d)",
			name, followerEnd, leaderMin)
	}

	// Byte-identical over what both still hold below the commit end
	// (retention keeps deleting expired files on both meanwhile).
	leader = g.Leader(t)
	var compared, files int64
	for _, from := range commitlogFiles(t, follower) {
		if from >= end {
			continue
		}
		n := min(int64(fileSize), end-from)
		a, errA := os.ReadFile(filepath.Join(follower.DataDir(), "commitlog", fmt.Sprintf("%020d", from)))
		b, errB := os.ReadFile(filepath.Join(leader.DataDir(), "commitlog", fmt.Sprintf("%020d", from)))
		if errors.Is(errA, fs.ErrNotExist) || errors.Is(errB, fs.ErrNotExist) {
			continue // deleted by retention on one side
		}
		if errA != nil || errB != nil {
			t.Fatal(errors.Join(errA, errB))
		}
		if int64(len(a)) < n || int64(len(b)) < n || !bytes.Equal(a[:n], b[:n]) {
			t.Fatalf("%s's commitlog file %020d differs from the leader's below the commit end %d", name, from, end)
		}
		compared += n
		files++
	}
	if compared == 0 {
		t.Fatalf("no commitlog file below the commit end %d held by both %s and the leader", end, name)
	}
	got, err := readKept(follower)
	if err != nil {
		t.Fatal(err)
	}
	for off, b := range got {
		if acked[off] != b {
			t.Fatalf("%s serves offset %d = %.30q, acknowledged %.30q", name, off, b, acked[off])
		}
	}
	if _, ok := got[int64(len(acked)-1)]; !ok {
		t.Fatalf("%s does not serve the last acknowledged message (offset %d)", name, len(acked)-1)
	}
	if reads, bad := stopReads(); bad != "" {
		t.Fatal(bad)
	} else if reads == 0 {
		t.Fatal("the background reader read nothing")
	}
	s := snaps[0]
	t.Logf("%s (commit end %d when stopped) rejoined after the leader's retention deleted %d files below %d: a snapshot at raft "+
		"index %d, %d bytes in %d files; %.2f s from its restart (process start included) to the leader's commit end; afterwards "+
		"%d bytes in %d files byte-identical to the leader's, %d messages served, all as acknowledged",
		name, followerEnd, leaderMin/fileSize, leaderMin, s.Index, s.Bytes, s.Files, took.Seconds(), compared, files, len(got))
}
