package storage

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const benchFileSize = 1 << 30

func benchMessage() *Message {
	return &Message{Topic: "BenchTopic", Body: make([]byte, 1024), Properties: []Property{{PropertyTags, "TagA"}},
		BornTimestamp: 1}
}

// BenchmarkRawMmapCopy is the floor the put path is compared with: a 1 KiB
// memcpy into a prefaulted, shared, file-backed mapping.
func BenchmarkRawMmapCopy(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, benchFileSize); err != nil {
		b.Fatal(err)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, benchFileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(data)
	for i := 0; i < len(data); i += pageSize { // prefault for writing
		data[i] = 1
	}
	src := make([]byte, 1024)
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	pos := 0
	for i := 0; i < b.N; i++ {
		if pos+1024 > len(data) {
			pos = 0
		}
		copy(data[pos:], src)
		pos += 1024
	}
}

func benchPut(b *testing.B, mode FlushMode, writers int) {
	s, err := Open(Options{Dir: b.TempDir(), FileSize: benchFileSize, FlushMode: mode})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// One put first: it waits for the allocator to prepare the first file,
	// a one-off cost of Open, not of a put.
	if _, err := s.PutMessage(context.Background(), benchMessage()); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N / writers
	for w := 0; w < writers; w++ {
		n := per
		if w == 0 {
			n += b.N % writers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := benchMessage()
			ctx := context.Background()
			for i := 0; i < n; i++ {
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
	if mode == FlushSync {
		b.ReportMetric(float64(st.PutLatency.Quantile(0.99).Nanoseconds()), "p99-flushwait-ns")
		if n := st.SyncLatency.Count(); n > 0 {
			b.ReportMetric(float64(b.N)/float64(n), "msgs/sync")
			b.ReportMetric(float64(st.SyncLatency.Sum.Microseconds())/float64(n), "us/sync")
		}
	}
}

// BenchmarkPutMessage measures the async put path with a 1 KiB body.
func BenchmarkPutMessage(b *testing.B) {
	b.Run("async/writers=1", func(b *testing.B) { benchPut(b, FlushAsync, 1) })
	b.Run("async/writers=GOMAXPROCS", func(b *testing.B) { benchPut(b, FlushAsync, runtime.GOMAXPROCS(0)) })
}

// BenchmarkPutMessageSync measures group commit: 64 writers, 1 KiB bodies,
// each put acknowledged only after the msync covering it.
func BenchmarkPutMessageSync(b *testing.B) {
	b.Run("writers=64", func(b *testing.B) { benchPut(b, FlushSync, 64) })
	b.Run("writers=256", func(b *testing.B) { benchPut(b, FlushSync, 256) })
}
