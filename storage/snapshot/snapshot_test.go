package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const fileSize = 4096

var testHost = netip.MustParseAddrPort("127.0.0.1:10911")

// source is a commitlog on real files holding n records of ~1 KiB (three
// per 4 KiB file), with store times 1000+i.
type source struct {
	log   *commitlog.Log
	fs    vfs.FS
	dir   string
	lastT int64
}

func newSource(t *testing.T, fs vfs.FS, dir string, n int) *source {
	t.Helper()
	nop := zerolog.Nop()
	cdir := filepath.Join(dir, "commitlog")
	if err := fs.MkdirAll(cdir); err != nil {
		t.Fatal(err)
	}
	l, err := commitlog.Open(commitlog.Options{FS: fs, Dir: cdir, FileSize: fileSize, RequireCRC: true, Clock: base.SystemClock,
		Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	s := &source{log: l, fs: fs, dir: cdir}
	for i := range n {
		sp := record.Spec{Topic: "T", Body: bytes.Repeat([]byte{byte('a' + i%26)}, 1000+i%7), StoreHost: testHost, PropCRC: true}
		sp.BodyCRC = record.BodyCRC(sp.Body)
		if ferr := sp.Size(); ferr != nil {
			t.Fatal(ferr)
		}
		ts := int64(1000 + i)
		if _, err := l.Append(sp.Total, nil, func(dst []byte, at int64) { sp.Encode(dst, int64(i), at, ts) }); err != nil {
			t.Fatal(err)
		}
		s.lastT = ts
	}
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	return s
}

// manifest builds the manifest of the whole log.
func (s *source) manifest(t *testing.T) Manifest {
	t.Helper()
	end := s.log.MaxOffset()
	files, err := Files(s.log, fileSize, s.log.MinOffset(), end)
	if err != nil {
		t.Fatal(err)
	}
	m := Manifest{Version: Version, Index: 42, Term: 3, FileSize: fileSize, MinOffset: s.log.MinOffset(), End: end,
		LastStoreTS: s.lastT, Files: files, Queues: []Queue{{Topic: "T", Queue: 0, First: 0, Next: 7}}}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	return m
}

func stageOpts(fs vfs.FS, dir string) StageOptions {
	return StageOptions{FS: fs, Dir: filepath.Join(dir, "snapshot.tmp"), FileSize: fileSize, MaxBytes: 1 << 20, RequireCRC: true}
}

// TestStageRoundTrip: a log of several files streamed by Read into a
// Stage on real files verifies, and the staged files hold exactly the
// source's bytes up to End (zeros after it).
func TestStageRoundTrip(t *testing.T) {
	for _, chunk := range []int{100, 1000, fileSize, DefaultChunkBytes} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			src := newSource(t, vfs.Default, t.TempDir(), 10)
			m := src.manifest(t)
			if len(m.Files) != 4 {
				t.Fatalf("%d files, want 4 (3 records a file)", len(m.Files))
			}
			dst := t.TempDir()
			st, err := NewStage(stageOpts(vfs.Default, dst), m)
			if err != nil {
				t.Fatal(err)
			}
			chunks := 0
			if err := Read(src.log, &m, chunk, func(c Chunk) error { chunks++; return st.Write(c) }); err != nil {
				t.Fatal(err)
			}
			if err := st.Finish(); err != nil {
				t.Fatal(err)
			}
			if st.Written() != m.End-m.MinOffset {
				t.Fatalf("staged %d bytes, want %d", st.Written(), m.End-m.MinOffset)
			}
			for _, f := range m.Files {
				got, err := vfs.Default.ReadFile(filepath.Join(st.Dir(), segment.FileName(f.From)))
				if err != nil {
					t.Fatal(err)
				}
				want, err := vfs.Default.ReadFile(filepath.Join(src.dir, segment.FileName(f.From)))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[:f.Size], want[:f.Size]) || !commitlog.AllZero(got[f.Size:]) || len(got) != fileSize {
					t.Fatalf("file %d differs from the source", f.From)
				}
			}
		})
	}
}

