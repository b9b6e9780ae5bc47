package raftlog

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/internal/hist"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

var _ raft.Storage = (*Log)(nil)

// DefaultIndexUnits is the number of units per index file (32 MiB).
const DefaultIndexUnits = 1 << 20

// Options configure a Log.
type Options struct {
	FS vfs.FS
	// Dir is the raft directory (the store's Dir/raft).
	Dir string
	// Commitlog is the store's commitlog, recovered (commitlog.Recover)
	// and started: DATA entries are placed into it, and nothing else may
	// append to it while the Log is open.
	Commitlog *commitlog.Log
	// Meta is this replica's identity; bootstrapped when Dir has none,
	// checked against raft/meta otherwise. FileSize must be the
	// commitlog's.
	Meta Meta
	// RequireCRC: every record of a DATA entry carries the whole-record CRC.
	RequireCRC bool
	// Flushed is the checkpoint's flushed commitlog offset: the data below
	// it was acknowledged durable, so damage there refuses to start. In a
	// group the checkpoint must take it from DurableEnd, never from the
	// commitlog's own flushed offset (which runs ahead of the index).
	Flushed int64
	// Checked is where the commitlog's recovery scan started
	// (commitlog.ScanResult.From): it checked every record from there on
	// in full. Below it, files were sealed and synced before the
	// checkpoint moved past them, and recovery takes a DATA entry that
	// ends there on its unit (CRC, term order, continuity with the entries
	// around it), without reading its payload (design §3.4 step 3 scans
	// "the index from the checkpoint"): reading even one field of each
	// record would read every retained commitlog file at each start, and
	// a start would grow with retention (5.3 GB retained, cold cache: 6–16 s
	// to open, 1.6 s without; BENCHMARKS.md "A start reads what recovery
	// checks"). Damage there is found by the reads that cross it (record
	// CRCs; Entries checks the data CRC), by `storaged check`, and mended
	// by `storaged replica repair`. 0: every payload is read.
	Checked int64
	// IndexUnits is the number of units per index file (0: DefaultIndexUnits).
	IndexUnits int
	// CacheBytes bounds the memory of the entries appended last that
	// Entries serves from memory (entryCache: their payloads and 64 bytes
	// an entry; 0: DefaultCacheBytes, negative: none).
	CacheBytes int
}

// Errors.
var (
	// ErrTruncateCommitted: the entries to replace include a committed
	// one. Raft never asks for it; if it does, the node must stop.
	ErrTruncateCommitted = errors.New("raftlog: truncation at or below the commit index")
	// ErrStopped: an earlier write failed; the Log refuses everything until
	// it is reopened (storaged's sticky-error rule: a restart recovers).
	ErrStopped = errors.New("raftlog: stopped after a failed write")
	// ErrBadEntry: an entry the Log cannot place (a gap, records stamped
	// for another offset, a payload too big for a unit).
	ErrBadEntry = errors.New("raftlog: bad entry")
)

