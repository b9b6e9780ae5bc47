package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/storaged/storaged/storage/internal/base"
)

// Version is the manifest format this package writes and reads.
const Version = 1

// Bounds a manifest must respect: a decoder never allocates more than
// MaxManifestBytes allows, and a receiver never stages more files than
// MaxFiles.
const (
	// MaxManifestBytes bounds an encoded manifest (the MsgSnap's Data).
	MaxManifestBytes = 8 << 20
	// MaxFiles bounds the files of one snapshot (1 GiB files: 64 TiB).
	MaxFiles = 1 << 16
	// MaxQueues bounds the consume queues a manifest lists.
	MaxQueues = 1 << 18
	// MaxTopicLen is RocketMQ's topic length limit.
	MaxTopicLen = 127
	// MaxFileSize bounds the commitlog file size a manifest may declare.
	MaxFileSize = 1 << 40
)

// ErrBadManifest: a manifest that does not decode or breaks a rule.
var ErrBadManifest = errors.New("snapshot: bad manifest")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC is the CRC-32C (Castagnoli) the manifest and the chunks carry.
func CRC(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Manifest describes a snapshot at raft index Index (design §3.5).
type Manifest struct {
	Version int    `json:"version"`
	Index   uint64 `json:"index"` // S, the applied index the snapshot is taken at
	Term    uint64 `json:"term"`  // Term(S)
	// FileSize is the commitlog file size; the receiver's must be the same.
	FileSize int64 `json:"file_size"`
	// MinOffset is the start of the oldest file kept; End the commit end at
	// S (the commitlog offset past the last DATA entry up to S).
	MinOffset int64 `json:"min_offset"`
	End       int64 `json:"end"`
	// LastStoreTS is the newest store time of the records below End (0:
	// none); the receiver's scan must find the same.
	LastStoreTS int64 `json:"last_store_ts"`
	// Files are the commitlog files from MinOffset on, in order: every one
	// but the last sealed and whole (Size = FileSize), the last holding
	// the bytes up to End.
	Files []File `json:"files"`
	// Queues are the consume queues at S, sorted by topic and queue.
	Queues []Queue `json:"queues"`
	// Topics is the sender's topic table (name and queue count, sorted by
	// name): in a group it is replicated by commands of the log, which a
	// snapshot replaces. Counts only grow, so a table a little newer than
	// S is the same as the one at S once the entries after S apply.
	Topics []Topic `json:"topics,omitempty"`
	// Deleted are the sender's topic tombstones (name and the commitlog
	// offset of its last delete, sorted by name): records of a deleted
	// topic below its offset are never indexed, and a receiver that had
	// the topic drops its queues. TopicsIndex is the raft index of the
	// last topic command the table and tombstones reflect (0: S): the
	// receiver applies only topic commands after it.
	Deleted     []Tombstone `json:"deleted,omitempty"`
	TopicsIndex uint64      `json:"topics_index,omitempty"`
	// Delay is the delay-level progress replicated by the log's progress
	// commands (level → next queue offset of its schedule queue, levels
	// strictly increasing), DelayIndex the raft index of the command that
	// set it last; Timer and TimerIndex the timer-message progress and its
	// command's index (nil: none yet). The commands are compacted away
	// with the log the snapshot replaces, so the snapshot carries what
	// they set: a receiver that then leads resumes deliveries from it
	// instead of repeating them. Like Topics they may be a little newer
	// than S (the sender's applied state): a progress command follows the
	// re-puts it covers, and a member can lead only once it holds every
	// committed entry, those re-puts among them.
	Delay      []DelayLevel `json:"delay,omitempty"`
	DelayIndex uint64       `json:"delay_index,omitempty"`
	Timer      *Timer       `json:"timer,omitempty"`
	TimerIndex uint64       `json:"timer_index,omitempty"`
	// PeerAddrs are the peer addresses the group's conf changes named for
	// the members they added, and Removed the ids they removed (raftlog's
	// raft/conf): the conf changes are compacted away with the log the
	// snapshot replaces, and the receiver's transport needs the addresses
	// of members its flags may not list. The membership itself travels in
	// raft's snapshot metadata.
	PeerAddrs map[uint64]string `json:"peer_addrs,omitempty"`
	Removed   []uint64          `json:"removed,omitempty"`
}

// MaxMembers bounds a manifest's peer addresses and removed ids.
const MaxMembers = 1024

// maxPeerAddrLen bounds one peer address of a manifest.
const maxPeerAddrLen = 256

// Tombstone is one deleted topic of a snapshot.
type Tombstone struct {
	Name string `json:"name"`
	At   int64  `json:"at"`
}

// DelayLevel is one level of a snapshot's delay progress.
type DelayLevel struct {
	Level int   `json:"level"`
	Next  int64 `json:"next"`
}

// Timer is a snapshot's timer-message progress (storage/timers.Progress).
type Timer struct {
	Low      int64 `json:"low"`
	Ingested int64 `json:"ingested"`
	DueMS    int64 `json:"due_ms"`
	Phys     int64 `json:"phys"`
}

// MaxDelayLevels bounds a manifest's delay levels (the store's progress
// command takes as many).
const MaxDelayLevels = 1024

// Topic is one topic of a snapshot's topic table.
type Topic struct {
	Name   string `json:"name"`
	Queues int32  `json:"queues"`
}

// File is one commitlog file of a snapshot: the commitlog offset of its
// first byte, how many bytes of it are sent, and their CRC-32C.
type File struct {
	From int64  `json:"from"`
	Size int64  `json:"size"`
	CRC  uint32 `json:"crc32c"`
}

// Queue is one consume queue at S: First is the queue offset of its first
// message at or past MinOffset (Next when retention removed them all),
// Next the offset its next message takes. The receiver's queue starts at
// First (RocketMQ's fill-pre-blank), and its rebuild must reach Next.
type Queue struct {
	Topic string `json:"topic"`
	Queue int32  `json:"queue"`
	First int64  `json:"first"`
	Next  int64  `json:"next"`
}

// Bytes is the sum of the file bytes the snapshot transfers.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Check reports why m breaks the rules, or nil: the version; a file size
// within bounds; MinOffset on a file boundary and End not below it; the
// files contiguous from MinOffset, exactly as many as reach End, every one
// but the last whole and the last ending at End; queues sorted, unique,
// with sane names and 0 ≤ First ≤ Next.
func (m *Manifest) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadManifest, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Version != Version:
		return bad("version %d, want %d", m.Version, Version)
	case m.FileSize <= 0 || m.FileSize > MaxFileSize:
		return bad("file size %d", m.FileSize)
	case m.MinOffset < 0 || m.MinOffset%m.FileSize != 0:
		return bad("min offset %d is not a file start", m.MinOffset)
	case m.End < m.MinOffset:
		return bad("end %d below the min offset %d", m.End, m.MinOffset)
	case m.Index == 0 || m.Term == 0:
		return bad("index %d, term %d: a snapshot is of an index with a term", m.Index, m.Term)
	case m.LastStoreTS < 0:
		return bad("last store time %d", m.LastStoreTS)
	case len(m.Files) > MaxFiles:
		return bad("%d files, at most %d", len(m.Files), MaxFiles)
	case len(m.Queues) > MaxQueues:
		return bad("%d queues, at most %d", len(m.Queues), MaxQueues)
	case len(m.PeerAddrs) > MaxMembers || len(m.Removed) > MaxMembers:
		return bad("%d peer addresses and %d removed ids, at most %d each", len(m.PeerAddrs), len(m.Removed), MaxMembers)
	}
	for id, addr := range m.PeerAddrs {
		if id == 0 || addr == "" || len(addr) > maxPeerAddrLen {
			return bad("peer address of member %d: %d bytes (1 to %d)", id, len(addr), maxPeerAddrLen)
		}
	}
	want := (m.End - m.MinOffset + m.FileSize - 1) / m.FileSize
	if int64(len(m.Files)) != want {
		return bad("%d files from %d to %d, want %d", len(m.Files), m.MinOffset, m.End, want)
	}
	for i, f := range m.Files {
		from := m.MinOffset + int64(i)*m.FileSize
		size := m.FileSize
		if i == len(m.Files)-1 {
			size = m.End - from
		}
		if f.From != from || f.Size != size {
			return bad("file %d is [%d, +%d), want [%d, +%d)", i, f.From, f.Size, from, size)
		}
	}
	if len(m.Topics) > MaxQueues {
		return bad("%d topics, at most %d", len(m.Topics), MaxQueues)
	}
	for i, tp := range m.Topics {
		if tp.Name == "" || len(tp.Name) > MaxTopicLen || tp.Queues <= 0 {
			return bad("topic %q with %d queues", trunc(tp.Name), tp.Queues)
		}
		if i > 0 && m.Topics[i-1].Name >= tp.Name {
			return bad("topics not sorted and unique at %q", trunc(tp.Name))
		}
	}
	if len(m.Deleted) > MaxQueues {
		return bad("%d tombstones, at most %d", len(m.Deleted), MaxQueues)
	}
	for i, d := range m.Deleted {
		if d.Name == "" || len(d.Name) > MaxTopicLen || d.At < 0 || (i > 0 && m.Deleted[i-1].Name >= d.Name) {
			return bad("tombstone %q at %d (names sorted and unique)", trunc(d.Name), d.At)
		}
	}
	if len(m.Delay) > MaxDelayLevels {
		return bad("%d delay levels, at most %d", len(m.Delay), MaxDelayLevels)
	}
	for i, d := range m.Delay {
		if d.Level < 1 || d.Level > MaxDelayLevels || d.Next < 0 || (i > 0 && m.Delay[i-1].Level >= d.Level) {
			return bad("delay level %d at %d (levels from 1 to %d, increasing, offsets not negative)", d.Level, d.Next, MaxDelayLevels)
		}
	}
	if len(m.Delay) > 0 && m.DelayIndex == 0 {
		return bad("delay progress of %d levels at raft index %d", len(m.Delay), m.DelayIndex)
	}
	if t := m.Timer; (t == nil) != (m.TimerIndex == 0) ||
		(t != nil && (t.Low < 0 || t.Ingested < t.Low || t.Phys < 0)) {
		return bad("timer progress %+v at raft index %d", t, m.TimerIndex)
	}
	for i, q := range m.Queues {
		if q.Topic == "" || len(q.Topic) > MaxTopicLen || q.Queue < 0 || q.First < 0 || q.First > q.Next {
			return bad("queue %q/%d: first %d, next %d", trunc(q.Topic), q.Queue, q.First, q.Next)
		}
		if i > 0 && cmpQueue(m.Queues[i-1], q) >= 0 {
			return bad("queues not sorted and unique at %q/%d", trunc(q.Topic), q.Queue)
		}
	}
	return nil
}

