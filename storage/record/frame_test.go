package record

import (
	"bytes"
	"testing"
)

// frameSeeds are records of every shape the walk distinguishes (V1 and V2
// magic, IPv6 hosts, with and without the whole-record CRC, a batch's first
// record).
func frameSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, g := range goldenSpecs() {
		out = append(out, encodeSpec(t, g.spec, g.queueOff, g.phys, g.storeTS))
	}
	first := Spec{Topic: "T", Body: []byte("batch"), StoreHost: testStoreHost, PropCRC: true, BatchFirst: true,
		Props: []Property{{Key: PropertyTags, Value: "x"}}}
	first.BodyCRC = BodyCRC(first.Body)
	if err := first.Size(); err != nil {
		t.Fatal(err)
	}
	first.BatchCount, first.BatchBytes = 2, first.Total+100
	b := make([]byte, first.Total)
	first.Encode(b, 1, 2, 3)
	out = append(out, b)
	// A topic past 127 bytes is encoded with the V2 magic (two-byte topic length).
	out = append(out, encodeSpec(t, Spec{Topic: string(bytes.Repeat([]byte("v"), 200)), Body: []byte("v2"),
		StoreHost: testStoreHost, PropCRC: true}, 4, 5, 6))
	return out
}

// junkSeeds are bytes that are no record: empty, zeros, a blank.
var junkSeeds = [][]byte{nil, make([]byte, 8), make([]byte, MinLen), {0, 0, 0, 8, 0xCB, 0xD4, 0x31, 0x94}}

// FuzzCheckFrame is the differential test of the light check against the
// full one: on any bytes and either CRC mode, CheckFrame and Check accept
// the same inputs with the same error, and on a record agree on its length,
// PHYSICALOFFSET, store time, properties and batch extent; Parse (lengths
// only, no CRC) accepts everything they accept with the same length, and
// rejects with the same error whatever fails before the CRC; and Decode's
// record, read by offset from its copy, has exactly the fields Check read
// in place.
func FuzzCheckFrame(f *testing.F) {
	for _, b := range append(frameSeeds(f), junkSeeds...) {
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, b []byte, requireCRC bool) {
		fr, ferr := CheckFrame(b, requireCRC)
		h, herr := Check(b, requireCRC)
		p, perr := Parse(b)
		if (ferr == nil) != (herr == nil) || (ferr != nil && ferr.Error() != herr.Error()) {
			t.Fatalf("CheckFrame error %v, Check error %v", ferr, herr)
		}
		if herr == nil && perr != nil {
			t.Fatalf("Check accepts what Parse rejects: %v", perr)
		}
		if perr != nil && perr.Error() != herr.Error() {
			t.Fatalf("Parse error %v, Check error %v: the one walk reports one error", perr, herr)
		}
		if perr == nil && (p.Total < MinLen || int(p.Total) > len(b)) {
			t.Fatalf("Parse total %d outside [%d, %d]", p.Total, MinLen, len(b))
		}
		rec, n, derr := DecodeChecked(b, requireCRC)
		if (derr == nil) != (herr == nil) || (derr != nil && derr.Error() != herr.Error()) {
			t.Fatalf("Decode error %v, Check error %v", derr, herr)
		}
		if herr != nil {
			return
		}
		if fr.Total != h.Total || fr.Total != p.Total || fr.PhysOffset != h.PhysOffset || fr.StoreTS != h.StoreTS ||
			!bytes.Equal(fr.Props, h.Props) || len(h.Props) > 0 && &fr.Props[0] != &h.Props[0] ||
			cap(fr.Props) != len(fr.Props) || cap(h.Props) != len(h.Props) || cap(h.Body) != len(h.Body) || cap(h.Topic) != len(h.Topic) {
			t.Fatalf("CheckFrame %+v, Check %+v", fr, h)
		}
		fc, fb, fok, fe := fr.Batch()
		hc, hb, hok, he := h.Batch()
		if fc != hc || fb != hb || fok != hok || (fe == nil) != (he == nil) {
			t.Fatalf("Frame.Batch %d %d %v %v, Header.Batch %d %d %v %v", fc, fb, fok, fe, hc, hb, hok, he)
		}
		bornHost, _ := getHost(b, h.bornHostAt, h.SysFlag&FlagBornHostV6 != 0)
		storeHost, _ := getHost(b, h.storeHostAt, h.SysFlag&FlagStoreHostV6 != 0)
		if n != int(h.Total) || !bytes.Equal(rec.Raw, b[:n]) || rec.TotalSize != h.Total || rec.Magic != h.Magic ||
			rec.BodyCRC != h.BodyCRC || rec.QueueID != h.QueueID || rec.Flag != h.Flag || rec.QueueOffset != h.QueueOffset ||
			rec.PhysicalOffset != h.PhysOffset || rec.SysFlag != h.SysFlag || rec.BornTimestamp != h.BornTS ||
			rec.StoreTimestamp != h.StoreTS || rec.ReconsumeTimes != h.Reconsume || rec.PreparedTxOffset != h.PreparedTx ||
			!bytes.Equal(rec.Body, h.Body) || rec.Topic != string(h.Topic) || rec.PropertiesRaw != string(h.Props) ||
			rec.BornHost != bornHost || rec.StoreHost != storeHost {
			t.Fatalf("Decode %+v, Check %+v", rec, h)
		}
		if len(rec.Body) > 0 && (&rec.Body[0] == &b[0] || cap(rec.Body) != len(rec.Body)) {
			t.Fatal("Decode's Body aliases the input or can grow into the record")
		}
	})
}

