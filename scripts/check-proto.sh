#!/usr/bin/env bash
# check-proto.sh: lint the protos, check that gen/ is up to date, and check for breaking changes.
#
#   1. buf lint (buf.yaml: STANDARD).
#   2. buf generate, then fail if gen/ differs from what is committed (changed, deleted or untracked
#      files). Regenerate with `go tool -modfile=tools/buf/go.mod buf generate` and commit gen/.
#   3. buf breaking (buf.yaml: FILE) against HEAD~1, only when HEAD~1 exists and has proto/.
#      '.git#ref=HEAD~1' resolves against the checked-out HEAD. ('.git#branch=main,ref=HEAD~1' would
#      resolve to main~1 whatever is checked out, and fail where no local main branch exists.)
#
# Tools come from the pinned modfiles tools/buf/go.mod and tools/go.mod (see buf.gen.yaml), never from
# $GOPATH/bin. Runs from any directory; it works on the repository root. Called by .ci/run.
set -euo pipefail

root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
cd "$root"

buf() { go tool -modfile=tools/buf/go.mod buf "$@"; }

echo "check-proto: buf lint"
buf lint

echo "check-proto: buf generate"
buf generate
if ! git diff --exit-code --stat -- gen; then
  echo "check-proto: gen/ is stale: run 'go tool -modfile=tools/buf/go.mod buf generate' and commit gen/" >&2
  exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- gen)
if [ -n "$untracked" ]; then
  echo "check-proto: untracked generated files (commit them):" >&2
  echo "$untracked" >&2
  exit 1
fi

if git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null \
  && [ -n "$(git ls-tree -d --name-only 'HEAD~1' -- proto)" ]; then
  echo "check-proto: buf breaking against HEAD~1"
  buf breaking --against '.git#ref=HEAD~1'
else
  echo "check-proto: skip buf breaking (HEAD~1 missing or has no proto/)"
fi
echo "check-proto: OK"
