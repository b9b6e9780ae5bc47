// Command storaged-image builds and checks the storaged container image
// without a Docker engine (internal/ociimage has the why).
//
//	storaged-image base [-check .ko.yaml] [-oci-layout DIR]
//	    build the base ko builds on; print its digest; with -check, exit 1
//	    unless .ko.yaml pins that digest
//	storaged-image serve [-addr 127.0.0.1:5055]
//	    serve the base on a loopback registry until SIGINT/SIGTERM, for
//	    `ko build` by hand
//	storaged-image ci [-repo DIR] [-keep]
//	    the CI image check: the base and its pin, ko build twice (the two
//	    tarballs must be identical), unpack, run storaged from the unpacked
//	    file system as UID 65532 (chroot, private mount namespace with
//	    /proc), ask its health, read its build info, stop it. Needs root,
//	    unshare (util-linux) and chroot (coreutils).
//
// Exit status: 0 ok, 1 a failed check or error, 2 usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/storaged/storaged/internal/ociimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, "usage: storaged-image base [-check .ko.yaml] [-oci-layout DIR] | serve [-addr HOST:PORT] | ci [-repo DIR] [-keep]")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var err error
	switch args[0] {
	case "base":
		check := fs.String("check", "", "a .ko.yaml `file` whose defaultBaseImage must pin this base")
		dir := fs.String("oci-layout", "", "also write the base as an OCI image layout into `dir`")
		if fs.Parse(args[1:]) != nil || fs.NArg() > 0 {
			return usage()
		}
		err = runBase(stdout, *check, *dir)
	case "serve":
		addr := fs.String("addr", "127.0.0.1:5055", "loopback `address` to serve the registry on (the host of .ko.yaml's defaultBaseImage)")
		if fs.Parse(args[1:]) != nil || fs.NArg() > 0 {
			return usage()
		}
		err = runServe(ctx, stdout, *addr)
	case "ci":
		repo := fs.String("repo", ".", "repository `root` (with .ko.yaml and tools/ko/go.mod)")
		keep := fs.Bool("keep", false, "keep the work directory (tarballs, unpacked file system)")
		if fs.Parse(args[1:]) != nil || fs.NArg() > 0 {
			return usage()
		}
		err = runCI(ctx, stdout, *repo, *keep)
	default:
		return usage()
	}
	if err != nil {
		fmt.Fprintln(stderr, "storaged-image:", err)
		return 1
	}
	return 0
}

// runBase builds the base, prints its digest and checks the pin.
func runBase(stdout io.Writer, check, dir string) error {
	idx, err := ociimage.Base()
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, digest)
	if dir != "" {
		if _, err := layout.Write(dir, idx); err != nil {
			return err
		}
	}
	if check != "" {
		return checkPin(check, digest.String())
	}
	return nil
}

// checkPin fails unless the .ko.yaml at path pins digest.
func checkPin(path, digest string) error {
	cfg, err := ociimage.ReadKoConfig(path)
	if err != nil {
		return err
	}
	ref, err := cfg.PinnedBase()
	if err != nil {
		return err
	}
	if ref.DigestStr() != digest {
		return fmt.Errorf("%s pins the base %s, but the base built from this source is %s: "+
			"if the base was changed on purpose, put the new digest in %s", path, ref.DigestStr(), digest, path)
	}
	return nil
}

// runServe serves the base until ctx ends.
func runServe(ctx context.Context, stdout io.Writer, addr string) error {
	idx, err := ociimage.Base()
	if err != nil {
		return err
	}
	reg, ref, err := ociimage.ServeBase(ctx, addr, idx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "serving the base as %s until SIGINT/SIGTERM\n", ref)
	<-ctx.Done()
	return reg.Close()
}
