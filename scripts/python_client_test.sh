#!/usr/bin/env bash
# python_client_test.sh: run the Python gRPC client check (python_client_test.py) against storaged.
#
#   scripts/python_client_test.sh             build storaged, start it on a free 127.0.0.1 port with a
#                                             temporary data dir, run the check, stop it (SIGTERM, by pid)
#   scripts/python_client_test.sh HOST:PORT   run the check against a storaged that is already running
#
# Needs Debian's /usr/bin/python3 with python3-grpcio python3-protobuf, and protobuf-compiler
# protobuf-compiler-grpc libprotobuf-dev (.ci/run installs them). The Go test TestPythonClient in
# cmd/storaged does the same from `go test`. Exit status: the check's (0 ok, 1 failed, 2 missing deps).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=/usr/bin/python3
pkgs="python3-grpcio python3-protobuf protobuf-compiler-grpc protobuf-compiler libprotobuf-dev"

if ! "$python" -c 'import grpc, google.protobuf' 2>/dev/null || ! command -v protoc >/dev/null ||
   ! command -v grpc_python_plugin >/dev/null; then
  echo "python_client_test: missing prerequisites: apt-get install $pkgs" >&2
  exit 2
fi

if [ $# -ge 1 ]; then
  exec "$python" "$root/scripts/python_client_test.py" "$1"
fi

tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || echo "python_client_test: storaged exited with status $?" >&2
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$root" && go build -o "$tmp/storaged" ./cmd/storaged)
"$tmp/storaged" --listen 127.0.0.1:0 --metrics-listen "" --admin-listen "" --data-dir "$tmp/data" 2>"$tmp/log" &
pid=$!

# Wait (at most 30 s) for the store to be open: the "serving" log line.
for _ in $(seq 300); do
  grep -q '"message":"serving"' "$tmp/log" && break
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$tmp/log" >&2
    echo "python_client_test: storaged exited during startup" >&2
    exit 1
  fi
  sleep 0.1
done
addr=$(sed -n -E 's/.*"grpc":"([^"]+)".*"message":"listening".*/\1/p' "$tmp/log" | head -n1)
if [ -z "$addr" ] || ! grep -q '"message":"serving"' "$tmp/log"; then
  cat "$tmp/log" >&2
  echo "python_client_test: storaged did not start serving within 30 s" >&2
  exit 1
fi

"$python" "$root/scripts/python_client_test.py" "$addr"
