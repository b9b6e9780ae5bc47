package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Unpack writes the file system of img (its layers flattened, whiteouts
// applied: mutate.Extract) into dir, which must exist, as a container
// runtime would see it. Every write goes through an os.Root on dir, so no
// entry (a "../" name, a symlink pointing out) can reach outside it. With
// owners set, files get the uid/gid of their tar headers (needs root); else
// they belong to the caller.
//
// Regular files, directories, symlinks and hard links only: anything else
// (devices, fifos) is an error, as the storaged image has none.
func Unpack(img v1.Image, dir string, owners bool) (err error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	rc := mutate.Extract(img)
	defer func() { err = errors.Join(err, rc.Close()) }()

	type dirMeta struct {
		name     string
		mode     fs.FileMode
		uid, gid int
	}
	var dirs []dirMeta    // modes applied last: a 0500 directory must still take its files
	var links [][2]string // hard links: target, name
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// Extract ends its tar (the 1 KiB trailer) before it reports a
			// failure through the pipe: read on, or a layer that failed to
			// read looks like an empty one.
			if _, err := io.Copy(io.Discard, rc); err != nil {
				return fmt.Errorf("ociimage: reading the image: %w", err)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("ociimage: reading the image: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if name == "." {
			continue
		}
		if parent := path.Dir(name); parent != "." {
			// Extract emits the upper layers first, so a file can come
			// before the directory entry of a lower layer.
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
		}
		mode := h.FileInfo().Mode()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
			dirs = append(dirs, dirMeta{name, mode, h.Uid, h.Gid})
			continue
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
		case tar.TypeLink:
			// Made last: Extract emits the upper layers first, so the
			// target may come later. A link shares the target's owner and
			// mode. The target is a path in the image, also when absolute.
			links = append(links, [2]string{path.Clean(strings.TrimPrefix(h.Linkname, "/")), name})
			continue
		default:
			return fmt.Errorf("ociimage: %s: unsupported tar entry type %q", name, h.Typeflag)
		}
		if owners {
			if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := root.Chmod(name, mode); err != nil {
				return fmt.Errorf("ociimage: %s: %w", name, err)
			}
		}
	}
	for _, l := range links {
		if err := root.Link(l[0], l[1]); err != nil {
			return fmt.Errorf("ociimage: %s: %w", l[1], err)
		}
	}
	// Deepest first: a parent's mode must not stop the chmod of a child.
	slices.SortStableFunc(dirs, func(a, b dirMeta) int { return strings.Count(b.name, "/") - strings.Count(a.name, "/") })
	for _, d := range dirs {
		if owners {
			if err := root.Lchown(d.name, d.uid, d.gid); err != nil {
				return fmt.Errorf("ociimage: %s: %w", d.name, err)
			}
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("ociimage: %s: %w", d.name, err)
		}
	}
	return nil
}
