package raftlog

import (
	"bytes"
	"errors"
	iofs "io/fs"
	"testing"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/vfs"
)

// TestIndexLastNonZero: the last non-zero unit from index k on, across
// index files and within one, is what a unit-by-unit walk finds, and
// saveUnits keeps exactly the units from k through it (nothing when
// they are all zero).
func TestIndexLastNonZero(t *testing.T) {
	const units = 8
	fs := vfs.NewMem()
	x, err := loadIndex(fs, "/d/index", units, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer x.close()
	for i := uint64(0); i < 3*units; i += units { // three files
		if _, err := x.ensure(i); err != nil {
			t.Fatal(err)
		}
	}
	walk := func(k uint64) (uint64, bool) {
		last, ok := uint64(0), false
		for i := k; x.slot(i) != nil; i++ {
			if !commitlog.AllZero(x.slot(i)) {
				last, ok = i, true
			}
		}
		return last, ok
	}
	check := func(what string) {
		t.Helper()
		for k := uint64(0); k <= 3*units; k++ {
			gl, gok := x.lastNonZero(k)
			wl, wok := walk(k)
			if gl != wl || gok != wok {
				t.Fatalf("%s, from %d: lastNonZero %d %v, a walk finds %d %v", what, k, gl, gok, wl, wok)
			}
			name := "/d/index/" + indexName(k) + ".broken"
			fs.Remove(name)
			if err := saveUnits(fs, "/d", x, k); err != nil {
				t.Fatal(err)
			}
			got, err := fs.ReadFile(name)
			if !wok {
				if !errors.Is(err, iofs.ErrNotExist) {
					t.Fatalf("%s, from %d: all zero, yet saved %d bytes (%v)", what, k, len(got), err)
				}
				continue
			}
			var want []byte
			for i := k; i <= wl; i++ {
				want = append(want, x.slot(i)...)
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s, from %d: saved %d bytes (%v), want units %d-%d (%d bytes)", what, k, len(got), err, k, wl, len(want))
			}
		}
	}
	check("all zero")
	x.slot(2)[5] = 1
	check("one unit in the first file")
	x.slot(units + 3)[UnitSize-1] = 7 // its last byte
	check("and one in the second")
	x.slot(3*units - 1)[0] = 9 // the last unit of the last file
	check("and the very last unit")
}
