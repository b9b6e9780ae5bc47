package history

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Record is one message found in a queue at the end of a scenario.
type Record struct {
	Offset          int64
	Value           string
	CommitLogOffset int64
}

// Stored is every queue's records, read back after healing.
type Stored map[int32][]Record

// at finds the record at a queue offset.
func (s Stored) at(q int32, off int64) (Record, bool) {
	rs := s[q]
	i := sort.Search(len(rs), func(i int) bool { return rs[i].Offset >= off })
	if i < len(rs) && rs[i].Offset == off {
		return rs[i], true
	}
	return Record{}, false
}

// maxListed bounds how many problems an error spells out.
const maxListed = 20

func joined(what string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	n := len(problems)
	if n > maxListed {
		problems = append(problems[:maxListed:maxListed], fmt.Sprintf("… and %d more", n-maxListed))
	}
	errs := []error{fmt.Errorf("%d %s", n, what)}
	for _, p := range problems {
		errs = append(errs, errors.New(p))
	}
	return errors.Join(errs...)
}

// Lost checks checker (a): every ok put is stored at its (queue, offset)
// with its value and, when the server named one, at its commitlog offset
// (for one replica, this is the check that stored bytes are what the acks
// say). It returns the number of acked puts.
func Lost(ops []Op, stored Stored) (acked int, err error) {
	var problems []string
	for _, o := range ops {
		if o.Kind != Put || o.Outcome != OK {
			continue
		}
		acked++
		r, ok := stored.at(o.Queue, o.Offset)
		switch {
		case !ok:
			problems = append(problems, "lost: "+o.String()+": nothing stored there")
		case r.Value != o.Value:
			problems = append(problems, fmt.Sprintf("lost: %s: %q stored there", o, r.Value))
		case r.CommitLogOffset != o.CommitLogOffset:
			problems = append(problems, fmt.Sprintf("moved: %s: stored at commitlog %d", o, r.CommitLogOffset))
		}
	}
	return acked, joined("acked puts not stored as acked", problems)
}

// Duplicates checks checker (c): a value stored k times needs k sends that
// may have stored it (ok or unknown), and more than one only if one of them
// was unknown or a retry; a value never sent, or whose every send failed
// definitely, must not be stored at all. It returns how many extra copies
// were found (all of them explained when err is nil).
func Duplicates(ops []Op, stored Stored) (dups int, err error) {
	type sends struct{ maybe, unknownOrRetry int }
	by := map[string]*sends{}
	for _, o := range ops {
		if o.Kind != Put {
			continue
		}
		s := by[o.Value]
		if s == nil {
			s = &sends{}
			by[o.Value] = s
		}
		if o.Outcome != Fail {
			s.maybe++
		}
		if o.Outcome == Unknown || o.Outcome == Pending || o.Attempt > 0 {
			s.unknownOrRetry++
		}
	}
	count := map[string]int{}
	where := map[string][]string{}
	for q, rs := range stored {
		for _, r := range rs {
			count[r.Value]++
			where[r.Value] = append(where[r.Value], fmt.Sprintf("q%d@%d", q, r.Offset))
		}
	}
	var problems []string
	for _, v := range slices.Sorted(maps.Keys(count)) {
		k := count[v]
		s := by[v]
		switch {
		case s == nil:
			problems = append(problems, fmt.Sprintf("unexpected: %q stored at %v, never sent", v, where[v]))
		case s.maybe == 0:
			problems = append(problems, fmt.Sprintf("unexpected: %q stored at %v, every send failed definitely", v, where[v]))
		case k > 1 && (k > s.maybe || s.unknownOrRetry == 0):
			problems = append(problems, fmt.Sprintf("duplicate: %q stored %d times at %v after %d possible sends (%d unknown or retried)",
				v, k, where[v], s.maybe, s.unknownOrRetry))
		}
		if k > 1 {
			dups += k - 1
		}
	}
	return dups, joined("stored values no send explains", problems)
}

// Liveness checks checker (e): at least minPerSec operations finished ok
// per second of the run, so a scenario whose clients never got through
// cannot pass. It returns the rate.
func Liveness(ops []Op, run time.Duration, minPerSec float64) (float64, error) {
	n := 0
	for _, o := range ops {
		if o.Outcome == OK {
			n++
		}
	}
	rate := float64(n) / run.Seconds()
	if rate < minPerSec {
		return rate, fmt.Errorf("liveness: %d ok operations in %v = %.1f/s, below the floor of %.1f/s", n, run, rate, minPerSec)
	}
	return rate, nil
}

// FirstOKAfter is how long after t (history time) the first put began that
// ended ok, for "writes succeed within 5 s of healing"; false if none did.
func FirstOKAfter(ops []Op, t int64) (time.Duration, bool) {
	best := int64(-1)
	for _, o := range ops {
		if o.Kind == Put && o.Outcome == OK && o.Return >= t && (best < 0 || o.Return < best) {
			best = o.Return
		}
	}
	if best < 0 {
		return 0, false
	}
	return time.Duration(best - t), true
}

