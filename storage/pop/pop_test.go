package pop

import (
	"bytes"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestCodecRoundTrip(t *testing.T) {
	for _, ops := range [][]Op{
		{{Kind: Set, Key: QueueKey{"g", "T", 0}, Cursor: 5, Items: []Item{{Offset: 3, Deadline: 1000, Gen: 1}}}},
		{{Kind: Set, Key: QueueKey{"g", "T", 1}, Cursor: 9}},
		{{Kind: Set, Key: QueueKey{strings.Repeat("g", 255), "%RETRY%g", 1023}, Cursor: NoCursor,
			Items: []Item{{Offset: 1<<62 + 5, Deadline: 1 << 50, Gen: 1<<64 - 1}}},
			{Kind: Drop, Key: QueueKey{"g", "T", 7}, Cursor: NoCursor, Items: []Item{{Offset: 0, Gen: 2}, {Offset: 1, Gen: 3}}}},
		// Version 2: an item redelivered in place (a FIFO group).
		{{Kind: Set, Key: QueueKey{"g", "T", 0}, Cursor: NoCursor, Items: []Item{{Offset: 3, Deadline: 1000, Gen: 4, Redelivered: 2},
			{Offset: 4, Deadline: 1000, Gen: 5}}}},
	} {
		b := Encode(ops)
		if len(b) != EncodedLen(ops) {
			t.Fatalf("EncodedLen %d, encoded %d", EncodedLen(ops), len(b))
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)): %v", ops, err)
		}
		for i := range got { // Decode makes an empty Items slice
			if len(got[i].Items) == 0 {
				got[i].Items = nil
			}
		}
		if !reflect.DeepEqual(got, ops) {
			t.Fatalf("Decode(Encode(%v)) = %v", ops, got)
		}
	}
}

// TestEncodeGolden pins the wire format of POP state records.
func TestEncodeGolden(t *testing.T) {
	got := Encode([]Op{{Kind: Drop, Key: QueueKey{"g", "T", 2}, Cursor: NoCursor, Items: []Item{{Offset: 258, Deadline: 0, Gen: 7}}}})
	want := []byte{1, 0, 1, // version, 1 op
		2, 1, 'g', 1, 'T', 0, 0, 0, 2, // Drop, group, topic, queue 2
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // cursor -1
		0, 1, // 1 item
		0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	got = Encode([]Op{{Kind: Drop, Key: QueueKey{"g", "T", 2}, Cursor: NoCursor, Items: []Item{{Offset: 258, Deadline: 0, Gen: 7, Redelivered: 3}}}})
	want = append(append([]byte{2}, want[1:]...), 0, 0, 0, 3) // version 2: each item ends with its redeliveries
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode v2 = %v, want %v", got, want)
	}
	// Computed independently (Python: struct.pack('>BBiqQ', 1, 1, 3, 258, 7),
	// its CRC-32C, base64url without padding).
	if h := EncodeHandle(Handle{Retry: true, Queue: 3, Offset: 258, Gen: 7}); h != "AQEAAAADAAAAAAAAAQIAAAAAAAAAB3FPRLI" {
		t.Fatalf("handle %q", h)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode([]Op{{Kind: Set, Key: QueueKey{"g", "T", 2}, Cursor: 4, Items: []Item{{Offset: 3, Deadline: 9, Gen: 1}}}})
	mut := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	for name, b := range map[string][]byte{
		"empty":               nil,
		"short":               {1, 0},
		"version":             mut(0, 3),
		"v1 item length":      mut(0, 2), // version 2 with 24-byte items
		"v2 redelivered none": append(mut(0, 2), 0, 0, 0, 0),
		"zero ops":            {1, 0, 0},
		"too many ops":        append([]byte{1, 0, 2}, good[3:]...),
		"kind":                mut(3, 9),
		"empty group":         mut(4, 0),
		"truncated":           good[:len(good)-1],
		"trailing":            append(bytes.Clone(good), 0),
		"negative queue":      mut(8, 0x80),
		"cursor":              mut(12, 0x80),
		"items overflow":      mut(21, 9),
		"zero gen":            append(bytes.Clone(good[:len(good)-8]), 0, 0, 0, 0, 0, 0, 0, 0),
		"drop no items":       Encode([]Op{{Kind: Drop, Key: QueueKey{"g", "T", 0}, Cursor: NoCursor}}),
		"set nothing":         Encode([]Op{{Kind: Set, Key: QueueKey{"g", "T", 0}, Cursor: NoCursor}}),
		"drop cursor":         Encode([]Op{{Kind: Drop, Key: QueueKey{"g", "T", 0}, Cursor: 3, Items: []Item{{Offset: 1, Gen: 1}}}}),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrDecode) {
			t.Errorf("%s: Decode(%v) = %v, want ErrDecode", name, b, err)
		}
	}
}

