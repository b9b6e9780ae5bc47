package raftlog

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testFileSize = 16 << 10 // small commitlog files: many rolls and blanks
	testUnits    = 16       // units per index file: many index files
)

var testHost = netip.MustParseAddrPort("127.0.0.1:10911")

var testMeta = Meta{NodeID: 1, Group: "g1", ClusterUUID: "c0ffee", FileSize: testFileSize, Voters: []uint64{1, 2, 3}}

// replica is a commitlog and the raft log over it, on one file system.
type replica struct {
	fs  vfs.FS
	cl  *commitlog.Log
	log *Log
}

// openReplica opens (or recovers) the replica in /d of fs.
func openReplica(fs vfs.FS) (*replica, error) { return openReplicaAs(fs, testMeta) }

// openReplicaAs opens the replica in /d of fs as the node meta names.
func openReplicaAs(fs vfs.FS, meta Meta) (*replica, error) {
	return openReplicaFrom(fs, meta, 0, false)
}

// openReplicaFrom is openReplicaAs with the checkpoint's dispatched
// offset: the commitlog's recovery scan starts at it or below, and the
// raft log is told where it started (Options.Checked), as the store does;
// with readAll it is not (Checked 0: every payload is read).
func openReplicaFrom(fs vfs.FS, meta Meta, dispatched int64, readAll bool) (*replica, error) {
	return openReplicaCache(fs, meta, dispatched, readAll, 0)
}

// openReplicaCache is openReplicaFrom with Options.CacheBytes.
func openReplicaCache(fs vfs.FS, meta Meta, dispatched int64, readAll bool, cacheBytes int) (*replica, error) {
	nop := zerolog.Nop()
	if err := fs.MkdirAll("/d/commitlog"); err != nil {
		return nil, err
	}
	cl, err := commitlog.Open(commitlog.Options{FS: fs, Dir: "/d/commitlog", FileSize: testFileSize, RequireCRC: true,
		Clock: base.SystemClock, Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		return nil, err
	}
	// What the store does: the commit end is acknowledged data too.
	commitEnd, err := CommitEnd(fs, "/d/raft", testUnits)
	if err != nil {
		cl.Close()
		return nil, err
	}
	synced, err := SyncedData(fs, "/d/raft", testUnits)
	if err != nil {
		cl.Close()
		return nil, err
	}
	var scan commitlog.ScanResult
	if synced == nil {
		scan, err = cl.Recover(commitEnd, dispatched)
	} else {
		scan, err = cl.RecoverGroup(commitEnd, dispatched, synced)
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	cl.Start()
	checked := scan.From
	if readAll {
		checked = 0
	}
	l, err := Open(Options{FS: fs, Dir: "/d/raft", Commitlog: cl, Meta: meta, RequireCRC: true, Checked: checked, IndexUnits: testUnits,
		CacheBytes: cacheBytes})
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &replica{fs: fs, cl: cl, log: l}, nil
}

func mustOpen(t testing.TB, fs vfs.FS) *replica {
	t.Helper()
	r, err := openReplica(fs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// close closes the raft log and the commitlog without syncing: what a
// kill -9 leaves (MemFS keeps the page cache).
func (r *replica) close() error {
	err := r.log.Close()
	r.cl.WaitPopulated()
	if cerr := r.cl.Close(); err == nil {
		err = cerr
	}
	return err
}

// records encodes 1-3 records stamped for commitlog offset at; the
// caller picks at with Place.
func records(rng *rand.Rand, n int) []record.Spec {
	specs := make([]record.Spec, n)
	for j := range specs {
		body := make([]byte, 1+rng.IntN(1500))
		for k := range body {
			body[k] = byte('a' + rng.IntN(26))
		}
		specs[j] = record.Spec{Topic: "T", Body: body, StoreHost: testHost, BornHost: testHost, PropCRC: true}
		specs[j].BodyCRC = record.BodyCRC(body)
		if ferr := specs[j].Size(); ferr != nil {
			panic(ferr)
		}
	}
	return specs
}

func encodeAt(specs []record.Spec, at int64) []byte {
	total := 0
	for _, s := range specs {
		total += s.Total
	}
	b := make([]byte, total)
	off := 0
	for i := range specs {
		specs[i].Encode(b[off:off+specs[i].Total], int64(i), at+int64(off), 1)
		off += specs[i].Total
	}
	return b
}

func specsLen(specs []record.Spec) int {
	n := 0
	for _, s := range specs {
		n += s.Total
	}
	return n
}