// WritesAfterHeals checks the liveness rule (e), "writes succeed within
// `within` of healing": for each heal (history time), how long until the
// first put that returned ok at or after it. Only a heal that stayed
// healed for `within` (no fault of starts began in that time, and the
// history went on until end) is held to the bound: a heal followed sooner
// by the next fault may see no write before it, which says nothing about
// recovery. A held heal with no ok put within the bound is an error. It
// returns the time for every heal an ok put followed, in heal order, and
// how many heals were held to the bound.
func WritesAfterHeals(ops []Op, heals, starts []int64, end int64, within time.Duration) (ds []time.Duration, held int, err error) {
	var rets []int64 // returns of ok puts, sorted
	for _, o := range ops {
		if o.Kind == Put && o.Outcome == OK {
			rets = append(rets, o.Return)
		}
	}
	slices.Sort(rets)
	var problems []string
	for _, h := range heals {
		first := int64(-1)
		if i, _ := slices.BinarySearch(rets, h); i < len(rets) {
			first = rets[i]
			ds = append(ds, time.Duration(first-h))
		}
		healedUntil := end
		for _, s := range starts {
			if s >= h && s < healedUntil {
				healedUntil = s
			}
		}
		if time.Duration(healedUntil-h) < within {
			continue
		}
		held++
		switch {
		case first < 0:
			problems = append(problems, fmt.Sprintf("healed at %v: no put succeeded after it", time.Duration(h)))
		case time.Duration(first-h) > within:
			problems = append(problems, fmt.Sprintf("healed at %v: the first put succeeded %v later, over %v", time.Duration(h), time.Duration(first-h), within))
		}
	}
	return ds, held, joined("heals without a write within the liveness bound", problems)
}

// CommitlogSHA256 hashes the commitlog bytes [from, to) of a data dir. The
// commitlog is a sequence of files named by their first offset (20 digits,
// RocketMQ's MappedFileQueue naming), so equal hashes over the same range
// mean byte-identical logs there: checker (b).
func CommitlogSHA256(dataDir string, from, to int64) (string, error) {
	dir := filepath.Join(dataDir, "commitlog")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("history: %w", err)
	}
	h := sha256.New()
	pos := from
	for _, e := range ents {
		base, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil || len(e.Name()) != 20 {
			continue // not a segment (.broken copies, temp files)
		}
		info, err := e.Info()
		if err != nil {
			return "", fmt.Errorf("history: %w", err)
		}
		end := base + info.Size()
		if end <= pos || base >= to {
			continue
		}
		if base > pos {
			return "", fmt.Errorf("history: commitlog gap: %d..%d missing in %s", pos, base, dir)
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", fmt.Errorf("history: %w", err)
		}
		n := min(end, to) - pos
		_, err = io.Copy(h, io.NewSectionReader(f, pos-base, n))
		f.Close()
		if err != nil {
			return "", fmt.Errorf("history: %w", err)
		}
		pos += n
	}
	if pos < to {
		return "", fmt.Errorf("history: commitlog ends at %d, before %d, in %s", pos, to, dir)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Divergent checks checker (b) over replicas' digests of the same range
// (name → CommitlogSHA256): all must be equal.
func Divergent(digests map[string]string) error {
	var first, firstName string
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(digests)) {
		d := digests[name]
		if firstName == "" {
			first, firstName = d, name
			continue
		}
		if d != first {
			problems = append(problems, fmt.Sprintf("%s has %s, %s has %s", name, d, firstName, first))
		}
	}
	return joined("replicas diverge", problems)
}

// WeakReads holds the reads marked Weak (served by any replica without
// ReadIndex, so possibly stale) to the rule a follower read can keep
// (replication design §5.4 d): an ok read that found a message found the
// value the healed leader stores at that offset, never another (the
// committed prefix never changes), and the value of a put that had been
// invoked before the read returned, never one not yet sent. A weak read
// that found nothing proves nothing and is not checked.
func WeakReads(ops []Op, stored Stored) (checked int, err error) {
	firstCall := map[string]int64{}
	for _, o := range ops {
		if o.Kind != Put {
			continue
		}
		if c, ok := firstCall[o.Value]; !ok || o.Call < c {
			firstCall[o.Value] = o.Call
		}
	}
	var problems []string
	for _, o := range ops {
		if o.Kind != Read || !o.Weak || o.Outcome != OK || !o.Found {
			continue
		}
		checked++
		r, ok := stored.at(o.Queue, o.Offset)
		switch call, sent := firstCall[o.Value]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: nothing stored there at the end", o))
		case r.Value != o.Value:
			problems = append(problems, fmt.Sprintf("%s: %q stored there at the end", o, r.Value))
		case !sent:
			problems = append(problems, fmt.Sprintf("%s: a value never sent", o))
		case call > o.Return:
			problems = append(problems, fmt.Sprintf("%s: read before its put was invoked (at %v)", o, time.Duration(call)))
		}
	}
	return checked, joined("weak reads that no replica may serve", problems)
}

// Percentile is the p-th percentile (0 < p ≤ 100, nearest rank) of ds, 0
// for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Unavailability is, for each fault started at a time in faults (history
// time), how long writes were unavailable: from the fault to the return
// of the first ok put invoked at or after it. A fault after which no put
// succeeded is left out (the liveness checks catch a group that never
// recovers).
func Unavailability(ops []Op, faults []int64) []time.Duration {
	var ds []time.Duration
	for _, f := range faults {
		best := int64(-1)
		for _, o := range ops {
			if o.Kind == Put && o.Outcome == OK && o.Call >= f && (best < 0 || o.Return < best) {
				best = o.Return
			}
		}
		if best >= 0 {
			ds = append(ds, time.Duration(best-f))
		}
	}
	return ds
}
