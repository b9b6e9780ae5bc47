package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/storagetest"
	"github.com/storaged/storaged/storage/vfs"
)

// snapLoop is a snapshot transport over the test network: a snapshot
// goes straight into the receiving store's ReceiveSnapshot, chunk by
// chunk, then Finish (the real install), one at a time per sender, on a
// goroutine the test's cleanup waits for.
type snapLoop struct {
	testTransport

	mu      sync.Mutex
	busy    bool
	sent    int   // snapshots taken by their receiver
	failed  int   // snapshots that failed
	bytes   int64 // file bytes of the last snapshot taken
	lastDur time.Duration
	wg      sync.WaitGroup
}

func (k *snapLoop) SendSnapshot(to uint64, o snapshot.Outgoing) {
	k.mu.Lock()
	if k.busy {
		k.mu.Unlock()
		o.Done(errors.New("test: one snapshot at a time"))
		return
	}
	k.busy = true
	k.mu.Unlock()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		start := time.Now()
		n, err := k.send(to, o)
		k.mu.Lock()
		k.busy = false
		if err != nil {
			k.failed++
		} else {
			k.sent++
			k.bytes = n
			k.lastDur = time.Since(start)
		}
		k.mu.Unlock()
		o.Done(err)
	}()
}

func (k *snapLoop) send(to uint64, o snapshot.Outgoing) (int64, error) {
	msg, err := o.Message()
	if err != nil {
		return 0, err
	}
	k.n.mu.Lock()
	dst, cut := k.n.stores[to], k.n.cut[to] || k.n.cut[k.from]
	k.n.mu.Unlock()
	if dst == nil || cut {
		return 0, errors.New("test: the receiver is down or cut off")
	}
	in, err := dst.ReceiveSnapshot(k.from, msg)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := o.Read(0, func(file, off int64, b []byte, crc uint32) error {
		n += int64(len(b))
		return in.Write(file, off, b, crc)
	}); err != nil {
		in.Discard()
		return n, err
	}
	return n, in.Finish()
}

func (k *snapLoop) stats() (sent, failed int, bytes int64, took time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sent, k.failed, k.bytes, k.lastDur
}

// behindGroup is a group whose member 3 was down while the leader (1)
// and member 2 took more puts and retention deleted the expired files
// below what member 3 holds (with a catch-up window of one byte): member
// 3's next start needs a snapshot, and the leader's oldest file starts
// past member 3's commit end (its consume queue must jump).
type behindGroup struct {
	*testGroup
	clock *storagetest.Clock
	loops map[uint64]*snapLoop
	want  map[int64]string // T/0's bodies by queue offset
	n     int64            // T/0's next queue offset
	// old3End and old3Bytes are member 3's commit end and commitlog bytes
	// below it when it stopped.
	old3End   int64
	old3Bytes []byte
}

func newBehindGroup(t *testing.T, mod func(*Options)) *behindGroup {
	t.Helper()
	return newBehindGroupSteps(t, mod, nil)
}

// newBehindGroupSteps is newBehindGroup with step, if set, called before
// each of the 60 first puts (i: the put's index; member 3 is up before
// put 10 and down from then on).
func newBehindGroupSteps(t *testing.T, mod func(*Options), step func(b *behindGroup, i int)) *behindGroup {
	t.Helper()
	b := &behindGroup{clock: storagetest.NewClock(time.Unix(1_750_000_000, 0)), loops: map[uint64]*snapLoop{}, want: map[int64]string{}}
	t.Cleanup(func() {
		for _, l := range b.loops {
			l.wg.Wait() // after the stores closed (cleanups run last in, first out)
		}
	})
	b.testGroup = newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		o.Clock = b.clock
		o.FileReservedTime, o.DeleteWhen, o.DiskCheckInterval = time.Hour, "*", 24*time.Hour
		o.Group.CatchUpWindow = 1
		l := &snapLoop{testTransport: o.Group.Transport.(testTransport)}
		b.loops[o.Group.ID] = l
		o.Group.Transport = l
		if mod != nil {
			mod(o)
		}
	})
	g := b.testGroup
	g.elect(1)
	body := strings.Repeat("i", 6000)
	for i := range 60 {
		if step != nil {
			step(b, i)
		}
		if i == 10 {
			g.converge(1, g.ids...)
			b.old3End = g.m[3].s.ReplicaInfo().CommitEnd
			b.old3Bytes = b.bytes(3, 0, b.old3End)
			g.closeMember(3)
		}
		b.put(fmt.Sprintf("%04d%s", i, body))
		if i == 20 { // a topic created while member 3 is down: its command goes with the compacted log
			if _, err := g.m[1].s.CreateTopic("Extra", 12); err != nil {
				t.Fatal(err)
			}
		}
	}
	g.converge(1, 1, 2)
	// Everything stored so far is an hour and more old; the leader and
	// member 2 delete what retention lets them.
	b.clock.Advance(2 * time.Hour)
	for _, id := range []uint64{1, 2} {
		g.m[id].s.ret.Round()
		if st, _ := g.m[id].s.ret.Stats(); st.DeletedFiles == 0 || st.LastError != "" {
			t.Fatalf("member %d: retention deleted %d files (%s)", id, st.DeletedFiles, st.LastError)
		}
	}
	leader := g.m[1].s
	if min := leader.log.MinOffset(); min <= b.old3End {
		t.Fatalf("the leader's oldest file starts at %d, not past member 3's commit end %d", min, b.old3End)
	}
	if first, _ := leader.group.rlog.FirstIndex(); first < 12 {
		t.Fatalf("the leader's raft log starts at %d after retention", first)
	}
	for i := 60; i < 65; i++ {
		b.put(fmt.Sprintf("%04d%s", i, body))
	}
	return b
}

