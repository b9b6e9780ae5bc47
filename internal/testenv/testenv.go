// Package testenv holds the one rule for a test whose prerequisite is
// missing (a tool .ci/run installs, root, a Linux facility): under CI=true
// it fails, so CI never passes by skipping; elsewhere it skips, saying what
// is missing. Only tests import it.
package testenv

import (
	"os"
	"testing"
)

// Need returns when ok; otherwise it fails t under CI=true and skips it
// elsewhere, with what as the reason.
func Need(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("%s (CI=true: .ci/run provides it)", what)
	}
	t.Skipf("%s; skipped outside CI (CI=true makes this a failure)", what)
}

// InCI reports whether the tests run under CI=true, as .ci/run runs them.
func InCI() bool { return os.Getenv("CI") == "true" }
