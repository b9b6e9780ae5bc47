package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// BaseRepository is the repository name of the base in a registry: the
// path part of .ko.yaml's defaultBaseImage.
const BaseRepository = "storaged-base"

// Platforms are the architectures of the base index; the layer is the same
// for all (no binaries in it), only the config's architecture differs.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// epoch is every timestamp in the base (files, config, history): a fixed
// time, so the digest depends on the content only.
var epoch = time.Unix(0, 0).UTC()

// entry is one file or directory of the base layer.
type entry struct {
	name     string // without a leading slash; directories end in "/"
	mode     fs.FileMode
	uid, gid int
	data     string
}

// passwd and group: distroless's users, minus the ones nothing here needs.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
	// nsswitch.conf: Go's resolver reads the hosts order from it.
	nsswitch = "hosts: files dns\n"
)

// entries lists the base layer in the order written: parents first.
func entries() ([]entry, error) {
	certs, err := caBundle()
	if err != nil {
		return nil, err
	}
	const dir = fs.ModeDir | 0o755
	return []entry{
		{name: "etc/", mode: dir},
		{name: "etc/group", mode: 0o644, data: group},
		{name: "etc/nsswitch.conf", mode: 0o644, data: nsswitch},
		{name: "etc/passwd", mode: 0o644, data: passwd},
		{name: "etc/ssl/", mode: dir},
		{name: "etc/ssl/certs/", mode: dir},
		{name: CertFile[1:], mode: 0o644, data: certs},
		{name: "home/", mode: dir},
		{name: "home/nonroot/", mode: fs.ModeDir | 0o700, uid: UID, gid: GID},
		{name: "root/", mode: fs.ModeDir | 0o700},
		{name: "tmp/", mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{name: "var/", mode: dir},
		{name: "var/lib/", mode: dir},
		{name: DataDir[1:] + "/", mode: dir, uid: UID, gid: GID},
	}, nil
}

// caBundle is the PEM bundle of the Mozilla NSS roots that x509roots/fallback
// carries (the version go.mod pins). Roots with an NSS constraint
// (distrust after a date) are left out: a PEM file cannot carry the
// constraint, and trusting them without it would trust more than NSS does.
func caBundle() (string, error) {
	var b bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return "", err
		}
		n++
	}
	if n == 0 {
		return "", fmt.Errorf("ociimage: no CA roots in x509roots/fallback/bundle")
	}
	return b.String(), nil
}

// baseLayer is the gzipped tar of entries. Compressed with
// klauspost/compress, whose version go.mod pins, not compress/gzip: the
// bytes of the standard library's may change with a Go release, and with
// them the pinned digest. (Not uncompressed: ko's --tarball writes Docker's
// format, which has no media types, and go-containerregistry reading it
// back takes every layer to be compressed like the first one.)
func baseLayer() ([]byte, error) {
	es, err := entries()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, e := range es {
		h := &tar.Header{
			Name: e.name, Mode: int64(e.mode.Perm()), Uid: e.uid, Gid: e.gid,
			ModTime: epoch, Format: tar.FormatUSTAR, Typeflag: tar.TypeReg, Size: int64(len(e.data)),
		}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if e.mode.IsDir() {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("ociimage: %s: %w", e.name, err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Base returns the base image index: one image per Platforms entry, each
// the base layer and Config. The same source always gives the same digest.
func Base() (v1.ImageIndex, error) {
	data, err := baseLayer()
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range Platforms {
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err := mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History: v1.History{
				Created:   v1.Time{Time: epoch},
				CreatedBy: "go run ./cmd/storaged-image base",
				Comment:   "passwd/group with nonroot " + strconv.Itoa(UID) + ", CA roots, " + DataDir,
			},
		})
		if err != nil {
			return nil, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		cf.Created = v1.Time{Time: epoch}
		cf.Config = Config()
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return nil, err
		}
		platform := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	return idx, nil
}
