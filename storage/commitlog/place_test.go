package commitlog

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// encodeAt encodes one record of body stamped for commitlog offset at.
func encodeAt(t *testing.T, at int64, body string) []byte {
	t.Helper()
	sp := record.Spec{Topic: "T", Body: []byte(body), StoreHost: testHost, PropCRC: true}
	sp.BodyCRC = record.BodyCRC(sp.Body)
	if ferr := sp.Size(); ferr != nil {
		t.Fatal(ferr)
	}
	b := make([]byte, sp.Total)
	sp.Encode(b, 0, at, 1)
	return b
}

// TestPlaceAtMatchesAppend: a replica placing a leader's bytes with
// PlaceAt ends with files byte-identical to the leader's, blanks included,
// and refuses offsets that are neither the end nor the next file's start.
func TestPlaceAtMatchesAppend(t *testing.T) {
	leaderFS, replicaFS := vfs.NewMem(), vfs.NewMem()
	leader, replica := openLog(t, leaderFS), openLog(t, replicaFS)
	bodies := []string{string(bytes.Repeat([]byte("a"), 1500)), string(bytes.Repeat([]byte("b"), 1500)),
		string(bytes.Repeat([]byte("c"), 1500)), "d", string(bytes.Repeat([]byte("e"), 3000))}
	blanks := 0
	for i, body := range bodies {
		at, n := appendOne(t, leader, int64(i), body)
		b := append([]byte(nil), leader.At(at)[:n]...)
		blank, err := replica.PlaceAt(at, b)
		if err != nil {
			t.Fatalf("record %d at %d: %v", i, at, err)
		}
		if blank {
			blanks++
		}
	}
	if blanks == 0 {
		t.Fatal("no record rolled: the test does not cover the blank")
	}
	if leader.MaxOffset() != replica.MaxOffset() {
		t.Fatalf("ends differ: leader %d, replica %d", leader.MaxOffset(), replica.MaxOffset())
	}
	for off := int64(0); off < leader.MaxOffset(); off += fileSize {
		if !bytes.Equal(leader.At(off), replica.At(off)) {
			t.Fatalf("file at %d differs", off)
		}
	}
	end := replica.MaxOffset()
	for _, bad := range []int64{end - 1, end + 1, end + fileSize} {
		if _, err := replica.PlaceAt(bad, encodeAt(t, bad, "x")); err == nil {
			t.Errorf("PlaceAt(%d) with the end at %d: no error", bad, end)
		}
	}
	if _, err := replica.PlaceAt(end, make([]byte, fileSize)); err == nil {
		t.Error("PlaceAt of more than a file: no error")
	}
	if replica.MaxOffset() != end {
		t.Fatalf("a refused PlaceAt moved the end to %d", replica.MaxOffset())
	}
}

// TestTruncateAfterDropsPreparedFile: a truncation back into an earlier
// file deletes, durably, the file the allocator prepared past the old end,
// so no power cut after it leaves a gap that Load refuses.
func TestTruncateAfterDropsPreparedFile(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		fs := vfs.NewMem()
		l := openLog(t, fs)
		var first int64 = -1
		for l.MaxOffset() < fileSize+100 {
			at, _ := appendOne(t, l, 0, string(bytes.Repeat([]byte("x"), 700)))
			if first < 0 {
				first = at
			}
		}
		l.WaitPopulated() // the file after the second is prepared now
		if err := l.TruncateAfter(first); err != nil {
			t.Fatal(err)
		}
		l.WaitPopulated()
		for _, d := range []vfs.FS{fs, fs.Crash(rand.New(rand.NewPCG(seed, 1)))} {
			ents, err := d.ReadDir("/d/commitlog")
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			for _, e := range ents {
				from, ok := segment.ParseFileName(e.Name)
				if !ok {
					continue
				}
				if from != want {
					t.Fatalf("seed %d: commitlog files %v: a gap before %s", seed, ents, e.Name)
				}
				want += fileSize
			}
		}
		img := fs.Crash(rand.New(rand.NewPCG(seed, 1)))
		re := openLog(t, img) // fails the test on a gap
		if re.MaxOffset() > fileSize {
			t.Fatalf("seed %d: recovered end %d past the first file", seed, re.MaxOffset())
		}
		re.Close()
		l.Close()
	}
}
