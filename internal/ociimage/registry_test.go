package ociimage

import (
	"net"
	"net/http"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestServeBase pulls the base back from the loopback registry the way ko
// does (by digest, one platform out of the index).
func TestServeBase(t *testing.T) {
	idx := testBase(t)
	want, _ := idx.Digest()
	reg, ref, err := ServeBase(t.Context(), "127.0.0.1:0", idx)
	if err != nil {
		t.Fatal(err)
	}
	if ref.DigestStr() != want.String() || ref.Context().RepositoryStr() != BaseRepository ||
		ref.Context().RegistryStr() != reg.Addr || !strings.HasPrefix(reg.Addr, "127.0.0.1:") {
		t.Errorf("pushed as %s (registry %s), want %s/%s@%s", ref, reg.Addr, reg.Addr, BaseRepository, want)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	pulled, err := remote.Index(ref, remote.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := pulled.Digest(); got != want {
		t.Errorf("pulled index %s, want %s", got, want)
	}
	img, err := remote.Image(ref, remote.WithTransport(tr), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"}))
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := img.ConfigFile(); err != nil || cf.Architecture != "arm64" || cf.Config.User != User {
		t.Errorf("arm64 image config %+v %v", cf, err)
	}
	tr.CloseIdleConnections()
	if err := reg.Close(); err != nil {
		t.Error(err)
	}
	if c, err := net.Dial("tcp", reg.Addr); err == nil {
		c.Close()
		t.Error("the registry still listens after Close")
	}
}

func TestServeBaseAddressInUse(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if _, _, err := ServeBase(t.Context(), lis.Addr().String(), testBase(t)); err == nil || !strings.Contains(err.Error(), "listener") {
		t.Errorf("ServeBase on a busy address = %v", err)
	}
}
