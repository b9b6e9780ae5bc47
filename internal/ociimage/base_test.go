package ociimage

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"go.uber.org/goleak"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sharedBase is one Base() for the tests that only read it (a build takes
// about a second under -race on a loaded machine); TestBaseDeterministic
// builds its own.
var sharedBase = sync.OnceValues(Base)

func testBase(t *testing.T) v1.ImageIndex {
	t.Helper()
	idx, err := sharedBase()
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

const koYAML = "../../.ko.yaml"

// TestBasePinned: .ko.yaml pins the digest of the base this source builds.
// It fails on any change to the base (a file, the config, a dependency
// such as the CA bundle): then put the digest it prints in .ko.yaml.
func TestBasePinned(t *testing.T) {
	digest, err := testBase(t).Digest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ReadKoConfig(koYAML)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := cfg.PinnedBase()
	if err != nil {
		t.Fatal(err)
	}
	if ref.DigestStr() != digest.String() {
		t.Errorf(".ko.yaml pins %s, this source builds %s: if the base changed on purpose, pin the new digest "+
			"(go run ./cmd/storaged-image base)", ref.DigestStr(), digest)
	}
}

// TestBaseDeterministic: two builds in one process are identical (the
// index digest covers the manifests, configs and layer bytes); the pin
// test compares across machines and time.
func TestBaseDeterministic(t *testing.T) {
	i1, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	i2, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := i1.Digest()
	d2, _ := i2.Digest()
	if d1 != d2 {
		t.Errorf("two base indexes differ: %s %s", d1, d2)
	}
}

// baseImage returns the base's image for the platform.
func baseImage(t *testing.T, arch string) v1.Image {
	t.Helper()
	idx := testBase(t)
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.Architecture == arch {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no %s image in the base", arch)
	return nil
}

// TestBaseIndex: written out as an OCI layout (what a registry or ko gets)
// and read back, a valid OCI index (validate reads every blob and checks
// digests, sizes, diff ids) with the same digest, one image per platform,
// each with one gzip layer and the layout's config.
func TestBaseIndex(t *testing.T) {
	built := testBase(t)
	dir := t.TempDir()
	if _, err := layout.Write(dir, built); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex() // index.json: the base index itself
	if err != nil {
		t.Fatal(err)
	}
	want, _ := built.Digest()
	if got, err := idx.Digest(); err != nil || got != want {
		t.Fatalf("read back: digest %s %v, want %s", got, err, want)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("invalid index: %v", err)
	}
	if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
		t.Errorf("index media type %s", mt)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != len(Platforms) {
		t.Fatalf("%d manifests, want %d", len(m.Manifests), len(Platforms))
	}
	for i, d := range m.Manifests {
		if d.Platform == nil || !d.Platform.Equals(Platforms[i]) {
			t.Errorf("manifest %d platform %v, want %v", i, d.Platform, Platforms[i])
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != Platforms[i].Architecture || !cf.Created.Time.Equal(epoch) {
			t.Errorf("config %s/%s created %v", cf.OS, cf.Architecture, cf.Created)
		}
		if !reflect.DeepEqual(cf.Config, Config()) {
			t.Errorf("config %+v, want %+v", cf.Config, Config())
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("layers %v %v", layers, err)
		}
		if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
		}
	}
}

// TestBaseFiles unpacks the base and reads it as the server and Go would.
func TestBaseFiles(t *testing.T) {
	root := os.Geteuid() == 0
	if !root && os.Getenv("CI") == "true" {
		t.Fatal("CI runs as root: the owners of the unpacked files are part of this test")
	}
	dir := t.TempDir()
	if err := Unpack(baseImage(t, "amd64"), dir, root); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if !strings.Contains(read("etc/passwd"), "\nnonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot 65532:\n%s", read("etc/passwd"))
	}
	if !strings.Contains(read("etc/group"), "\nnonroot:x:65532:") {
		t.Errorf("/etc/group has no nonroot 65532:\n%s", read("etc/group"))
	}
	// The CA bundle: every block a certificate, and the pool Go builds
	// from SSL_CERT_FILE has them all.
	rest := []byte(read(CertFile[1:]))
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil || b.Type != "CERTIFICATE" {
			t.Fatalf("certificate %d: %s %v", n, b.Type, err)
		}
		n++
	}
	if n < 100 || len(strings.TrimSpace(string(rest))) > 0 {
		t.Errorf("%d certificates, %d bytes left over", n, len(rest))
	}
	for _, c := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
	}{
		{DataDir[1:], os.ModeDir | 0o755, UID, GID},
		{"home/nonroot", os.ModeDir | 0o700, UID, GID},
		{"tmp", os.ModeDir | os.ModeSticky | 0o777, 0, 0},
		{"root", os.ModeDir | 0o700, 0, 0},
		{"etc/passwd", 0o644, 0, 0},
	} {
		fi, err := os.Lstat(filepath.Join(dir, c.name))
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s mode %v, want %v", c.name, fi.Mode(), c.mode)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if root && (int(st.Uid) != c.uid || int(st.Gid) != c.gid) {
			t.Errorf("%s owner %d:%d, want %d:%d", c.name, st.Uid, st.Gid, c.uid, c.gid)
		}
	}
}

// TestCABundleLeavesOutConstrainedRoots: the PEM file cannot say "distrust
// after", so the roots that carry it are not in the file.
func TestCABundleLeavesOutConstrainedRoots(t *testing.T) {
	pemData, err := caBundle()
	if err != nil {
		t.Fatal(err)
	}
	inFile := map[string]bool{}
	for rest := []byte(pemData); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		inFile[string(b.Bytes)] = true
	}
	total, constrained := 0, 0
	for r := range bundle.Roots() {
		total++
		if r.Constraint != nil {
			constrained++
			if inFile[string(r.Certificate)] {
				t.Error("a root with a constraint is in the PEM file")
			}
		} else if !inFile[string(r.Certificate)] {
			t.Error("an unconstrained root is missing from the PEM file")
		}
	}
	if len(inFile) != total-constrained {
		t.Errorf("%d certificates in the file, want %d of %d", len(inFile), total-constrained, total)
	}
	t.Logf("%d roots, %d with a constraint left out", total, constrained)
}
