package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/storage/record"
)

const benchFileSize = 1 << 30

func benchMessage() *Message {
	return &Message{Topic: "BenchTopic", Body: make([]byte, 1024), Properties: []Property{{Key: PropertyTags, Value: "TagA"}},
		BornTimestamp: 1}
}

// prefaultedMapping maps a preallocated file of benchFileSize bytes, shared
// and faulted in for writing, as the raw baseline and the encode benchmarks
// write into it.
func prefaultedMapping(b *testing.B) []byte {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if err := unix.Fallocate(int(f.Fd()), 0, 0, benchFileSize); err != nil {
		b.Fatal(err)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, benchFileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(data) })
	for i := 0; i < len(data); i += pageSize { // prefault for writing
		data[i] = 1
	}
	return data
}

// BenchmarkRawMmapCopy is the floor the put path is compared with: a 1 KiB
// memcpy into a prefaulted, shared, file-backed mapping.
func BenchmarkRawMmapCopy(b *testing.B) {
	data := prefaultedMapping(b)
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

// BenchmarkRawMsync is the disk's side of the sync-mode bound: one op
// writes 58 KiB (what one group commit of 64 writers covers, measured in
// BenchmarkPutMessageSync) into a prefaulted shared mapping and msyncs it.
// No store can ack 64 one-at-a-time writers faster than 64 puts per such
// sync: msgs/s <= 64 / (time per op).
func BenchmarkRawMsync(b *testing.B) {
	data := prefaultedMapping(b)
	src := make([]byte, 58<<10)
	b.SetBytes(int64(len(src)))
	b.ResetTimer()
	pos := 0
	for i := 0; i < b.N; i++ {
		if pos+len(src) > len(data) {
			pos = 0
		}
		copy(data[pos:], src)
		if err := unix.Msync(data[pos&^(pageSize-1):pos+len(src)], unix.MS_SYNC); err != nil {
			b.Fatal(err)
		}
		pos += len(src)
	}
	b.StopTimer()
	b.ReportMetric(64/(b.Elapsed().Seconds()/float64(b.N)), "bound-msgs/s@64")
}

// BenchmarkEncodeRecord is the part of a put that the record format itself
// costs: the body CRC and the encode (header, 1 KiB body, tail, and the
// whole-record CRC when on) into the same kind of mapping as the raw
// baseline, with no lock, clock, queue offsets, statistics or dispatch.
// Its ratio to BenchmarkRawMmapCopy bounds what any put of this layout can
// reach.
func BenchmarkEncodeRecord(b *testing.B) {
	for _, propCRC := range []bool{true, false} {
		name := "propCRC=on"
		if !propCRC {
			name = "propCRC=off"
		}
		b.Run(name, func(b *testing.B) {
			data := prefaultedMapping(b)
			m := benchMessage()
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			pos := 0
			for i := 0; i < b.N; i++ {
				r := record.Spec{Topic: m.Topic, Body: m.Body, Props: m.Properties, BornTS: m.BornTimestamp,
					StoreHost: DefaultStoreHost, PropCRC: propCRC}
				if verr := r.Size(); verr != nil {
					b.Fatal(verr)
				}
				r.BodyCRC = BodyCRC(r.Body)
				if pos+r.Total > len(data) {
					pos = 0
				}
				r.Encode(data[pos:], int64(i), int64(pos), 1)
				pos += r.Total
			}
		})
	}
}

// benchPut puts 1 KiB messages from writers goroutines; keyed gives each
// put a fresh UNIQ_KEY (32 hexadecimal characters, as RocketMQ's clients
// write them), so every put is a first put that the dedup window
// remembers: the cost an idempotent put adds.
func benchPut(b *testing.B, mode FlushMode, writers int, keyed bool) {
	s, err := Open(Options{Dir: b.TempDir(), FileSize: benchFileSize, FlushMode: mode})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// One put first: it waits for the allocator to create the first file,
	// a one-off cost of Open, not of a put. Then the allocator's population
	// of the first file and of the next one finishes, so that the puts
	// measured write into faulted-in pages as the raw baseline does (a
	// first write to a page costs a ~15 µs fault here; in steady state the
	// allocator populates files ahead of the writer).
	if _, err := s.PutMessage(context.Background(), benchMessage()); err != nil {
		b.Fatal(err)
	}
	s.log.WaitPopulated()
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
		var keys []string
		if keyed {
			b.StopTimer()
			keys = make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("%08X%024X", w, i)
			}
			b.StartTimer()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := benchMessage()
			props := m.Properties
			ctx := context.Background()
			for i := 0; i < n; i++ {
				if keyed {
					m.Properties = append(props[:len(props):len(props)], Property{Key: PropertyUniqKey, Value: keys[i]})
				}
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
	b.Run("async/writers=1", func(b *testing.B) { benchPut(b, FlushAsync, 1, false) })
	b.Run("async/writers=GOMAXPROCS", func(b *testing.B) { benchPut(b, FlushAsync, runtime.GOMAXPROCS(0), false) })
}

// BenchmarkPutMessageKeyed is BenchmarkPutMessage with a fresh UNIQ_KEY
// on every put (idempotent.go): against BenchmarkPutMessage, what the
// dedup window costs a put.
func BenchmarkPutMessageKeyed(b *testing.B) {
	b.Run("async/writers=1", func(b *testing.B) { benchPut(b, FlushAsync, 1, true) })
	b.Run("async/writers=GOMAXPROCS", func(b *testing.B) { benchPut(b, FlushAsync, runtime.GOMAXPROCS(0), true) })
}

// BenchmarkPutMessageSync measures group commit: 64 writers, 1 KiB bodies,
// each put acknowledged only after the msync covering it.
func BenchmarkPutMessageSync(b *testing.B) {
	b.Run("writers=64", func(b *testing.B) { benchPut(b, FlushSync, 64, false) })
	b.Run("writers=256", func(b *testing.B) { benchPut(b, FlushSync, 256, false) })
}

// BenchmarkPutMessages measures the async batch path: 100 messages of 1 KiB
// per call, one writer; ns/op and allocations are per call. Run with
// -benchtime 30000x or more it writes several GiB: past the page cache's
// dirty limits it then measures the disk's write bandwidth.
func BenchmarkPutMessages(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir(), FileSize: benchFileSize})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := &Batch{Topic: "BenchTopic", Messages: make([]BatchMessage, 100)}
	for i := range batch.Messages {
		batch.Messages[i] = BatchMessage{Body: make([]byte, 1024), Properties: []Property{{Key: PropertyTags, Value: "TagA"}}, BornTimestamp: 1}
	}
	ctx := context.Background()
	if _, err := s.PutMessages(ctx, batch); err != nil { // waits for the first file
		b.Fatal(err)
	}
	b.SetBytes(100 * 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if res, err := s.PutMessages(ctx, batch); err != nil || res.Status != PutOK {
			b.Fatal(res.Status, err)
		}
	}
	b.StopTimer()
	// The longest put-lock hold includes any wait for the next file at a
	// roll; b.N is large enough to roll 1 GiB files.
	b.ReportMetric(float64(s.Stats().MaxLockHold.Microseconds()), "max-lock-us")
	b.ReportMetric(float64(s.Stats().Rolls), "rolls")
}

// BenchmarkTransactionSync measures a transactional message in sync mode
// with 64 writers (transactions.go): the half put and its commit (the
// message put, then the op record), each acknowledged after its msync;
// an op is one transaction. Beside BenchmarkPutMessageSync/writers=64 in
// the same run, the cost of the two-phase send.
func BenchmarkTransactionSync(b *testing.B) {
	const writers = 64
	s, err := Open(Options{Dir: b.TempDir(), FileSize: benchFileSize, FlushMode: FlushSync, txnManual: true,
		MaxPendingTransactions: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.PutMessage(context.Background(), benchMessage()); err != nil {
		b.Fatal(err)
	}
	s.log.WaitPopulated()
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		n := b.N / writers
		if w == 0 {
			n += b.N % writers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < n; i++ {
				m := benchMessage()
				m.SysFlag = TransactionPreparedType
				res, err := s.PutMessage(ctx, m)
				if err != nil || res.Status != PutOK {
					b.Error(res.Status, err)
					return
				}
				if _, err := s.EndTransaction(ctx, m.Topic, res.Append.WroteOffset, true); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
