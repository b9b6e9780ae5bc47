package storage

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/vfs"
)

// BenchmarkRecoveryScan measures the recovery scan: every record of a
// 256 MiB commitlog checked in full (sizes, body CRC, whole-record CRC,
// PHYSICALOFFSET). It reports GiB/s of commitlog verified.
func BenchmarkRecoveryScan(b *testing.B) {
	const total = 256 << 20
	dir := b.TempDir()
	s, err := Open(Options{Dir: dir, FileSize: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	m := benchMessage()
	for s.log.MaxOffset() < total {
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			b.Fatal(err)
		}
	}
	end := s.log.MaxOffset()
	files := s.log.Files().Snapshot()
	b.SetBytes(end)
	b.ResetTimer()
	for b.Loop() {
		r := commitlog.Scan(files, 0, true)
		if r.End != end {
			b.Fatalf("scan ended at %d of %d: %s", r.End, end, r.BadReason)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(end)*float64(b.N)/b.Elapsed().Seconds()/(1<<30), "GiB/s")
	s.Close()
}

// TestRestartAfterCrash writes STORAGED_RESTART_GIB GiB (default: skipped;
// `STORAGED_RESTART_GIB=10 go test ./storage -run TestRestartAfterCrash -v
// -timeout 30m` by hand), stops the store as a killed process would, and
// reports how long Open takes: recovery scans only from the checkpoint's
// file, so the restart time does not grow with the log.
func TestRestartAfterCrash(t *testing.T) {
	gib, _ := strconv.Atoi(os.Getenv("STORAGED_RESTART_GIB"))
	if gib <= 0 {
		t.Skip("set STORAGED_RESTART_GIB to run (writes that many GiB)")
	}
	dir := t.TempDir()
	o := Options{Dir: dir}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	m := benchMessage()
	start := time.Now()
	for s.log.MaxOffset() < int64(gib)<<30 {
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	written := s.log.MaxOffset()
	t.Logf("wrote %.1f GiB in %v", float64(written)/(1<<30), time.Since(start))
	s.crash()
	start = time.Now()
	s2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	defer s2.Close()
	if got := s2.log.MaxOffset(); got != written {
		t.Fatalf("recovered end %d, written %d", got, written)
	}
	t.Logf("restart after a crash with %.1f GiB written: Open took %v", float64(written)/(1<<30), took)
}

// BenchmarkPullMessages measures the read path: pulls of 32 messages of
// 1 KiB from one queue, every record CRC-checked. It reports messages/s.
func BenchmarkPullMessages(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir(), FileSize: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 100000
	m := benchMessage()
	for i := 0; i < n; i++ {
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			b.Fatal(err)
		}
	}
	for {
		if _, hi, err := s.QueueInfo("BenchTopic", 0); err == nil && hi == n {
			break
		}
		s.PullMessages(context.Background(), PullRequest{Topic: "BenchTopic", Offset: 0, Wait: time.Second})
	}
	b.ReportAllocs()
	b.ResetTimer()
	off, msgs := int64(0), 0
	for b.Loop() {
		res, err := s.PullMessages(context.Background(), PullRequest{Topic: "BenchTopic", Offset: off, MaxMessages: 32})
		if err != nil || len(res.Messages) == 0 {
			b.Fatalf("pull at %d: %v", off, err)
		}
		msgs += len(res.Messages)
		off = res.NextOffset
		if off == n {
			off = 0
		}
	}
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkOpenLastFileTail: Open and Close of a store whose one
// commitlog file (1 GiB, the default size) holds 64 MiB of records,
// after a clean close (the tail past the end trusted, only its first
// page read) and with the abort marker left as a crash leaves it (the
// whole 960 MiB tail read to prove it zero). The page cache is warm: on
// a cold one the read of the tail comes from the disk too.
func BenchmarkOpenLastFileTail(b *testing.B) {
	dir := b.TempDir()
	o := Options{Dir: dir, FileSize: 1 << 30}
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	m := benchMessage()
	for s.log.MaxOffset() < 64<<20 {
		if _, err := s.PutMessage(context.Background(), m); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for _, crashed := range []bool{false, true} {
		name := "clean"
		if crashed {
			name = "abort"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if crashed {
					if err := createAbort(vfs.Default, dir); err != nil {
						b.Fatal(err)
					}
				}
				s, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