// Log is the raft log of one replica over the commitlog (design §2,
// Option A): raft.Storage for the RawNode, and the write side the raft
// loop calls per Ready (Append, SetHardState, Sync).
//
// Every method takes one mutex: the raft goroutine is the writer, readers
// (a snapshot sender, statistics) are rare. Commitlog bytes are read under
// the commitlog's read guard and copied out.
type Log struct {
	opts Options
	cl   *commitlog.Log
	meta Meta

	mu sync.Mutex
	// hsMu guards hs (the pointer, the file and its slot state) and hsErr.
	// SyncCommit takes it alone, so that a checkpoint does not wait for the
	// raft loop's msyncs, which run under mu. Lock order: mu, then hsMu.
	hsMu    sync.Mutex
	hs      *hardStateFile
	hsErr   error         // a failed SyncCommit's: the next call under mu stops the Log with it
	pending *pb.HardState // set by SetHardState, written by Sync; nil when on disk
	idx     *index
	metaLog vfs.File
	base    logBase // raft/base: FirstIndex-1 and where the data up to it ends
	first   uint64  // FirstIndex = base.Index+1
	last    uint64  // LastIndex
	dataEnd int64   // commitlog offset past the last DATA entry (Meta.LogBase if none)
	metaEnd int64   // meta-log offset past the last CONF/CMD payload
	synced  uint64  // units of indexes ≤ synced are durable (Sync)
	// durableEnd is dataEnd at synced (DurableEnd), read without mu.
	durableEnd atomic.Int64
	// mark is the synced point raft/mark would record (mark.go; Term and
	// UnitCRC are looked up when it is written), zero when none; markSaved is the
	// index of the mark last written, markCut counts the truncations (a
	// mark written from before one is not counted as saved). markMu
	// orders SaveMark's write of the file with InstallSnapshot's removal
	// (taken before mu).
	mark      markPoint
	markSaved uint64
	markCut   uint64
	markMu    sync.Mutex
	// walked..walkedTo are the units recovery's walk of the index
	// checked (RecoveryWalk).
	walked, walkedTo uint64
	// newestConf is the newest CONF entry at or below last (LastConf).
	newestConf confAt
	metaDirty  bool
	// hot: entries above it were written by this process; those at or
	// below it came from disk and get their dataCRC checked on read.
	hot     uint64
	stopped error
	halted  atomic.Bool // stopped != nil, for SyncCommit
	closed  bool
	joining bool // the joining marker is there (Joining)
	conf    Conf // raft/conf (conf.go)

	// cache holds the entries appended last (entryCache).
	cache entryCache

	// entriesLat times each Entries call: raft makes them on its own
	// goroutine, under the replica's lock, and a call that reads cold
	// pages (a follower far behind) holds up every proposal meanwhile
	// (design §8; EntriesLatency).
	entriesLat hist.Histogram
	// syncLat times the disk part of each Sync (SyncLatency): the
	// commitlog's msync, the index units', the meta-log's.
	syncLat hist.Histogram
}

// Open opens (or bootstraps) the raft log in opts.Dir and reconciles it
// with the commitlog (design §3.4 steps 2-5, see recover.go). Damage to
// acknowledged entries is a *base.CorruptionError (storage.CorruptionError).
func Open(opts Options) (*Log, error) {
	if opts.IndexUnits <= 0 {
		opts.IndexUnits = DefaultIndexUnits
	}
	if opts.Commitlog == nil || opts.FS == nil || opts.Dir == "" {
		return nil, errors.New("raftlog: Options need FS, Dir and Commitlog")
	}
	if opts.Meta.FileSize != opts.Commitlog.FileSize() {
		return nil, fmt.Errorf("raftlog: Meta.FileSize %d, the commitlog's is %d", opts.Meta.FileSize, opts.Commitlog.FileSize())
	}
	if err := opts.FS.MkdirAll(filepath.Join(opts.Dir, "meta-log")); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	want := opts.Meta
	want.LogBase = opts.Commitlog.MaxOffset()
	conf, err := readConf(opts.FS, opts.Dir)
	if err != nil {
		return nil, err
	}
	if slices.Contains(conf.Removed, want.NodeID) {
		return nil, fmt.Errorf("%w: member %d was removed from group %q (raft ids are never reused: add a new member "+
			"with a new id and an empty data dir instead)", ErrRemoved, want.NodeID, want.Group)
	}
	meta, _, err := loadOrBootstrapMeta(opts.FS, opts.Dir, want, opts.IndexUnits, len(conf.Records) > 0)
	if err != nil {
		return nil, err
	}
	lb, err := readBase(opts.FS, opts.Dir, meta)
	if err != nil {
		return nil, err
	}
	l := &Log{opts: opts, cl: opts.Commitlog, meta: meta, base: lb, first: lb.Index + 1, conf: conf}
	l.cache.limit = opts.CacheBytes
	if opts.CacheBytes == 0 {
		l.cache.limit = DefaultCacheBytes
	}
	if _, err := opts.FS.Size(filepath.Join(opts.Dir, joiningName)); err == nil {
		l.joining = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			l.closeFiles()
		}
	}()
	_, hsErr := opts.FS.Size(filepath.Join(opts.Dir, hardStateName))
	if l.hs, err = openHardState(opts.FS, filepath.Join(opts.Dir, hardStateName)); err != nil {
		return nil, err
	}
	if l.metaLog, err = opts.FS.OpenFile(filepath.Join(opts.Dir, "meta-log", indexName(0)), true); err != nil {
		return nil, fmt.Errorf("raftlog: open meta-log: %w", err)
	}
	if l.idx, err = loadIndex(opts.FS, filepath.Join(opts.Dir, "index"), uint64(opts.IndexUnits), l.first); err != nil {
		return nil, err
	}
	if err := l.idx.removeStale(); err != nil {
		return nil, err
	}
	if b := l.idx.slot(l.first); l.hs.cur.Seq == 0 && (lb.Index > 0 || (b != nil && !commitlog.AllZero(b))) {
		return nil, lostHardState(errors.Is(hsErr, fs.ErrNotExist))
	}
	// Make every directory entry durable, on every Open and not only at
	// bootstrap: a power cut right after bootstrap may have kept raft/meta
	// but not raft/hardstate's entry, which a later fdatasync of the file
	// alone would never make durable.
	for _, d := range []string{filepath.Dir(opts.Dir), opts.Dir, filepath.Join(opts.Dir, "meta-log"), filepath.Join(opts.Dir, "index")} {
		if err := base.SyncDir(opts.FS, d); err != nil {
			return nil, fmt.Errorf("raftlog: %w", err)
		}
	}
	if err := l.recover(); err != nil {
		return nil, err
	}
	ok = true
	return l, nil
}

