package offsets

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"
)

func snapshotOf(entries ...Entry) Snapshot {
	return Snapshot{At: 1 << 40, QueueOffset: 77, BodyCRC: 0xdeadbeef, Entries: entries}
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, s := range []Snapshot{
		{Entries: []Entry{}},
		snapshotOf(Entry{Key: Key{"g", "T", 0}, Offset: 0, At: 0}),
		snapshotOf(Entry{Key: Key{strings.Repeat("g", 255), strings.Repeat("t", 255), 1<<31 - 1}, Offset: 1<<62 + 5, At: 1 << 40},
			Entry{Key: Key{"%RETRY%g", "a|b", 7}, Offset: 42, At: 12345}),
	} {
		got, err := DecodeSnapshot(EncodeSnapshot(s))
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if !reflect.DeepEqual(got, s) {
			t.Fatalf("decoded %+v, want %+v", got, s)
		}
	}
}

// reseal replaces b's trailing CRC with the right one for its body, so a
// test reaches the checks behind the CRC.
func reseal(b []byte) []byte {
	body := b[:len(b)-4]
	return binary.BigEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

func TestDecodeSnapshotRejects(t *testing.T) {
	good := EncodeSnapshot(snapshotOf(Entry{Key: Key{"g", "T", 1}, Offset: 5, At: 100}, Entry{Key: Key{"h", "T", 1}, Offset: 6, At: 200}))
	flipped := append([]byte(nil), good...)
	flipped[30] ^= 1
	version := append([]byte(nil), good...)
	version[0] = 9
	dup := EncodeSnapshot(snapshotOf(Entry{Key: Key{"g", "T", 1}, Offset: 5, At: 100}, Entry{Key: Key{"g", "T", 1}, Offset: 6, At: 200}))
	late := EncodeSnapshot(snapshotOf(Entry{Key: Key{"g", "T", 1}, Offset: 5, At: 1<<40 + 1}))
	negative := EncodeSnapshot(snapshotOf(Entry{Key: Key{"g", "T", -1}, Offset: 5, At: 1}))
	tooMany := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(tooMany[21:], 1<<31)
	trailing := append(append([]byte(nil), good[:len(good)-4]...), 0)
	for name, b := range map[string][]byte{
		"empty":           nil,
		"short":           good[:10],
		"crc":             flipped,
		"version":         reseal(version),
		"key twice":       dup,
		"entry after it":  late,
		"negative queue":  negative,
		"count past size": reseal(tooMany),
		"cut entry":       reseal(good[:len(good)-10]),
		"trailing byte":   reseal(append(trailing, 0, 0, 0, 0)),
	} {
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrDecode) {
			t.Errorf("%s: %v, want ErrDecode", name, err)
		}
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(EncodeSnapshot(Snapshot{}))
	f.Add(EncodeSnapshot(snapshotOf(Entry{Key: Key{"g", "T", 2}, Offset: 258, At: 3})))
	f.Add(EncodeSnapshot(snapshotOf(Entry{Key: Key{"a", "b", 0}}, Entry{Key: Key{"c", "d", 1}, Offset: 9, At: 1 << 40})))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b)
		if err != nil {
			return
		}
		if again := EncodeSnapshot(s); !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v re-encodes to %v, not %v", s, again, b)
		}
	})
}

// TestTableCutRestore: Cut names the last record applied with the
// entries it left, Restore brings them back with their At (so that a
// rewrite's rule still holds after it), and Reset forgets the record.
func TestTableCutRestore(t *testing.T) {
	tb := New(10)
	if _, last, applied := tb.Cut(); last != -1 || applied != 0 {
		t.Fatalf("new table: last %d, applied %d", last, applied)
	}
	a, b := Key{"a", "T", 0}, Key{"b", "T", 1}
	tb.Apply([]Entry{{Key: a, Offset: 1}}, 100)
	tb.Apply([]Entry{{Key: b, Offset: 2}}, 200)
	tb.Apply([]Entry{{Key: a, Offset: 3}}, 300)
	es, last, applied := tb.Cut()
	want := []Entry{{Key: a, Offset: 3, At: 300}, {Key: b, Offset: 2, At: 200}}
	if !reflect.DeepEqual(es, want) || last != 300 || applied != 3 || tb.Applied() != 3 {
		t.Fatalf("Cut = %+v, %d, %d; want %+v, 300, 3", es, last, applied, want)
	}
	r := New(10)
	r.Restore(es, last)
	if got, glast, _ := r.Cut(); !reflect.DeepEqual(got, want) || glast != 300 {
		t.Fatalf("restored %+v at %d", got, glast)
	}
	// A rewrite of a's value of 100 (superseded at 300) changes nothing in
	// the restored table, as in the original.
	if n := r.Apply([]Entry{{Key: a, Offset: 1, Rewrite: true, From: 100}}, 400); n != 0 {
		t.Fatalf("a stale rewrite applied to the restored table")
	}
	if v, _ := r.Get(a); v != 3 {
		t.Fatalf("a = %d after the stale rewrite, want 3", v)
	}
	r.Reset()
	if _, last, _ := r.Cut(); last != -1 {
		t.Fatalf("after Reset the table still names record %d", last)
	}
}
