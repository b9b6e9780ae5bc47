package kubernetes_test

// Offline validation of the kustomize base in this directory (no cluster, no schema download):
// `kustomize build` (pinned in tools/deploy/go.mod) renders it, every document of the output is
// decoded strictly into its k8s.io/api type, then checked against the facts of the storaged binary
// and of the Dockerfile (deploy/internal/k8scheck, whose own tests prove that each check can fail).

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/storaged/storaged/deploy/internal/k8scheck"
)

// Facts shared with dockerfile_test.go.
const (
	defaultGRPCPort    = k8scheck.DefaultGRPCPort
	defaultMetricsPort = k8scheck.DefaultMetricsPort
	containerDataDir   = k8scheck.ContainerDataDir
	nonRootID          = k8scheck.NonRootID
)

// problems collects check failures, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// kustomizeBuild renders dir (relative to the repository root) with the pinned kustomize and decodes the output.
func kustomizeBuild(t *testing.T, dir string) *k8scheck.Objects {
	t.Helper()
	out := k8scheck.Tool(t, "kustomize", "build", dir)
	o := &k8scheck.Objects{}
	if err := k8scheck.DecodeStream("kustomize build "+dir, out, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestKustomizeBuild checks what `kubectl apply -k deploy/kubernetes` applies.
func TestKustomizeBuild(t *testing.T) {
	o := kustomizeBuild(t, "deploy/kubernetes")
	if len(o.StatefulSets) != 1 || len(o.Services) != 2 || len(o.PDBs) != 1 || o.Count() != 4 {
		t.Errorf("kustomize build: %d objects (%d StatefulSets, %d Services, %d PDBs), want 1, 2 and 1",
			o.Count(), len(o.StatefulSets), len(o.Services), len(o.PDBs))
	}
	for _, problem := range k8scheck.Check(o) {
		t.Error(problem)
	}
}

// TestKustomizationListsManifests keeps kustomization.yaml complete: every manifest file is a resource.
func TestKustomizationListsManifests(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: apiVersion %q kind %q", k.APIVersion, k.Kind)
	}
	var files []string
	for _, pattern := range []string{"*.yaml", "*.yml"} {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matches...)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" || f == "kustomization.yml" })
	for _, f := range files {
		if !slices.Contains(k.Resources, f) {
			t.Errorf("kustomization.yaml: resources does not list %s", f)
		}
	}
	for _, r := range k.Resources {
		if !slices.Contains(files, r) {
			t.Errorf("kustomization.yaml: resource %s is not a manifest file here", r)
		}
	}
}