func TestHandleRoundTrip(t *testing.T) {
	for _, h := range []Handle{{Queue: 0, Offset: 0, Gen: 1}, {Retry: true, Queue: 1023, Offset: 1 << 62, Gen: 1<<64 - 1}} {
		s := EncodeHandle(h)
		if len(s) != HandleLen {
			t.Fatalf("handle %q is %d characters, want %d", s, len(s), HandleLen)
		}
		got, err := DecodeHandle(s)
		if err != nil || got != h {
			t.Fatalf("DecodeHandle(EncodeHandle(%+v)) = %+v, %v", h, got, err)
		}
	}
}

func TestDecodeHandleRefuses(t *testing.T) {
	good := EncodeHandle(Handle{Queue: 1, Offset: 2, Gen: 3})
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	reenc := func(mod func([]byte)) string {
		b := bytes.Clone(raw)
		mod(b)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	flip := []byte(good)
	flip[10] ^= 1
	for name, s := range map[string]string{
		"empty":        "",
		"short":        good[:len(good)-1],
		"long":         good + "A",
		"not base64":   strings.Repeat("*", HandleLen),
		"bit flip":     string(flip),
		"version":      reenc(func(b []byte) { b[0] = 2 }),
		"flags":        reenc(func(b []byte) { b[1] = 2 }),
		"std alphabet": good[:HandleLen-1] + "+",
		"padded":       good[:HandleLen-1] + "=",
	} {
		if s == good {
			continue
		}
		if _, err := DecodeHandle(s); !errors.Is(err, ErrBadHandle) {
			t.Errorf("%s: DecodeHandle(%q) = %v, want ErrBadHandle", name, s, err)
		}
	}
}

// FuzzDecodeHandle: no input panics; what is accepted re-encodes to
// itself; and an encoded handle decodes to what was encoded.
func FuzzDecodeHandle(f *testing.F) {
	f.Add(EncodeHandle(Handle{Queue: 1, Offset: 2, Gen: 3}))
	f.Add(EncodeHandle(Handle{Retry: true, Queue: 1023, Offset: 1 << 40, Gen: 1 << 63}))
	f.Add("")
	f.Add(strings.Repeat("A", HandleLen))
	f.Fuzz(func(t *testing.T, s string) {
		h, err := DecodeHandle(s)
		if err != nil {
			if !errors.Is(err, ErrBadHandle) {
				t.Fatalf("DecodeHandle(%q): %v, not ErrBadHandle", s, err)
			}
			return
		}
		if got := EncodeHandle(h); got != s {
			t.Fatalf("DecodeHandle(%q) = %+v, which encodes to %q", s, h, got)
		}
	})
}

// FuzzDecode: no record body panics the decoder, and what it accepts
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(Encode([]Op{{Kind: Set, Key: QueueKey{"g", "T", 0}, Cursor: 5, Items: []Item{{Offset: 3, Deadline: 1000, Gen: 1}}}}))
	f.Add(Encode([]Op{{Kind: Drop, Key: QueueKey{"g", "T", 0}, Cursor: NoCursor, Items: []Item{{Offset: 3, Gen: 1}}}}))
	f.Add([]byte{1, 0, 1})
	f.Add(Encode([]Op{{Kind: Set, Key: QueueKey{"g", "T", 0}, Cursor: NoCursor, Items: []Item{{Offset: 3, Deadline: 1000, Gen: 1, Redelivered: 1}}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("Decode: %v, not ErrDecode", err)
			}
			return
		}
		if got := Encode(ops); !bytes.Equal(got, b) {
			t.Fatalf("Decode(%x) = %v, which encodes to %x", b, ops, got)
		}
	})
}

