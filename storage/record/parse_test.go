package record

import (
	"errors"
	"net/netip"
	"testing"
)

// FuzzParse: the one field walker never panics on any bytes, every error
// wraps ErrCorrupt, it never reports a total outside the bytes, and on a
// record Decode accepts it reads the same fields Decode does.
func FuzzParse(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, MinLen))
	for _, spec := range []Spec{
		{Topic: "T", Body: []byte("seed"), StoreHost: testStoreHost, PropCRC: true,
			Props: []Property{{Key: PropertyTags, Value: "tagA"}}},
		{Topic: "V6", QueueID: 3, Body: []byte("v6"), BornHost: netip.MustParseAddrPort("[::1]:1"),
			StoreHost: netip.MustParseAddrPort("[::1]:2")},
	} {
		f.Add(encodeSpec(f, spec, 7, 0, 1))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Parse error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if h.Total < MinLen || int(h.Total) > len(b) {
			t.Fatalf("total %d outside [%d, %d]", h.Total, MinLen, len(b))
		}
		rec, _, derr := Decode(b)
		if derr != nil {
			return
		}
		tags, _ := rec.Property(PropertyTags)
		if string(h.Topic) != rec.Topic || h.QueueID != rec.QueueID || h.QueueOffset != rec.QueueOffset ||
			string(h.Property(PropertyTags)) != tags || h.StoreTS != rec.StoreTimestamp || h.PhysOffset != rec.PhysicalOffset ||
			string(h.Body) != string(rec.Body) || h.Total != rec.TotalSize {
			t.Fatalf("Parse %q/%d@%d tags %q, Decode %q/%d@%d tags %q",
				h.Topic, h.QueueID, h.QueueOffset, h.Property(PropertyTags), rec.Topic, rec.QueueID, rec.QueueOffset, tags)
		}
	})
}

// TestBatchProperty: the batch extent the encoder writes is read back by
// Header.Batch, and a record without one starts no batch.
func TestBatchProperty(t *testing.T) {
	first := Spec{Topic: "T", Body: []byte("a"), StoreHost: testStoreHost, PropCRC: true, BatchFirst: true}
	if ferr := first.Size(); ferr != nil {
		t.Fatal(ferr)
	}
	first.BatchCount, first.BatchBytes = 3, first.Total+200
	b := make([]byte, first.Total)
	first.Encode(b, 0, 0, 1)
	h, err := Check(b, true)
	if err != nil {
		t.Fatal(err)
	}
	count, n, ok, err := h.Batch()
	if err != nil || !ok || count != 3 || n != int64(first.Total+200) {
		t.Fatalf("Batch() = %d, %d, %v, %v; want 3, %d, true, nil", count, n, ok, err, first.Total+200)
	}
	plain := encodeSpec(t, Spec{Topic: "T", Body: []byte("a"), StoreHost: testStoreHost, PropCRC: true}, 0, 0, 1)
	h, err = Check(plain, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := h.Batch(); ok || err != nil {
		t.Fatalf("plain record: Batch() ok=%v err=%v", ok, err)
	}
}
