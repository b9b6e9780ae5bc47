package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/storaged/storaged/storage/timers"
)

// Group-mode commands (design replication.md §2.1, §3.5): raft entries
// that are not records, kept by raftlog as CMD entries in its meta-log and
// applied by every replica in log order. Layout, big-endian:
//
//	0  u32 total length (the entry's length)
//	4  u32 cmdMagic: never a record magic, so raftlog classifies it CMD
//	8  u8  kind
//	9  the kind's payload
//
// cmdDelayProgress: u16 count, then count × {u16 level (1-based), i64 next
// queue offset of that level's schedule queue}, levels strictly
// increasing, offsets not negative. The leader's scheduler proposes one
// after each round that delivered, so it follows in the log the re-puts
// it covers; a new leader resumes from the last one committed.
//
// cmdTimerProgress: u8 version (1), then i64 Low, i64 Ingested, i64 DueMS,
// i64 Phys (storage/timers.Progress). The leader's timer service proposes
// one after each round that delivered or recalled, after the re-puts it
// covers committed; a new leader rebuilds its due index from the last one
// committed.
//
// cmdTopic: u16 name length, the topic's name, i32 queue count: create the
// topic with that many queues, or raise its count to it (never lower it:
// every replica applies max(current, count), so concurrent creates and
// raises of one topic commute). The leader proposes one for CreateTopic,
// UpdateTopic and a put's auto-create, and answers once it applied it.
//
// cmdTopicDelete: u16 name length, the topic's name: delete the topic
// (grouptopics.go). Every replica removes it from its table, tombstones it
// at the commitlog offset past the last DATA entry before the command (its
// records below are never indexed again) and drops its consume queues.
const (
	cmdMagic         uint32 = 0x53444D43 // "SDMC"
	cmdHeader               = 9
	cmdDelayProgress byte   = 1
	cmdTimerProgress byte   = 2
	timerCmdVersion  byte   = 1
	timerCmdLen             = cmdHeader + 1 + 4*8
	cmdTopic         byte   = 3
	cmdTopicDelete   byte   = 4
	// maxCmdLevels bounds a decoded progress command (the delay table's
	// levels; RocketMQ's has 18).
	maxCmdLevels = 1024
)

// errBadCmd: a command entry that does not decode (a replica applies only
// what its leader encoded; a bad one is corruption or a newer format).
var errBadCmd = errors.New("storage: bad group command")

// encodeDelayProgress encodes next (level → next queue offset) for the
// levels 1..len(next).
func encodeDelayProgress(next []int64) []byte {
	b := make([]byte, cmdHeader+2+10*len(next))
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[4:], cmdMagic)
	b[8] = cmdDelayProgress
	binary.BigEndian.PutUint16(b[9:], uint16(len(next)))
	for i, off := range next {
		p := cmdHeader + 2 + 10*i
		binary.BigEndian.PutUint16(b[p:], uint16(i+1))
		binary.BigEndian.PutUint64(b[p+2:], uint64(off))
	}
	return b
}

// isDelayProgress tells whether b is a delay progress command (its header
// only; decodeDelayProgress checks the rest).
func isDelayProgress(b []byte) bool {
	return len(b) >= cmdHeader && binary.BigEndian.Uint32(b[4:]) == cmdMagic && b[8] == cmdDelayProgress
}

// decodeDelayProgress decodes a delay progress command into level → next
// queue offset.
func decodeDelayProgress(b []byte) (map[int]int64, error) {
	if !isDelayProgress(b) {
		return nil, fmt.Errorf("%w: not a delay progress command", errBadCmd)
	}
	if n := binary.BigEndian.Uint32(b[0:]); int64(n) != int64(len(b)) {
		return nil, fmt.Errorf("%w: length field %d, entry %d bytes", errBadCmd, n, len(b))
	}
	if len(b) < cmdHeader+2 {
		return nil, fmt.Errorf("%w: %d bytes, no count", errBadCmd, len(b))
	}
	count := int(binary.BigEndian.Uint16(b[cmdHeader:]))
	if count > maxCmdLevels || len(b) != cmdHeader+2+10*count {
		return nil, fmt.Errorf("%w: %d levels in %d bytes", errBadCmd, count, len(b))
	}
	out := make(map[int]int64, count)
	last := 0
	for i := range count {
		p := cmdHeader + 2 + 10*i
		level := int(binary.BigEndian.Uint16(b[p:]))
		off := int64(binary.BigEndian.Uint64(b[p+2:]))
		if level <= last || off < 0 {
			return nil, fmt.Errorf("%w: level %d (after %d) at offset %d", errBadCmd, level, last, off)
		}
		out[level], last = off, level
	}
	return out, nil
}

// encodeTimerProgress encodes the timer service's progress.
func encodeTimerProgress(p timers.Progress) []byte {
	b := make([]byte, timerCmdLen)
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[4:], cmdMagic)
	b[8] = cmdTimerProgress
	b[9] = timerCmdVersion
	for i, v := range []int64{p.Low, p.Ingested, p.DueMS, p.Phys} {
		binary.BigEndian.PutUint64(b[10+8*i:], uint64(v))
	}
	return b
}

// isTimerProgress tells whether b is a timer progress command (its header
// only; decodeTimerProgress checks the rest).
func isTimerProgress(b []byte) bool {
	return len(b) >= cmdHeader && binary.BigEndian.Uint32(b[4:]) == cmdMagic && b[8] == cmdTimerProgress
}