// TestTable: pops, renewals and drops, the group's due order, the bounds,
// and a rebuild from the table's own restatement (Below) equal to it.
func TestTable(t *testing.T) {
	tb := New(Limits{Inflight: 5, InflightPerGroup: 3, Cursors: 2})
	k := QueueKey{"g", "T", 0}
	if tb.Room("g") != 3 {
		t.Fatalf("room %d", tb.Room("g"))
	}
	g1, g2, g3 := tb.NextGen(), tb.NextGen(), tb.NextGen()
	tb.Apply(Op{Kind: Set, Key: k, Cursor: 3, Items: []Item{{0, 300, g1, 0}, {1, 100, g2, 0}, {2, 200, g3, 0}}}, 10)
	if c, ok := tb.Cursor(k); !ok || c != 3 {
		t.Fatalf("cursor %d %v", c, ok)
	}
	if tb.Room("g") != 0 || tb.Room("h") != 2 || tb.Inflight("") != 3 {
		t.Fatalf("room g %d, h %d, total %d", tb.Room("g"), tb.Room("h"), tb.Inflight(""))
	}
	if d, ok := tb.NextDeadline("g"); !ok || d != 100 {
		t.Fatalf("next deadline %d %v", d, ok)
	}
	due := tb.Due("g", 250, 10)
	if len(due) != 2 || !(due[0].Offset == 1 && due[1].Offset == 2 || due[0].Offset == 2 && due[1].Offset == 1) {
		t.Fatalf("due at 250: %v", due)
	}
	if len(tb.Due("g", 250, 1)) != 1 || len(tb.Due("g", 99, 10)) != 0 {
		t.Fatal("Due's limit or deadline not kept")
	}
	// A renewal replaces the generation and deadline.
	g4 := tb.NextGen()
	tb.Apply(Op{Kind: Set, Key: k, Cursor: NoCursor, Items: []Item{{1, 500, g4, 0}}}, 20)
	if d, g, ok := tb.Get(Key{k, 1}); !ok || d != 500 || g != g4 {
		t.Fatalf("renewed: %d %d %v", d, g, ok)
	}
	if d, _ := tb.NextDeadline("g"); d != 200 {
		t.Fatalf("next deadline after renewal %d", d)
	}
	// A drop of a stale generation changes nothing; of the current one
	// frees the slot.
	tb.Apply(Op{Kind: Drop, Key: k, Cursor: NoCursor, Items: []Item{{Offset: 1, Gen: g2}}}, 30)
	if _, _, ok := tb.Get(Key{k, 1}); !ok {
		t.Fatal("a stale drop removed the renewed message")
	}
	tb.Apply(Op{Kind: Drop, Key: k, Cursor: NoCursor, Items: []Item{{Offset: 1, Gen: g4}, {Offset: 0, Gen: g1}}}, 40)
	if tb.Inflight("g") != 1 || tb.Room("g") != 2 {
		t.Fatalf("after drops: %d in flight, room %d", tb.Inflight("g"), tb.Room("g"))
	}
	if err := tb.AdmitCursor(QueueKey{"g", "T", 1}); err != nil {
		t.Fatal(err)
	}
	tb.Advance(QueueKey{"g", "T", 1}, 7)
	if err := tb.AdmitCursor(QueueKey{"g", "T", 2}); !errors.Is(err, ErrTooManyCursors) {
		t.Fatalf("third cursor: %v", err)
	}
	if at, ok := tb.OldestAt(); !ok || at != 10 {
		t.Fatalf("oldest at %d %v", at, ok)
	}
	// Restating everything below 41 rebuilds the same state.
	re := New(Limits{Inflight: 5, InflightPerGroup: 3, Cursors: 2})
	for _, op := range tb.Below(41) {
		re.Apply(op, 50)
	}
	for _, qk := range []QueueKey{k, {"g", "T", 1}} {
		a, aok := tb.Cursor(qk)
		b, bok := re.Cursor(qk)
		if a != b || aok != bok {
			t.Errorf("cursor %v: %d %v, restated %d %v", qk, a, aok, b, bok)
		}
	}
	for off := int64(0); off < 3; off++ {
		ad, ag, aok := tb.Get(Key{k, off})
		bd, bg, bok := re.Get(Key{k, off})
		if ad != bd || ag != bg || aok != bok {
			t.Errorf("offset %d: %d %d %v, restated %d %d %v", off, ad, ag, aok, bd, bg, bok)
		}
	}
	// Generations: a replay of a Drop (as of a Set) raises the counter
	// past it; SeedGen raises it past its argument.
	fromDrop := New(Limits{Inflight: 5, InflightPerGroup: 3, Cursors: 2})
	fromDrop.Apply(Op{Kind: Drop, Key: k, Cursor: NoCursor, Items: []Item{{Offset: 1, Gen: g4}}}, 1)
	if fromDrop.NextGen() <= g4 {
		t.Error("a table rebuilt from records hands out a generation a Drop named")
	}
	re.SeedGen(1 << 40)
	if g := re.NextGen(); g != 1<<40+1 {
		t.Errorf("after SeedGen(1<<40): %d", g)
	}
	re.SeedGen(5)
	if g := re.NextGen(); g != 1<<40+2 {
		t.Errorf("SeedGen lowered the counter: %d", g)
	}
	if len(re.Below(50)) != 0 {
		t.Errorf("nothing lies below 50 after the restatement, Below says %v", re.Below(50))
	}
}

