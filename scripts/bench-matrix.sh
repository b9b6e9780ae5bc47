#!/usr/bin/env bash
# bench-matrix.sh: the service benchmarks of BENCHMARKS.md in one invocation.
#
# Builds storaged and storaged-bench (scripts/bench-lib.sh: STORAGED_REV, default HEAD), then runs
# `storaged-bench matrix`: the floor (a no-op MessageStoreService behind storaged's gRPC server options,
# as its own process), storaged --flush-mode async and storaged --flush-mode sync (each with a temp data
# dir under $BENCH_DATA_ROOT, loopback 127.0.0.1:0), every case RUNS times, the targets taking turns
# within each run so that each ratio compares runs seconds apart. Writes the results JSON, a Markdown
# table of them next to it, and the chart.
#
#   scripts/bench-matrix.sh [extra storaged-bench matrix flags, e.g. --cases unary-c64 --runs 5]
#
# Environment: OUT (results JSON, default ${TMPDIR:-/tmp}/storaged-bench/results.json), CHART (default
# docs/bench-throughput.png), RUNS (3), DURATION (10s), WARMUP (2s), BENCH_DATA_ROOT (default $TMPDIR or
# /tmp), TARGETS (floor,async,sync; r3 adds a local replication group of three storaged, loaded through
# client.LeaderTracker, stream cases through a client.Stream per stream; r3-keyed the same group written with a UNIQ_KEY on every
# put), CASES (the matrix default list), BASE_REV (a second storaged built
# from that revision for the base-async and base-sync targets: an A/B of two builds in one run, e.g.
# BASE_REV=main TARGETS=floor,base-sync,sync).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
root=$(bench_root)
cd "$root"

bin=$(mktemp -d "${TMPDIR:-/tmp}/storaged-bench-bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
bench_build "$bin"
note=$BENCH_REV_NOTE
base=()
if [ -n "${BASE_REV:-}" ]; then
  STORAGED_REV=$BASE_REV bench_build "$bin/base"
  note="$note; base: $BENCH_REV_NOTE"
  base=(--base "$bin/base/storaged")
fi

out=${OUT:-${TMPDIR:-/tmp}/storaged-bench/results.json}
chart=${CHART:-docs/bench-throughput.png}
mkdir -p "$(dirname "$out")" "$(dirname "$chart")"
bench_machine >&2

args=(--storaged "$bin/storaged" --runs "${RUNS:-3}" --duration "${DURATION:-10s}" --warmup "${WARMUP:-2s}"
  --targets "${TARGETS:-floor,async,sync}" --data-root "${BENCH_DATA_ROOT:-${TMPDIR:-/tmp}}"
  --out "$out" --note "$note" "${base[@]}")
if [ -n "${CASES:-}" ]; then
  args+=(--cases "$CASES")
fi
"$bin/storaged-bench" matrix "${args[@]}" "$@"
"$bin/storaged-bench" chart --in "$out" --out "$chart" --method unary
"$bin/storaged-bench" report --in "$out" >"${out%.json}.md"
echo "bench-matrix: results in $out (table: ${out%.json}.md), chart in $chart" >&2
