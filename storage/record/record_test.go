package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// goldenSpecs are records whose bytes are pinned in testdata/*.golden.
func goldenSpecs() map[string]struct {
	spec                    Spec
	queueOff, phys, storeTS int64
} {
	v4 := netip.MustParseAddrPort("10.1.2.3:4567")
	v6 := netip.MustParseAddrPort("[2001:db8::1]:10911")
	store := netip.MustParseAddrPort("192.168.0.9:10911")
	type g = struct {
		spec                    Spec
		queueOff, phys, storeTS int64
	}
	return map[string]g{
		"v4_plain": {Spec{Topic: "TopicTest", QueueID: 3, Flag: 7, Body: []byte("Hello RocketMQ"),
			Props: []Property{{Key: "TAGS", Value: "TagA"}, {Key: "KEYS", Value: "k1"}}, BornTS: 1700000000000, BornHost: v4, StoreHost: store,
			PropCRC: false}, 42, 4096, 1700000000123},
		"v4_propcrc": {Spec{Topic: "TopicTest", QueueID: 0, Body: []byte("body"),
			Props: []Property{{Key: "TAGS", Value: "TagA"}}, BornTS: 1, BornHost: v4, StoreHost: store, PropCRC: true}, 0, 0, 2},
		"v6_hosts": {Spec{Topic: "t6", QueueID: 1, Body: []byte{0, 1, 2, 3}, BornTS: 5, BornHost: v6,
			StoreHost: netip.MustParseAddrPort("[::1]:9"), PropCRC: true}, 9, 123456789, 6},
		"empty_body_no_props": {Spec{Topic: "x", Body: []byte{}, StoreHost: store}, 0, 0, 0},
	}
}

func encodeSpec(t testing.TB, r Spec, qo, phys, ts int64) []byte {
	t.Helper()
	r.BodyCRC = BodyCRC(r.Body)
	if verr := r.Size(); verr != nil {
		t.Fatalf("size: %v", verr)
	}
	b := make([]byte, r.Total)
	r.Encode(b, qo, phys, ts)
	return b
}

func TestGoldenRecords(t *testing.T) {
	for name, g := range goldenSpecs() {
		t.Run(name, func(t *testing.T) {
			got := encodeSpec(t, g.spec, g.queueOff, g.phys, g.storeTS)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding changed:\n got %x\nwant %x", got, want)
			}
			rec, n, err := Decode(want)
			if err != nil || n != len(want) {
				t.Fatalf("decode golden: n=%d err=%v", n, err)
			}
			s := g.spec
			if rec.Topic != s.Topic || rec.QueueID != s.QueueID || rec.Flag != s.Flag || !bytes.Equal(rec.Body, s.Body) ||
				rec.QueueOffset != g.queueOff || rec.PhysicalOffset != g.phys || rec.StoreTimestamp != g.storeTS ||
				rec.BornTimestamp != s.BornTS ||
				rec.StoreHost.Port() != s.StoreHost.Port() || rec.BornHost.Port() != s.BornHost.Port() ||
				rec.BodyCRC != BodyCRC(s.Body) || rec.HasPropCRC != s.PropCRC {
				t.Fatalf("decoded fields differ: %+v vs spec %+v", rec, s)
			}
			wantBorn := s.BornHost
			if !wantBorn.IsValid() {
				wantBorn = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
			}
			if rec.BornHost != wantBorn || rec.StoreHost.Addr() != s.StoreHost.Addr() {
				t.Fatalf("hosts: got %v %v want %v %v", rec.BornHost, rec.StoreHost, s.BornHost, s.StoreHost)
			}
			if h := StoreHost(want); h != rec.StoreHost || StoreTimestamp(want) != rec.StoreTimestamp {
				t.Fatalf("StoreHost/StoreTimestamp in place: %v %d, decoded %v %d", h, StoreTimestamp(want), rec.StoreHost, rec.StoreTimestamp)
			}
			for _, p := range s.Props {
				if v, ok := rec.Property(p.Key); !ok || v != p.Value {
					t.Fatalf("property %s = %q, %v", p.Key, v, ok)
				}
			}
		})
	}
}

