// Package buildinfo says which build of storaged is running: the version,
// the source revision and the Go toolchain. It feeds `storaged --version`,
// the "version" field of every log line and the storaged_build_info
// metric.
//
// Two ways to stamp a build, and the first wins:
//
//  1. -ldflags "-X github.com/storaged/storaged/internal/buildinfo.Version=v1.2.3
//     -X github.com/storaged/storaged/internal/buildinfo.Revision=<commit>",
//     for builds without the git metadata (the Dockerfile: .git is not in
//     the build context);
//  2. what the go command records by itself (runtime/debug.ReadBuildInfo):
//     since Go 1.24 `go build` and `ko build` in a git checkout set the main
//     module's version from the tag or commit (v1.2.3, or a pseudo-version
//     v0.0.0-20261129120000-abcdef123456, "+dirty" with uncommitted
//     changes), and vcs.revision / vcs.modified.
//
// `go run` and `go test` record neither, and the module version is then
// "(devel)": Version reports Unstamped instead.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); empty means "ask the go command's build info".
var (
	Version  string
	Revision string
)

// Unstamped is the version of a build that carries none (go run, go test).
const Unstamped = "dev"

// unknownRevision is the revision of a build without VCS information.
const unknownRevision = "unknown"

// modifiedSuffix marks a revision built with uncommitted changes; the same
// suffix as prometheus/common/version, so dashboards for other exporters'
// *_build_info read ours alike.
const modifiedSuffix = "-modified"

// Info describes one build.
type Info struct {
	Version   string // v1.2.3, a Go pseudo-version, or Unstamped
	Revision  string // commit id (+ "-modified" for a dirty tree), or "unknown"
	GoVersion string // the toolchain that built the binary: go1.26.8
}

// Get returns the running binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo() // nil when the binary has none (not built in module mode)
	return resolve(Version, Revision, bi)
}

// resolve combines the linker-set values with the go command's build
// information; split from Get so tests can feed it any *debug.BuildInfo.
func resolve(version, revision string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
		if info.Version == "" || info.Version == "(devel)" {
			info.Version = Unstamped
		}
	}
	if info.Revision == "" {
		rev, modified := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		switch {
		case rev == "":
			info.Revision = unknownRevision
		case modified:
			info.Revision = rev + modifiedSuffix
		default:
			info.Revision = rev
		}
	}
	return info
}

// String is the line `storaged --version` prints after the program name.
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}