// Meta is raft/meta as on disk.
func (l *Log) Meta() Meta { return l.meta }

// InitialState implements raft.Storage: the latest HardState (the one set
// last, written or not) and the membership recorded at or below its
// commit (raft/conf, else the bootstrap membership of raft/meta). The raft
// loop applies the conf entries between that record and the commit again
// (see confName).
func (l *Log) InitialState() (*pb.HardState, *pb.ConfState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	hs := l.pending
	if hs == nil {
		hs = l.hs.hardState()
	}
	return proto.Clone(hs).(*pb.HardState), l.membershipLocked(hs.GetCommit()).ConfState(), nil
}

// Entries implements raft.Storage: entries [lo, hi), at least one, at
// most maxSize bytes of proto encoding past the first. Those appended last
// are the values Append took (entryCache); the others are read fresh:
// DATA bytes copied out of the commitlog under its read guard (retention
// may unmap a file while a MsgApp is being marshalled), every unit's CRC
// checked, and the payload CRC of every entry that came from disk rather
// than from this process's writes, so a damaged record is never shipped.
func (l *Log) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	start := time.Now()
	defer func() { l.entriesLat.Observe(time.Since(start)) }()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return nil, l.stopped
	}
	if lo < l.first {
		return nil, raft.ErrCompacted
	}
	if hi > l.last+1 {
		return nil, fmt.Errorf("raftlog: entries [%d, %d) past the last index %d", lo, hi, l.last)
	}
	if l.last < l.first {
		return nil, raft.ErrUnavailable
	}
	var out []*pb.Entry
	var size uint64
	for i := lo; i < hi; i++ {
		e, ok := l.cache.get(i)
		if !ok {
			var err error
			if e, err = l.entryLocked(i); err != nil {
				return nil, err
			}
		}
		size += uint64(proto.Size(e))
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
	}
	return out[:len(out):len(out)], nil
}

// entryLocked reads entry i (first ≤ i ≤ last).
func (l *Log) entryLocked(i uint64) (*pb.Entry, error) {
	u, err := l.unitLocked(i)
	if err != nil {
		return nil, err
	}
	e := &pb.Entry{Term: proto.Uint64(u.Term), Index: proto.Uint64(i)}
	switch u.Kind {
	case KindEmpty:
		return e, nil
	case KindData:
		l.cl.ReadLock()
		b := l.cl.At(u.Pos)
		if int64(len(b)) >= int64(u.Len) {
			e.Data = append([]byte(nil), b[:u.Len]...)
		}
		l.cl.ReadUnlock()
		if e.Data == nil {
			return nil, l.corrupt(i, u, "its commitlog bytes are gone")
		}
	case KindConf, KindCmd:
		e.Data = make([]byte, u.Len)
		if _, err := l.metaLog.ReadAt(e.Data, u.Pos); err != nil && u.Len > 0 {
			return nil, fmt.Errorf("raftlog: read meta-log at %d for entry %d: %w", u.Pos, i, err)
		}
		if u.Kind == KindConf {
			t := pb.EntryConfChangeV2
			if u.Flags&FlagConfV1 != 0 {
				t = pb.EntryConfChange
			}
			e.Type = t.Enum()
		}
	}
	if i <= l.hot && crc32c(e.Data) != u.DataCRC {
		return nil, l.corrupt(i, u, "payload CRC mismatch")
	}
	return e, nil
}

