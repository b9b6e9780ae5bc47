package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/storaged/storaged/internal/proctest"
)

// replicaRepairRun runs `storaged replica repair` on p's data dir with
// args and returns its exit code, JSON report and stderr.
func replicaRepairRun(t *testing.T, p *proctest.Process, args ...string) (int, replicaRepairReport, string) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"replica", "repair", "--data-dir", p.DataDir(), "--file-size", "256KiB"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var rep replicaRepairReport
	if code != 2 {
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("repair output %q (%s): %v", stdout.String(), stderr.String(), err)
		}
	}
	return code, rep, stderr.String()
}

type replicaRepairReport struct {
	Commit      uint64 `json:"commit"`
	MetaRebuilt bool   `json:"meta_rebuilt"`
	HardState   *struct {
		Term, Vote, Commit uint64
	} `json:"hardstate_rebuilt"`
	Repaired []uint64 `json:"repaired"`
	Error    string   `json:"error"`
}

// TestGroupHardStateRepair (design replication.md §3.4): a follower's
// raft/hardstate is zeroed while it is stopped. It refuses to start (a
// member back at term 0 could vote twice in one term), naming the file
// and `storaged replica repair`; a repair that hears from the leader
// only is refused (with 3 voters both peers must answer); `storaged
// replica repair --from` both peers rebuilds it (a term at least the
// group's, a vote for itself, a commit it shares with them), and the
// member starts, rejoins and catches up, its committed commitlog bytes
// identical to the leader's. Then its raft/meta is damaged the same way
// and rebuilt from the peers with its --raft-id and --raft-peers.
func TestGroupHardStateRepair(t *testing.T) {
	const fileSize = 256 << 10
	g := newGroup(t)
	acked := map[int64]string{}
	put := func(prefix string, from, to int) {
		t.Helper()
		for k := from; k < to; k++ {
			g.putAcked(t, acked, fmt.Sprintf("%s-%04d-%s", prefix, k, strings.Repeat("h", 200)))
		}
	}
	put("hs", 0, 40)
	leader := g.Leader(t)
	var follower *proctest.Process
	for _, p := range g.nodes {
		if p != leader {
			follower = p
			break
		}
	}
	name, id := g.Name(follower), g.memberID(follower)
	waitAcked(t, name, follower, acked)
	term := mustReplicaInfo(t, leader).GetTerm()
	follower.Kill(t)

	path := filepath.Join(follower.DataDir(), "raft", "hardstate")
	if err := os.WriteFile(path, make([]byte, 128), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr, err := follower.StartRefused(t, 60*time.Second)
	for _, want := range []string{"raft/hardstate", "storaged replica repair"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("%s refused to start (%v) without naming %q:\n%s", name, err, want, stderr)
		}
	}
	put("hs", 40, 50) // the other two carry on

	var others []string
	for _, p := range g.nodes {
		if p != follower {
			m := g.memberID(p)
			others = append(others, fmt.Sprintf("%d=%s", m, g.peerAddrs[m-1]))
		}
	}
	leader = g.Leader(t)
	lid := g.memberID(leader)
	if code, rep, errOut := replicaRepairRun(t, follower, "--from", fmt.Sprintf("%d=%s", lid, g.peerAddrs[lid-1])); code != 1 ||
		!strings.Contains(rep.Error, "reach 1 more") {
		t.Fatalf("repair from the leader only: exit %d, %+v, %s; want a refusal asking for the other member", code, rep, errOut)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, make([]byte, 128)) {
		t.Fatal("the refused repair wrote raft/hardstate")
	}
	code, rep, errOut := replicaRepairRun(t, follower, "--from", strings.Join(others, ","))
	if code != 0 || rep.HardState == nil {
		t.Fatalf("repair --from %v: exit %d, %+v\n%s", others, code, rep, errOut)
	}
	if rep.HardState.Term < term || rep.HardState.Vote != uint64(id) || rep.HardState.Commit == 0 {
		t.Fatalf("rebuilt HardState %+v: want term >= %d, vote %d, a commit", *rep.HardState, term, id)
	}
	t.Logf("rebuilt raft/hardstate: term %d, vote %d, commit %d", rep.HardState.Term, rep.HardState.Vote, rep.HardState.Commit)

	follower.Restart(t)
	put("hs", 50, 60)
	sameCommitted := func() {
		t.Helper()
		for _, p := range g.nodes {
			waitAcked(t, g.Name(p), p, acked)
			noWrongRead(t, g.Name(p), p, acked)
		}
		leader := g.Leader(t)
		li := mustReplicaInfo(t, leader)
		deadline := time.Now().Add(30 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			fi, err := replicaInfo(follower)
			if err == nil && fi.GetCommitEnd() == li.GetCommitEnd() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: commit end %d (%v), the leader's %d", name, fi.GetCommitEnd(), err, li.GetCommitEnd())
			}
			<-tick.C
		}
		want := commitlogPrefix(t, leader, li.GetCommitEnd(), fileSize)
		if got := commitlogPrefix(t, follower, li.GetCommitEnd(), fileSize); !bytes.Equal(got, want) {
			t.Fatalf("%s's committed commitlog bytes [0, %d) differ from the leader's", name, li.GetCommitEnd())
		}
	}
	sameCommitted()

	// raft/meta: damaged while stopped, rebuilt with the member's flags.
	follower.Kill(t)
	mpath := filepath.Join(follower.DataDir(), "raft", "meta")
	b, err := os.ReadFile(mpath)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x20
	if err := os.WriteFile(mpath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if stderr, err := follower.StartRefused(t, 60*time.Second); !strings.Contains(stderr, "raft/meta") || !strings.Contains(stderr, "--raft-id") {
		t.Fatalf("%s refused to start (%v) without naming raft/meta and the repair's --raft-id:\n%s", name, err, stderr)
	}
	peersFlag := strings.Join(append(others, fmt.Sprintf("%d=%s", id, g.peerAddrs[id-1])), ",")
	if code, _, errOut := replicaRepairRun(t, follower, "--from", strings.Join(others, ",")); code != 2 || !strings.Contains(errOut, "--raft-id") {
		t.Fatalf("repair of a damaged raft/meta without --raft-id: exit %d, %s; want a usage error naming --raft-id", code, errOut)
	}
	if code, rep, errOut := replicaRepairRun(t, follower, "--raft-id", fmt.Sprint(id), "--raft-peers", peersFlag, "--raft-group", "other"); code != 1 ||
		!strings.Contains(rep.Error, "PermissionDenied") {
		t.Fatalf("repair as another group: exit %d, %+v, %s; want the peers to refuse", code, rep, errOut)
	}
	code, rep, errOut = replicaRepairRun(t, follower, "--raft-id", fmt.Sprint(id), "--raft-peers", peersFlag)
	if code != 0 || !rep.MetaRebuilt {
		t.Fatalf("repair of raft/meta: exit %d, %+v\n%s", code, rep, errOut)
	}
	follower.Restart(t)
	put("hs", 60, 70)
	sameCommitted()
}
