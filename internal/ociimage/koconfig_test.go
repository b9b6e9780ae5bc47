package ociimage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadKoConfig(t *testing.T) {
	const pinned = "127.0.0.1:5055/storaged-base@sha256:84ed205da9bec403a5af877070b246fcde0c9368a8d8c076fed1c604d94ed404"
	for _, tc := range []struct {
		name, yaml, want string // want: "" for no error
	}{
		{"pinned", "defaultBaseImage: " + pinned + "\nbuilds:\n  - id: s\n    main: ./cmd/storaged\n", ""},
		{"unknown key", "defaultBaseImage: " + pinned + "\ndefaultBaseImgae: x\n", "unknown field"},
		{"unknown build key", "defaultBaseImage: " + pinned + "\nbuilds:\n  - id: s\n    mian: ./cmd/storaged\n", "unknown field"},
		{"a tag, not a digest", "defaultBaseImage: 127.0.0.1:5055/storaged-base:latest\n", "not pinned by digest"},
		{"another repository", "defaultBaseImage: 127.0.0.1:5055/distroless@sha256:84ed205da9bec403a5af877070b246fcde0c9368a8d8c076fed1c604d94ed404\n", "repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), ".ko.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := ReadKoConfig(path)
			if err == nil {
				_, err = cfg.PinnedBase()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := ReadKoConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file read fine")
	}
}
