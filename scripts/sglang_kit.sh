#!/usr/bin/env bash
# Print the folder of the SGLang CPU kit (the CPU kernel wheel, its source tarball and the
# requirements list of sglang 0.5.23 on a CPU torch), or say on stderr where it was looked for
# and exit 1.
#
#   scripts/sglang_kit.sh
#
# Looked for, in order: $DRAFTDATA_SGLANG_CPU; shared/sglang-cpu beside this clone (../shared);
# beside the main checkout when this is a git worktree (the folder above the common .git).
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
tried=()
if [ -n "${DRAFTDATA_SGLANG_CPU:-}" ]; then
  if [ -d "$DRAFTDATA_SGLANG_CPU" ]; then (cd "$DRAFTDATA_SGLANG_CPU" && pwd); exit 0; fi
  echo "DRAFTDATA_SGLANG_CPU=$DRAFTDATA_SGLANG_CPU is not a folder" >&2
  exit 1
fi
candidates=("$ROOT/../shared/sglang-cpu")
common="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
if [ -n "$common" ] && [ "$(basename "$common")" = .git ]; then
  candidates+=("$(dirname "$common")/../shared/sglang-cpu")
fi
for c in "${candidates[@]}"; do
  if [ -d "$c" ]; then (cd "$c" && pwd); exit 0; fi
  tried+=("$c")
done
echo "the SGLang CPU kit is not found (looked in ${tried[*]}); set DRAFTDATA_SGLANG_CPU to its folder" >&2
exit 1
