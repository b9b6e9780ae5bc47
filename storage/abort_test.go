package storage

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// TestRecoveryTrustsTailOnlyAfterCleanClose: Open reads the last
// commitlog file's tail past the end (to cut what a crashed run left
// there) unless the last run closed cleanly, when it reads only the page
// holding the end. Bytes are planted past the end after each way a run
// can end; a crash, also of a run that itself started after a clean
// close, and bytes within the end's page get the whole check: saved as a
// .broken file and zeroed. Only a clean close with the end's page zero
// leaves the rest unread.
func TestRecoveryTrustsTailOnlyAfterCleanClose(t *testing.T) {
	const fileSize = 64 << 10
	garbage := []byte("bytes a crashed run's writeback left past the end")
	cases := []struct {
		name    string
		end     func(t *testing.T, o Options) // ends the run after putN's clean one
		at      int64                         // where to plant, past the end
		trusted bool
	}{
		{name: "crash", end: crashedRun, at: 3 * pageSize, trusted: false},
		{name: "clean close", end: func(*testing.T, Options) {}, at: 3 * pageSize, trusted: true},
		{name: "clean close, the end's page dirty", end: func(*testing.T, Options) {}, at: 8, trusted: false},
		{name: "a run after a clean close crashed in Open", end: crashedOpen, at: 3 * pageSize, trusted: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{Dir: dir, FileSize: fileSize, MaxMessageSize: 4096}
			offs := putN(t, o, 5)
			end := offs[4].NextOffset()
			c.end(t, o)
			path := filepath.Join(dir, "commitlog", fileName(0))
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			plant := end - end%pageSize + c.at // from the end's page
			if c.at < pageSize {
				plant = end + c.at
			}
			copy(b[plant:], garbage)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}

			var lines logLines
			o.Logger = lines.logger()
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.log.MaxOffset(); got != end {
				t.Fatalf("end after recovery %d, want %d", got, end)
			}
			// The store works either way: a put lands at the end and reads back.
			r, err := s.PutMessage(context.Background(), msg("G", "after"))
			if err != nil || r.Append.WroteOffset != end {
				t.Fatalf("put after recovery: %+v, %v; want it at %d", r.Append, err, end)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			planted := bytes.Equal(after[plant:plant+int64(len(garbage))], garbage)
			_, brokenErr := os.Stat(filepath.Join(dir, "commitlog", fileName(end)+".broken"))
			if c.trusted {
				if !planted || brokenErr == nil || lines.count(`"tail_trusted":true`) != 1 {
					t.Fatalf("after a clean close the tail was read: planted bytes kept %v, .broken file: %v, log:\n%s",
						planted, brokenErr, lines.buf.String())
				}
				return
			}
			if planted || brokenErr != nil || lines.count(`"tail_trusted":false`) != 1 {
				t.Fatalf("the tail was not checked: planted bytes kept %v, .broken file: %v, log:\n%s",
					planted, brokenErr, lines.buf.String())
			}
		})
	}
}

// crashedRun opens the store and stops it as a killed process would.
func crashedRun(t *testing.T, o Options) {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	s.crash()
}

// crashedOpen has a run die inside Open, after recovery: Open fails
// on a corrupt config/delayOffset.json, which is then put right.
func crashedOpen(t *testing.T, o Options) {
	t.Helper()
	path := filepath.Join(o.Dir, "config", "delayOffset.json")
	if err := os.WriteFile(path, []byte("not sealed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(o); err == nil {
		s.Close()
		t.Fatal("Open took a corrupt delayOffset.json")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestGroupCleanCloseLeavesLogSynced: a group member's clean close (the
// abort marker removed, so the next Open trusts the tail past the log's
// end) leaves no byte of its commitlog unsynced: a power cut right after
// it changes nothing there, in the leader's log and in a follower's.
func TestGroupCleanCloseLeavesLogSynced(t *testing.T) {
	fs := vfs.NewMem()
	g := newTestGroupWith(t, time.Minute, nil, func(o *Options) { o.FS = fs })
	g.elect(1)
	for i := range 40 {
		g.putOK(1, fmt.Sprintf("m%d", i))
	}
	g.converge(1, g.ids...)
	for _, id := range []uint64{2, 1} {
		dir := filepath.Join(g.m[id].opts.Dir, "commitlog")
		g.closeMember(id)
		if abortExists(fs, g.m[id].opts.Dir) {
			t.Fatalf("member %d: the abort marker is still there after Close", id)
		}
		entries, err := fs.ReadDir(dir)
		if err != nil || len(entries) == 0 {
			t.Fatalf("member %d: commitlog files %v, %v", id, entries, err)
		}
		for seed := range uint64(4) {
			img := fs.Crash(rand.New(rand.NewPCG(seed, 7)))
			for _, e := range entries {
				path := filepath.Join(dir, e.Name)
				want, err := fs.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := img.ReadFile(path); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("member %d: %s after a power cut differs from the closed log (%v)", id, e.Name, err)
				}
			}
		}
	}
}
