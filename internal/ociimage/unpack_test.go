package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/storaged/storaged/internal/testenv"
)

// layerOf builds a gzip layer from tar headers (data for regular files).
func layerOf(t *testing.T, files ...tarFile) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := f.h
		h.Size = int64(len(f.data))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := b.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type tarFile struct {
	h    tar.Header
	data string
}

func reg(name, data string) tarFile {
	return tarFile{tar.Header{Name: name, Typeflag: tar.TypeReg}, data}
}

// imageOf stacks layers, lowest first.
func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestUnpackLayers(t *testing.T) {
	lower := layerOf(t,
		tarFile{tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o750}, ""},
		reg("d/a", "lower"),
		reg("gone", "removed by the upper layer"),
		reg("f", "target"),
	)
	upper := layerOf(t,
		reg("d/a", "upper"),
		reg(".wh.gone", ""),
		tarFile{tar.Header{Name: "d/b", Typeflag: tar.TypeReg, Mode: 0o4755}, "setuid"},
		tarFile{tar.Header{Name: "g", Typeflag: tar.TypeLink, Linkname: "f"}, ""},
		tarFile{tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/d/a"}, ""},
		tarFile{tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../.."}, ""}, // dropped by Extract: leaves the rootfs
		reg("up/x", "a plain directory now"),
	)
	dir := t.TempDir()
	if err := Unpack(imageOf(t, lower, upper), dir, false); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("d/a"); got != "upper" {
		t.Errorf("d/a = %q, want the upper layer's", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "gone")); !os.IsNotExist(err) {
		t.Errorf("whited-out file: %v", err)
	}
	if got := read("up/x"); got != "a plain directory now" {
		t.Errorf("up/x = %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "up")); err != nil || !fi.IsDir() {
		t.Errorf("up: %v %v, want a directory (the escaping symlink dropped)", fi, err)
	}
	for name, want := range map[string]os.FileMode{"d": os.ModeDir | 0o750, "d/b": os.ModeSetuid | 0o755, "f": 0o644} {
		if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v %v, want %v", name, fi.Mode(), err, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "s")); err != nil || target != "/d/a" {
		t.Errorf("symlink s -> %q %v", target, err)
	}
	f, _ := os.Stat(filepath.Join(dir, "f"))
	g, err := os.Stat(filepath.Join(dir, "g"))
	if err != nil || !os.SameFile(f, g) {
		t.Errorf("hard link g is not f: %v", err)
	}
}

// TestUnpackStaysInside: links are resolved inside the directory. An
// absolute hard-link target is the image's file, not the host's; a hard
// link through a symlink to outside is refused (os.Root), and nothing
// outside is reached. (Extract itself drops files under a symlink of the
// same or a lower layer, and relative links that climb out.)
func TestUnpackStaysInside(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	err := Unpack(imageOf(t, layerOf(t,
		reg("etc/passwd", "the image's"),
		tarFile{tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}, ""},
	)), dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "h")); err != nil || string(b) != "the image's" {
		t.Errorf("h = %q %v, want the image's /etc/passwd", b, err)
	}

	dir = t.TempDir()
	err = Unpack(imageOf(t, layerOf(t,
		tarFile{tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: outside}, ""},
		tarFile{tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "evil/secret"}, ""},
	)), dir, false)
	if err == nil || !strings.Contains(err.Error(), "ociimage: h:") {
		t.Errorf("Unpack = %v, want an error for the link h", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "h")); !os.IsNotExist(err) {
		t.Errorf("h exists: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(outside, "secret")); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("the outside file got a link: %v", err)
	}
}

// TestUnpackErrors: what Extract fails on (it ends its tar before
// reporting) and what Unpack refuses are errors, not an empty directory.
func TestUnpackErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		layer func(t *testing.T) v1.Layer
		want  string
	}{
		{"path out of the rootfs", func(t *testing.T) v1.Layer { return layerOf(t, reg("../x", "up")) }, "unsafe tar path"},
		{"not a tar", func(t *testing.T) v1.Layer {
			return static.NewLayer([]byte(strings.Repeat("not a tar ", 100)), types.OCIUncompressedLayer)
		}, "reading the image"},
		{"fifo", func(t *testing.T) v1.Layer {
			return layerOf(t, tarFile{tar.Header{Name: "p", Typeflag: tar.TypeFifo}, ""})
		}, "unsupported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Unpack(imageOf(t, layerOf(t, reg("ok", "fine")), tc.layer(t)), t.TempDir(), false)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Unpack = %v, want %q", err, tc.want)
			}
		})
	}
	if err := Unpack(imageOf(t), filepath.Join(t.TempDir(), "missing"), false); err == nil {
		t.Error("Unpack into a missing directory succeeded")
	}
}

// TestUnpackOwners: with owners, files and directories get the header's
// uid/gid (the data dir must be 65532's in the unpacked image).
func TestUnpackOwners(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "chown needs root (CI runs as root)")
	img := imageOf(t, layerOf(t,
		tarFile{tar.Header{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: UID, Gid: GID}, ""},
		tarFile{tar.Header{Name: "data/f", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 123, Gid: 456}, "x"},
		tarFile{tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "data/f", Uid: 7, Gid: 8}, ""},
	))
	dir := t.TempDir()
	if err := Unpack(img, dir, true); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][2]int{"data": {UID, GID}, "data/f": {123, 456}, "l": {7, 8}} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != want[0] || int(st.Gid) != want[1] {
			t.Errorf("%s owner %d:%d, want %v", name, st.Uid, st.Gid, want)
		}
	}
}