// TestProgress: random pops, renewals, acks, cursor moves and a reset;
// after each, Progress's per-queue counts and cursors equal those counted
// from the messages in flight and the cursors (the table keeps them
// incrementally; the model walks everything).
func TestProgress(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := New(Limits{Inflight: 1 << 20, InflightPerGroup: 1 << 20, Cursors: 1 << 20})
	keys := []QueueKey{{"a", "T", 0}, {"a", "T", 1}, {"a", "%RETRY%a", 0}, {"b", "T", 0}}
	live := map[Key]uint64{}
	cursors := map[QueueKey]int64{}
	for step := range 2000 {
		k := keys[rng.IntN(len(keys))]
		off := int64(rng.IntN(8))
		switch r := rng.IntN(10); {
		case r < 5: // pop or renew
			g := tb.NextGen()
			cur := int64(NoCursor)
			if rng.IntN(2) == 0 {
				cur = off + 1
				cursors[k] = cur
			}
			tb.Apply(Op{Kind: Set, Key: k, Cursor: cur, Items: []Item{{Offset: off, Deadline: 1, Gen: g}}}, int64(step))
			live[Key{k, off}] = g
		case r < 9: // ack: with the right generation or a stale one
			g, ok := live[Key{k, off}]
			if !ok || rng.IntN(4) == 0 {
				g = tb.NextGen() // matches nothing
			} else {
				delete(live, Key{k, off})
			}
			tb.Apply(Op{Kind: Drop, Key: k, Cursor: NoCursor, Items: []Item{{Offset: off, Gen: g}}}, int64(step))
		case rng.IntN(50) == 0:
			tb.Reset()
			live, cursors = map[Key]uint64{}, map[QueueKey]int64{}
		default: // its topic deleted: the cursor goes, what is in flight stays
			tb.DropCursor(k)
			delete(cursors, k)
		}
		want := map[QueueKey]QueueProgress{}
		for k := range live {
			p := want[k.QueueKey]
			p.Key = k.QueueKey
			p.Inflight++
			want[k.QueueKey] = p
		}
		for k, c := range cursors {
			p := want[k]
			p.Key, p.Next, p.HasNext = k, c, true
			want[k] = p
		}
		got := tb.Progress()
		if len(got) != len(want) {
			t.Fatalf("step %d: %d queues, want %d: %v", step, len(got), len(want), got)
		}
		for i, p := range got {
			if p != want[p.Key] {
				t.Fatalf("step %d: %+v, want %+v", step, p, want[p.Key])
			}
			if i > 0 && !lessQueue(got[i-1].Key, p.Key) {
				t.Fatalf("step %d: not sorted: %v", step, got)
			}
		}
		if tb.Inflight("") != len(live) {
			t.Fatalf("step %d: %d in flight, want %d", step, tb.Inflight(""), len(live))
		}
	}
}

