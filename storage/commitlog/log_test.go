package commitlog

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const fileSize = 4096

// openLog opens and recovers the log in fs and starts its allocator.
func openLog(t *testing.T, fs vfs.FS) *Log {
	t.Helper()
	l := openLogNoRecover(t, fs)
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	return l
}

// appendOne appends one record with body and returns its offset.
func appendOne(t *testing.T, l *Log, qo int64, body string) (int64, int) {
	t.Helper()
	sp := record.Spec{Topic: "T", Body: []byte(body), StoreHost: testHost, PropCRC: true}
	sp.BodyCRC = record.BodyCRC(sp.Body)
	if ferr := sp.Size(); ferr != nil {
		t.Fatal(ferr)
	}
	p, err := l.Append(sp.Total, nil, func(dst []byte, at int64) { sp.Encode(dst, qo, at, 1) })
	if err != nil {
		t.Fatal(err)
	}
	return p.At, sp.Total
}

// TestAppendRollsAfterBlank: records that do not fit the rest of a file go
// to the next one, and the rest is an END_OF_FILE blank covering it
// exactly; Recover finds every record again.
func TestAppendRollsAfterBlank(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs)
	var offs []int64
	body := string(bytes.Repeat([]byte("x"), 1100))
	for i := range 6 { // ~1 KiB each: 3 per 4 KiB file
		at, _ := appendOne(t, l, int64(i), body)
		offs = append(offs, at)
	}
	if offs[3] != fileSize || offs[0] != 0 {
		t.Fatalf("offsets %v: the fourth record must start the second file", offs)
	}
	b := l.At(offs[2] + int64(record.TotalSize(l.At(offs[2]))))
	if !record.IsBlank(b) || int64(record.TotalSize(b)) != int64(len(b)) {
		t.Fatalf("the rest of the first file is not one blank: %x", b[:8])
	}
	l.Close()
	l2 := openLogNoRecover(t, fs)
	r, err := l2.Recover(0, 0)
	if err != nil || r.Records != 6 || r.End != l2.MaxOffset() {
		t.Fatalf("recover: %+v %v (max %d)", r, err, l2.MaxOffset())
	}
}

func openLogNoRecover(t *testing.T, fs vfs.FS) *Log {
	t.Helper()
	nop := zerolog.Nop()
	if err := fs.MkdirAll("/d/commitlog"); err != nil {
		t.Fatal(err)
	}
	l, err := Open(Options{FS: fs, Dir: "/d/commitlog", FileSize: fileSize, RequireCRC: true, Clock: base.SystemClock,
		Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestAdmitRefusalAppendsNothing: an admit error leaves the log as it was:
// no bytes, no blank, no roll, even when the records would not have fit.
func TestAdmitRefusalAppendsNothing(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs)
	appendOne(t, l, 0, string(bytes.Repeat([]byte("x"), 3000)))
	before, files := l.MaxOffset(), len(l.Files().Snapshot())
	refused := errors.New("refused")
	called := false
	_, err := l.Append(2000, func(time.Time) error { return refused }, func([]byte, int64) { called = true })
	if !errors.Is(err, refused) || called {
		t.Fatalf("Append = %v, encode called %v", err, called)
	}
	if l.MaxOffset() != before || len(l.Files().Snapshot()) != files || l.Stats().Rolls != 1 {
		t.Fatalf("after a refusal: max %d (was %d), files %d (was %d), rolls %d", l.MaxOffset(), before,
			len(l.Files().Snapshot()), files, l.Stats().Rolls)
	}
}

// TestTruncateAfter: truncating at a record boundary in an earlier file
// zeroes the rest of that file, deletes the later files, moves both ends
// back, and appends continue there; a reopened log recovers exactly the
// records below the cut.
func TestTruncateAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep int // records kept of 8
	}{{"inside the first file", 2}, {"at a file start", 3}, {"inside a later file", 5}, {"at the end", 8}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			l := openLog(t, fs)
			var offs []int64
			body := string(bytes.Repeat([]byte("y"), 1100))
			for i := range 8 {
				at, _ := appendOne(t, l, int64(i), body)
				offs = append(offs, at)
			}
			end := l.MaxOffset()
			if _, err := l.Sync(0); err != nil {
				t.Fatal(err)
			}
			l.WaitPopulated() // the allocator has prepared the file after the last: truncation must drop it too
			cut := end
			if tc.keep < len(offs) {
				cut = offs[tc.keep]
			}
			if err := l.TruncateAfter(cut); err != nil {
				t.Fatal(err)
			}
			if l.MaxOffset() != cut || l.Flushed() > cut {
				t.Fatalf("after truncate at %d: max %d flushed %d", cut, l.MaxOffset(), l.Flushed())
			}
			for _, f := range l.Files().Snapshot() {
				if f.From() > cut {
					t.Fatalf("file %s past the cut %d still listed", f.Name(), cut)
				}
			}
			entries, _ := fs.ReadDir("/d/commitlog")
			for _, e := range entries {
				if from, ok := segment.ParseFileName(e.Name); ok && from > cut-cut%fileSize && from != l.Files().Last().End() {
					t.Fatalf("file %s past the cut %d is still on disk", e.Name, cut)
				}
			}
			if tail := l.At(cut); tail != nil && !AllZero(tail) {
				t.Fatalf("bytes past the cut are not zero")
			}
			// Appends continue at the cut, with queue offsets chosen anew.
			at, n := appendOne(t, l, int64(tc.keep), "after")
			if at != cut && !(cut%fileSize != 0 && at == cut-cut%fileSize+fileSize) {
				t.Fatalf("append after the cut went to %d, want %d", at, cut)
			}
			if _, err := l.Sync(0); err != nil {
				t.Fatal(err)
			}
			l.Close()
			l2 := openLogNoRecover(t, fs)
			r, err := l2.Recover(0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Records != int64(tc.keep+1) || r.End != at+int64(n) {
				t.Fatalf("recovered %d records to %d, want %d to %d", r.Records, r.End, tc.keep+1, at+int64(n))
			}
		})
	}
}