func cmpQueue(a, b Queue) int {
	if c := bytes.Compare([]byte(a.Topic), []byte(b.Topic)); c != 0 {
		return c
	}
	return int(a.Queue) - int(b.Queue)
}

// SortQueues sorts qs as Check wants them.
func SortQueues(qs []Queue) { slices.SortFunc(qs, cmpQueue) }

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Encode checks m and encodes it: JSON sealed with a CRC (base.Seal).
func (m *Manifest) Encode() ([]byte, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("snapshot: encode manifest: %w", err)
	}
	b := base.Seal(body)
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %d bytes encoded, at most %d", ErrBadManifest, len(b), MaxManifestBytes)
	}
	return b, nil
}

// Decode decodes and checks a manifest. Input over MaxManifestBytes, a
// wrong seal, unknown fields or a broken rule are ErrBadManifest.
func Decode(b []byte) (Manifest, error) {
	if len(b) > MaxManifestBytes {
		return Manifest{}, fmt.Errorf("%w: %d bytes, at most %d", ErrBadManifest, len(b), MaxManifestBytes)
	}
	body, ok := base.Unseal(b)
	if !ok {
		return Manifest{}, fmt.Errorf("%w: the seal's CRC does not match", ErrBadManifest)
	}
	var m Manifest
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %w", ErrBadManifest, err)
	}
	if d.More() {
		return Manifest{}, fmt.Errorf("%w: trailing data", ErrBadManifest)
	}
	if err := m.Check(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}
