package testenv

import (
	"runtime"
	"testing"
)

// TestNeed: a missing prerequisite fails the test under CI=true and skips
// it elsewhere; a present one does neither.
func TestNeed(t *testing.T) {
	for _, tc := range []struct {
		ci              string
		ok              bool
		failed, skipped bool
	}{
		{"true", true, false, false},
		{"", true, false, false},
		{"true", false, true, false},
		{"", false, false, true},
		{"false", false, false, true},
	} {
		t.Setenv("CI", tc.ci)
		failed, skipped := run(func(tb testing.TB) { Need(tb, tc.ok, "the tool") })
		if failed != tc.failed || skipped != tc.skipped {
			t.Errorf("CI=%q ok=%v: failed %v skipped %v, want %v %v", tc.ci, tc.ok, failed, skipped, tc.failed, tc.skipped)
		}
	}
}

// run runs f on a recording TB whose Fatalf and Skipf end f's goroutine,
// as the real ones do, and reports which was called.
func run(f func(testing.TB)) (failed, skipped bool) {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failed, r.skipped
}

type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(string, ...any) {
	r.failed = true
	runtime.Goexit()
}

func (r *recorder) Skipf(string, ...any) {
	r.skipped = true
	runtime.Goexit()
}