func (l *Log) corrupt(i uint64, u Unit, why string) error {
	return &base.CorruptionError{File: "raft/index", Offset: u.Pos, Flushed: l.opts.Flushed,
		Reason: fmt.Sprintf("raft entry %d (%s, term %d, %d bytes at %d): %s", i, u.Kind, u.Term, u.Len, u.Pos, why)}
}

// unitAt decodes the unit of index i (tests, tools).
func (l *Log) unitAt(i uint64) (Unit, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unitLocked(i)
}

// unitLocked decodes the unit of index i (first ≤ i ≤ last).
func (l *Log) unitLocked(i uint64) (Unit, error) {
	b := l.idx.slot(i)
	if b == nil {
		return Unit{}, fmt.Errorf("raftlog: no index file holds entry %d", i)
	}
	u, err := DecodeUnit(b)
	if err != nil {
		return Unit{}, &base.CorruptionError{File: "raft/index/" + indexName(i-i%l.idx.units), Offset: int64(i),
			Reason: fmt.Sprintf("unit of raft entry %d: %v", i, err)}
	}
	return u, nil
}

// Term implements raft.Storage. Term(FirstIndex-1) is the base term.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return 0, l.stopped
	}
	switch {
	case i+1 < l.first:
		return 0, raft.ErrCompacted
	case i > l.last:
		return 0, raft.ErrUnavailable
	case i == l.first-1:
		return l.base.Term, nil // the base (0 until Compact moves FirstIndex)
	}
	u, err := l.unitLocked(i)
	return u.Term, err
}

// LastIndex implements raft.Storage.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last, nil
}

// FirstIndex implements raft.Storage: 1 until Compact moves it up (design
// §3.5: the catch-up window, retention).
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first, nil
}

// Snapshot implements raft.Storage with the base: index FirstIndex-1, its
// term, the membership recorded at it, no data. The data of a snapshot (the
// manifest of the commitlog files up to the base, design §3.5) is the
// sender's to build, off the raft goroutine; nothing installs one yet, so
// nothing calls Compact outside tests.
func (l *Log) Snapshot() (*pb.Snapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(l.first - 1), Term: proto.Uint64(l.base.Term),
		ConfState: l.membershipLocked(l.first - 1).ConfState()}}, nil
}

// SetHardState records hs for the next Sync, which writes it.
func (l *Log) SetHardState(hs *pb.HardState) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	l.pending = proto.Clone(hs).(*pb.HardState)
	return nil
}

// KindOf tells what kind of entry e is, as the Log stores it.
func KindOf(e *pb.Entry) Kind { return classify(e) }

// classify tells an entry's kind.
func classify(e *pb.Entry) Kind {
	switch e.GetType() {
	case pb.EntryConfChange, pb.EntryConfChangeV2:
		return KindConf
	}
	switch d := e.GetData(); {
	case len(d) == 0:
		return KindEmpty
	case len(d) >= 8 && record.HasMagic(d):
		return KindData
	}
	return KindCmd
}

// Append writes entries as raft hands them over in Ready.Entries: the
// indexes must be contiguous and start at most at LastIndex+1; when they
// start at or below LastIndex, the suffix from there is truncated first
// (design §2.3). Entries below FirstIndex are ignored, as MemoryStorage
// does. A DATA entry's records must be stamped for the commitlog offset
// they go to (their PHYSICALOFFSET fields): the end of the previous DATA
// entry, or the start of the next file when they do not fit. Both the
// leader's own entries and a follower's go through here; nothing is
// durable before Sync.
//
// Any error stops the Log (ErrStopped after it): the node must stop, and a
// restart recovers.
func (l *Log) Append(ents []*pb.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	for len(ents) > 0 && ents[0].GetIndex() < l.first {
		ents = ents[1:]
	}
	if len(ents) == 0 {
		return nil
	}
	k := ents[0].GetIndex()
	for j, e := range ents {
		if e.GetIndex() != k+uint64(j) {
			return fmt.Errorf("%w: entry %d follows %d", ErrBadEntry, e.GetIndex(), k+uint64(j)-1)
		}
	}
	if k > l.last+1 {
		return fmt.Errorf("%w: entry %d leaves a gap after the last index %d", ErrBadEntry, k, l.last)
	}
	if k <= l.last {
		if err := l.truncateLocked(k); err != nil {
			return l.stop(err)
		}
	}
	for _, e := range ents {
		if err := l.appendLocked(e); err != nil {
			return l.stop(err)
		}
	}
	return nil
}

