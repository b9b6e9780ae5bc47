package commitlog

import (
	"bytes"
	"testing"

	"github.com/storaged/storaged/storage/record"
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
