package ociimage

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/yaml"
)

// KoConfig is the part of ko's .ko.yaml this repository uses (ko v0.19's
// keys); ReadKoConfig rejects any other key, so a typo cannot be ignored
// by ko and by the tests alike.
type KoConfig struct {
	DefaultBaseImage string    `json:"defaultBaseImage"`
	Builds           []KoBuild `json:"builds"`
}

// KoBuild is one entry of .ko.yaml's builds.
type KoBuild struct {
	ID      string   `json:"id"`
	Main    string   `json:"main"`
	Env     []string `json:"env,omitempty"`
	Flags   []string `json:"flags,omitempty"`
	Ldflags []string `json:"ldflags,omitempty"`
}

// ReadKoConfig parses a .ko.yaml strictly.
func ReadKoConfig(path string) (KoConfig, error) {
	var c KoConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("ociimage: %s: %w", path, err)
	}
	return c, nil
}

// PinnedBase is defaultBaseImage as a digest reference; an error if it is
// not pinned by digest or not the storaged base repository.
func (c KoConfig) PinnedBase() (name.Digest, error) {
	ref, err := name.NewDigest(c.DefaultBaseImage)
	if err != nil {
		return ref, fmt.Errorf("ociimage: defaultBaseImage %q is not pinned by digest: %w", c.DefaultBaseImage, err)
	}
	if repo := ref.Context().RepositoryStr(); repo != BaseRepository {
		return ref, fmt.Errorf("ociimage: defaultBaseImage %q: repository %q, want %q", c.DefaultBaseImage, repo, BaseRepository)
	}
	return ref, nil
}
