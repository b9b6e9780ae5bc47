package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is an in-memory OCI registry (go-containerregistry's
// pkg/registry) on a loopback listener, holding the base for ko to pull.
// Plain HTTP: go-containerregistry, and so ko, speak HTTP to 127.0.0.1 and
// localhost without being told.
type Registry struct {
	Addr string // host:port it listens on
	srv  *http.Server
	done chan error
}

// ServeBase listens on addr (127.0.0.1:0 for any free port), serves a
// registry and pushes idx to it as BaseRepository@<digest>. It returns the
// reference of the pushed index. Close stops it.
func ServeBase(ctx context.Context, addr string, idx v1.ImageIndex) (*Registry, name.Digest, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, name.Digest{}, fmt.Errorf("ociimage: registry listener: %w", err)
	}
	r := &Registry{
		Addr: lis.Addr().String(),
		srv: &http.Server{
			Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
			ReadHeaderTimeout: 10 * time.Second,
		},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(lis) }()
	digest, err := idx.Digest()
	if err == nil {
		var ref name.Digest
		if ref, err = name.NewDigest(r.Addr + "/" + BaseRepository + "@" + digest.String()); err == nil {
			if err = remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err == nil {
				return r, ref, nil
			}
		}
	}
	return nil, name.Digest{}, errors.Join(fmt.Errorf("ociimage: pushing the base: %w", err), r.Close())
}

// Close stops the registry and waits for its goroutine.
func (r *Registry) Close() error {
	err := r.srv.Close()
	if serr := <-r.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
