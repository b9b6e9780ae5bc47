# syntax=docker/dockerfile:1
#
# storaged container image, for people with Docker; CI builds the same
# layout with ko instead (.ko.yaml, README "Building the image").
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t storaged:dev .
#   docker run --rm -p 9090:9090 -p 9091:9091 -v storaged-data:/var/lib/storaged storaged:dev
# The runtime image has no shell and no libc, so every command below is in exec form and the binary is static.
# The layout (binary path, user, environment, ports, volume, health check) is ko's: internal/ociimage has it,
# deploy/kubernetes/image_test.go compares the two.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Static binaries only: the distroless "static" base has no libc.
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# .git is not in the build context: the version and revision come in as build args.
ARG VERSION=dev
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags timetzdata \
      -ldflags="-s -w -X github.com/storaged/storaged/internal/buildinfo.Version=${VERSION} -X github.com/storaged/storaged/internal/buildinfo.Revision=${REVISION}" \
      -o /out/storaged ./cmd/storaged \
 && install -d -o 65532 -g 65532 /out/data

FROM gcr.io/distroless/static-debian12:nonroot
# /ko-app/storaged: where ko puts the binary (ko cannot be told otherwise).
COPY --from=build /out/storaged /ko-app/storaged
COPY --from=build --chown=65532:65532 /out/data /var/lib/storaged
# Numeric UID:GID so that Kubernetes runAsNonRoot can verify it (65532 = "nonroot" in distroless).
USER 65532:65532
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/ko-app \
    STORAGED_LISTEN=:9090 \
    STORAGED_METRICS_LISTEN=:9091 \
    STORAGED_DATA_DIR=/var/lib/storaged
# 9090: gRPC (MessageStoreService, grpc.health.v1, reflection); 9091: Prometheus /metrics (and optional pprof).
EXPOSE 9090 9091
VOLUME ["/var/lib/storaged"]
# Liveness only: the overall ("") health status is SERVING while the process runs, also during commitlog recovery.
# Readiness (storaged.v1.MessageStoreService) is left to orchestrators; Kubernetes ignores HEALTHCHECK and uses its own gRPC probes.
# If STORAGED_LISTEN is changed to another port, this check must be overridden (docker run --health-cmd ...).
HEALTHCHECK --interval=10s --timeout=5s --start-period=2m --retries=3 \
  CMD ["/ko-app/storaged", "health", "-addr=127.0.0.1:9090", "-timeout=3s"]
ENTRYPOINT ["/ko-app/storaged"]
