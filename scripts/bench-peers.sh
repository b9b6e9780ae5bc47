#!/usr/bin/env bash
# bench-peers.sh: storaged beside its peers in one matrix (issue 16), the "Peers" table of BENCHMARKS.md.
#
# Installs what the peers need on a fresh Debian machine, then runs scripts/bench-matrix.sh with the
# peers as extra targets, so that the floor, storaged async and sync, NATS JetStream and Redis take
# turns case by case and run by run in one sitting (storaged-bench matrix; cmd/storaged-bench/peers.go
# says how each case maps onto the peers' own benchmark clients):
#   nats            nats-server v2.15.2, JetStream R1 file stream, default sync_interval (2 min)
#   nats-always     the same with sync_interval: always
#   redis-everysec  redis-server (Debian), appendonly yes, appendfsync everysec
#   redis-always    appendfsync always
# nats-server and natscli v0.5.0 (its `nats bench`) are built with `go install` into bin/ at the repo
# root (gitignored); redis-server and redis-benchmark come from apt (redis-server, as root).
#
#   scripts/bench-peers.sh [extra storaged-bench matrix flags]
#
# Environment: as scripts/bench-matrix.sh (OUT, CHART, RUNS, DURATION, WARMUP, STORAGED_REV, BASE_REV,
# BENCH_DATA_ROOT), with defaults TARGETS=floor,async,sync,nats,nats-always,redis-everysec,redis-always,
# CASES=unary-c1,unary-c16,unary-c64,batch100-c16, OUT=${TMPDIR:-/tmp}/storaged-bench/peers.json and
# CHART=docs/bench-peers.png. NO_INSTALL=1 skips the installs (the binaries must be there).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/bench-lib.sh"
root=$(bench_root)
bindir=$root/bin
nats_server_version=v2.15.2
natscli_version=v0.5.0

if [ -z "${NO_INSTALL:-}" ]; then
  mkdir -p "$bindir"
  if ! "$bindir/nats-server" --version 2>/dev/null | grep -q "$nats_server_version"; then
    echo "bench-peers: go install nats-server $nats_server_version into $bindir" >&2
    GOBIN=$bindir go install "github.com/nats-io/nats-server/v2@$nats_server_version"
  fi
  if ! "$bindir/nats" --version 2>/dev/null | grep -q "$natscli_version"; then
    echo "bench-peers: go install natscli $natscli_version into $bindir" >&2
    GOBIN=$bindir go install "github.com/nats-io/natscli/nats@$natscli_version"
  fi
  if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    echo "bench-peers: apt-get install redis-server" >&2
    sudo=
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  fi
fi
redis_server=$(command -v redis-server)
redis_benchmark=$(command -v redis-benchmark)
echo "peers: $("$bindir/nats-server" --version), natscli $("$bindir/nats" --version), $("$redis_server" --version | cut -d' ' -f1-3)" >&2

export TARGETS=${TARGETS:-floor,async,sync,nats,nats-always,redis-everysec,redis-always}
export CASES=${CASES:-unary-c1,unary-c16,unary-c64,batch100-c16}
export OUT=${OUT:-${TMPDIR:-/tmp}/storaged-bench/peers.json}
export CHART=${CHART:-docs/bench-peers.png}
exec "$here/bench-matrix.sh" --nats-server "$bindir/nats-server" --nats "$bindir/nats" \
  --redis-server "$redis_server" --redis-benchmark "$redis_benchmark" "$@"