func (l *Log) stop(err error) error {
	l.stopped = fmt.Errorf("%w: %w", ErrStopped, err)
	l.halted.Store(true)
	return err
}

// appendLocked places e at LastIndex+1.
func (l *Log) appendLocked(e *pb.Entry) error {
	i := e.GetIndex()
	data := e.GetData()
	if int64(len(data)) > int64(^uint32(0)) {
		return fmt.Errorf("%w: entry %d has %d bytes", ErrBadEntry, i, len(data))
	}
	u := Unit{Term: e.GetTerm(), Kind: classify(e), Len: uint32(len(data)), DataCRC: crc32c(data)}
	if u.Kind == KindEmpty {
		u.DataCRC = 0
	}
	if prev, err := l.termLocked(i - 1); err != nil {
		return err
	} else if u.Term < prev {
		return fmt.Errorf("%w: entry %d has term %d below its predecessor's %d", ErrBadEntry, i, u.Term, prev)
	}
	dst, err := l.idx.ensure(i)
	if err != nil {
		return err
	}
	switch u.Kind {
	case KindData:
		if err := l.checkRecords(i, data); err != nil {
			return err
		}
		u.Pos = record.PhysOffset(data)
		if end := l.cl.MaxOffset(); end != l.dataEnd {
			return fmt.Errorf("raftlog: the commitlog ends at %d, the raft log's data at %d (something else appended)", end, l.dataEnd)
		}
		blank, err := l.cl.PlaceAt(u.Pos, data)
		if err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrBadEntry, i, err)
		}
		if blank {
			u.Flags |= FlagBlank
		}
		l.dataEnd = u.Pos + int64(len(data))
	case KindConf, KindCmd:
		if e.GetType() == pb.EntryConfChange {
			u.Flags |= FlagConfV1
		}
		u.Pos = l.metaEnd
		if _, err := l.metaLog.WriteAt(data, u.Pos); err != nil {
			return fmt.Errorf("raftlog: write meta-log: %w", err)
		}
		l.metaEnd += int64(len(data))
		l.metaDirty = true
	}
	u.Encode(dst)
	l.last = i
	l.cache.add(e)
	if u.Kind == KindConf {
		l.newestConf = confAt{index: i, known: true}
	}
	return nil
}

// termLocked is Term without the lock; i in [first-1, last].
func (l *Log) termLocked(i uint64) (uint64, error) {
	if i+1 == l.first || i == 0 {
		return l.base.Term, nil
	}
	u, err := l.unitLocked(i)
	return u.Term, err
}

// checkRecords checks that data is whole records stamped for the offsets
// they will lie at: the records start at PHYSICALOFFSET of the first.
func (l *Log) checkRecords(i uint64, data []byte) error {
	pos := record.PhysOffset(data)
	for off := 0; off < len(data); {
		h, err := record.Check(data[off:], l.opts.RequireCRC)
		if err != nil {
			return fmt.Errorf("%w: entry %d: record at +%d: %w", ErrBadEntry, i, off, err)
		}
		if h.PhysOffset != pos+int64(off) {
			return fmt.Errorf("%w: entry %d: record at +%d stamped for %d, lies at %d", ErrBadEntry, i, off, h.PhysOffset, pos+int64(off))
		}
		off += int(h.Total)
	}
	return nil
}

// NextPos is where a DATA entry of n bytes proposed right after entry
// after (≤ LastIndex) would lie: the end of the last DATA entry up to
// after, or the start of the next file when n bytes and a blank do not fit
// the rest of that file (commitlog.Append's roll rule). A leader stamps
// from its own tail, which it sets from NextPos(LastIndex, ·) once ready.
func (l *Log) NextPos(after uint64, n int) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	end, err := l.dataEndAt(after)
	if err != nil {
		return 0, err
	}
	return Place(end, n, l.meta.FileSize), nil
}

// Place applies the roll rule: n bytes go at end, or at the next file's
// start when n plus a blank do not fit the rest of end's file.
func Place(end int64, n int, fileSize int64) int64 {
	if int64(n)+record.BlankLen > fileSize-end%fileSize {
		return end - end%fileSize + fileSize
	}
	return end
}

