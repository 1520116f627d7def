#!/usr/bin/env bash
# Print the folder scripts/sglang_env.sh builds the SGLang tier's environment from, or say on
# stderr why there is none and exit 1.
#
#   scripts/sglang_kit.sh
#
# Where this CPU can load SGLang's CPU kernels (scripts/sglang_cpu_check.sh): the SGLang CPU kit
# (the kernel wheel, its source tarball and the requirements list of sglang 0.5.23 on a CPU
# torch), looked for, in order, at $DRAFTDATA_SGLANG_CPU; shared/sglang-cpu beside this clone
# (../shared); beside the main checkout when this is a git worktree (the folder above the common
# .git). Elsewhere (an AVX2-only CPU) the kernels cannot load and SGLang runs on torch's own CPU
# ops: the environment needs nothing of the kit but its requirements list, which the repository
# carries (scripts/sglang-cpu), so any clone builds it, and the kit, found or not, is no input
# of the environment (scripts/env_path.sh keys the folder on what this prints).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
if ! bash "$HERE/sglang_cpu_check.sh" 2>/dev/null; then
  echo "$HERE/sglang-cpu"
  exit 0
fi
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
echo "the SGLang CPU kit is not found (looked in ${tried[*]}); this CPU can run its kernels, which SGLang loads here: set DRAFTDATA_SGLANG_CPU to its folder" >&2
exit 1
