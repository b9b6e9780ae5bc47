package cluster

import (
	"bytes"
	"context"
	be "encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/internal/proctest"
)

// memberID is a node's raft id (newGroup names member i "n<i>").
func (g *group) memberID(p *proctest.Process) int {
	var id int
	fmt.Sscanf(g.Name(p), "n%d", &id)
	return id
}

// putAcked puts body to the current leader until it is acknowledged
// (a leader change answers "nothing stored": retrying is safe), and
// records it.
func (g *group) putAcked(t *testing.T, acked map[int64]string, body string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader := g.Leader(t)
		off, err := putTo(leader, body)
		if err == nil {
			if prev, dup := acked[off]; dup {
				t.Fatalf("queue offset %d acked twice (%q, then %q)", off, prev, body)
			}
			acked[off] = body
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %q: %v", body, err)
		}
	}
}

// replicaInfo asks p for its view of the group.
func replicaInfo(p *proctest.Process) (*storagedv1.GetReplicaInfoResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return storagedv1.NewMessageStoreServiceClient(p.Conn()).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
}

// noWrongRead fails if p serves any message of the test queue whose body
// is not the acknowledged one at that offset (every put of these tests is
// acknowledged, so an unknown offset is wrong too).
func noWrongRead(t *testing.T, name string, p *proctest.Process, acked map[int64]string) {
	t.Helper()
	got, err := readAll(p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for off, body := range got {
		if want, ok := acked[off]; !ok || want != body {
			t.Fatalf("%s served offset %d = %.40q, acknowledged %.40q (%v)", name, off, body, want, ok)
		}
	}
}

// commitlogPrefix reads the first n bytes of p's commitlog (its files in
// order).
func commitlogPrefix(t *testing.T, p *proctest.Process, n int64, fileSize int64) []byte {
	t.Helper()
	var out []byte
	for off := int64(0); off < n; off += fileSize {
		b, err := os.ReadFile(filepath.Join(p.DataDir(), "commitlog", fmt.Sprintf("%020d", off)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b[:min(int64(len(b)), n-off)]...)
	}
	return out
}

// TestGroupBitFlipRepair (design replication.md §3.4, issue 14's bit-flip
// nemesis): a bit flip in a committed record on one follower, with its
// store stopped. That member refuses to start, with an error naming the
// file, the record's offset and `storaged replica repair`; the other two
// keep taking puts; `storaged replica repair --from` the leader restores
// the entry; the member starts, rejoins and catches up; its committed
// commitlog bytes are then identical to the leader's, and no member ever
// served a body other than the acknowledged one.
func TestGroupBitFlipRepair(t *testing.T) { bitFlipRepair(t, false) }

// TestGroupBitFlipRepairChangedMembership is TestGroupBitFlipRepair in a
// group whose membership changed before the flip (a learner, member 4,
// was added; it never runs): repair still takes the damaged entry from
// the leader (Log Matching needs no membership; only the steps that count
// voters are refused once raft/conf records a change).
func TestGroupBitFlipRepairChangedMembership(t *testing.T) { bitFlipRepair(t, true) }

func bitFlipRepair(t *testing.T, changeMembership bool) {
	const fileSize = 256 << 10
	mg := newMemberGroup(t)
	g := mg.group
	acked := map[int64]string{}
	// Every read of the whole test, from every running member, is checked
	// against what was sent and acknowledged (readCheck).
	rc := newReadCheck()
	stopReads := rc.run(g)
	t.Cleanup(func() { stopReads() }) // a failed test stops it too
	put := func(body string) { t.Helper(); rc.put(t, g, acked, body) }
	for k := range 40 {
		put(fmt.Sprintf("flip-%04d-%s", k, strings.Repeat("x", 300)))
	}
	var spare string // member 4's peer address, with changeMembership
	if changeMembership {
		spare = freePorts(t, 1)[0]
		m := mg.change(t, "add learner 4", g.nodes, nil, func(ctx context.Context, c storagedv1.AdminServiceClient) (*storagedv1.ReplicaMembership, error) {
			resp, err := c.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: 4, PeerAddr: spare})
			return resp.GetMembership(), err
		}, func(m *storagedv1.ReplicaMembership) bool { return slices.Contains(m.GetLearners(), 4) })
		t.Logf("membership changed: voters %v, learners %v at index %d", m.GetVoters(), m.GetLearners(), m.GetIndex())
		put("flip-after-the-change")
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
	waitAcked(t, name, follower, acked) // committed there: reads stop at the commit point
	if changeMembership {
		// Its raft/conf records the change: the case repair used to refuse.
		if ri := mustReplicaInfo(t, follower); !slices.Contains(ri.GetMembership().GetLearners(), 4) {
			t.Fatalf("%s has not applied the change: %v", name, ri.GetMembership())
		}
	}
	follower.Kill(t)

	// Flip one bit in the body of a committed record, in place.
	path := filepath.Join(follower.DataDir(), "commitlog", fmt.Sprintf("%020d", 0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte("flip-0007-"))
	if at < 0 {
		t.Fatal("the record of put 7 is not in the first commitlog file")
	}
	var rec int64 // the start of the record holding at: walk TOTALSIZE fields
	for next := int64(be.BigEndian.Uint32(b)); next <= int64(at); next += int64(be.BigEndian.Uint32(b[next:])) {
		rec = next
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[at+12] ^ 0x04}, int64(at+12)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	// It refuses to start, and says where and what to run.
	stderr, err := follower.StartRefused(t, 60*time.Second)
	for _, want := range []string{"commitlog/00000000000000000000", fmt.Sprintf("commitlog offset %d", rec), "storaged replica repair"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("%s refused to start (%v) without naming %q:\n%s", name, err, want, stderr)
		}
	}

	// The offline tools say the same: check points at replica repair, and
	// the standalone cut refuses a member's data dir.
	runTool := func(args ...string) (int, string, string) {
		cmd := exec.Command(binary, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	dirArgs := []string{"--data-dir", follower.DataDir(), "--file-size", "256KiB"}
	if code, out, _ := runTool(append([]string{"check"}, dirArgs...)...); code != 1 || !strings.Contains(out, "storaged replica repair") {
		t.Fatalf("storaged check of the damaged member: exit %d, %s; want 1 and the replica repair advice", code, out)
	}
	if code, _, errOut := runTool(append([]string{"repair", "--truncate-at", fmt.Sprint(rec)}, dirArgs...)...); code != 1 ||
		!strings.Contains(errOut, "replication group") {
		t.Fatalf("storaged repair --truncate-at on a member's dir: exit %d, %s; want a refusal", code, errOut)
	}

	// The other two keep serving puts.
	for k := 40; k < 60; k++ {
		put(fmt.Sprintf("flip-%04d-%s", k, strings.Repeat("y", 300)))
	}

	// Repair from the leader.
	leader = g.Leader(t)
	from := fmt.Sprintf("%d=%s", g.memberID(leader), g.peerAddrs[g.memberID(leader)-1])
	args := []string{"replica", "repair", "--data-dir", follower.DataDir(), "--file-size", "256KiB", "--from", from}
	if changeMembership {
		// With the flags an operator gives after the change: the current
		// members, learner 4 too. They digest to another cluster id than
		// the group's; repair must take the group's from raft/meta, or
		// the leader refuses it.
		peers := []string{"4=" + spare}
		for i, a := range g.peerAddrs {
			peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
		}
		args = append(args, "--raft-id", fmt.Sprint(g.memberID(follower)), "--raft-peers", strings.Join(peers, ","),
			"--raft-learners", "4")
	}
	cmd := exec.Command(binary, args...)
	var stdout, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("storaged replica repair --from %s: %v\n%s\n%s", from, err, stdout.String(), errOut.String())
	}
	var rep struct {
		Damaged  []struct{ Index uint64 } `json:"damaged"`
		Repaired []uint64                 `json:"repaired"`
		Bytes    int64                    `json:"bytes_rewritten"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("repair output %q: %v", stdout.String(), err)
	}
	if len(rep.Damaged) != 1 || len(rep.Repaired) != 1 || rep.Repaired[0] != rep.Damaged[0].Index || rep.Bytes < 300 {
		t.Fatalf("repair: %s, want the one damaged entry repaired", stdout.String())
	}
	t.Logf("repaired raft entry %d (%d bytes) from member %s", rep.Repaired[0], rep.Bytes, from)

	// It starts, rejoins and catches up; nobody served a wrong body.
	follower.Restart(t)
	for k := 60; k < 70; k++ {
		put(fmt.Sprintf("flip-%04d-%s", k, strings.Repeat("z", 300)))
	}
	for _, p := range g.nodes {
		waitAcked(t, g.Name(p), p, acked)
		noWrongRead(t, g.Name(p), p, acked)
	}

	// Its committed bytes are the leader's (no puts now: wait for the
	// follower's commit end to reach the leader's).
	li, err := replicaInfo(leader)
	if err != nil {
		t.Fatal(err)
	}
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
	if reads, bad := stopReads(); bad != "" {
		t.Fatal(bad)
	} else if reads == 0 {
		t.Fatal("the background reader read nothing")
	} else {
		t.Logf("%d messages read in the background from the members, all as sent and acknowledged", reads)
	}
	want := commitlogPrefix(t, leader, li.GetCommitEnd(), fileSize)
	if got := commitlogPrefix(t, follower, li.GetCommitEnd(), fileSize); !bytes.Equal(got, want) {
		t.Fatalf("%s's committed commitlog bytes [0, %d) differ from the leader's", name, li.GetCommitEnd())
	}
}

// readCheck reads the test queue from every running member in the
// background and checks each message: its body was sent, and where the
// put was acknowledged, it is that put's body at that offset.
type readCheck struct {
	mu    sync.Mutex
	sent  map[string]bool
	acked map[int64]string
	bad   string
	reads int
}

func newReadCheck() *readCheck {
	return &readCheck{sent: map[string]bool{}, acked: map[int64]string{}}
}

func (r *readCheck) send(body string) { r.mu.Lock(); r.sent[body] = true; r.mu.Unlock() }

func (r *readCheck) ack(off int64, body string) { r.mu.Lock(); r.acked[off] = body; r.mu.Unlock() }

// put sends body to the leader until it is acknowledged (g.putAcked) and
// records it in acked and in r.
func (r *readCheck) put(t *testing.T, g *group, acked map[int64]string, body string) {
	t.Helper()
	r.send(body)
	one := map[int64]string{}
	g.putAcked(t, one, body)
	for off, b := range one {
		if prev, dup := acked[off]; dup {
			t.Fatalf("queue offset %d acked twice (%q, then %q)", off, prev, b)
		}
		r.ack(off, b)
		acked[off] = b
	}
}

// run starts the reader; the function it returns stops it and says how
// many messages it read and the first wrong one ("" if none).
func (r *readCheck) run(g *group) func() (int, string) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		pace := time.NewTicker(20 * time.Millisecond) // a round of reads at most every 20 ms: the machine is shared
		defer pace.Stop()
		for {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			for _, p := range g.nodes {
				select {
				case <-stop:
					return
				default:
				}
				got, err := readKept(p) // from the first offset retention kept
				if err != nil {
					continue // a member stopped, stopping or starting
				}
				r.mu.Lock()
				for off, body := range got {
					r.reads++
					if want, ok := r.acked[off]; (ok && want != body) || !r.sent[body] {
						if r.bad == "" {
							r.bad = fmt.Sprintf("%s served offset %d = %.40q (acknowledged there: %.40q)", g.Name(p), off, body, want)
						}
					}
				}
				r.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	return func() (int, string) {
		once.Do(func() { close(stop) })
		<-done
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.reads, r.bad
	}
}
