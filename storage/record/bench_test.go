package record

import (
	"net/netip"
	"testing"
)

// benchRecord is the record the storage benchmarks write: 1 KiB body, a
// tag, the whole-record CRC.
func benchRecord(b *testing.B) []byte {
	return encodeSpec(b, Spec{Topic: "BenchTopic", Body: make([]byte, 1024), Props: []Property{{Key: PropertyTags, Value: "TagA"}},
		BornTS: 1, BornHost: netip.MustParseAddrPort("127.0.0.1:5"), StoreHost: testStoreHost, PropCRC: true}, 7, 4096, 9)
}

var (
	sinkHeader Header
	sinkRecord *Record
)

// BenchmarkCheck measures the full check a reader runs on a record in
// place (walk, CRC, every field read).
func BenchmarkCheck(b *testing.B) {
	rec := benchRecord(b)
	b.SetBytes(int64(len(rec)))
	for b.Loop() {
		h, err := Check(rec, true)
		if err != nil {
			b.Fatal(err)
		}
		sinkHeader = h
	}
}

// BenchmarkDecode measures what a pull pays per message: the check, the
// copy and the decoded fields.
func BenchmarkDecode(b *testing.B) {
	rec := benchRecord(b)
	b.SetBytes(int64(len(rec)))
	b.ReportAllocs()
	for b.Loop() {
		r, _, err := DecodeStrict(rec)
		if err != nil {
			b.Fatal(err)
		}
		sinkRecord = r
	}
}

var sinkInt int64

// BenchmarkCheckBatch is what recovery's scan ran per record before
// CheckFrame: the full check and the batch extent.
func BenchmarkCheckBatch(b *testing.B) {
	rec := benchRecord(b)
	b.SetBytes(int64(len(rec)))
	for b.Loop() {
		h, err := Check(rec, true)
		if err != nil {
			b.Fatal(err)
		}
		c, _, _, _ := h.Batch()
		sinkInt = c + h.PhysOffset + h.StoreTS
	}
}
