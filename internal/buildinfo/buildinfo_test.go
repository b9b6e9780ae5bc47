package buildinfo

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		s := []debug.BuildSetting{{Key: "-trimpath", Value: "true"}, {Key: "vcs", Value: "git"}}
		if rev != "" {
			s = append(s, debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			s = append(s, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return s
	}
	const sha = "34b83570f6c1d2e3a4b5c6d7e8f9a0b1c2d3e4f5"
	for _, tc := range []struct {
		name              string
		version, revision string // linker-set
		bi                *debug.BuildInfo
		want              Info
	}{
		{"go run: nothing recorded", "", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Unstamped, "unknown", "go1.26.8"}},
		{"no build info at all", "", "", nil,
			Info{Unstamped, "unknown", runtime.Version()}},
		{"go build in a clean checkout", "", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261129120000-34b83570f6c1"}, Settings: vcs(sha, "false")},
			Info{"v0.0.0-20261129120000-34b83570f6c1", sha, "go1.26.8"}},
		{"go build with uncommitted changes", "", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261129120000-34b83570f6c1+dirty"}, Settings: vcs(sha, "true")},
			Info{"v0.0.0-20261129120000-34b83570f6c1+dirty", sha + "-modified", "go1.26.8"}},
		{"tagged", "", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(sha, "false")},
			Info{"v1.2.3", sha, "go1.26.8"}},
		{"ldflags win over the build info", "v1.2.4", "cafe",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(sha, "true")},
			Info{"v1.2.4", "cafe", "go1.26.8"}},
		{"ldflags version only: the revision still comes from vcs", "v1.2.4", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs(sha, "")},
			Info{"v1.2.4", sha, "go1.26.8"}},
		{"docker build: ldflags, no vcs", "v1.2.4", "",
			&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs("", "")},
			Info{"v1.2.4", "unknown", "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.version, tc.revision, tc.bi); got != tc.want {
				t.Errorf("resolve = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	got := Info{"v1.2.3", "abc", "go1.26.8"}.String()
	if want := "v1.2.3 (revision abc, go1.26.8)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// TestStampedByLinker builds a tiny program with -ldflags -X and checks
// that the variable names in the package doc are the ones the linker sets
// (a renamed variable makes -X a silent no-op).
func TestStampedByLinker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "stamped")
	const pkg = "github.com/storaged/storaged/internal/buildinfo"
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags=-X "+pkg+".Version=v9.8.7-test -X "+pkg+".Revision=feedface", "./testdata/stamp")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); !strings.HasPrefix(got, "v9.8.7-test (revision feedface, go") {
		t.Errorf("stamped binary prints %q", got)
	}
}
