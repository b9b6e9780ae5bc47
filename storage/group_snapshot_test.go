package storage

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
