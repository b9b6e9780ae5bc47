package mesh_test

// The mesh overlays, rendered with the pinned kustomize and decoded strictly (Istio specs with
// protojson, GRPCRoute with gateway-api's types): the base's checks still hold, and the mesh
// settings are those README.md documents (proxy outlives the drain, retries only on UNAVAILABLE,
// no timeouts).

import (
	"testing"

	"github.com/storaged/storaged/deploy/internal/k8scheck"
)

func TestMeshOverlays(t *testing.T) {
	for _, c := range []struct {
		dir  string
		mesh k8scheck.Mesh
	}{
		{"deploy/mesh/istio", k8scheck.Mesh{Istio: true, Native: true}},
		{"deploy/mesh/linkerd", k8scheck.Mesh{Linkerd: true, Native: true}},
	} {
		t.Run(c.dir, func(t *testing.T) {
			out := k8scheck.Tool(t, "kustomize", "build", c.dir)
			o := &k8scheck.Objects{}
			if err := k8scheck.DecodeStream("kustomize build "+c.dir, out, o); err != nil {
				t.Fatal(err)
			}
			for _, p := range append(k8scheck.Check(o), k8scheck.CheckMesh(o, c.mesh)...) {
				t.Error(p)
			}
		})
	}
}