// dataEndAt is the commitlog offset past the last DATA entry ≤ i.
func (l *Log) dataEndAt(i uint64) (int64, error) {
	if i >= l.last {
		return l.dataEnd, nil
	}
	for ; i >= l.first; i-- {
		u, err := l.unitLocked(i)
		if err != nil {
			return 0, err
		}
		if u.Kind == KindData {
			return u.Pos + int64(u.Len), nil
		}
	}
	return l.base.DataEnd, nil
}

// metaEndAt is the meta-log offset past the last CONF/CMD payload ≤ i.
func (l *Log) metaEndAt(i uint64) (int64, error) {
	if i >= l.last {
		return l.metaEnd, nil
	}
	for ; i >= l.first; i-- {
		u, err := l.unitLocked(i)
		if err != nil {
			return 0, err
		}
		if u.Kind == KindConf || u.Kind == KindCmd {
			return u.Pos + int64(u.Len), nil
		}
	}
	return l.base.MetaEnd, nil
}

// truncateLocked drops entries k..last durably (design §2.3): (1) k must
// be above the commit index; (2) the commitlog bytes from the end of the
// last DATA entry kept are copied to commitlog/<offset>.truncated, (3)
// zeroed and synced, later files deleted (commitlog.TruncateAfter, which
// also moves the written and flushed ends back); the meta-log is cut and
// synced; (4) the units from k on are zeroed and synced. Only then do new
// entries go in. Steps (5)-(6) of the design (the put path's cached file
// and the checkpoint) belong to the store and the raft loop: the commitlog
// resets its own cached file; the checkpoint must be rewritten by the raft
// loop if its flushed offset lies past DurableEnd.
func (l *Log) truncateLocked(k uint64) error {
	commit := l.hs.cur.Commit
	if l.pending != nil {
		commit = max(commit, l.pending.GetCommit())
	}
	if k <= commit {
		return fmt.Errorf("%w: entry %d, commit %d", ErrTruncateCommitted, k, commit)
	}
	p, err := l.dataEndAt(k - 1)
	if err != nil {
		return err
	}
	m, err := l.metaEndAt(k - 1)
	if err != nil {
		return err
	}
	if err := l.cutCommitlog(p, ".truncated"); err != nil {
		return err
	}
	if m < l.metaEnd {
		if err := l.metaLog.Truncate(m); err != nil {
			return fmt.Errorf("raftlog: truncate meta-log: %w", err)
		}
		if err := l.metaLog.Sync(); err != nil {
			return fmt.Errorf("raftlog: sync meta-log: %w", err)
		}
	}
	if _, err := l.idx.zeroRange(k, l.last); err != nil {
		return err
	}
	l.last, l.dataEnd, l.metaEnd = k-1, p, m
	l.cache.cutFrom(k)
	if l.mark.Index > l.last {
		l.mark = markPoint{} // the next Sync sets it again
	}
	if l.newestConf.known && l.newestConf.index > l.last {
		l.newestConf.known = false // the one before it is not looked for (LastConf)
	}
	if l.markSaved > l.last {
		l.markSaved = 0 // the next SaveMark writes over it
	}
	l.markCut++
	if l.synced > l.last {
		l.synced = l.last
		l.durableEnd.Store(p)
	}
	l.hot = min(l.hot, l.last)
	return nil
}

// cutCommitlog removes the commitlog from p on, keeping a copy of the
// bytes in commitlog/<p><suffix>.
func (l *Log) cutCommitlog(p int64, suffix string) error {
	end := l.cl.MaxOffset()
	if end <= p {
		return nil
	}
	var saved []byte
	l.cl.ReadLock()
	for off := p; off < end; {
		b := l.cl.At(off)
		if len(b) == 0 {
			break
		}
		n := min(int64(len(b)), end-off)
		saved = append(saved, b[:n]...)
		off += n
	}
	l.cl.ReadUnlock()
	name := filepath.Join(l.cl.Files().Dir(), segment.FileName(p)+suffix)
	if err := l.opts.FS.WriteFile(name, saved); err != nil {
		return fmt.Errorf("raftlog: save the cut commitlog bytes: %w", err)
	}
	if err := l.cl.TruncateAfter(p); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return nil
}