// TestDropTopic: a topic's delete drops its cursors and messages in flight
// written below the delete's offset, of every group, and keeps those of
// other topics and those written after it; the deadline heaps, per-queue
// sets and counts stay consistent.
func TestDropTopic(t *testing.T) {
	tb := New(Limits{Inflight: 100, InflightPerGroup: 100, Cursors: 100})
	gone, gone2, kept := QueueKey{"g", "Gone", 0}, QueueKey{"h", "Gone", 1}, QueueKey{"g", "Kept", 0}
	tb.Apply(Op{Kind: Set, Key: gone, Cursor: 3, Items: []Item{{0, 300, tb.NextGen(), 0}, {1, 100, tb.NextGen(), 0}}}, 10)
	tb.Apply(Op{Kind: Set, Key: kept, Cursor: 2, Items: []Item{{1, 200, tb.NextGen(), 0}}}, 20)
	tb.Apply(Op{Kind: Set, Key: gone2, Cursor: 1, Items: []Item{{0, 50, tb.NextGen(), 0}}}, 30)
	tb.Advance(QueueKey{"i", "Gone", 2}, 7) // a cursor with no record
	late := QueueKey{"j", "Gone", 0}
	tb.Apply(Op{Kind: Set, Key: late, Cursor: 1, Items: []Item{{0, 400, tb.NextGen(), 0}}}, 60) // after the delete
	if c, n := tb.DropTopic("Gone", 50); c != 3 || n != 3 {
		t.Fatalf("dropped %d cursors, %d in flight; want 3 and 3", c, n)
	}
	if tb.Inflight("") != 2 || tb.Inflight("g") != 1 || tb.Inflight("h") != 0 || tb.Stats() != 2 {
		t.Fatalf("in flight: all %d, g %d, h %d, stats %d", tb.Inflight(""), tb.Inflight("g"), tb.Inflight("h"), tb.Stats())
	}
	if d, ok := tb.NextDeadline("g"); !ok || d != 200 {
		t.Fatalf("g's next deadline %d %v, want Kept's 200", d, ok)
	}
	if due := tb.Due("g", 1000, 10); len(due) != 1 || due[0].Topic != "Kept" {
		t.Fatalf("g's due %v", due)
	}
	var keys []QueueKey
	for _, p := range tb.Progress() {
		keys = append(keys, p.Key)
	}
	if len(keys) != 2 || keys[0] != kept || keys[1] != late {
		t.Fatalf("progress left %v, want Kept's and the later Gone state", keys)
	}
	if _, ok := tb.Cursor(gone); ok {
		t.Fatal("a cursor of the deleted topic survived")
	}
}
