package raftlog

import (
	"bytes"
	"errors"
	"testing"
)

func TestUnitRoundTripAndRejects(t *testing.T) {
	good := []Unit{
		{Term: 1, Pos: 0, Len: 100, Kind: KindData, DataCRC: 7},
		{Term: 9, Pos: 1 << 40, Len: 5, Kind: KindData, Flags: FlagBlank, DataCRC: 0xffffffff},
		{Term: 2, Kind: KindEmpty},
		{Term: 3, Pos: 12, Len: 0, Kind: KindCmd, DataCRC: crc32c(nil)},
		{Term: 3, Pos: 12, Len: 9, Kind: KindConf, Flags: FlagConfV1, DataCRC: 1},
	}
	for _, u := range good {
		var b [UnitSize]byte
		u.Encode(b[:])
		got, err := DecodeUnit(b[:])
		if err != nil || got != u {
			t.Errorf("DecodeUnit(Encode(%+v)) = %+v, %v", u, got, err)
		}
	}
	reseal := func(b []byte) []byte { // fix the unit CRC after editing fields
		var u [UnitSize]byte
		copy(u[:], b)
		crc := crc32c(u[:28])
		u[28], u[29], u[30], u[31] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
		return u[:]
	}
	base := func(u Unit) []byte { var b [UnitSize]byte; u.Encode(b[:]); return b[:] }
	data := Unit{Term: 1, Pos: 64, Len: 10, Kind: KindData, DataCRC: 5}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"zero", make([]byte, UnitSize), ErrUnitZero},
		{"short", base(data)[:UnitSize-1], ErrUnitBad},
		{"flipped bit", func() []byte { b := base(data); b[3] ^= 1; return b }(), ErrUnitCRC},
		{"flipped crc", func() []byte { b := base(data); b[31] ^= 1; return b }(), ErrUnitCRC},
		{"unknown kind", func() []byte { b := base(data); b[20] = 9; return reseal(b) }(), ErrUnitBad},
		{"kind none", func() []byte { b := base(data); b[20] = 0; return reseal(b) }(), ErrUnitBad},
		{"unknown flag", func() []byte { b := base(data); b[21] = 0x80; return reseal(b) }(), ErrUnitBad},
		{"reserved", func() []byte { b := base(data); b[22] = 1; return reseal(b) }(), ErrUnitBad},
		{"negative pos", func() []byte { b := base(data); b[8] = 0x80; return reseal(b) }(), ErrUnitBad},
		{"empty with payload", base(Unit{Term: 1, Kind: KindEmpty, Len: 3}), ErrUnitBad},
		{"blank on cmd", base(Unit{Term: 1, Kind: KindCmd, Flags: FlagBlank}), ErrUnitBad},
		{"v1 on data", base(Unit{Term: 1, Kind: KindData, Len: 1, Flags: FlagConfV1}), ErrUnitBad},
		{"data without bytes", base(Unit{Term: 1, Kind: KindData}), ErrUnitBad},
	}
	for _, c := range cases {
		if _, err := DecodeUnit(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
}

func FuzzDecodeUnit(f *testing.F) {
	var b [UnitSize]byte
	Unit{Term: 1, Pos: 64, Len: 10, Kind: KindData, Flags: FlagBlank, DataCRC: 5}.Encode(b[:])
	f.Add(b[:])
	f.Add(make([]byte, UnitSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeUnit(b)
		if err != nil {
			return
		}
		var again [UnitSize]byte
		u.Encode(again[:])
		if !bytes.Equal(again[:], b[:UnitSize]) {
			t.Fatalf("decoded %+v re-encodes to %x, not %x", u, again, b[:UnitSize])
		}
	})
}

func TestHardStateSlots(t *testing.T) {
	enc := func(s slot) []byte { b := make([]byte, slotSize); s.encode(b); return b }
	s1 := slot{Seq: 1, Term: 2, Vote: 3, Commit: 4}
	s2 := slot{Seq: 2, Term: 5, Vote: 1, Commit: 9}
	torn := enc(s2)
	torn[10] ^= 0xff
	cases := []struct {
		name  string
		file  []byte
		want  slot
		found bool
	}{
		{"empty file", nil, slot{}, false},
		{"zeros", make([]byte, 2*slotSize), slot{}, false},
		{"one slot", append(make([]byte, slotSize), enc(s1)...), s1, true},
		{"newest wins", append(enc(s2), enc(s1)...), s2, true},
		{"newest wins, other order", append(enc(s1), enc(s2)...), s2, true},
		{"torn newest: the older one", append(torn, enc(s1)...), s1, true},
		{"short second slot", append(enc(s1), enc(s2)[:slotSize-1]...), s1, true},
		{"padding not zero", func() []byte { b := enc(s1); b[40] = 1; return b }(), slot{}, false},
	}
	for _, c := range cases {
		got, found := decodeHardState(c.file)
		if got != c.want || found != c.found {
			t.Errorf("%s: %+v %v, want %+v %v", c.name, got, found, c.want, c.found)
		}
	}
}

func FuzzDecodeHardState(f *testing.F) {
	b := make([]byte, 2*slotSize)
	slot{Seq: 3, Term: 1, Vote: 2, Commit: 3}.encode(b[slotSize:])
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, found := decodeHardState(b)
		if !found {
			return
		}
		again := make([]byte, slotSize)
		s.encode(again)
		if !bytes.Equal(again, b[(s.Seq%2)*slotSize:][:slotSize]) && !bytes.Equal(again, b[:slotSize]) && !(len(b) >= 2*slotSize && bytes.Equal(again, b[slotSize:2*slotSize])) {
			t.Fatalf("slot %+v is not in the file", s)
		}
	})
}
