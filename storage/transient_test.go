package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/vfs"
)

// failWhere is an injector that fails op on paths containing part with
// err, until cleared.
func failWhere(op vfs.Op, part string, err error) vfs.Injector {
	return func(o vfs.Op, path string) error {
		if o == op && strings.Contains(path, part) {
			return err
		}
		return nil
	}
}

// waitWritable returns once s.Writable() is want, waiting on the fault
// table's change channel (no polling, no sleep); it fails after 10 s.
func waitWritable(t *testing.T, s *Store, want bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		ch := s.faults.Change()
		if s.Writable() == want {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("store writable = %v after 10s, want %v (faults %+v, write error %v)",
				s.Writable(), want, s.Stats().Faults, s.WriteErr())
		}
	}
}

func faultOf(t *testing.T, s *Store, source string) FaultStats {
	t.Helper()
	for _, f := range s.Stats().Faults {
		if f.Source == source {
			return f
		}
	}
	t.Fatalf("no fault source %q in %+v", source, s.Stats().Faults)
	return FaultStats{}
}

// TestTransientWriteFaults: ENOSPC or EMFILE on the checkpoint, a
// consume-queue file or the delay progress turns puts away (retriable,
// nothing appended) and counts the failure, and once the cause clears the
// component's own retry succeeds, the store takes writes again by itself
// and nothing acknowledged is lost across a restart. Before faults.go each
// of these left the store read-only until restart.
func TestTransientWriteFaults(t *testing.T) {
	enospc := fmt.Errorf("write: %w", syscall.ENOSPC)
	emfile := fmt.Errorf("open: %w", syscall.EMFILE)
	tests := []struct {
		name    string
		source  string
		op      vfs.Op
		path    string // part of the failing file's path
		cause   error
		trigger func(t *testing.T, s *Store, clock *alarmClock) // makes the component write
		full    bool                                            // refusal wraps ErrDiskFull
	}{
		{name: "checkpoint ENOSPC", source: "checkpoint", op: vfs.OpWriteFile, path: checkpointName + ".tmp", cause: enospc, full: true,
			trigger: func(t *testing.T, s *Store, _ *alarmClock) { mustPut(t, s, "T", 0, "after-fault") }},
		{name: "checkpoint EMFILE", source: "checkpoint", op: vfs.OpWriteFile, path: checkpointName + ".tmp", cause: emfile,
			trigger: func(t *testing.T, s *Store, _ *alarmClock) { mustPut(t, s, "T", 0, "after-fault") }},
		{name: "consume queue write ENOSPC", source: "consume_queue", op: vfs.OpFileWrite, path: "consumequeue", cause: enospc, full: true,
			trigger: func(t *testing.T, s *Store, _ *alarmClock) { mustPut(t, s, "NewTopic", 3, "after-fault") }},
		// MemFS reports any failed create as ENOSPC (vfs.ErrNoSpace).
		{name: "consume queue open EMFILE", source: "consume_queue", op: vfs.OpOpenFile, path: "consumequeue", cause: emfile, full: true,
			trigger: func(t *testing.T, s *Store, _ *alarmClock) { mustPut(t, s, "NewTopic", 3, "after-fault") }},
		{name: "delay progress ENOSPC", source: "delay_progress", op: vfs.OpWriteFile, path: delayOffsetName, cause: enospc, full: true,
			trigger: func(t *testing.T, s *Store, clock *alarmClock) {
				putDelayed(t, s, "T", 0, 1, "after-fault")
				settle(t, s)
				clock.Advance(2 * time.Second) // due: the scheduler delivers, then persists
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := vfs.NewMem()
			clock := newAlarmClock(schedT0)
			disk := &fakeDisk{pct: 10}
			o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, Clock: clock, StatDisk: disk.stat,
				FileReservedTime: -1, CheckpointInterval: 5 * time.Millisecond}
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Close() }()
			mustPut(t, s, "T", 0, "before-fault")

			fs.SetInjector(failWhere(tt.op, tt.path, tt.cause))
			tt.trigger(t, s, clock)
			waitWritable(t, s, false)

			f := faultOf(t, s, tt.source)
			if !f.Failing || f.Failures == 0 || !strings.Contains(f.Error, tt.cause.Error()) {
				t.Fatalf("fault stats while failing: %+v", f)
			}
			if s.WriteErr() != nil {
				t.Fatalf("transient fault turned sticky: %v", s.WriteErr())
			}
			res, err := s.PutMessage(context.Background(), msg("T", "refused"))
			if !errors.Is(err, ErrNotWritable) || !errors.Is(err, ErrWriteRetrying) || errors.Is(err, ErrDiskFull) != tt.full ||
				res.Appended() || res.Status != ServiceNotAvailable {
				t.Fatalf("put during the fault: %v %v (appended %v)", res.Status, err, res.Appended())
			}

			fs.SetInjector(nil) // the cause clears: space freed, fds closed
			waitWritable(t, s, true)
			f = faultOf(t, s, tt.source)
			if f.Failing || f.Recoveries != 1 || f.Failures == 0 {
				t.Fatalf("fault stats after recovery: %+v", f)
			}
			mustPut(t, s, "T", 0, "after-recovery")
			if err := s.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}

			s, err = Open(o)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			var bodies []string
			for _, topic := range []string{"T", "NewTopic"} {
				for qid := int32(0); qid < 4; qid++ {
					r, err := s.PullMessages(context.Background(), PullRequest{Topic: topic, QueueID: qid, MaxMessages: 100})
					if err != nil {
						continue
					}
					for _, m := range r.Messages {
						bodies = append(bodies, string(m.Body))
					}
				}
			}
			got := strings.Join(bodies, ",")
			for _, want := range []string{"before-fault", "after-fault", "after-recovery"} {
				if !strings.Contains(got, want) {
					t.Fatalf("after restart the store holds %q, missing %q", got, want)
				}
			}
		})
	}
}