// TestCheckFrameSeeds runs the differential check on the seeds and on every
// single-byte flip of them, so the plain test run covers the damaged
// records recovery sees (the fuzzer explores further with -fuzz).
func TestCheckFrameSeeds(t *testing.T) {
	seeds := frameSeeds(t)
	for s, seed := range append(seeds, junkSeeds...) {
		for i := -1; i < len(seed); i++ {
			b := bytes.Clone(seed)
			if i >= 0 {
				b[i] ^= 0x41
			}
			for _, rc := range []bool{false, true} {
				fr, ferr := CheckFrame(b, rc)
				h, herr := Check(b, rc)
				if (ferr == nil) != (herr == nil) || (ferr != nil && ferr.Error() != herr.Error()) {
					t.Fatalf("flip %d: CheckFrame error %v, Check error %v", i, ferr, herr)
				}
				if herr == nil && (fr.Total != h.Total || fr.PhysOffset != h.PhysOffset || fr.StoreTS != h.StoreTS ||
					!bytes.Equal(fr.Props, h.Props)) {
					t.Fatalf("flip %d: CheckFrame %+v, Check %+v", i, fr, h)
				}
				if i < 0 && s < len(seeds) && herr != nil && !rc {
					t.Fatalf("seed %x does not check: %v", seed, herr)
				}
			}
		}
	}
}

// TestCheckFrameBatch: the batch extent the encoder writes is read back
// through a Frame as through a Header.
func TestCheckFrameBatch(t *testing.T) {
	seeds := frameSeeds(t)
	var found bool
	for _, b := range seeds {
		fr, err := CheckFrame(b, true)
		if err != nil {
			continue
		}
		if c, n, ok, err := fr.Batch(); ok {
			found = true
			if err != nil || c != 2 || n != int64(fr.Total)+100 {
				t.Fatalf("Frame.Batch() = %d, %d, %v, %v", c, n, ok, err)
			}
		}
	}
	if !found {
		t.Fatal("no seed carries a batch extent")
	}
}

// BenchmarkCheckFrame is what recovery's scan runs per record
// (BenchmarkCheckBatch's work through the light check).
func BenchmarkCheckFrame(b *testing.B) {
	rec := benchRecord(b)
	b.SetBytes(int64(len(rec)))
	for b.Loop() {
		fr, err := CheckFrame(rec, true)
		if err != nil {
			b.Fatal(err)
		}
		c, _, _, _ := fr.Batch()
		sinkInt = c + fr.PhysOffset + fr.StoreTS
	}
}