func (b *behindGroup) put(body string) {
	b.t.Helper()
	res, err := b.testGroup.put(1, body)
	if err != nil || res.Status != PutOK || res.Append.QueueOffset != b.n {
		b.t.Fatalf("put %d: %v %v at %d", b.n, res.Status, err, res.Append.QueueOffset)
	}
	b.want[b.n] = body
	b.n++
}

// bytes copies member id's commitlog bytes [from, to).
func (b *behindGroup) bytes(id uint64, from, to int64) []byte {
	s := b.m[id].s
	var out []byte
	s.log.ReadLock()
	defer s.log.ReadUnlock()
	for off := from; off < to; {
		c := s.log.At(off)
		if len(c) == 0 {
			b.t.Fatalf("member %d: no commitlog file holds %d", id, off)
		}
		n := min(int64(len(c)), to-off)
		out = append(out, c[:n]...)
		off += n
	}
	return out
}

// sameQueue checks that member id serves T/0 as the leader does: the same
// bounds (the same end only, unless strict: its own retention may have
// trimmed more), and each offset the body put there at the same
// commitlog offset.
func (b *behindGroup) sameQueue(id uint64, strict bool) {
	b.t.Helper()
	lmin, lmax, err := b.m[1].s.QueueInfo("T", 0)
	if err != nil {
		b.t.Fatal(err)
	}
	min, max, err := b.m[id].s.QueueInfo("T", 0)
	if err != nil || (strict && min != lmin) || min < lmin || max != lmax {
		b.t.Fatalf("member %d: T/0 [%d, %d) %v, the leader's [%d, %d)", id, min, max, err, lmin, lmax)
	}
	for off := min; off < max; {
		got, err := b.m[id].s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: off, MaxMessages: 16})
		if err != nil || len(got.Messages) == 0 {
			b.t.Fatalf("member %d: pull at %d: %v", id, off, err)
		}
		ref, err := b.m[1].s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: off, MaxMessages: len(got.Messages)})
		if err != nil {
			b.t.Fatal(err)
		}
		for i, r := range got.Messages {
			if r.QueueOffset != off+int64(i) || string(r.Body) != b.want[r.QueueOffset] ||
				i >= len(ref.Messages) || r.PhysicalOffset != ref.Messages[i].PhysicalOffset {
				b.t.Fatalf("member %d: queue offset %d: %q at %d", id, r.QueueOffset, r.Body[:8], r.PhysicalOffset)
			}
		}
		off = got.NextOffset
	}
}