// decodeTimerProgress decodes a timer progress command.
func decodeTimerProgress(b []byte) (timers.Progress, error) {
	if !isTimerProgress(b) {
		return timers.Progress{}, fmt.Errorf("%w: not a timer progress command", errBadCmd)
	}
	if len(b) != timerCmdLen || int64(binary.BigEndian.Uint32(b[0:])) != int64(len(b)) {
		return timers.Progress{}, fmt.Errorf("%w: timer progress of %d bytes (length field %d), want %d", errBadCmd, len(b), binary.BigEndian.Uint32(b[0:]), timerCmdLen)
	}
	if b[9] != timerCmdVersion {
		return timers.Progress{}, fmt.Errorf("%w: timer progress version %d (this build reads %d)", errBadCmd, b[9], timerCmdVersion)
	}
	var v [4]int64
	for i := range v {
		v[i] = int64(binary.BigEndian.Uint64(b[10+8*i:]))
	}
	p := timers.Progress{Low: v[0], Ingested: v[1], DueMS: v[2], Phys: v[3]}
	if err := p.Check(); err != nil {
		return timers.Progress{}, fmt.Errorf("%w: %w", errBadCmd, err)
	}
	return p, nil
}

// encodeTopicCmd encodes a topic command (name valid, queues in range: the
// caller checked them).
func encodeTopicCmd(name string, queues int32) []byte {
	b := make([]byte, cmdHeader+2+len(name)+4)
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[4:], cmdMagic)
	b[8] = cmdTopic
	binary.BigEndian.PutUint16(b[9:], uint16(len(name)))
	copy(b[11:], name)
	binary.BigEndian.PutUint32(b[11+len(name):], uint32(queues))
	return b
}

// isTopicCmd tells whether b is a topic command (its header only).
func isTopicCmd(b []byte) bool {
	return len(b) >= cmdHeader && binary.BigEndian.Uint32(b[4:]) == cmdMagic && b[8] == cmdTopic
}

// decodeTopicCmd decodes a topic command; the name and count are checked
// as CreateTopic checks them.
func decodeTopicCmd(b []byte) (string, int32, error) {
	if !isTopicCmd(b) {
		return "", 0, fmt.Errorf("%w: not a topic command", errBadCmd)
	}
	if n := binary.BigEndian.Uint32(b[0:]); int64(n) != int64(len(b)) || len(b) < cmdHeader+2 {
		return "", 0, fmt.Errorf("%w: length field %d, entry %d bytes", errBadCmd, n, len(b))
	}
	l := int(binary.BigEndian.Uint16(b[cmdHeader:]))
	if len(b) != cmdHeader+2+l+4 {
		return "", 0, fmt.Errorf("%w: a %d-byte name in %d bytes", errBadCmd, l, len(b))
	}
	name := string(b[cmdHeader+2 : cmdHeader+2+l])
	queues := int32(binary.BigEndian.Uint32(b[cmdHeader+2+l:]))
	if p := TopicNameProblem(name); p != "" || NotAllowedSendTopic(name) {
		return "", 0, fmt.Errorf("%w: topic %q: %s", errBadCmd, name, p)
	}
	if verr := checkQueues(queues); verr != nil {
		return "", 0, fmt.Errorf("%w: topic %s: %v", errBadCmd, name, verr)
	}
	return name, queues, nil
}

// encodeTopicDeleteCmd encodes a topic delete (name valid: the caller
// checked it).
func encodeTopicDeleteCmd(name string) []byte {
	b := make([]byte, cmdHeader+2+len(name))
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[4:], cmdMagic)
	b[8] = cmdTopicDelete
	binary.BigEndian.PutUint16(b[9:], uint16(len(name)))
	copy(b[11:], name)
	return b
}

// isTopicDeleteCmd tells whether b is a topic delete (its header only).
func isTopicDeleteCmd(b []byte) bool {
	return len(b) >= cmdHeader && binary.BigEndian.Uint32(b[4:]) == cmdMagic && b[8] == cmdTopicDelete
}

// isTopicChangeCmd: a topic create, raise or delete (replayed in log
// order at Open).
func isTopicChangeCmd(b []byte) bool { return isTopicCmd(b) || isTopicDeleteCmd(b) }

// decodeTopicDeleteCmd decodes a topic delete; the name is checked as
// DeleteTopic checks it.
func decodeTopicDeleteCmd(b []byte) (string, error) {
	if !isTopicDeleteCmd(b) {
		return "", fmt.Errorf("%w: not a topic delete command", errBadCmd)
	}
	if n := binary.BigEndian.Uint32(b[0:]); int64(n) != int64(len(b)) || len(b) < cmdHeader+2 {
		return "", fmt.Errorf("%w: length field %d, entry %d bytes", errBadCmd, n, len(b))
	}
	l := int(binary.BigEndian.Uint16(b[cmdHeader:]))
	if len(b) != cmdHeader+2+l {
		return "", fmt.Errorf("%w: a %d-byte name in %d bytes", errBadCmd, l, len(b))
	}
	name := string(b[cmdHeader+2:])
	if p := TopicNameProblem(name); p != "" || SystemTopic(name) {
		return "", fmt.Errorf("%w: topic %q: %s", errBadCmd, name, p)
	}
	return name, nil
}
