#!/usr/bin/env bash
# bench-profile.sh: CPU and allocation profiles of a server under load (issue 7 item 4).
#
# Builds storaged and storaged-bench (scripts/bench-lib.sh: STORAGED_REV, default HEAD), starts the
# target with pprof on its metrics port (storaged --pprof, or the floor with --pprof), runs storaged-bench
# against it, and while the load runs takes a CPU profile and a delta allocation profile over
# PROFILE_SECONDS, then an in-use heap profile and the /metrics page. Prints `go tool pprof -top` of
# each and keeps the raw profiles in OUTDIR.
#
#   scripts/bench-profile.sh [storaged-bench run flags, default: --method unary --concurrency 64]
#
# Environment: TARGET (async, sync or floor; default async), OUTDIR (default
# ${TMPDIR:-/tmp}/storaged-bench/profile-$TARGET),
# PROFILE_SECONDS (10), WARMUP (3), NODES (25, lines of each -top), BENCH_DATA_ROOT (default $TMPDIR or /tmp).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
root=$(bench_root)
cd "$root"

target=${TARGET:-async}
outdir=${OUTDIR:-${TMPDIR:-/tmp}/storaged-bench/profile-$target}
secs=${PROFILE_SECONDS:-10}
warmup=${WARMUP:-3}
nodes=${NODES:-25}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

bin=$(mktemp -d "${TMPDIR:-/tmp}/storaged-bench-bin.XXXXXX")
data=$(mktemp -d "${BENCH_DATA_ROOT:-${TMPDIR:-/tmp}}/storaged-bench-data.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || true
  fi
  rm -rf "$bin" "$data"
}
trap cleanup EXIT
bench_build "$bin"

log=$outdir/server.log
case $target in
  async | sync)
    "$bin/storaged" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --admin-listen "" --pprof --data-dir "$data" \
      --flush-mode "$target" 2>"$log" &
    ;;
  floor)
    "$bin/storaged-bench" floor --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --pprof 2>"$log" &
    ;;
  *)
    echo "bench-profile: TARGET must be async, sync or floor" >&2
    exit 2
    ;;
esac
pid=$!
# The server prints {"grpc":"127.0.0.1:N",...,"metrics":"127.0.0.1:M",...,"message":"listening"}.
if ! timeout 60 bash -c "until grep -q '\"message\":\"listening\"' '$log'; do sleep 0.1; done"; then
  echo "bench-profile: no listening line from $target:" >&2
  cat "$log" >&2
  exit 1
fi
line=$(grep -m1 '"message":"listening"' "$log")
grpc=$(sed -E 's/.*"grpc":"([^"]+)".*/\1/' <<<"$line")
metrics=$(sed -E 's/.*"metrics":"([^"]+)".*/\1/' <<<"$line")
echo "bench-profile: $target on $grpc, pprof on http://$metrics/debug/pprof/" >&2

load=("$@")
if [ ${#load[@]} -eq 0 ]; then
  load=(--method unary --concurrency 64)
fi
{
  bench_machine
  echo "target: $target ($BENCH_REV_NOTE)"
  echo "load: storaged-bench --addr $grpc --warmup ${warmup}s --duration $((secs + 2))s ${load[*]}"
  echo "profiles: CPU and allocs over ${secs}s of the measured phase"
} | tee "$outdir/README.txt" >&2

"$bin/storaged-bench" --addr "$grpc" --warmup "${warmup}s" --duration "$((secs + 2))s" --quiet \
  --metrics-url "http://$metrics/metrics" --json "$outdir/summary.json" --label "$target" "${load[@]}" \
  >"$outdir/summary.txt" &
bench=$!
sleep "$((warmup + 1))"
curl -sf -o "$outdir/cpu.pprof" "http://$metrics/debug/pprof/profile?seconds=$secs" &
cpu=$!
curl -sf -o "$outdir/allocs.pprof" "http://$metrics/debug/pprof/allocs?seconds=$secs" &
allocs=$!
wait "$cpu" "$allocs"
wait "$bench"
curl -sf -o "$outdir/heap.pprof" "http://$metrics/debug/pprof/heap"
curl -sf -o "$outdir/metrics.txt" "http://$metrics/metrics"

cat "$outdir/summary.txt"
pp() { go tool pprof -top -nodecount="$nodes" "$@" 2>/dev/null; }
{
  echo "=== CPU (flat) ==="
  pp "$outdir/cpu.pprof"
  echo "=== CPU (cumulative) ==="
  pp -cum "$outdir/cpu.pprof"
  echo "=== allocations during the load (alloc_space) ==="
  pp -sample_index=alloc_space "$outdir/allocs.pprof"
  echo "=== allocations during the load (alloc_objects) ==="
  pp -sample_index=alloc_objects "$outdir/allocs.pprof"
  echo "=== heap in use after the load ==="
  pp -sample_index=inuse_space "$outdir/heap.pprof"
} | tee "$outdir/top.txt"
