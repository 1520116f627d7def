#!/usr/bin/env bash
# Exit 0 when this CPU can run SGLang's CPU kernels; else say why on stderr and exit 1.
#
#   scripts/sglang_cpu_check.sh
#
# It reads /proc/cpuinfo, or the file $DRAFTDATA_CPUINFO names (the tests judge other CPUs so).
#
# The kernels (the SGLang CPU kit's wheel, or a build from its source) are compiled for
# x86-64-v4 with AVX512-BF16 and VNNI (the kit's CMake: -march=x86-64-v4 -mavx512bf16
# -mavx512vnni -mamx-*); elsewhere they die with SIGILL when loaded, and SGLang loads them on CPU.
set -u
NEEDED="avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16 avx512_vnni"
CPUINFO="${DRAFTDATA_CPUINFO:-/proc/cpuinfo}"
FLAGS=" $(grep -m1 '^flags' "$CPUINFO" 2>/dev/null | cut -d: -f2) "
MISSING=""
for f in $NEEDED; do case "$FLAGS" in *" $f "*) ;; *) MISSING="$MISSING $f" ;; esac; done
[ -z "$MISSING" ] && exit 0
CPU="$(grep -m1 '^model name' "$CPUINFO" 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
echo "this CPU (${CPU:-unknown}) lacks${MISSING}: SGLang's CPU kernels are built for x86-64-v4 with AVX512-BF16/VNNI and die with SIGILL here" >&2
exit 1
