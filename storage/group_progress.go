package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"maps"
	"path/filepath"
	"slices"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/timers"
	"github.com/storaged/storaged/storage/vfs"
)

// The scheduled-delivery progress of a group (design replication.md §3.5)
// lives in commands of the raft log: the delay scheduler's {level → next
// queue offset} and the timer service's timers.Progress. Open recovers it
// from the last such commands at or below the commit index
// (raftlog.LastCmd), which works only while the log still holds them.
// Two things drop them: retention's compaction (raftlog.CompactBelow,
// before it deletes files) and a snapshot install (the log restarts at a
// base past them). Losing the progress never loses a delivery (a new
// leader would start its schedule queues from their oldest message), but
// it repeats every delivery still in them, which §3.5 forbids beyond the
// last progress entry. So the progress travels with what replaces the
// commands:
//
//   - config/groupProgress.json holds the progress this replica applied
//     and the raft index of each command that set it, written before each
//     compaction and at each install; Open reads it, then the commands
//     still in the log at or below the commit index, keeping the newer
//     (delay levels only grow, timer progress by raft index);
//   - a snapshot's manifest carries the sender's progress and indexes
//     (snapshot.Manifest.Delay, Timer), which the install applies and
//     writes to that file before it removes its journal; a roll-forward
//     at Open writes it from the journal's manifest.
//
// A progress newer than a snapshot's index or than the commit index on
// disk is still safe to resume from: it was applied, so committed, and a
// progress command follows in the log the re-puts it covers; a member can
// lead only once it holds every committed entry, those re-puts among
// them. A damaged file is logged and ignored (deliveries then repeat,
// none is lost).

// progressName is the replicated progress file in the config dir.
const progressName = "groupProgress.json"

// groupProgress is the replicated progress: the file's body, and what a
// snapshot manifest carries.
type groupProgress struct {
	Delay      map[int]int64    `json:"delay,omitempty"`
	DelayIndex uint64           `json:"delay_index,omitempty"`
	Timer      *timers.Progress `json:"timer,omitempty"`
	TimerIndex uint64           `json:"timer_index,omitempty"`
	// Through (the file only): an index this replica had applied before
	// the progress was read, so the file holds the newest progress
	// commands at or below it; a start reads only the commands past it
	// from the log (loadProgress). 0: unknown, the whole log is read.
	Through uint64 `json:"through,omitempty"`
}

// progress returns a copy of the replicated progress this replica applied.
func (g *groupState) progress() groupProgress {
	g.delayMu.Lock()
	defer g.delayMu.Unlock()
	p := groupProgress{Delay: maps.Clone(g.delayProg), DelayIndex: g.delayIndex, TimerIndex: g.timerIndex}
	if g.timerIndex > 0 {
		t := g.timerProg
		p.Timer = &t
	}
	return p
}

// setProgress merges p into the replicated progress (setDelayProgress's
// and setTimerProgress's rules: the newer wins).
func (g *groupState) setProgress(p groupProgress) {
	if p.DelayIndex > 0 {
		g.setDelayProgress(p.Delay, p.DelayIndex)
	}
	if p.Timer != nil && p.TimerIndex > 0 {
		g.setTimerProgress(*p.Timer, p.TimerIndex)
	}
}

// check reports why p cannot be resumed from, or nil.
func (p groupProgress) check() error {
	for level, off := range p.Delay {
		if level < 1 || level > maxCmdLevels || off < 0 {
			return fmt.Errorf("delay level %d at %d", level, off)
		}
	}
	if p.Timer != nil {
		return p.Timer.Check()
	}
	return nil
}

// readProgress reads config/groupProgress.json in dir (the data dir); the
// zero progress when there is none, an error when it is damaged.
func readProgress(fsys vfs.FS, dir string) (groupProgress, error) {
	b, err := fsys.ReadFile(filepath.Join(dir, "config", progressName))
	if errors.Is(err, iofs.ErrNotExist) {
		return groupProgress{}, nil
	}
	if err != nil {
		return groupProgress{}, fmt.Errorf("storage: read %s: %w", progressName, err)
	}
	body, ok := base.Unseal(b)
	var p groupProgress
	if !ok || json.Unmarshal(body, &p) != nil {
		return groupProgress{}, fmt.Errorf("storage: %s is damaged", progressName)
	}
	if err := p.check(); err != nil {
		return groupProgress{}, fmt.Errorf("storage: %s: %w", progressName, err)
	}
	return p, nil
}

// writeProgress replaces config/groupProgress.json in dir atomically
// (temp file, fsync, rename, dir sync).
func writeProgress(fsys vfs.FS, dir string, p groupProgress) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := base.WriteAtomic(fsys, filepath.Join(dir, "config"), progressName, base.Seal(body)); err != nil {
		return fmt.Errorf("storage: write %s: %w", progressName, err)
	}
	return nil
}

