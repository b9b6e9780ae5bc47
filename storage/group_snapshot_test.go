package storage

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/replica"

	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/vfs"
)

// TestGroupSnapshotManifest: on a group whose commitlog spans several
// files, every replica's manifest at the same applied index is the same
// (the committed prefix is byte-identical, so are the CRCs), the leader's
// snapshot streamed through snapshot.Read into a snapshot.Stage verifies
// and holds exactly a follower's bytes, and its queue table names T/0 from
// 0 to the number of puts. A standalone store has no snapshot.
func TestGroupSnapshotManifest(t *testing.T) {
	g := newTestGroup(t, time.Minute)
	g.elect(1)
	body := strings.Repeat("s", 6000)
	const n = 40
	for i := range n {
		if res, err := g.put(1, fmt.Sprintf("%04d%s", i, body)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	end := g.converge(1, g.ids...)
	g.poll("every replica applied the same index", func() bool {
		a := g.m[1].s.ReplicaInfo().Applied
		return g.m[2].s.ReplicaInfo().Applied == a && g.m[3].s.ReplicaInfo().Applied == a
	}, 1)
	var ms []snapshot.Manifest
	for _, id := range g.ids {
		m, err := g.m[id].s.SnapshotManifest()
		if err != nil {
			t.Fatalf("node %d: %v", id, err)
		}
		ms = append(ms, m)
	}
	m := ms[0]
	if m.End != end || len(m.Files) < 3 || m.MinOffset != 0 {
		t.Fatalf("manifest ends at %d with %d files from %d; want the commit end %d, at least 3 files from 0", m.End, len(m.Files), m.MinOffset, end)
	}
	for i, o := range ms[1:] {
		if fmt.Sprint(o) != fmt.Sprint(m) {
			t.Fatalf("node %d's manifest %+v differs from the leader's %+v", g.ids[i+1], o, m)
		}
	}
	if len(m.Queues) != 1 || m.Queues[0] != (snapshot.Queue{Topic: "T", Queue: 0, First: 0, Next: n}) {
		t.Fatalf("queues %+v, want T/0 [0, %d)", m.Queues, n)
	}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if m, err = snapshot.Decode(b); err != nil {
		t.Fatal(err)
	}

	dst := t.TempDir()
	st, err := snapshot.NewStage(snapshot.StageOptions{FS: vfs.Default, Dir: filepath.Join(dst, "snapshot.tmp"),
		FileSize: g.m[1].opts.FileSize, MaxBytes: 1 << 30, RequireCRC: true}, m)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := snapshot.Read(g.m[1].s.log, &m, 0, st.Write); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot at index %d: %d files, %d bytes staged and verified in %v", m.Index, len(m.Files), st.Written(), time.Since(start))
	follower := g.m[2].s
	for _, f := range m.Files {
		got, err := vfs.Default.ReadFile(filepath.Join(dst, "snapshot.tmp", segment.FileName(f.From)))
		if err != nil {
			t.Fatal(err)
		}
		follower.log.ReadLock()
		want := append([]byte(nil), follower.log.At(f.From)[:f.Size]...)
		follower.log.ReadUnlock()
		if !bytes.Equal(got[:f.Size], want) {
			t.Fatalf("staged file %d differs from node 2's commitlog", f.From)
		}
	}

	alone, err := Open(Options{Dir: t.TempDir(), FileSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	if _, err := alone.SnapshotManifest(); !errors.Is(err, ErrNotGroup) {
		t.Fatalf("standalone: %v, want ErrNotGroup", err)
	}
}

// TestQueueFirstAtOrAbove: a queue's first offset at or above a commitlog
// offset is that message's queue offset, the next one for an offset
// inside a message, and the count past the last message.
func TestQueueFirstAtOrAbove(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), FileSize: 64 << 10, FlushMode: FlushSync})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var phys []int64
	for i := range 30 {
		res, err := s.PutMessage(t.Context(), &Message{Topic: "T", QueueID: 0, Body: bytes.Repeat([]byte{'q'}, 5000+i), BornHost: DefaultStoreHost})
		if err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
		phys = append(phys, res.Append.WroteOffset)
	}
	deadline := time.Now().Add(time.Minute)
	for s.index.Dispatched() < s.log.MaxOffset() { // the dispatcher indexes after the put returns
		if time.Now().After(deadline) {
			t.Fatalf("indexed up to %d of %d", s.index.Dispatched(), s.log.MaxOffset())
		}
		<-time.After(time.Millisecond)
	}
	q := s.index.Queue("T", 0)
	for _, tc := range []struct {
		at   int64
		want int64
	}{{0, 0}, {phys[7], 7}, {phys[7] + 1, 8}, {phys[29], 29}, {phys[29] + 1, 30}, {1 << 40, 30}} {
		if got, err := q.FirstAtOrAbove(tc.at); err != nil || got != tc.want {
			t.Errorf("FirstAtOrAbove(%d) = %d %v, want %d", tc.at, got, err, tc.want)
		}
	}
}

// snapSink is a snapshot transport for tests: each snapshot is staged
// into a real snapshot.Stage and verified, then refused (nothing installs
// one yet), one at a time, on a goroutine Close waits for.
type snapSink struct {
	testTransport
	dir      string
	fileSize int64

	mu       sync.Mutex
	busy     bool
	staged   []snapshot.Manifest
	bytes    []int64
	refusals int
	wg       sync.WaitGroup
}

var errNoInstall = errors.New("test: the receiver does not install snapshots")

func (k *snapSink) SendSnapshot(to uint64, o snapshot.Outgoing) {
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
		err := k.stage(to, o)
		k.mu.Lock()
		k.busy = false
		if err != nil {
			k.refusals++
		}
		k.mu.Unlock()
		if err == nil {
			err = errNoInstall
		}
		o.Done(err)
	}()
}

