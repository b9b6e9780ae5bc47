package server

import (
	"context"
	"net/http"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Paths of the HTTP health endpoints, served on the metrics port next to
// /metrics. They exist for probes and meshes that cannot speak gRPC: a
// Linkerd proxy with a default-deny policy authorizes the kubelet's HTTP
// probes but not its gRPC ones (linkerd/linkerd2#9595), and a kubelet gRPC
// probe is plaintext only, so it fails once --tls-cert is set, while the
// metrics port stays plaintext.
const (
	// LivezPath answers what grpc.health.v1 Check of the overall service
	// ("") answers: 200 while the process serves (also during commitlog
	// recovery), 503 once the drain has begun. It never depends on the
	// disk or on other pods, so a liveness probe on it restarts only a
	// process that is gone.
	LivezPath = "/livez"
	// ReadyzPath answers what Check of ServiceName answers: 200 when the
	// store is recovered and takes writes, 503 while it recovers, is
	// read-only after a failed write or sync, is above the disk warning
	// watermark, has a background write failing, or drains. Reads keep
	// working while it is read-only, above the watermark or has a
	// background write failing: a readiness probe on it takes the pod out
	// of the load-balanced Service (puts go only where they can succeed),
	// and a headless Service with publishNotReadyAddresses keeps the pod
	// addressable for reads.
	ReadyzPath = "/readyz"
)

// healthChecker is the part of grpc.health.v1 the HTTP endpoints read;
// *health.Server implements it.
type healthChecker interface {
	Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
}

// HealthHandler serves LivezPath and ReadyzPath from the server's own
// health service, so the HTTP and gRPC answers can never disagree. GET and
// HEAD only; the body is the status name (SERVING, NOT_SERVING). Query
// parameters are ignored: Linkerd refuses probes whose path carries one
// (linkerd/linkerd2#10877), so no behaviour hangs on them.
func (g *GRPCServer) HealthHandler() http.Handler { return healthHandler{g.health} }

type healthHandler struct{ hc healthChecker }

func (h healthHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var service string
	switch r.URL.Path {
	case LivezPath:
		service = ""
	case ReadyzPath:
		service = ServiceName
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if resp, err := h.hc.Check(r.Context(), &healthpb.HealthCheckRequest{Service: service}); err == nil {
		st = resp.GetStatus()
	}
	code := http.StatusServiceUnavailable
	if st == healthpb.HealthCheckResponse_SERVING {
		code = http.StatusOK
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		w.Write([]byte(st.String() + "\n"))
	}
}