func mustPut(t *testing.T, s *Store, topic string, qid int32, body string) {
	t.Helper()
	m := msg(topic, body)
	m.QueueID = qid
	if _, err := s.PutMessage(context.Background(), m); err != nil {
		t.Fatalf("put %q: %v", body, err)
	}
}

// TestCommitlogSyncFailureStaysSticky: a commitlog msync failing once,
// here the checkpoint's sync in async mode, keeps the store read-only
// after the cause is gone, unlike every other write (fsyncgate).
func TestCommitlogSyncFailureStaysSticky(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024, FlushInterval: time.Hour,
		FlushThoroughInterval: time.Hour, CheckpointInterval: 5 * time.Millisecond}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var once sync.Once
	fs.SetInjector(func(op vfs.Op, path string) (err error) {
		if op == vfs.OpSync && strings.Contains(path, "commitlog") {
			once.Do(func() { err = errors.New("input/output error") })
		}
		return err
	})
	mustPut(t, s, "T", 0, "x")
	waitWritable(t, s, false)
	fs.SetInjector(nil)
	if s.WriteErr() == nil || !errors.Is(s.WriteErr(), ErrWriteFailed) {
		t.Fatalf("write error after a failed commitlog sync: %v", s.WriteErr())
	}
	for _, f := range s.Stats().Faults {
		if f.Failing {
			t.Fatalf("a commitlog sync failure counted as transient: %+v", f)
		}
	}
	if _, err := s.PutMessage(context.Background(), msg("T", "y")); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("put after a failed commitlog sync: %v", err)
	}
}

// TestTopicConfigFaultCounted: a failed write of the topic table refuses
// the put that creates a topic (retriable) and is counted under
// topic_config, without a failing spell: other puts and health go on.
func TestTopicConfigFaultCounted(t *testing.T) {
	fs := vfs.NewMem()
	s, err := Open(Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustPut(t, s, "Known", 0, "x")
	fs.SetInjector(failWhere(vfs.OpWriteFile, topicsName, fmt.Errorf("write: %w", syscall.ENOSPC)))
	if _, err := s.PutMessage(context.Background(), msg("Brand-new", "y")); !errors.Is(err, ErrTopicConfig) {
		t.Fatalf("put creating a topic while its config cannot be written: %v", err)
	}
	f := faultOf(t, s, "topic_config")
	if f.Failures != 1 || f.Failing {
		t.Fatalf("topic_config fault stats %+v, want 1 failure, not failing", f)
	}
	if !s.Writable() {
		t.Fatal("a failed topic-config write made the store unwritable")
	}
	mustPut(t, s, "Known", 0, "z")
	fs.SetInjector(nil)
	mustPut(t, s, "Brand-new", 0, "y")
}