// stageAll streams src into a new stage through mutate (which may alter,
// drop or add chunks) and returns the first error of Write or Finish.
func stageAll(t *testing.T, src *source, m Manifest, dst string, mutate func(i int, c Chunk, write func(Chunk) error) error) (*Stage, error) {
	t.Helper()
	st, err := NewStage(stageOpts(vfs.Default, dst), m)
	if err != nil {
		return nil, err
	}
	i := 0
	err = Read(src.log, &m, 1000, func(c Chunk) error {
		i++
		return mutate(i-1, c, st.Write)
	})
	if err == nil {
		err = st.Finish()
	}
	return st, err
}

// TestStageRefuses: every kind of bad input is refused with its error,
// the refusal is sticky, and Discard leaves no staging dir behind (the
// data dir holds only what it held before).
func TestStageRefuses(t *testing.T) {
	flip := func(b []byte) []byte { b = append([]byte(nil), b...); b[len(b)/2] ^= 1; return b }
	cases := []struct {
		name   string
		m      func(m *Manifest, src *source)
		mutate func(i int, c Chunk, write func(Chunk) error) error
		want   error
	}{
		{"chunk CRC wrong", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i == 3 {
				c.CRC ^= 1
			}
			return w(c)
		}, ErrBadChunk},
		{"bytes flipped, chunk CRC recomputed: file CRC catches it", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i == 2 {
				c.Data = flip(c.Data)
				c.CRC = CRC(c.Data)
			}
			return w(c)
		}, ErrBadChunk},
		{"chunk skipped", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i == 2 {
				return nil
			}
			return w(c)
		}, ErrBadChunk},
		{"chunk repeated", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if err := w(c); err != nil || i != 1 {
				return err
			}
			return w(c)
		}, ErrBadChunk},
		{"past the file's size", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i == 4 { // the second file's first chunk, 1000 bytes: grow it past 4096
				c.Offset = 0
				c.Data = make([]byte, MaxChunkBytes)
				c.CRC = CRC(c.Data)
			}
			return w(c)
		}, ErrBadChunk},
		{"oversized chunk", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i == 0 {
				c.Data = make([]byte, MaxChunkBytes+1)
				c.CRC = CRC(c.Data)
			}
			return w(c)
		}, ErrBadChunk},
		{"transfer stops halfway (peer vanished)", nil, func(i int, c Chunk, w func(Chunk) error) error {
			if i >= 7 {
				return nil
			}
			return w(c)
		}, ErrVerify},
		{"manifest ends inside a record", func(m *Manifest, src *source) {
			// An end 100 bytes short, with file CRCs of those bytes: the
			// chunks agree with the manifest, the records do not.
			m.End -= 100
			files, err := Files(src.log, fileSize, m.MinOffset, m.End)
			if err != nil {
				panic(err)
			}
			m.Files = files
		}, nil, ErrVerify},
		{"manifest with a later store time", func(m *Manifest, _ *source) { m.LastStoreTS++ }, nil, ErrVerify},
		{"another file size", func(m *Manifest, _ *source) { m.FileSize *= 2 }, nil, ErrBadManifest},
		{"more than the stage may take", func(m *Manifest, _ *source) {
			m.Files = nil
			m.End = m.MinOffset + 1000*fileSize
			for i := range 1000 {
				m.Files = append(m.Files, File{From: m.MinOffset + int64(i)*fileSize, Size: fileSize})
			}
		}, nil, ErrBadManifest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := newSource(t, vfs.Default, t.TempDir(), 10)
			m := src.manifest(t)
			if tc.m != nil {
				tc.m(&m, src)
			}
			mutate := tc.mutate
			if mutate == nil {
				mutate = func(_ int, c Chunk, w func(Chunk) error) error { return w(c) }
			}
			dst := t.TempDir()
			st, err := stageAll(t, src, m, dst, mutate)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if st == nil {
				return
			}
			if err := st.Finish(); err == nil {
				t.Fatal("Finish after a refusal succeeded")
			}
			if err := st.Discard(); err != nil {
				t.Fatal(err)
			}
			ents, err := vfs.Default.ReadDir(dst)
			if err != nil || len(ents) != 0 {
				t.Fatalf("after Discard the data dir holds %v (%v)", ents, err)
			}
		})
	}
}