// TestLayoutOffsets pins the field positions RocketMQ's decoders read
// directly (MessageDecoder: FLAG=16, QUEUE_OFFSET=20, PHY_POS=28,
// SYSFLAG=36, STORE_TIMESTAMP=56 for an IPv4 born host) and the length
// formula 91 + body + topic + props.
func TestLayoutOffsets(t *testing.T) {
	g := goldenSpecs()["v4_plain"]
	b := encodeSpec(t, g.spec, g.queueOff, g.phys, g.storeTS)
	be := binary.BigEndian
	props := "TAGS\x01TagA\x02KEYS\x01k1\x02"
	if want := 91 + len("Hello RocketMQ") + len("TopicTest") + len(props); len(b) != want || int(be.Uint32(b)) != want {
		t.Fatalf("length %d (field %d), want %d", len(b), be.Uint32(b), want)
	}
	checks := []struct {
		name string
		got  uint64
		want uint64
	}{
		{"magic", uint64(be.Uint32(b[4:])), uint64(MagicV1)},
		{"flag", uint64(be.Uint32(b[16:])), 7},
		{"queueOffset", be.Uint64(b[20:]), 42},
		{"physOffset", be.Uint64(b[28:]), 4096},
		{"sysflag", uint64(be.Uint32(b[36:])), 0},
		{"bornTS", be.Uint64(b[40:]), 1700000000000},
		{"bornIP", uint64(be.Uint32(b[48:])), 0x0A010203},
		{"bornPort", uint64(be.Uint32(b[52:])), 4567},
		{"storeTS", be.Uint64(b[56:]), 1700000000123},
		{"storePort", uint64(be.Uint32(b[68:])), 10911},
		{"bodyLen", uint64(be.Uint32(b[84:])), 14},
		{"topicLen", uint64(b[88+14]), 9},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if got := string(b[len(b)-len(props):]); got != props {
		t.Errorf("properties %q, want %q", got, props)
	}
}

func TestPropCRCForm(t *testing.T) {
	g := goldenSpecs()["v4_propcrc"]
	b := encodeSpec(t, g.spec, g.queueOff, g.phys, g.storeTS)
	tail := b[len(b)-crcPropLen:]
	if string(tail[:9]) != "__CRC32#\x01" || tail[19] != 2 {
		t.Fatalf("crc property malformed: %q", tail)
	}
	// Digits are least significant first: reverse them to read the number.
	want := BodyCRC(b[:len(b)-crcPropLen])
	var digits [10]byte
	c := want
	for i := range digits {
		digits[i] = '0' + byte(c%10)
		c /= 10
	}
	if string(tail[9:19]) != string(digits[:]) {
		t.Fatalf("digits %q, want %q (crc %d)", tail[9:19], digits, want)
	}
}

func TestDecodeRejectsDamage(t *testing.T) {
	g := goldenSpecs()["v4_propcrc"]
	good := encodeSpec(t, g.spec, g.queueOff, g.phys, g.storeTS)
	// Every single-bit flip anywhere in a CRC-protected record is caught.
	for i := range good {
		for bit := 0; bit < 8; bit++ {
			b := bytes.Clone(good)
			b[i] ^= 1 << bit
			if _, _, err := DecodeStrict(b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("flip byte %d bit %d: err = %v, want ErrCorrupt", i, bit, err)
			}
		}
	}
	for n := 0; n < len(good); n++ {
		if _, _, err := Decode(good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: err = %v", n, err)
		}
	}
	blank := make([]byte, 16)
	PutBlank(blank, 16)
	if _, _, err := Decode(blank); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("blank decoded as a message: %v", err)
	}
	if !IsBlank(blank) {
		t.Fatal("IsBlank false for a blank")
	}
}

func TestDecodeV2Topic(t *testing.T) {
	long := bytes.Repeat([]byte("a"), 200)
	r := Spec{Topic: string(long), Body: []byte("b"), StoreHost: testStoreHost, PropCRC: true}
	b := encodeSpec(t, r, 1, 2, 3)
	if binary.BigEndian.Uint32(b[4:]) != MagicV2 {
		t.Fatal("a 200-byte topic must use the V2 magic")
	}
	rec, _, err := Decode(b)
	if err != nil || rec.Topic != string(long) {
		t.Fatalf("decode V2: %v", err)
	}
}

func TestMsgID(t *testing.T) {
	host := netip.MustParseAddrPort("10.0.0.1:10911")
	id := MsgID(host, 0x1234)
	if id != "0A00000100002A9F0000000000001234" {
		t.Fatalf("msgId %s", id)
	}
	h, off, err := ParseMsgID(id)
	if err != nil || h != host || off != 0x1234 {
		t.Fatalf("parse: %v %d %v", h, off, err)
	}
	v6 := netip.MustParseAddrPort("[2001:db8::1]:80")
	id6 := MsgID(v6, 7)
	if len(id6) != 56 {
		t.Fatalf("v6 msgId length %d", len(id6))
	}
	if h, off, err := ParseMsgID(id6); err != nil || h != v6 || off != 7 {
		t.Fatalf("parse v6: %v %d %v", h, off, err)
	}
	if _, _, err := ParseMsgID("zz"); err == nil {
		t.Fatal("bad msgId accepted")
	}
}

