#!/usr/bin/env bash
# bench-catchup.sh BIN MODE(on|off) MSGS: three storaged members on loopback; one follower stopped
# while MSGS 1 KiB messages are committed (batch 100 x 16); then all stopped, the page cache dropped, the two restarted, the
# page cache dropped again, and the lagging one started. Reports the seconds until it has applied
# the leader's commit, a unary c4 load on the leader meanwhile (p50/p99), and the leader's
# storaged_raft_storage_entries_seconds and readahead counters, as one JSON line (BENCHMARKS.md,
# "Reading ahead of a follower"). MODE on runs the members with --raft-catchup-readahead 32MiB, off
# with 0. Needs root (it writes /proc/sys/vm/drop_caches), python3, curl, and storaged-bench on PATH
# or in STORAGED_BENCH; uses ports 19501-19523.
set -euo pipefail
bin=$1 mode=$2 msgs=$3
ra=32MiB; [ "$mode" = off ] && ra=0
bench=${STORAGED_BENCH:-storaged-bench}
root=$(mktemp -d "${TMPDIR:-/tmp}/bench-catchup.XXXXXX")
declare -A pid
trap 'for p in "${pid[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$root"' EXIT
peers="1=127.0.0.1:19511,2=127.0.0.1:19512,3=127.0.0.1:19513"
start() {
  "$bin" --listen 127.0.0.1:1950$1 --peer-listen 127.0.0.1:1951$1 --data-dir $root/d$1 --raft-id $1 --raft-peers $peers \
    --metrics-listen 127.0.0.1:1952$1 --admin-listen= --log-level warn --file-size 128MiB --raft-catchup-readahead $ra \
    >> $root/l$1 2>&1 &
  pid[$1]=$!
}
metric() { curl -s http://127.0.0.1:1952$1/metrics | awk -v m="$2" '$1==m {print $2}'; }
leader() { for i in "$@"; do [ "$(metric $i storaged_raft_ready 2>/dev/null)" = 1 ] && { echo $i; return; }; done; echo 0; }
waitleader() { for _ in $(seq 1 300); do l=$(leader "$@"); [ "$l" != 0 ] && { echo $l; return; }; sleep 0.1; done; echo "no leader" >&2; exit 1; }
stopm() { kill -TERM ${pid[$1]}; wait ${pid[$1]} 2>/dev/null || true; unset "pid[$1]"; }
for i in 1 2 3; do start $i; done
L=$(waitleader 1 2 3)
F=3; [ $L = 3 ] && F=2
stopm $F
$bench --addr 127.0.0.1:1950$L --method batch --batch-size 100 --concurrency 16 --messages $msgs --warmup 0s --quiet --json $root/load.json >/dev/null
others=""; for i in 1 2 3; do [ $i != $F ] && others="$others $i"; done
for i in $others; do stopm $i; done
sync; echo 1 > /proc/sys/vm/drop_caches
for i in $others; do start $i; done
L=$(waitleader $others)
sync; echo 1 > /proc/sys/vm/drop_caches
commit=$(metric $L storaged_raft_commit_index)
t0=$(date +%s.%N)
start $F
$bench --addr 127.0.0.1:1950$L --method unary --concurrency 4 --duration 15s --warmup 0s --quiet --json $root/u.json >/dev/null &
bp=$!
t1=""
for _ in $(seq 1 1200); do
  a=$(metric $F storaged_raft_applied_index 2>/dev/null || echo 0)
  if [ -n "$a" ] && [ "$a" -ge "$commit" ]; then t1=$(date +%s.%N); break; fi
  sleep 0.05
done
wait $bp || true
python3 - "$root" "$t0" "${t1:-0}" "$mode" "$L" "$F" <<'PY'
import json, sys, urllib.request
root, t0, t1, mode, L, F = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
load = json.load(open(root + "/load.json")); u = json.load(open(root + "/u.json"))
m = {}
for line in urllib.request.urlopen(f"http://127.0.0.1:1952{L}/metrics").read().decode().splitlines():
    if line.startswith("storaged_raft_storage_entries_seconds_") or line.startswith("storaged_raft_catchup_"):
        k, v = line.rsplit(" ", 1); m[k] = float(v)
cnt = m.get("storaged_raft_storage_entries_seconds_count", 0); s = m.get("storaged_raft_storage_entries_seconds_sum", 0)
# the largest bucket bound holding the 99th percentile
b = sorted((float(k.split('le="')[1].split('"')[0]), v) for k, v in m.items() if 'le="' in k and "+Inf" not in k)
p99 = next((le for le, v in b if v >= 0.99 * cnt), float("inf"))
print(json.dumps({"mode": mode, "lag_msgs": load["messages"], "catchup_s": round(t1 - t0, 2) if t1 else None,
  "unary_msgs_s": round(u["msgs_per_sec"]), "unary_p50_ms": u["latency"]["p50_us"]/1000, "unary_p99_ms": u["latency"]["p99_us"]/1000, "unary_max_ms": u["latency"]["max_us"]/1000,
  "entries_calls": int(cnt), "entries_sum_s": round(s, 3), "entries_p99_le_s": p99,
  "readahead_mib": round(m.get("storaged_raft_catchup_readahead_bytes_total", 0) / 2**20, 1),
  "readaheads": int(m.get("storaged_raft_catchup_readaheads_total", 0))}))
PY