// TestStageBadRecord: a source whose file holds a record with a bad CRC
// (manifest and chunk CRCs computed over the bad bytes, as a sender with
// a damaged disk would) is refused by the record scan.
func TestStageBadRecord(t *testing.T) {
	fs := vfs.NewMem()
	src := newSource(t, fs, "/src", 10)
	// Damage a body byte of the fifth record (second file) in the mapping.
	src.log.ReadLock()
	b := src.log.At(fileSize + 500)
	b[0] ^= 0xff
	src.log.ReadUnlock()
	m := src.manifest(t)
	st, err := NewStage(StageOptions{FS: fs, Dir: "/dst/snapshot.tmp", FileSize: fileSize, MaxBytes: 1 << 20, RequireCRC: true}, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := Read(src.log, &m, 0, st.Write); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(); !errors.Is(err, ErrVerify) {
		t.Fatalf("Finish: %v, want ErrVerify", err)
	}
	if err := st.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.ReadDir("/dst/snapshot.tmp"); err == nil {
		t.Fatal("the staging dir survived Discard")
	}
}

// TestReadNoticesChange: bytes that change under the sender after the
// manifest was built are never sent as the snapshot.
func TestReadNoticesChange(t *testing.T) {
	fs := vfs.NewMem()
	src := newSource(t, fs, "/src", 10)
	m := src.manifest(t)
	src.log.ReadLock()
	src.log.At(2*fileSize + 10)[0] ^= 1
	src.log.ReadUnlock()
	if err := Read(src.log, &m, 0, func(Chunk) error { return nil }); !errors.Is(err, ErrGone) {
		t.Fatalf("Read: %v, want ErrGone", err)
	}
}

// TestManifestEncoding: a manifest survives Encode/Decode, and Decode
// refuses a bad seal, unknown fields and broken rules.
func TestManifestEncoding(t *testing.T) {
	m := Manifest{Version: Version, Index: 9, Term: 2, FileSize: 100, MinOffset: 200, End: 450, LastStoreTS: 7,
		Files:  []File{{From: 200, Size: 100, CRC: 1}, {From: 300, Size: 100, CRC: 2}, {From: 400, Size: 50, CRC: 3}},
		Queues: []Queue{{Topic: "A", Queue: 1, First: 3, Next: 9}, {Topic: "B", Queue: 0, First: 0, Next: 0}},
		Delay:  []DelayLevel{{Level: 1, Next: 5}, {Level: 3, Next: 0}}, DelayIndex: 8,
		Deleted: []Tombstone{{Name: "Gone", At: 120}, {Name: "Old", At: 0}}, TopicsIndex: 9,
		Timer: &Timer{Low: 2, Ingested: 4, DueMS: 1000, Phys: 250}, TimerIndex: 7}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("decoded %+v, want %+v", got, m)
	}
	bad := map[string][]byte{
		"seal":    append(append([]byte(nil), b[:10]...), append([]byte{b[10] ^ 1}, b[11:]...)...),
		"unknown": base.Seal([]byte(`{"version":1,"index":1,"term":1,"file_size":1,"min_offset":0,"end":0,"x":1}`)),
		"huge":    make([]byte, MaxManifestBytes+1),
	}
	rules := map[string]func(m *Manifest){
		"version":       func(m *Manifest) { m.Version = 2 },
		"min offset":    func(m *Manifest) { m.MinOffset = 150 },
		"end":           func(m *Manifest) { m.End = 100 },
		"missing file":  func(m *Manifest) { m.Files = m.Files[:2] },
		"short file":    func(m *Manifest) { m.Files[1].Size = 99 },
		"gap":           func(m *Manifest) { m.Files[1].From = 310 },
		"queue order":   func(m *Manifest) { m.Queues[0], m.Queues[1] = m.Queues[1], m.Queues[0] },
		"queue first":   func(m *Manifest) { m.Queues[0].First = 10 },
		"empty topic":   func(m *Manifest) { m.Queues[0].Topic = "" },
		"no term":       func(m *Manifest) { m.Term = 0 },
		"zero filesize": func(m *Manifest) { m.FileSize = 0 },
		"delay order":   func(m *Manifest) { m.Delay = []DelayLevel{{Level: 2, Next: 1}, {Level: 2, Next: 3}} },
		"delay level 0": func(m *Manifest) { m.Delay = []DelayLevel{{Level: 0, Next: 1}} },
		"delay offset":  func(m *Manifest) { m.Delay = []DelayLevel{{Level: 1, Next: -1}} },
		"delay index":   func(m *Manifest) { m.DelayIndex = 0 },
		"delay levels":  func(m *Manifest) { m.Delay = make([]DelayLevel, MaxDelayLevels+1) },
		"timer index":   func(m *Manifest) { m.TimerIndex = 0 },
		"timer no prog": func(m *Manifest) { m.Timer = nil },
		"timer low":     func(m *Manifest) { m.Timer = &Timer{Low: 5, Ingested: 4} },
		"timer phys":    func(m *Manifest) { m.Timer = &Timer{Phys: -1} },
		"tomb order":    func(m *Manifest) { m.Deleted = []Tombstone{{Name: "B", At: 1}, {Name: "A", At: 1}} },
		"tomb dup":      func(m *Manifest) { m.Deleted = []Tombstone{{Name: "A", At: 1}, {Name: "A", At: 2}} },
		"tomb at":       func(m *Manifest) { m.Deleted = []Tombstone{{Name: "A", At: -1}} },
		"tomb name":     func(m *Manifest) { m.Deleted = []Tombstone{{Name: "", At: 1}} },
	}
	for name, f := range rules {
		c := m
		c.Files = append([]File(nil), m.Files...)
		c.Queues = append([]Queue(nil), m.Queues...)
		f(&c)
		if _, err := c.Encode(); !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: Encode %v, want ErrBadManifest", name, err)
		}
		body, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		bad[name] = base.Seal(body)
	}
	for name, b := range bad {
		if _, err := Decode(b); !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: Decode %v, want ErrBadManifest", name, err)
		}
	}
}

