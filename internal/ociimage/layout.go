// Package ociimage is the storaged container image without a Docker
// engine: the layout both image builds share (the Dockerfile and ko), the
// base image ko builds on, and the pieces the CI image check needs (a
// loopback registry, unpacking an image into a directory).
//
// Why a base of our own: `ko build` puts the binary on a base image pulled
// from a registry, and the only registries reachable in CI are on loopback.
// So the base is built here, from bytes pinned in go.mod (go-containerregistry
// for the format, golang.org/x/crypto/x509roots/fallback for the CA roots),
// deterministically: the same source gives the same digest on every machine,
// and .ko.yaml pins that digest (TestBasePinned fails when the two part).
// It is what ko needs from gcr.io/distroless/static-debian12:nonroot, the
// Dockerfile's base: /etc/passwd and /etc/group with nonroot (65532), CA
// certificates, /tmp, a home; no shell, no libc. It has no zoneinfo: the
// binary embeds it (-tags timetzdata in both builds).
//
// The image config (user, environment, ports, volume, health check) is set
// on the base, because ko keeps the base's config and only sets the
// entrypoint (/ko-app/storaged: ko's fixed path, which the Dockerfile
// copies), appends /ko-app to PATH and adds KO_DATA_PATH.
package ociimage

import (
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The layout of the storaged image, shared by the Dockerfile and ko
// (deploy/kubernetes/image_test.go compares them).
const (
	// BinaryPath is where ko puts the binary (not configurable in ko) and
	// where the Dockerfile copies it.
	BinaryPath = "/ko-app/storaged"
	// DataDir is the data volume, owned by UID/GID so the server can
	// write it without root.
	DataDir = "/var/lib/storaged"
	UID     = 65532 // "nonroot" in distroless; the pod's runAsUser and fsGroup
	GID     = 65532

	GRPCPort    = 9090 // STORAGED_LISTEN
	MetricsPort = 9091 // STORAGED_METRICS_LISTEN

	// BasePath is the PATH of the base, distroless's; ko appends ":/ko-app".
	BasePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// ImagePath is the PATH of the finished image (both builds), so that
	// `kubectl exec ... -- storaged check` finds the binary.
	ImagePath = BasePath + ":/ko-app"

	// CertFile is the CA bundle, where Go and distroless look for it.
	CertFile = "/etc/ssl/certs/ca-certificates.crt"
)

// User is the image's USER, numeric so that Kubernetes' runAsNonRoot can
// check it.
var User = strconv.Itoa(UID) + ":" + strconv.Itoa(GID)

// Env is the environment both images set (beyond PATH and distroless's
// SSL_CERT_FILE): listen on every interface (a sidecar or a Service
// reaches the pod IP, not loopback) and keep the data on the volume.
func Env() []string {
	return []string{
		"STORAGED_LISTEN=:" + strconv.Itoa(GRPCPort),
		"STORAGED_METRICS_LISTEN=:" + strconv.Itoa(MetricsPort),
		"STORAGED_DATA_DIR=" + DataDir,
	}
}

// HealthcheckCommand is the image's HEALTHCHECK CMD (Docker only;
// Kubernetes ignores it and uses its gRPC probes): liveness, the overall
// ("") health, SERVING while the process runs, also during recovery. It
// asks the default port: a changed STORAGED_LISTEN needs another
// --health-cmd.
func HealthcheckCommand() []string {
	return []string{BinaryPath, "health", "-addr=127.0.0.1:" + strconv.Itoa(GRPCPort), "-timeout=3s"}
}

// Healthcheck is HEALTHCHECK's timing: the start period covers a long
// commitlog recovery.
func Healthcheck() *v1.HealthConfig {
	return &v1.HealthConfig{
		Test:        append([]string{"CMD"}, HealthcheckCommand()...),
		Interval:    10 * time.Second,
		Timeout:     5 * time.Second,
		StartPeriod: 2 * time.Minute,
		Retries:     3,
	}
}

// Config is the config of the base image: what ko keeps in the image it
// builds.
func Config() v1.Config {
	return v1.Config{
		User: User,
		Env:  append([]string{"PATH=" + BasePath, "SSL_CERT_FILE=" + CertFile}, Env()...),
		ExposedPorts: map[string]struct{}{
			strconv.Itoa(GRPCPort) + "/tcp":    {},
			strconv.Itoa(MetricsPort) + "/tcp": {},
		},
		Volumes:     map[string]struct{}{DataDir: {}},
		Healthcheck: Healthcheck(),
	}
}