// persistProgress writes the replicated progress applied so far, unless
// the file holds it already: before the raft log drops the commands that
// set it, and (every > 0) whenever through, an index applied before the
// progress is read, is every past the file's (raftPoint, so that a start
// reads only the commands past it: loadProgress). through 0: unknown.
func (s *Store) persistProgress(through, every uint64) error {
	g := s.group
	g.progressMu.Lock()
	defer g.progressMu.Unlock()
	p := g.progress()
	p.Through = through
	moved := every > 0 && through >= g.progressThrough+every
	if p.DelayIndex == g.progressWritten[0] && p.TimerIndex == g.progressWritten[1] && !moved {
		return nil
	}
	if err := writeProgress(s.opts.FS, s.opts.Dir, p); err != nil {
		return err
	}
	g.progressWritten = [2]uint64{p.DelayIndex, p.TimerIndex}
	g.progressThrough = through
	return nil
}

// loadProgress is Open's: the progress file, then the newest commands at
// or below commit still in the raft log.
func (s *Store) loadProgress(commit uint64) error {
	g := s.group
	var lo uint64 // the commands from lo on are read from the log
	if p, err := readProgress(s.opts.FS, s.opts.Dir); err != nil {
		s.opts.Logger.Warn().Err(err).Msg("storage: replicated delivery progress file ignored; deliveries it covered may repeat")
	} else {
		g.setProgress(p)
		g.progressWritten, g.progressThrough = [2]uint64{p.DelayIndex, p.TimerIndex}, p.Through
		if p.Through <= commit {
			lo = p.Through + 1
		}
	}
	// Raft hands back no entry at or below the commit index, so the last
	// progress commands there are read from the log itself: those past
	// what the file holds (Through), not every retained unit.
	if b, idx, err := g.rlog.LastCmd(lo, commit, isDelayProgress); err != nil {
		return err
	} else if b != nil {
		p, err := decodeDelayProgress(b)
		if err != nil {
			return fmt.Errorf("storage: the delay progress command at raft index %d: %w", idx, err)
		}
		g.setDelayProgress(p, idx)
	}
	if b, idx, err := g.rlog.LastCmd(lo, commit, isTimerProgress); err != nil {
		return err
	} else if b != nil {
		p, err := decodeTimerProgress(b)
		if err != nil {
			return fmt.Errorf("storage: the timer progress command at raft index %d: %w", idx, err)
		}
		g.setTimerProgress(p, idx)
	}
	return nil
}

// manifestProgress puts p into a snapshot manifest.
func manifestProgress(m *snapshot.Manifest, p groupProgress) {
	for _, level := range slices.Sorted(maps.Keys(p.Delay)) {
		m.Delay = append(m.Delay, snapshot.DelayLevel{Level: level, Next: p.Delay[level]})
	}
	if len(m.Delay) > 0 {
		m.DelayIndex = p.DelayIndex
	}
	if p.Timer != nil {
		t := *p.Timer
		m.Timer = &snapshot.Timer{Low: t.Low, Ingested: t.Ingested, DueMS: t.DueMS, Phys: t.Phys}
		m.TimerIndex = p.TimerIndex
	}
}

// snapshotProgress is a snapshot manifest's progress.
func snapshotProgress(m snapshot.Manifest) groupProgress {
	var p groupProgress
	if len(m.Delay) > 0 {
		p.Delay = make(map[int]int64, len(m.Delay))
		for _, d := range m.Delay {
			p.Delay[d.Level] = d.Next
		}
		p.DelayIndex = m.DelayIndex
	}
	if t := m.Timer; t != nil {
		p.Timer = &timers.Progress{Low: t.Low, Ingested: t.Ingested, DueMS: t.DueMS, Phys: t.Phys}
		p.TimerIndex = m.TimerIndex
	}
	return p
}

// mergeProgress is a merged with b by the rules of setProgress.
func mergeProgress(a, b groupProgress) groupProgress {
	out := groupProgress{Delay: maps.Clone(a.Delay), DelayIndex: max(a.DelayIndex, b.DelayIndex), Timer: a.Timer, TimerIndex: a.TimerIndex}
	if len(b.Delay) > 0 && out.Delay == nil {
		out.Delay = map[int]int64{}
	}
	for level, off := range b.Delay {
		out.Delay[level] = max(out.Delay[level], off)
	}
	if b.Timer != nil && b.TimerIndex >= a.TimerIndex {
		out.Timer, out.TimerIndex = b.Timer, b.TimerIndex
	}
	return out
}
