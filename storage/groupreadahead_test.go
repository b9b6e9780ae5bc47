package storage

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// TestGroupCatchUpReadahead: a leader asks the kernel to read ahead of a
// follower that comes back far behind (GroupOptions.CatchUpReadahead),
// only then, only inside what that follower still needs, and not at all
// with the readahead off; the follower catches up byte-identical either
// way. raft's bounds are lowered (4 KiB per append, 16 KiB in flight) so
// that the catch-up of ~300 KiB takes many rounds, as a catch-up of GiBs
// does under the real bounds.
func TestGroupCatchUpReadahead(t *testing.T) {
	const ahead = 16 << 10
	for _, tc := range []struct {
		name      string
		readahead int64
	}{{"on", ahead}, {"off", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			fss := map[uint64]*vfs.MemFS{}
			g := newTestGroupWith(t, time.Minute, nil, func(o *Options) {
				fs := vfs.NewMem()
				fss[o.Group.ID] = fs
				o.FS = fs
				o.Group.CatchUpReadahead = tc.readahead
				o.Group.maxInflightBytes, o.Group.maxSizePerMsg = 16<<10, 4<<10
			})
			g.elect(1)
			body := strings.Repeat("r", 1000)
			put := func(i int) { g.mustPut(1, i, fmt.Sprintf("%s-%d", body, i)) }
			// Followers that keep up read what was just written: nothing
			// is read ahead for them. (Each put waits for both: a put
			// needs one follower's answer, and on a loaded machine the
			// other, in a slow fsync, may fall more than half the
			// readahead behind and rightly get one.)
			for i := range 20 {
				put(i)
				g.converge(1, g.ids...)
			}
			if ri := g.m[1].s.ReplicaInfo(); ri.ReadaheadBytes != 0 || ri.Readaheads != 0 {
				t.Fatalf("followers in step: %d bytes read ahead in %d requests, want none", ri.ReadaheadBytes, ri.Readaheads)
			}
			// Nor for one that comes back less than half the readahead
			// behind (~5.5 KiB, probed first): what it needs is still in
			// memory.
			g.net.setCut(3, true)
			for i := range 5 {
				put(20 + i)
			}
			g.net.setCut(3, false)
			behind := g.converge(1, g.ids...)
			if ri := g.m[1].s.ReplicaInfo(); ri.ReadaheadBytes != 0 || ri.Readaheads != 0 {
				t.Fatalf("a follower a little behind: %d bytes read ahead in %d requests, want none", ri.ReadaheadBytes, ri.Readaheads)
			}

			// The leader's WILLNEED requests, as commitlog ranges.
			type span struct{ lo, hi int64 }
			var mu sync.Mutex
			var asked []span
			fss[1].OnPopulate(func(path string, lo, hi int64, how vfs.PopulateMode) {
				if how != vfs.PopulateWillNeed {
					return
				}
				from, ok := segment.ParseFileName(filepath.Base(path))
				if !ok || filepath.Base(filepath.Dir(path)) != "commitlog" {
					t.Errorf("read ahead in %s, not a commitlog file", path)
					return
				}
				mu.Lock()
				asked = append(asked, span{from + lo, from + hi})
				mu.Unlock()
			})
			t.Cleanup(func() { fss[1].OnPopulate(nil) })

			// Follower 3 is cut off while 1 and 2 commit ~300 KiB, then
			// comes back.
			g.net.setCut(3, true)
			for i := range 300 {
				put(25 + i)
			}
			g.net.setCut(3, false)
			end := g.converge(1, g.ids...)
			g.sameBytes(end, g.ids...)

			ri := g.m[1].s.ReplicaInfo()
			if ri.StorageEntries.Count() == 0 {
				t.Errorf("no Entries call timed on the leader after a catch-up")
			}
			total := func() (n int64) {
				mu.Lock()
				defer mu.Unlock()
				for _, s := range asked {
					n += s.hi - s.lo
				}
				return n
			}
			if tc.readahead == 0 {
				if ri.ReadaheadBytes != 0 || ri.Readaheads != 0 || total() != 0 {
					t.Fatalf("readahead off: %d bytes in %d requests (%d seen by the file system), want none",
						ri.ReadaheadBytes, ri.Readaheads, total())
				}
				return
			}
			// The counters catch up with the prefetcher's last request.
			g.poll("the readahead counted", func() bool {
				ri = g.m[1].s.ReplicaInfo()
				return ri.ReadaheadBytes == total()
			})
			if ri.Readaheads == 0 || ri.ReadaheadBytes < ahead {
				t.Fatalf("a follower %d bytes behind: %d bytes read ahead in %d requests, want at least %d",
					end-behind, ri.ReadaheadBytes, ri.Readaheads, ahead)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range asked {
				if s.lo < behind || s.hi > end || s.hi <= s.lo {
					t.Fatalf("read ahead [%d, %d): outside what the follower needed, [%d, %d)", s.lo, s.hi, behind, end)
				}
			}
			// Each byte once, but for at most one window per rejection:
			// raft's guess of where a cut-off follower is runs ahead until
			// it answers, and each append rejection the leader steps (in
			// StateReplicate even a stale one, of an append sent before
			// the follower's position was known) moves the guess back to
			// what the follower has acknowledged; what was read ahead of
			// the guess is read again from there. Two rejections are the
			// usual here, three under load (the heartbeats of the round
			// trip each send another append to the old guess). A planner
			// that asked again every round would read many times the
			// catch-up.
			rejects := g.net.rejections(3, 1)
			if rejects == 0 {
				t.Fatalf("follower 3 came back %d bytes behind and rejected no append", end-behind)
			}
			if ri.ReadaheadBytes > end-behind+int64(rejects)*ahead {
				t.Fatalf("%d bytes read ahead for a follower %d bytes behind that rejected %d appends: more than once each", ri.ReadaheadBytes, end-behind, rejects)
			}
			t.Logf("%d bytes behind: %d bytes read ahead in %d requests, %d appends rejected", end-behind, ri.ReadaheadBytes, ri.Readaheads, rejects)
		})
	}
}
