package raftlog

import (
	"bytes"
	"errors"
	iofs "io/fs"
	"math"
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

// TestIndexZeroRange: zeroRange clears exactly the units from k to last,
// across index files, and reports whether any was not zero; a unit past
// last is left as it is (a live log's are zero already, and clearing
// them dirtied whole files: commitlog's TestTruncateAfterLeavesTheTailAlone),
// while zeroFrom, for recovery, clears to the end.
func TestIndexZeroRange(t *testing.T) {
	const units = 8
	for _, tc := range []struct {
		name    string
		k, last uint64
	}{
		{"inside one file", 2, 5},
		{"to a file's last unit", 3, units - 1},
		{"across two files", 5, units + 2},
		{"across three files", 1, 2*units + 6},
		{"one unit", units, units},
		{"to the end (zeroFrom)", 4, math.MaxUint64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			x, err := loadIndex(fs, "/d/index", units, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer x.close()
			for i := uint64(0); i < 3*units; i++ {
				if _, err := x.ensure(i); err != nil {
					t.Fatal(err)
				}
				x.slot(i)[0], x.slot(i)[UnitSize-1] = byte(i+1), 0xff
			}
			changed, err := x.zeroRange(tc.k, tc.last)
			if err != nil || !changed {
				t.Fatalf("zeroRange(%d, %d) = %v, %v; want changed", tc.k, tc.last, changed, err)
			}
			for i := uint64(0); i < 3*units; i++ {
				zero := commitlog.AllZero(x.slot(i))
				if want := i >= tc.k && i <= tc.last; zero != want {
					t.Fatalf("unit %d zero %v after zeroRange(%d, %d), want %v", i, zero, tc.k, tc.last, want)
				}
			}
			if changed, err := x.zeroRange(tc.k, tc.last); err != nil || changed {
				t.Fatalf("again: %v, %v; want nothing changed", changed, err)
			}
		})
	}
}