// TestTruncateAfterRefusesOutside: an offset outside the log is refused and
// changes nothing.
func TestTruncateAfterRefusesOutside(t *testing.T) {
	l := openLog(t, vfs.NewMem())
	appendOne(t, l, 0, "a")
	end := l.MaxOffset()
	for _, off := range []int64{-1, end + 1} {
		if err := l.TruncateAfter(off); err == nil {
			t.Fatalf("TruncateAfter(%d) accepted", off)
		}
	}
	if l.MaxOffset() != end {
		t.Fatalf("max %d after refused truncates, want %d", l.MaxOffset(), end)
	}
}

// TestRecoverCutsTornTail: bytes past the last valid record (a torn
// append) are saved to a .broken file and zeroed, and a record below the
// flushed offset that fails its checks is a CorruptionError.
func TestRecoverCutsTornTail(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs)
	at, n := appendOne(t, l, 0, "good")
	_, m := appendOne(t, l, 1, "torn")
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	l.At(at + int64(n))[m-1] ^= 0xff // damage the second record's CRC digits
	l.Close()
	l2 := openLogNoRecover(t, fs)
	if _, err := l2.Recover(at+int64(n)+int64(m), 0); !errors.As(err, new(*base.CorruptionError)) {
		t.Fatalf("damage below the flushed offset: %v, want a CorruptionError", err)
	}
	l2.Close()
	l3 := openLogNoRecover(t, fs)
	r, err := l3.Recover(at+int64(n), 0)
	if err != nil || r.End != at+int64(n) || l3.Stats().TornTails != 1 {
		t.Fatalf("recover: %+v %v torn %d", r, err, l3.Stats().TornTails)
	}
	broken := filepath.Join("/d/commitlog", fmt.Sprintf("%020d.broken", at+int64(n)))
	if b, err := fs.ReadFile(broken); err != nil || len(b) != m {
		t.Fatalf("torn tail saved as %s: %d bytes, %v; want %d", broken, len(b), err, m)
	}
	if !AllZero(l3.At(at + int64(n))) {
		t.Fatal("torn tail not zeroed")
	}
}

var testHost = netip.MustParseAddrPort("127.0.0.1:10911")

// TestWillNeedAsksForTheFilesInRange: WillNeed asks each file holding part
// of the range for exactly its part (file-relative, WILLNEED), clipped to
// the written end and to the files still on disk, and says how many bytes
// it asked for.
func TestWillNeedAsksForTheFilesInRange(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs)
	body := string(bytes.Repeat([]byte("x"), 1100))
	for i := range 8 { // 3 records per 4 KiB file: files 0, 1 and 2
		appendOne(t, l, int64(i), body)
	}
	l.WaitPopulated()
	end := l.MaxOffset()
	if end <= 2*fileSize || end >= 3*fileSize {
		t.Fatalf("written end %d: want it inside the third file", end)
	}
	type call struct {
		file   string
		lo, hi int64
	}
	var mu sync.Mutex
	var got []call
	fs.OnPopulate(func(path string, lo, hi int64, how vfs.PopulateMode) {
		if how != vfs.PopulateWillNeed {
			return // the allocator preparing a file, not a read ahead
		}
		mu.Lock()
		got = append(got, call{filepath.Base(path), lo, hi})
		mu.Unlock()
	})
	defer fs.OnPopulate(nil)
	name := func(i int64) string { return segment.FileName(i * fileSize) }
	for _, tc := range []struct {
		name   string
		lo, hi int64
		want   []call
	}{
		{"inside one file", 100, 900, []call{{name(0), 100, 900}}},
		{"across two files", fileSize - 10, fileSize + 30, []call{{name(0), fileSize - 10, fileSize}, {name(1), 0, 30}}},
		{"past the written end", 2*fileSize + 5, 10 * fileSize, []call{{name(2), 5, end - 2*fileSize}}},
		{"all of it", -fileSize, 10 * fileSize, []call{{name(0), 0, fileSize}, {name(1), 0, fileSize}, {name(2), 0, end - 2*fileSize}}},
		{"nothing written there", end, end + fileSize, nil},
		{"empty", 500, 500, nil},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		asked := l.WillNeed(tc.lo, tc.hi)
		mu.Lock()
		calls := slices.Clone(got)
		mu.Unlock()
		var want int64
		for _, c := range tc.want {
			want += c.hi - c.lo
		}
		if !slices.Equal(calls, tc.want) || asked != want {
			t.Errorf("%s: WillNeed(%d, %d) = %d bytes asking %v, want %d bytes asking %v", tc.name, tc.lo, tc.hi, asked, calls, want, tc.want)
		}
	}
	// Retention removed the first file: nothing is asked of it.
	removed := l.Files().RemoveFirst(1)
	if err := l.Files().Unmap(removed); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got = nil
	mu.Unlock()
	if asked := l.WillNeed(0, fileSize+30); asked != 30 || len(got) != 1 || got[0] != (call{name(1), 0, 30}) {
		t.Fatalf("after the first file was removed: %d bytes asking %v, want 30 of %s", asked, got, name(1))
	}
}