func TestParseProperties(t *testing.T) {
	got := ParseProperties("a\x01b\x02\x01x\x02k\x01\x02c\x01d\x02junk\x02")
	want := []Property{{Key: "a", Value: "b"}, {Key: "c", Value: "d"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v want %v", got, want)
	}
}

func FuzzDecode(f *testing.F) {
	for _, g := range goldenSpecs() {
		f.Add(encodeSpec(f, g.spec, g.queueOff, g.phys, g.storeTS))
	}
	f.Add([]byte{})
	f.Add(make([]byte, 100))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if n > len(b) || n < MinLen {
			t.Fatalf("n = %d of %d", n, len(b))
		}
		// Re-encoding what was decoded and decoding again gives the same
		// record: decode loses nothing the encoder writes.
		r := Spec{Topic: rec.Topic, QueueID: rec.QueueID, Flag: rec.Flag, Body: rec.Body, SysFlag: rec.SysFlag,
			BornTS: rec.BornTimestamp, BornHost: rec.BornHost, StoreHost: rec.StoreHost, Reconsume: rec.ReconsumeTimes,
			PreparedTx: rec.PreparedTxOffset, PropCRC: true}
		for _, p := range rec.Properties {
			if p.Key != PropertyCRC32 {
				r.Props = append(r.Props, p)
			}
		}
		r.BodyCRC = BodyCRC(r.Body)
		if r.Size() != nil {
			return // properties the store refuses to write
		}
		out := make([]byte, r.Total)
		r.Encode(out, rec.QueueOffset, rec.PhysicalOffset, rec.StoreTimestamp)
		again, m, err := DecodeStrict(out)
		if err != nil || m != r.Total {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if again.Topic != rec.Topic || again.QueueID != rec.QueueID || again.QueueOffset != rec.QueueOffset ||
			again.PhysicalOffset != rec.PhysicalOffset || again.StoreTimestamp != rec.StoreTimestamp ||
			!bytes.Equal(again.Body, rec.Body) || again.BornHost != rec.BornHost || again.StoreHost != rec.StoreHost ||
			again.SysFlag != rec.SysFlag || again.Flag != rec.Flag {
			t.Fatalf("round trip differs: %+v vs %+v", again, rec)
		}
	})
}

func FuzzEncodeDecode(f *testing.F) {
	f.Add("TopicA", int32(1), []byte("hello"), "TAGS", "x", int64(5), true, false)
	f.Add("%RETRY%g", int32(0), []byte{}, "k", "v", int64(0), false, true)
	f.Fuzz(func(t *testing.T, topic string, qid int32, body []byte, k, v string, qo int64, propCRC, v6 bool) {
		if !ValidTopic(topic) || body == nil {
			return
		}
		born := netip.MustParseAddrPort("1.2.3.4:5")
		if v6 {
			born = netip.MustParseAddrPort("[fe80::1]:5")
		}
		r := Spec{Topic: topic, QueueID: qid, Body: body, Props: []Property{{Key: k, Value: v}}, BornHost: born,
			StoreHost: testStoreHost, PropCRC: propCRC}
		r.BodyCRC = BodyCRC(body)
		if r.Size() != nil {
			return // invalid property: refused before encoding
		}
		b := make([]byte, r.Total+10)
		r.Encode(b, qo, 99, 100)
		rec, n, err := Decode(b)
		if err != nil {
			t.Fatalf("decode of encoded record: %v", err)
		}
		if n != r.Total || rec.Topic != topic || rec.QueueID != qid || !bytes.Equal(rec.Body, body) || rec.QueueOffset != qo ||
			rec.PhysicalOffset != 99 || rec.StoreTimestamp != 100 || rec.BornHost != born {
			t.Fatalf("round trip mismatch: %+v", rec)
		}
		if got, ok := rec.Property(k); !ok || got != v {
			t.Fatalf("property %q = %q %v", k, got, ok)
		}
	})
}

var testStoreHost = netip.MustParseAddrPort("127.0.0.1:10911")