func (k *snapSink) stage(to uint64, o snapshot.Outgoing) error {
	msg, err := o.Message()
	if err != nil {
		return err
	}
	from, dst, index, term, data, err := replica.SnapshotOf(msg)
	if err != nil {
		return err
	}
	m, err := snapshot.Decode(data)
	if err != nil {
		return err
	}
	if from != 1 || dst != to || m.Index != index || m.Term != term {
		return fmt.Errorf("MsgSnap %d->%d at %d/%d carries a manifest at %d/%d", from, dst, index, term, m.Index, m.Term)
	}
	st, err := snapshot.NewStage(snapshot.StageOptions{FS: vfs.Default, Dir: filepath.Join(k.dir, fmt.Sprint(len(k.staged))),
		FileSize: k.fileSize, MaxBytes: 1 << 30, RequireCRC: true}, m)
	if err != nil {
		return err
	}
	if err := o.Read(0, func(file, off int64, b []byte, crc uint32) error {
		return st.Write(snapshot.Chunk{File: file, Offset: off, Data: b, CRC: crc})
	}); err != nil {
		st.Discard()
		return err
	}
	if err := st.Finish(); err != nil {
		st.Discard()
		return err
	}
	k.mu.Lock()
	k.staged = append(k.staged, m)
	k.bytes = append(k.bytes, st.Written())
	k.mu.Unlock()
	return nil
}