// TestGroupSnapshotInstall: a follower that was down while retention
// deleted files on the leader past everything it holds rejoins by a
// snapshot (retention compacted the leader's raft log to what it
// deleted): it installs the leader's files, its commitlog is then
// byte-identical to the leader's over the whole range the leader holds,
// its consume queue serves the same offsets with the same messages (it
// jumped to the snapshot's first offset), it follows the log afterwards,
// and all of it survives a restart. A reader on the follower meanwhile
// never sees a message other than the one put at that offset.
func TestGroupSnapshotInstall(t *testing.T) {
	b := newBehindGroup(t, nil)
	g := b.testGroup
	start := time.Now()
	g.open(3)

	var wrong atomic.Value
	stop := make(chan struct{})
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a reader on member 3 throughout the install
		defer wg.Done()
		s := g.m[3].s
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			min, max, err := s.QueueInfo("T", 0)
			if err != nil || min >= max {
				continue
			}
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: min, MaxMessages: 64})
			if err != nil {
				continue // a queue being replaced: absent, never wrong
			}
			for _, r := range res.Messages {
				reads.Add(1)
				if string(r.Body) != b.want[r.QueueOffset] {
					wrong.Store(fmt.Sprintf("queue offset %d: %.8q", r.QueueOffset, r.Body))
				}
			}
		}
	}()
	end := g.converge(1, g.ids...)
	close(stop)
	wg.Wait()
	took := time.Since(start)
	if w := wrong.Load(); w != nil {
		t.Fatalf("a read on member 3 during the install got the wrong message: %v", w)
	}
	// The sender records its outcome after the receiver's Finish returned.
	g.poll("the leader's snapshot sender done", func() bool { sent, _, _, _ := b.loops[1].stats(); return sent > 0 }, 1)
	sent, failed, n, dur := b.loops[1].stats()
	if sent < 1 {
		t.Fatalf("no snapshot taken (%d failed)", failed)
	}
	leader, node3 := g.m[1].s, g.m[3].s
	// strict: member 3 holds exactly the leader's files; otherwise its own
	// retention (on the test's clock, two hours on) may have deleted more
	// of the old ones since, after a restart.
	check := func(what string, strict bool) {
		t.Helper()
		min, got := leader.log.MinOffset(), node3.log.MinOffset()
		if got != min && (strict || got < min) {
			t.Fatalf("%s: member 3's oldest file starts at %d, the leader's at %d", what, got, min)
		}
		min = max(min, got)
		if !bytes.Equal(b.bytes(3, min, end), b.bytes(1, min, end)) {
			t.Fatalf("%s: member 3's commitlog differs from the leader's in [%d, %d)", what, min, end)
		}
		b.sameQueue(3, strict)
		if _, err := vfs.Default.Size(filepath.Join(g.m[3].opts.Dir, installJournal)); err == nil {
			t.Fatalf("%s: the install journal is still there", what)
		}
		if tp, err := node3.Topic("Extra"); err != nil || tp.Queues != 12 {
			t.Fatalf("%s: member 3's topic Extra: %+v %v, want 12 queues (from the snapshot's topic table)", what, tp.TopicConfig, err)
		}
	}
	check("after the install", true)
	base, _, _ := node3.group.rlog.Base()
	if first, _ := node3.group.rlog.FirstIndex(); first != base+1 || base == 0 {
		t.Fatalf("member 3's raft log starts at %d, base %d", first, base)
	}
	t.Logf("member 3 rejoined by %d snapshot(s), the last of %d bytes (%d files from offset %d), in %v (transfer and install %v); %d reads during it",
		sent, n, (end-leader.log.MinOffset()+g.m[1].opts.FileSize-1)/g.m[1].opts.FileSize, leader.log.MinOffset(), took, dur, reads.Load())

	// It follows the log from there, and all of it survives a restart.
	for i := range 5 {
		b.put(fmt.Sprintf("after-%d", i))
	}
	end = g.converge(1, g.ids...)
	check("after more puts", true)
	g.closeMember(3)
	g.open(3)
	node3 = g.m[3].s
	end = g.converge(1, g.ids...)
	check("after a restart", false)
	b.put("last")
	end = g.converge(1, g.ids...)
	check("after a put following the restart", false)
}

