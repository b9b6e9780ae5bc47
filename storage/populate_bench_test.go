package storage

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/storage/vfs"
)

// BenchmarkSyncPutPopulate is the A/B of the allocator's population
// against sync-mode puts (issue 16; BENCHMARKS.md "Allocator population
// and sync-mode msync"): writers goroutines put 1 KiB messages into a
// fresh store with 1 GiB files, each put acknowledged after the msync
// covering it, while the allocator populates the rest of the first file
// and the next one in the way the variant says. Unlike benchPut it does
// not wait for population to finish first: the overlap is what is
// measured. Run it with a fixed -benchtime (e.g. 40000x: one store per
// run) and interleave the variants from a shell loop, one -bench pattern
// per run, so each ratio compares runs seconds apart.
func BenchmarkSyncPutPopulate(b *testing.B) {
	variants := []struct {
		name  string
		how   vfs.PopulateMode
		chunk int64
	}{
		{"write", vfs.PopulateWrite, 0},
		{"write4m", vfs.PopulateWrite, 4 << 20},
		{"read", vfs.PopulateRead, 0},
		{"willneed", vfs.PopulateWillNeed, 0},
		{"off", vfs.PopulateOff, 0},
	}
	for _, v := range variants {
		for _, writers := range []int{16, 64} {
			b.Run(v.name+"/writers="+strconv.Itoa(writers), func(b *testing.B) {
				benchPopulate(b, FlushSync, v.how, v.chunk, writers)
			})
		}
	}
}

// BenchmarkSyncPutPopulated is BenchmarkSyncPutPopulate once population
// has finished (WaitPopulated before the timer): the rest of a file's
// life, where a mode that leaves pages unmapped or read-only pays a fault
// per page on the put path instead.
func BenchmarkSyncPutPopulated(b *testing.B) {
	for _, how := range []vfs.PopulateMode{vfs.PopulateWrite, vfs.PopulateRead, vfs.PopulateWillNeed, vfs.PopulateOff} {
		for _, writers := range []int{16, 64} {
			b.Run(how.String()+"/writers="+strconv.Itoa(writers), func(b *testing.B) {
				benchPopulateSettled(b, FlushSync, how, 0, writers, true)
			})
		}
	}
}

// BenchmarkAsyncPutPopulate is the other side of that A/B: async puts
// into a fresh store while its file is populated, where a put that finds
// its page not yet faulted in takes the fault inside the append lock.
func BenchmarkAsyncPutPopulate(b *testing.B) {
	for _, how := range []vfs.PopulateMode{vfs.PopulateWrite, vfs.PopulateRead, vfs.PopulateWillNeed, vfs.PopulateOff} {
		b.Run(how.String()+"/writers=2", func(b *testing.B) { benchPopulate(b, FlushAsync, how, 0, 2) })
	}
}

func benchPopulate(b *testing.B, mode FlushMode, how vfs.PopulateMode, chunk int64, writers int) {
	benchPopulateSettled(b, mode, how, chunk, writers, false)
}

// benchPopulateSettled: settled waits for the allocator's population to
// finish before the timer starts.
func benchPopulateSettled(b *testing.B, mode FlushMode, how vfs.PopulateMode, chunk int64, writers int, settled bool) {
	// Whatever an earlier run left dirty is written back now, not during
	// this one.
	unix.Sync()
	s, err := Open(Options{Dir: b.TempDir(), FileSize: benchFileSize, FlushMode: mode,
		Populate: how, PopulateChunk: chunk})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// One put first: it waits for the allocator to create the first file.
	if _, err := s.PutMessage(context.Background(), benchMessage()); err != nil {
		b.Fatal(err)
	}
	if settled {
		s.log.WaitPopulated()
	}
	b.SetBytes(1024)
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N / writers
	for w := range writers {
		n := per
		if w == 0 {
			n += b.N % writers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := benchMessage()
			ctx := context.Background()
			for range n {
				if res, err := s.PutMessage(ctx, m); err != nil || res.Status != PutOK {
					b.Error(res.Status, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(st.AppendLatency.Quantile(0.99).Nanoseconds()), "p99-lock-ns")
	if mode != FlushSync {
		return
	}
	b.ReportMetric(float64(st.PutLatency.Quantile(0.99).Microseconds()), "p99-flushwait-us")
	if n := st.SyncLatency.Count(); n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "msgs/sync")
		b.ReportMetric(float64(st.SyncLatency.Sum.Microseconds())/float64(n), "us/sync")
		b.ReportMetric(float64(st.SyncLatency.Quantile(0.99).Microseconds()), "p99-sync-us")
	}
}
