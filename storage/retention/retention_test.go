package retention

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseDeleteWhen(t *testing.T) {
	for _, tc := range []struct {
		in    string
		hours []int // set hours; nil with ok false: refused
		ok    bool
	}{
		{"04", []int{4}, true},
		{"04;16", []int{4, 16}, true},
		{" 4 ; 23 ", []int{4, 23}, true},
		{"*", nil, true},
		{"24", nil, false},
		{"-1", nil, false},
		{"4;x", nil, false},
		{"", nil, false},
	} {
		got, err := ParseDeleteWhen(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseDeleteWhen(%q) error %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if !tc.ok {
			continue
		}
		want := [24]bool{}
		if tc.in == "*" {
			for h := range want {
				want[h] = true
			}
		}
		for _, h := range tc.hours {
			want[h] = true
		}
		if got != want {
			t.Errorf("ParseDeleteWhen(%q) = %v, want %v", tc.in, got, want)
		}
	}
}

func TestUsedPercent(t *testing.T) {
	for _, tc := range []struct {
		u    DiskUsage
		want float64
	}{
		{DiskUsage{}, 0},
		{DiskUsage{Size: 100, Used: 50, Avail: 50}, 50},
		{DiskUsage{Size: 100, Used: 90, Avail: 5}, 90 * 100.0 / 95}, // root-reserved blocks excluded, as df does
	} {
		if got := tc.u.UsedPercent(); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.u, got, tc.want)
		}
	}
}