// Sync makes everything appended and the HardState set so far durable, in
// the order recovery relies on: the commitlog bytes (one msync of the
// range not yet synced), the meta-log, the index units, then the HardState
// (one write into the next slot, synced when the term or vote changed).
// Raft may send messages for a Ready only after Sync returns.
//
// The flushes run without mu: raft's Step (a proposal, a follower's
// answer, under the replica's own lock) reads the Log (FirstIndex, Term,
// Entries), and made every proposal and every answer wait for the disk
// while the raft loop synced. Nothing they read moves meanwhile: only the
// raft goroutine appends, truncates and syncs, and compaction (another
// goroutine) drops only index files wholly at or below the synced index,
// never one being synced.
func (l *Log) Sync() error {
	l.mu.Lock()
	l.hsMu.Lock()
	herr := l.hsErr // a SyncCommit that failed stops the Log too
	l.hsMu.Unlock()
	if herr != nil && l.stopped == nil {
		l.stop(herr)
	}
	if l.stopped != nil {
		err := l.stopped
		l.mu.Unlock()
		return err
	}
	last, end, mend, conf, metaDirty, metaLog := l.last, l.dataEnd, l.metaEnd, l.newestConf, l.metaDirty, l.metaLog
	var units []segRange
	if last > l.synced {
		units = l.idx.syncRanges(l.synced+1, last)
	}
	l.mu.Unlock()

	start := time.Now()
	err := func() error {
		if _, err := l.cl.Sync(0); err != nil {
			return fmt.Errorf("raftlog: sync commitlog: %w", err)
		}
		if metaDirty {
			if err := metaLog.Sync(); err != nil {
				return fmt.Errorf("raftlog: sync meta-log: %w", err)
			}
		}
		for _, r := range units {
			if err := r.seg.Sync(r.lo, r.hi); err != nil {
				return fmt.Errorf("raftlog: sync index: %w", err)
			}
		}
		return nil
	}()
	l.syncLat.Observe(time.Since(start))

	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return l.stop(err)
	}
	if l.stopped != nil {
		return l.stopped
	}
	if metaDirty {
		l.metaDirty = false
	}
	if last > l.synced {
		l.synced = last
		l.durableEnd.Store(end)
		l.mark = markPoint{logBase{Index: last, DataEnd: end, MetaEnd: mend}, conf}
	}
	return l.writePendingLocked()
}

// writePendingLocked writes the HardState SetHardState left pending, if
// it changed anything (hardstate.go says when that syncs).
func (l *Log) writePendingLocked() error {
	hs := l.pending
	if hs == nil {
		return nil
	}
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	if err := l.hsErr; err != nil {
		return l.stop(err)
	}
	c := l.hs.cur
	// A commit never goes back: AdvanceCommit may have written a newer one
	// while this HardState waited for the Sync.
	commit := max(hs.GetCommit(), c.Commit)
	if c.Seq == 0 || hs.GetTerm() != c.Term || hs.GetVote() != c.Vote || commit != c.Commit {
		if err := l.hs.write(hs.GetTerm(), hs.GetVote(), commit); err != nil {
			return l.stop(err)
		}
	}
	l.pending = nil
	return nil
}

// WriteHardState sets hs and writes it now, before the Sync (hardstate.go
// says when that syncs): the raft loop applies committed entries it holds
// durably before it syncs the Ready's new ones, and a checkpoint taken
// meanwhile must find their commit written (SyncCommit syncs what is
// written). A commit past the entries synced is refused: on disk it would
// be damage to recovery; such a HardState goes through SetHardState and
// Sync. A nil or empty hs writes nothing.
func (l *Log) WriteHardState(hs *pb.HardState) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	if hs == nil || raft.IsEmptyHardState(hs) {
		return nil
	}
	if hs.GetCommit() > l.synced {
		return fmt.Errorf("raftlog: write a HardState with commit %d before entries up to %d are synced", hs.GetCommit(), l.synced)
	}
	l.pending = proto.Clone(hs).(*pb.HardState)
	return l.writePendingLocked()
}

// AdvanceCommit writes a commit-only HardState change now (not synced:
// hardstate.go), keeping the term and vote last written, so that a
// checkpoint of entries applied up to commit finds it (SyncCommit). The
// raft loop calls it when it applies entries the leader learned committed
// while its own Sync ran, before the Ready that will carry that commit.
// A commit past the entries synced is refused, as by WriteHardState; one
// at or below the commit written writes nothing. It does not wait for a
// Sync in progress (the flush runs without mu); a HardState left pending
// for that Sync keeps the higher commit when it is written.
func (l *Log) AdvanceCommit(commit uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped != nil {
		return l.stopped
	}
	if commit > l.synced {
		return fmt.Errorf("raftlog: advance the commit to %d before entries up to %d are synced", commit, l.synced)
	}
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	if err := l.hsErr; err != nil {
		return l.stop(err)
	}
	c := l.hs.cur
	if c.Seq == 0 || commit <= c.Commit {
		return nil
	}
	if err := l.hs.write(c.Term, c.Vote, commit); err != nil {
		return l.stop(err)
	}
	return nil
}