// FuzzDecodeManifest: Decode never panics, and what it accepts encodes
// back to a manifest that decodes to the same value.
func FuzzDecodeManifest(f *testing.F) {
	m := Manifest{Version: Version, Index: 9, Term: 2, FileSize: 100, MinOffset: 200, End: 450, LastStoreTS: 7,
		Files:  []File{{From: 200, Size: 100, CRC: 1}, {From: 300, Size: 100, CRC: 2}, {From: 400, Size: 50, CRC: 3}},
		Queues: []Queue{{Topic: "A", Queue: 1, First: 3, Next: 9}}}
	b, _ := m.Encode()
	f.Add(b)
	m.Delay, m.DelayIndex = []DelayLevel{{Level: 1, Next: 5}, {Level: 2, Next: 1}}, 4
	m.Timer, m.TimerIndex = &Timer{Low: 1, Ingested: 2, DueMS: 3, Phys: 4}, 5
	m.Deleted, m.TopicsIndex = []Tombstone{{Name: "A", At: 3}}, 6
	b, _ = m.Encode()
	f.Add(b)
	f.Add(base.Seal([]byte(`{"version":1,"index":1,"term":1,"file_size":1,"min_offset":0,"end":0}`)))
	f.Add([]byte("{}\n0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadManifest) {
				t.Fatalf("error %v does not wrap ErrBadManifest", err)
			}
			return
		}
		enc, err := m.Encode()
		if err != nil {
			t.Fatalf("a decoded manifest does not encode: %v", err)
		}
		// Compared by their encodings (an empty list and a missing one
		// are the same manifest).
		m2, err := Decode(enc)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if enc2, err := m2.Encode(); err != nil || !bytes.Equal(enc2, enc) {
			t.Fatalf("round trip: %+v %v, want %+v", m2, err, m)
		}
	})
}

// TestLastStoreTS: the store time of the last record below an end inside
// the last file, and an error for a range the source does not hold.
func TestLastStoreTS(t *testing.T) {
	src := newSource(t, vfs.NewMem(), "/src", 10)
	end := src.log.MaxOffset()
	last := end - end%fileSize
	if ts, err := LastStoreTS(src.log, last, end); err != nil || ts != src.lastT {
		t.Fatalf("LastStoreTS: %d %v, want %d", ts, err, src.lastT)
	}
	if ts, err := LastStoreTS(src.log, last, last); err != nil || ts != 0 {
		t.Fatalf("empty range: %d %v", ts, err)
	}
	if _, err := LastStoreTS(src.log, last, last+fileSize+1); !errors.Is(err, ErrGone) {
		t.Fatalf("past the file: %v, want ErrGone", err)
	}
	if _, err := LastStoreTS(src.log, last, end-1); err == nil {
		t.Fatal("an end inside a record was accepted")
	}
}
