package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"go.uber.org/goleak"

	"github.com/storaged/storaged/internal/ociimage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBaseCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	dir := t.TempDir()
	if code := run(t.Context(), []string{"base", "-check", "../../.ko.yaml", "-oci-layout", dir}, &out, &errOut); code != 0 {
		t.Fatalf("base -check .ko.yaml: exit %d: %s", code, errOut.String())
	}
	idx, err := ociimage.Base()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
	if out.String() != want.String()+"\n" {
		t.Errorf("printed %q, want the digest %s", out.String(), want)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Image(mustFirstManifest(t, idx)); err != nil {
		t.Errorf("the OCI layout lacks the base's images: %v", err)
	}

	// A stale pin fails, naming both digests.
	stale := filepath.Join(t.TempDir(), ".ko.yaml")
	if err := os.WriteFile(stale, []byte("defaultBaseImage: 127.0.0.1:5055/storaged-base@sha256:"+strings.Repeat("0", 64)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := run(t.Context(), []string{"base", "-check", stale}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), want.String()) || !strings.Contains(errOut.String(), strings.Repeat("0", 64)) {
		t.Errorf("stale pin: exit %d, stderr %q", code, errOut.String())
	}
}

func mustFirstManifest(t *testing.T, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) == 0 {
		t.Fatal(m, err)
	}
	return m.Manifests[0].Digest
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"bake"}, {"base", "extra"}, {"serve", "-port", "1"}, {"ci", "-bogus"}} {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "usage:") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut.String())
		}
	}
}

func TestParseVersion(t *testing.T) {
	v, r, err := parseVersion("storaged v0.0.0-20261129120000-34b83570f6c1 (revision 34b83570-modified, go1.26.8)\n")
	if err != nil || v != "v0.0.0-20261129120000-34b83570f6c1" || r != "34b83570-modified" {
		t.Errorf("parseVersion = %q %q %v", v, r, err)
	}
	for _, bad := range []string{"", "storaged dev\n", "storaged dev (revision x, go1.26.8)\ntrailing\n", "flag provided but not defined: -version\n"} {
		if _, _, err := parseVersion(bad); err == nil {
			t.Errorf("parseVersion(%q) succeeded", bad)
		}
	}
}

// TestCheckConfig: the config ko makes from the base passes; each
// departure from the layout fails.
func TestCheckConfig(t *testing.T) {
	good := func() v1.Config {
		c := ociimage.Config()
		c.Entrypoint = []string{ociimage.BinaryPath}
		c.Env = append(c.Env[1:], "PATH="+ociimage.ImagePath, "KO_DATA_PATH=/var/run/ko") // what ko does
		return c
	}
	if err := checkConfig(good()); err != nil {
		t.Fatalf("ko's config fails: %v", err)
	}
	for name, mutate := range map[string]func(*v1.Config){
		"root":               func(c *v1.Config) { c.User = "0:0" },
		"no user":            func(c *v1.Config) { c.User = "" },
		"other entrypoint":   func(c *v1.Config) { c.Entrypoint = []string{"/usr/local/bin/storaged"} },
		"cmd":                func(c *v1.Config) { c.Cmd = []string{"--help"} },
		"PATH without app":   func(c *v1.Config) { c.Env[len(c.Env)-2] = "PATH=" + ociimage.BasePath },
		"data dir env":       func(c *v1.Config) { c.Env[2] = "STORAGED_DATA_DIR=/data" },
		"port":               func(c *v1.Config) { c.ExposedPorts = map[string]struct{}{"9090/tcp": {}} },
		"volume":             func(c *v1.Config) { c.Volumes = nil },
		"healthcheck":        func(c *v1.Config) { c.Healthcheck = nil },
		"healthcheck timing": func(c *v1.Config) { c.Healthcheck.Interval = time.Minute },
	} {
		c := good()
		mutate(&c)
		if err := checkConfig(c); err == nil {
			t.Errorf("%s: passes", name)
		}
	}
}

func TestCheckCredentials(t *testing.T) {
	uid, gid := os.Getuid(), os.Getgid()
	groups, _ := os.Getgroups()
	err := checkCredentials(os.Getpid(), uid, gid)
	if len(groups) == 0 && err != nil {
		t.Errorf("own credentials: %v", err)
	}
	if len(groups) > 0 && (err == nil || !strings.Contains(err.Error(), "Groups:")) {
		t.Errorf("own credentials with supplementary groups %v: %v", groups, err)
	}
	if err := checkCredentials(os.Getpid(), uid+1, gid); err == nil || !strings.Contains(err.Error(), "Uid:") {
		t.Errorf("another uid: %v", err)
	}
}

func TestCheckOwner(t *testing.T) {
	dir := t.TempDir()
	if err := checkOwner(dir, os.Getuid(), os.Getgid()); err != nil {
		t.Error(err)
	}
	if err := checkOwner(dir, ociimage.UID, ociimage.GID); err == nil && os.Getuid() != ociimage.UID {
		t.Error("a directory of ours passes as 65532's")
	}
}