// TestGroupSnapshotInstallCrash takes a power-cut image of the follower's
// data dir (vfs.MemFS) at every step of a snapshot install (staged, the
// journal written, each file renamed in, the old files removed, the
// directory synced, the commitlog reloaded, each step of the raft log's
// reset, the queues moved, the checkpoint, done), three random images
// each, and opens a store on each image: every one opens, removes the
// journal and the staging dir, and is either the old state (raft log from
// 1, the old commit end, the old bytes and queue) or the installed one
// (raft log from the snapshot's index, its commit end, the leader's
// bytes and queue), never a mix; no committed message it holds is lost.
// The offline check refuses an image with the journal (ErrInstallPending).
func TestGroupSnapshotInstallCrash(t *testing.T) {
	fs3 := vfs.NewMem()
	type image struct {
		step string
		fs   *vfs.MemFS
	}
	var mu sync.Mutex
	var images []image
	rng := rand.New(rand.NewPCG(7, 13))
	b := newBehindGroup(t, func(o *Options) {
		if o.Group.ID != 3 {
			return
		}
		o.FS, o.Dir = fs3, "/n3"
		// Its own clock, at the time of the puts: its retention deletes
		// nothing of the old state the images are checked against.
		o.Clock = storagetest.NewClock(time.Unix(1_750_000_000, 0))
		o.StatDisk = func(string) (DiskUsage, error) { return DiskUsage{Size: 1 << 40, Avail: 1 << 40}, nil }
		o.Group.installHook = func(step string) {
			mu.Lock()
			defer mu.Unlock()
			for range 3 {
				images = append(images, image{step, fs3.Crash(rng)})
			}
		}
	})
	g := b.testGroup
	g.open(3)
	g.converge(1, g.ids...)
	leader, node3 := g.m[1].s, g.m[3].s
	snapBase, _, _ := node3.group.rlog.Base()
	snapEnd, err := node3.group.rlog.DataEndAt(snapBase)
	if err != nil {
		t.Fatal(err)
	}
	minOff := leader.log.MinOffset()
	leaderBytes := b.bytes(1, minOff, snapEnd)
	mu.Lock()
	imgs := images
	mu.Unlock()
	steps := map[string]bool{}
	for _, im := range imgs {
		steps[strings.SplitN(im.step, " ", 2)[0]] = true
	}
	for _, want := range []string{"journal", "rename", "remove", "sync", "commitlog", "raftlog:", "queues", "checkpoint", "done"} {
		if !steps[want] {
			t.Fatalf("no crash image at step %q (steps %v)", want, steps)
		}
	}
	olds, news := 0, 0
	for i, im := range imgs {
		what := fmt.Sprintf("image %d (after %s)", i, im.step)
		o := g.m[3].opts
		gopts := *o.Group
		gopts.Ticks, gopts.installHook = make(chan time.Time), nil
		o.Group, o.FS = &gopts, im.fs
		o.FileReservedTime = -1 // the image as it opens, nothing deleted after
		if _, err := im.fs.Size(filepath.Join(o.Dir, installJournal)); err == nil {
			// The offline tools leave a half-installed dir alone.
			if _, err := Check(o); !errors.Is(err, ErrInstallPending) {
				t.Fatalf("%s: storaged check of a dir with an unfinished install: %v", what, err)
			}
		}
		s, err := Open(o)
		if err != nil {
			t.Fatalf("%s: Open: %v", what, err)
		}
		for _, name := range []string{installJournal, snapshotDir} {
			if _, err := im.fs.Size(filepath.Join(o.Dir, name)); err == nil {
				t.Fatalf("%s: %s survived Open", what, name)
			}
		}
		first, _ := s.group.rlog.FirstIndex()
		ce := s.group.commitEnd.Load()
		read := func(from, to int64) []byte {
			var out []byte
			s.log.ReadLock()
			defer s.log.ReadUnlock()
			for off := from; off < to; {
				c := s.log.At(off)
				if len(c) == 0 {
					t.Fatalf("%s: no commitlog file holds %d", what, off)
				}
				n := min(int64(len(c)), to-off)
				out = append(out, c[:n]...)
				off += n
			}
			return out
		}
		var qFrom int64
		switch {
		case first == 1:
			olds++
			if ce != b.old3End || !bytes.Equal(read(0, ce), b.old3Bytes) {
				t.Fatalf("%s: the old state, but its commit end is %d (was %d) or its bytes differ", what, ce, b.old3End)
			}
		case first == snapBase+1:
			news++
			if ce != snapEnd || s.log.MinOffset() != minOff || !bytes.Equal(read(minOff, ce), leaderBytes) {
				t.Fatalf("%s: the installed state, but its commit end is %d (want %d) from %d (want %d), or its bytes differ",
					what, ce, snapEnd, s.log.MinOffset(), minOff)
			}
			qFrom = 1 // checked below: the queue starts past the deleted messages
			if tp, err := s.Topic("Extra"); err != nil || tp.Queues != 12 {
				t.Fatalf("%s: the installed state without the snapshot's topic Extra: %+v %v", what, tp.TopicConfig, err)
			}
		default:
			t.Fatalf("%s: the raft log starts at %d: neither 1 nor the snapshot's %d", what, first, snapBase+1)
		}
		qmin, qmax, err := s.QueueInfo("T", 0)
		if err != nil || qmax <= qmin || (qFrom == 1 && qmin == 0) {
			t.Fatalf("%s: T/0 [%d, %d) %v", what, qmin, qmax, err)
		}
		for off := qmin; off < qmax; off++ {
			res, err := s.PullMessages(context.Background(), PullRequest{Topic: "T", QueueID: 0, Offset: off, MaxMessages: 1})
			if err != nil || len(res.Messages) != 1 || string(res.Messages[0].Body) != b.want[off] {
				t.Fatalf("%s: queue offset %d: %v", what, off, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("%s: close: %v", what, err)
		}
	}
	if olds == 0 || news == 0 {
		t.Fatalf("%d old and %d installed images: want both", olds, news)
	}
	t.Logf("%d crash images over %d kinds of step: %d opened in the old state, %d in the installed one", len(imgs), len(steps), olds, news)
}
