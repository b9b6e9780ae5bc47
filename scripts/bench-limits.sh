#!/usr/bin/env bash
# bench-limits.sh: the hostile-client figures of issue 11 in BENCHMARKS.md in one invocation.
#
# Builds storaged and storaged-bench (scripts/bench-lib.sh: STORAGED_REV, default HEAD), then runs
# `storaged-bench limits`, each scenario on its own storaged process and temp data dir under
# $BENCH_DATA_ROOT (loopback 127.0.0.1:0):
#   topics  TOPICS topics with one message each: consume-queue disk (allocated blocks), then a restart:
#           time to SERVING, RSS, bytes written (/proc/PID/io), open fds, and fds while every queue is read
#   polls   producer p50/p99 alone, with 2,000 idle long polls, with 20 tag-filtered polls on a
#           300,000-message queue, interleaved ROUNDS times; ratios to the phase alone before each
#   pulls   server VmHWM for 32 concurrent 16 MiB include_raw pulls (or their RESOURCE_EXHAUSTED refusals)
# Writes the results JSON and a Markdown table of figures and goals next to it (.md).
#
#   scripts/bench-limits.sh [extra storaged-bench limits flags, e.g. --scenarios polls --polls-rounds 5]
#
# Environment: OUT (results JSON, default ${TMPDIR:-/tmp}/storaged-bench/limits.json), TOPICS (10000;
# a store that preallocates 6,000,000 bytes per consume queue, as 4b36369 does, needs TOPICS x 6 MB of
# disk: use 300 there), ROUNDS (3), STORAGED_ARGS (extra storaged flags, e.g. "--max-open-queue-files 256"),
# BENCH_DATA_ROOT (default $TMPDIR or /tmp).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
root=$(bench_root)
cd "$root"

bin=$(mktemp -d "${TMPDIR:-/tmp}/storaged-bench-bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
bench_build "$bin"

out=${OUT:-${TMPDIR:-/tmp}/storaged-bench/limits.json}
mkdir -p "$(dirname "$out")"
bench_machine >&2

"$bin/storaged-bench" limits --storaged "$bin/storaged" --storaged-args "${STORAGED_ARGS:-}" \
  --topics "${TOPICS:-10000}" --polls-rounds "${ROUNDS:-3}" \
  --data-root "${BENCH_DATA_ROOT:-${TMPDIR:-/tmp}}" --out "$out" --note "$BENCH_REV_NOTE" "$@"
echo "bench-limits: results in $out (table: ${out%.json}.md, server logs: ${out%.json}.log)" >&2