// TestGroupSnapshotSend: a follower that was down while the leader
// compacted its raft log past what the follower holds gets raft's MsgSnap
// as a file transfer: the leader builds the manifest at its log's base
// (the index, the commit end there, the files, the queues), streams the
// files through the transport's SendSnapshot with the files pinned
// against retention, and reports the outcome to raft; the staged copy
// verifies and is byte-identical to the leader's commitlog. (The
// follower cannot install it yet: the transfer is refused, raft sends it
// again later, and the group keeps committing on the other two.)
func TestGroupSnapshotSend(t *testing.T) {
	sink := &snapSink{dir: t.TempDir(), fileSize: 64 << 10}
	t.Cleanup(sink.wg.Wait) // after the group's cleanup (LIFO) has closed the stores
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		if o.Group.ID == 1 {
			sink.testTransport = o.Group.Transport.(testTransport)
			o.Group.Transport = sink
		}
	})
	g.elect(1)
	body := strings.Repeat("c", 6000)
	put := func(i int) { g.mustPut(1, i, fmt.Sprintf("%04d%s", i, body)) }
	for i := range 10 {
		put(i)
	}
	g.converge(1, g.ids...)
	g.closeMember(3)
	for i := 10; i < 40; i++ {
		put(i)
	}
	g.converge(1, 1, 2)
	leader := g.m[1].s
	var base uint64
	g.poll("the leader compacts its log to its durable commit", func() bool {
		base = leader.ReplicaInfo().Commit
		return leader.group.rlog.Compact(base) == nil
	}, 1)
	if f, _ := leader.group.rlog.FirstIndex(); f != base+1 {
		t.Fatalf("FirstIndex %d after Compact(%d)", f, base)
	}
	baseEnd, err := leader.group.rlog.DataEndAt(base)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	g.open(3)
	g.poll("a snapshot staged for node 3", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.staged) > 0
	}, 1, 3)
	took := time.Since(start)
	sink.mu.Lock()
	m, staged, refusals := sink.staged[0], sink.bytes[0], sink.refusals
	sink.mu.Unlock()
	if refusals != 0 {
		t.Fatalf("%d snapshots failed to stage", refusals)
	}
	if m.Index != base || m.End != baseEnd || m.MinOffset != 0 || len(m.Files) < 3 || staged != m.End {
		t.Fatalf("manifest at %d ending at %d from %d, %d files, %d bytes staged; want index %d, end %d from 0, >= 3 files",
			m.Index, m.End, m.MinOffset, len(m.Files), staged, base, baseEnd)
	}
	if len(m.Queues) != 1 || m.Queues[0].First != 0 || m.Queues[0].Next < 40 {
		t.Fatalf("queues %+v", m.Queues)
	}
	for _, f := range m.Files {
		got, err := vfs.Default.ReadFile(filepath.Join(sink.dir, "0", segment.FileName(f.From)))
		if err != nil {
			t.Fatal(err)
		}
		leader.log.ReadLock()
		want := append([]byte(nil), leader.log.At(f.From)[:f.Size]...)
		leader.log.ReadUnlock()
		if !bytes.Equal(got[:f.Size], want) {
			t.Fatalf("staged file %d differs from the leader's", f.From)
		}
	}
	t.Logf("snapshot at index %d: %d files, %d bytes staged and verified %v after node 3 restarted", m.Index, len(m.Files), staged, took)
	// The group still commits on nodes 1 and 2 while node 3 waits.
	put(40)
}

