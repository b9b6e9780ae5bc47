#!/usr/bin/env bash
# Lint Dockerfiles offline with dockerfile-utils (hadolint is neither in Debian 12 nor on npm).
#
#   scripts/lint-dockerfile.sh               # lints the repository's Dockerfile
#   scripts/lint-dockerfile.sh path/to/Dockerfile...
#
# dockerfile-utils prints each diagnostic on stdout ("Line: N", the line, "Warning: ..." or "Error: ...").
# It exits 1 on errors but 0 on warnings, so any output on stdout is treated as a finding here.
# npm's own messages (stderr) are passed through and are not findings.
set -euo pipefail

readonly DOCKERFILE_UTILS=dockerfile-utils@0.16.3

if [[ $# -eq 0 ]]; then
	set -- "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/Dockerfile"
fi

status=0
for file in "$@"; do
	rc=0
	out=$(npm_config_update_notifier=false npx --yes "$DOCKERFILE_UTILS" lint "$file") || rc=$?
	if [[ $rc -ne 0 || -n "$out" ]]; then
		printf '%s: findings (dockerfile-utils exit %d):\n%s\n' "$file" "$rc" "${out:-<no output>}" >&2
		status=1
	else
		printf '%s: OK (%s)\n' "$file" "$DOCKERFILE_UTILS"
	fi
done
exit "$status"
