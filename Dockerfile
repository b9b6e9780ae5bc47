# syntax=docker/dockerfile:1
#
# storaged container image.
#   docker build --build-arg VERSION=$(git describe --always --dirty) -t storaged:dev .
#   docker run --rm -p 9090:9090 -p 9091:9091 -v storaged-data:/var/lib/storaged storaged:dev
# The runtime image has no shell and no libc, so every command below is in exec form and the binaries are static.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Static binaries only: the distroless "static" base has no libc.
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/storaged ./cmd/storaged \
 && GOBIN=/out go install -trimpath github.com/grpc-ecosystem/grpc-health-probe@v0.4.63 \
 && install -d -o 65532 -g 65532 /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/storaged /usr/local/bin/storaged
COPY --from=build /out/grpc-health-probe /usr/local/bin/grpc-health-probe
COPY --from=build --chown=65532:65532 /out/data /var/lib/storaged
# Numeric UID:GID so that Kubernetes runAsNonRoot can verify it (65532 = "nonroot" in distroless).
USER 65532:65532
ENV STORAGED_LISTEN=:9090 \
    STORAGED_METRICS_LISTEN=:9091 \
    STORAGED_DATA_DIR=/var/lib/storaged
# 9090: gRPC (MessageStoreService, grpc.health.v1, reflection); 9091: Prometheus /metrics (and optional pprof).
EXPOSE 9090 9091
VOLUME ["/var/lib/storaged"]
# Liveness only: the overall ("") health status is SERVING while the process runs, also during commitlog recovery.
# Readiness (storaged.v1.MessageStoreService) is left to orchestrators; Kubernetes ignores HEALTHCHECK and uses its own gRPC probes.
# If STORAGED_LISTEN is changed to another port, this check must be overridden (docker run --health-cmd ...).
HEALTHCHECK --interval=10s --timeout=5s --start-period=2m --retries=3 \
  CMD ["/usr/local/bin/grpc-health-probe", "-addr=127.0.0.1:9090", "-connect-timeout=2s", "-rpc-timeout=2s"]
ENTRYPOINT ["/usr/local/bin/storaged"]