// TestGroupSnapshotReceive: node 3, restarted behind the leader's
// compacted raft log, is handed the leader's snapshot through
// ReceiveSnapshot. It refuses a MsgSnap for another member, from a member
// other than the stream's, whose manifest is at another index, or at an
// index it has committed already, a second snapshot while one is staged,
// and a bad chunk (staging dir gone, nothing changed); a stale staging dir
// is removed at Open. The good snapshot it stages in its data dir,
// verifies, steps into raft and installs: its commitlog is then the
// leader's up to the snapshot's end, its raft log starts past the
// snapshot's index, and the staging dir and the install journal are gone.
func TestGroupSnapshotReceive(t *testing.T) {
	sink := &snapSink{dir: t.TempDir(), fileSize: 64 << 10}
	t.Cleanup(sink.wg.Wait)
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
		if o.Group.ID == 1 {
			sink.testTransport = o.Group.Transport.(testTransport)
			o.Group.Transport = sink
		}
	})
	g.elect(1)
	body := strings.Repeat("r", 6000)
	for i := range 40 {
		if i == 10 {
			g.converge(1, g.ids...)
			g.closeMember(3)
		}
		if res, err := g.put(1, fmt.Sprintf("%04d%s", i, body)); err != nil || res.Status != PutOK {
			t.Fatalf("put %d: %v %v", i, res.Status, err)
		}
	}
	g.converge(1, 1, 2)
	leader := g.m[1].s
	var base uint64
	g.poll("the leader compacts its log", func() bool {
		base = leader.ReplicaInfo().Commit
		return leader.group.rlog.Compact(base) == nil
	}, 1)
	baseTerm, err := leader.group.rlog.Term(base)
	if err != nil {
		t.Fatal(err)
	}
	// A stale staging dir left by a crash is removed at Open.
	stale := filepath.Join(g.m[3].opts.Dir, "snapshot.tmp")
	if err := vfs.Default.MkdirAll(stale); err != nil {
		t.Fatal(err)
	}
	g.open(3)
	if _, err := vfs.Default.ReadDir(stale); err == nil {
		t.Fatal("a stale snapshot staging dir survived Open")
	}
	node3 := g.m[3].s
	snapOf := func(from, to, index, term uint64) *outgoingSnapshot {
		msg, err := proto.Marshal(&pb.Message{Type: pb.MsgSnap.Enum(), From: proto.Uint64(from), To: proto.Uint64(to),
			Term: proto.Uint64(leader.ReplicaInfo().Term), Snapshot: &pb.Snapshot{Metadata: &pb.SnapshotMetadata{
				Index: proto.Uint64(index), Term: proto.Uint64(term), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return &outgoingSnapshot{s: leader, to: to, msg: msg, index: index, term: term}
	}
	message := func(o *outgoingSnapshot) []byte {
		b, err := o.Message()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := node3.log.MaxOffset()
	infoBefore := node3.ReplicaInfo()

	good := snapOf(1, 3, base, baseTerm)
	in, err := node3.ReceiveSnapshot(1, message(good))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node3.ReceiveSnapshot(1, message(good)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a second snapshot while one is staged: %v", err)
	}
	// A bad chunk: refused, and the staging dir goes.
	i := 0
	err = good.Read(0, func(file, off int64, b []byte, crc uint32) error {
		if i++; i == 2 {
			crc ^= 1
		}
		return in.Write(file, off, b, crc)
	})
	if !errors.Is(err, snapshot.ErrBadChunk) {
		t.Fatalf("a chunk with a wrong CRC: %v", err)
	}
	in.Discard()
	if _, err := vfs.Default.ReadDir(stale); err == nil {
		t.Fatal("the staging dir survived a refused chunk")
	}
	if node3.log.MaxOffset() != before || node3.ReplicaInfo().Commit != infoBefore.Commit {
		t.Fatalf("node 3 changed: commitlog end %d -> %d, commit %d -> %d", before, node3.log.MaxOffset(), infoBefore.Commit, node3.ReplicaInfo().Commit)
	}

	wrongIndex, err := replica.SnapshotMessage(snapOf(1, 3, good.index+1, baseTerm).msg, mustEncode(t, good.m))
	if err != nil {
		t.Fatal(err)
	}
	// A consistent snapshot at index 1, which node 3 has committed.
	old := good.m
	old.Index, old.Term = 1, infoBefore.Term
	stale1, err := replica.SnapshotMessage(snapOf(1, 3, 1, old.Term).msg, mustEncode(t, old))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		from uint64
		msg  []byte
		why  string
	}{
		"for member 2":              {1, message(snapOf(1, 2, base, baseTerm)), "for member 2"},
		"from another member":       {2, message(good), "from member 1 on member 2's stream"},
		"from itself":               {3, message(snapOf(3, 3, base, baseTerm)), "from member 3"},
		"manifest at another index": {1, wrongIndex, "a manifest at"},
		"already committed":         {1, stale1, "has committed up to"},
		"garbage":                   {1, []byte{0xff, 0x01}, "bad peer message"},
	} {
		if _, err := node3.ReceiveSnapshot(tc.from, tc.msg); !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: %v, want ErrBadSnapshot saying %q", name, err, tc.why)
		}
	}

	// The good one, whole: staged, verified and installed.
	good = snapOf(1, 3, base, baseTerm)
	in, err = node3.ReceiveSnapshot(1, message(good))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := good.Read(0, func(file, off int64, b []byte, crc uint32) error {
		n += int64(len(b))
		return in.Write(file, off, b, crc)
	}); err != nil {
		t.Fatal(err)
	}
	if err := in.Finish(); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if n != good.m.Bytes() || n == 0 {
		t.Fatalf("%d bytes streamed, the manifest has %d", n, good.m.Bytes())
	}
	for _, name := range []string{stale, filepath.Join(g.m[3].opts.Dir, installJournal)} {
		if _, err := vfs.Default.Size(name); err == nil {
			t.Fatalf("%s survived the install", name)
		}
	}
	if f, _ := node3.group.rlog.FirstIndex(); f < good.m.Index+1 {
		t.Fatalf("node 3's raft log starts at %d after installing a snapshot at %d", f, good.m.Index)
	}
	if ce := node3.ReplicaInfo().CommitEnd; ce < good.m.End {
		t.Fatalf("node 3's commit end %d is below the snapshot's %d", ce, good.m.End)
	}
	for _, f := range good.m.Files {
		node3.log.ReadLock()
		got := append([]byte(nil), node3.log.At(f.From)[:f.Size]...)
		node3.log.ReadUnlock()
		leader.log.ReadLock()
		want := append([]byte(nil), leader.log.At(f.From)[:f.Size]...)
		leader.log.ReadUnlock()
		if !bytes.Equal(got, want) {
			t.Fatalf("node 3's file %d differs from the leader's after the install", f.From)
		}
	}
}

func mustEncode(t *testing.T, m snapshot.Manifest) []byte {
	t.Helper()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
