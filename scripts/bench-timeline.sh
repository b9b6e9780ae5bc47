#!/usr/bin/env bash
# bench-timeline.sh: one long r3 run, second by second (BENCHMARKS.md "Population in a window"):
# the group leader's acked PutMessage calls and the host's dirty + writeback pages each second, to
# find stalls a run's average hides.
#
#   scripts/bench-timeline.sh STORAGED OUT [SECONDS [storaged-bench matrix flags...]]
#   e.g. scripts/bench-timeline.sh /tmp/bin/storaged /tmp/t 75 --storaged-args "--populate-ahead 1GiB"
#
# Runs `storaged-bench matrix --targets r3 --cases unary-c64 --runs 1` for SECONDS (default 75),
# finds the leader by its metrics (storaged_raft_is_leader 1), and prints "second:puts/dirtyMB" per
# second; OUT.json, OUT.out and OUT.tl keep the results. Needs storaged-bench on PATH or
# STORAGED_BENCH, curl, ss (iproute2), Linux /proc.
set -euo pipefail
bin=$1 out=$2 secs=${3:-75}
shift 2
[ $# -gt 0 ] && shift
bench=${STORAGED_BENCH:-storaged-bench}
"$bench" matrix --storaged "$bin" --targets r3 --cases unary-c64 --runs 1 --duration "${secs}s" --warmup 1s \
  --out "$out.json" "$@" >"$out.out" 2>&1 &
run=$!
trap 'kill $run 2>/dev/null || true' EXIT
leader=""
for _ in $(seq 1 300); do
  for pid in $(pgrep -f -- "^$bin " || true); do
    for addr in $(ss -ltnp | grep "pid=$pid," | grep -o '127\.0\.0\.1:[0-9]*' || true); do
      if curl -s -m 1 "http://$addr/metrics" | grep -q '^storaged_raft_is_leader 1'; then leader=$addr; fi
    done
  done
  [ -n "$leader" ] && break
  sleep 0.1
done
[ -n "$leader" ] || { echo "bench-timeline: no leader found" >&2; exit 1; }
for i in $(seq 1 "$secs"); do
  puts=$(curl -s -m 1 "http://$leader/metrics" | awk '/^grpc_server_handled_total\{grpc_code="OK",grpc_method="PutMessage",/ {print $2}')
  dirty=$(awk '/^(Dirty|Writeback):/ {s += $2} END {print s / 1024}' /proc/meminfo)
  echo "$i ${puts:-0} $dirty"
  sleep 1
done >"$out.tl"
wait $run || true
trap - EXIT
awk 'NR > 1 && $2 >= p {printf "%d:%d/%.0f ", NR, $2 - p, $3} {p = $2}' "$out.tl"
echo
tail -1 "$out.out"
