#!/usr/bin/env bash
# Print the folder of a heavy test tier's cached environment (vllm, trainers, sglang):
#
#   scripts/env_path.sh NAME        ->  $DRAFTDATA_ENV_CACHE/NAME-<key>
#
# The cache lies outside the clone ($DRAFTDATA_ENV_CACHE, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/draftdata), so every clone, worktree and CI run on one machine
# shares one build. The key is a checksum of what decides the environment's contents: the build
# script scripts/NAME_env.sh, env_lib.sh and, for NAME=sglang, the files of the folder
# scripts/sglang_kit.sh names (the SGLang CPU kit where this CPU loads its kernels, else the
# repository's scripts/sglang-cpu: then the kit, found or not, changes nothing). A changed input
# gives a new folder, built afresh; an old one can be deleted at will.
set -eu
NAME="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${DRAFTDATA_ENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftdata}"
inputs=("$HERE/${NAME}_env.sh" "$HERE/env_lib.sh")
if [ "$NAME" = sglang ]; then
  if KIT="$(bash "$HERE/sglang_kit.sh" 2>/dev/null)"; then
    while IFS= read -r f; do inputs+=("$f"); done < <(find "$KIT" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.txt' -o -name '*.tar.gz' \) | sort)
  fi
fi
key=$(for f in "${inputs[@]}"; do [ -f "$f" ] && basename "$f" && cat "$f"; done | sha256sum | cut -c1-12)
echo "$CACHE/$NAME-$key"