// SyncedIndex is the last raft index whose entry is durable here (its
// bytes and unit synced).
func (l *Log) SyncedIndex() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.synced
}

// SyncCommit makes the last HardState written durable if it is not yet.
// Sync writes a commit-only change without syncing it (hardstate.go), so
// the commit on disk may lag; whoever is about to persist something that
// depends on entries up to the commit (a checkpoint recording them
// dispatched, the state a command changes) calls SyncCommit first, so that
// no file of the data dir records a raft index above the commit on disk.
// An error is sticky, as every sync failure is. It does not wait for a
// Sync in progress (hsMu, not mu).
func (l *Log) SyncCommit() error {
	if l.halted.Load() {
		return fmt.Errorf("%w: SyncCommit", ErrStopped)
	}
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	if l.hsErr != nil {
		return l.hsErr
	}
	if l.hs == nil {
		return fmt.Errorf("%w: SyncCommit while the hardstate is reopened", ErrStopped)
	}
	if err := l.hs.syncCommit(); err != nil {
		l.hsErr = fmt.Errorf("%w: %w", ErrStopped, err)
		return err
	}
	return nil
}

// syncCommitLocked is SyncCommit for a caller holding mu.
func (l *Log) syncCommitLocked() error {
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	if l.hsErr != nil {
		return l.stop(l.hsErr)
	}
	if err := l.hs.syncCommit(); err != nil {
		return l.stop(err)
	}
	return nil
}

// durableCommitLocked is the commit on disk. REQUIRES: mu.
func (l *Log) durableCommitLocked() uint64 {
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	return l.hs.durable.Commit
}

// DurableEnd is the commitlog offset past the last DATA entry whose unit
// is synced: what a checkpoint in a group may record as flushed. It does
// not wait for a Sync in progress.
func (l *Log) DurableEnd() int64 {
	return l.durableEnd.Load()
}

// EntriesLatency is the histogram of Entries calls: how long raft waited
// for its storage, mostly to read the entries it sends a follower that is
// behind (storaged_raft_storage_entries_seconds).
func (l *Log) EntriesLatency() hist.Snapshot { return l.entriesLat.Snapshot() }

// SyncLatency is the histogram of Syncs: how long each took to make a
// Ready's writes durable (storaged_raft_log_sync_seconds, etcd's
// wal_fsync_duration_seconds). Every put's commit waits for one on the
// leader and on a majority.
func (l *Log) SyncLatency() hist.Snapshot { return l.syncLat.Snapshot() }

// DataEnd is the commitlog offset past the last DATA entry: the end of
// what a follower may still need from this log.
func (l *Log) DataEnd() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dataEnd
}

// WillNeed asks the kernel to read commitlog bytes [lo, hi) into the page
// cache ahead of the Entries calls that will copy them
// (commitlog.Log.WillNeed); it returns the bytes asked for. A stopped or
// closed Log asks for nothing.
func (l *Log) WillNeed(lo, hi int64) int64 {
	l.mu.Lock()
	stop := l.closed || l.stopped != nil
	l.mu.Unlock()
	if stop || hi <= lo {
		return 0
	}
	return l.cl.WillNeed(lo, hi)
}

// Close releases the Log's files. It syncs nothing (the raft loop syncs
// per Ready; an unsynced tail is what a crash would lose too), and it does
// not close the commitlog, which the store owns.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.stopped == nil {
		l.stopped = fmt.Errorf("%w: closed", ErrStopped)
	}
	return l.closeFiles()
}

func (l *Log) closeFiles() error {
	var errs []error
	if l.idx != nil {
		errs = append(errs, l.idx.close())
	}
	if l.metaLog != nil {
		errs = append(errs, l.metaLog.Close())
	}
	l.hsMu.Lock()
	if l.hs != nil {
		errs = append(errs, l.hs.close())
	}
	l.hsMu.Unlock()
	return errors.Join(errs...)
}
