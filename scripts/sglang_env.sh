#!/usr/bin/env bash
# Create (once) the cached CPU SGLang environment used by the SGLang test tier
# (tests/integration/sglang).
#
#   scripts/sglang_env.sh [VENV_DIR]      (default: the cached folder scripts/env_path.sh sglang names)
#
# Built from the SGLang CPU kit (scripts/sglang_kit.sh finds it; its README has the facts):
# - the package index has no CPU build of SGLang's kernel library: the kit's wheel
#   (sglang_kernel_cpu, module sgl_kernel) is installed --no-deps; only when it does not load is
#   it rebuilt from the kit's source tarball (needs gcc, cmake and Debian's libnuma-dev numactl
#   libtbb-dev google-perftools; ~13 min on 2 cores);
# - those kernels are compiled for x86-64-v4 with AVX512-BF16/VNNI (and AMX; the kit's CMake
#   sets -march=x86-64-v4 -mavx512bf16 -mavx512vnni -mamx-*): on a CPU without them (an AVX2-only
#   AMD EPYC, say) the wheel dies with SIGILL on import and a rebuild would too. SGLang uses the
#   kernels only where the CPU has AMX, so the environment is built all the same: there the tier
#   (scripts/sglang_cpu_check.sh says which CPU) gives the server the library's names only
#   (tests/integration/sglang/no_kernels) and SGLang runs on torch's CPU ops;
# - sglang==0.5.23 pins a CUDA-only torch: it is installed --no-deps, its dependencies from the
#   kit's requirements list with torch held at the local CPU wheel (2.13.0);
# - torchvision (imported by sglang at start) is the index's CUDA build, installed --no-deps; its
#   two compiled-registration imports are made optional in this environment's own copy.
# A stamp file makes later calls a no-op; delete VENV_DIR to rebuild. Exit status is non-zero
# (and the reason is written to VENV_DIR/.failed) when the environment cannot be had; the tier
# then skips and prints that reason.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-$(bash "$HERE/env_path.sh" sglang)}"
TORCH_VERSION="${DRAFTDATA_SGLANG_TORCH:-2.13.0}"
TORCHVISION_VERSION="${DRAFTDATA_SGLANG_TORCHVISION:-0.28.0}"
SGLANG_VERSION="${DRAFTDATA_SGLANG_VERSION:-0.5.23}"
STAMP="$VENV/.installed-sglang${SGLANG_VERSION}-torch${TORCH_VERSION}"
. "$HERE/env_lib.sh"
[ -f "$STAMP" ] && exit 0
if ! KIT="$(bash "$HERE/sglang_kit.sh" 2>&1)"; then
  ENV_NAME=sglang_env ENV_VENV="$VENV"
  mkdir -p "$VENV"
  fail "$KIT"
fi
env_begin sglang_env "$VENV" "$STAMP" "sglang==$SGLANG_VERSION torch==$TORCH_VERSION from $KIT"
LOG="$VENV/install.log"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q)
REQS="$KIT/sglang-$SGLANG_VERSION-cpu-requirements.txt"
[ -f "$REQS" ] || fail "the SGLang CPU kit $KIT has no $(basename "$REQS")"
echo "torch==$TORCH_VERSION" >"$VENV/constraints.txt"
"${PIP[@]}" -c "$VENV/constraints.txt" "torch==$TORCH_VERSION" -r "$REQS" >"$LOG" 2>&1 \
  || fail "pip install of sglang's CPU requirements ($REQS, torch==$TORCH_VERSION) failed (see $LOG)"
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION" "torchvision==$TORCHVISION_VERSION" >>"$LOG" 2>&1 \
  || fail "pip install --no-deps sglang==$SGLANG_VERSION torchvision==$TORCHVISION_VERSION failed (see $LOG)"

# torchvision's compiled registrations do not load beside the CPU torch; sglang needs neither.
"$PY" - >>"$LOG" 2>&1 <<'PYEOF' || fail "cannot make torchvision's registrations optional in $VENV (see $LOG)"
import importlib.util, pathlib
init = pathlib.Path(importlib.util.find_spec("torchvision").origin)
text = init.read_text()
MARK = "# made optional by draftdata's sglang_env.sh"
if MARK not in text:
    names = ("_autograd_registrations", "_meta_registrations")
    for name in names:  # 0.28 imports them in one block: "from torchvision import (\n    NAME,\n..."
        line = f"    {name},\n"
        if line not in text:
            raise SystemExit(f"{init}: no '{name},' line in its import block")
        text = text.replace(line, "", 1)
    anchor = ")  # usort:skip\n"
    if anchor not in text:
        raise SystemExit(f"{init}: the end of its import block is not where expected")
    optional = (
        f"{anchor}{MARK}: their compiled\n# registrations do not load beside a CPU torch\n"
        f"for _name in {names!r}:\n    try:\n        __import__('torchvision.' + _name)\n"
        "    except Exception:\n        pass\n"
    )
    init.write_text(text.replace(anchor, optional, 1))
print("torchvision registrations made optional in", init)
PYEOF

kernel_loads() {
  "$PY" -c "import torch, sgl_kernel; print('sgl_kernel', sgl_kernel.__file__)" >>"$LOG" 2>&1
}
WHEELS=("$KIT"/sglang_kernel_cpu-*.whl)
if [ -f "${WHEELS[0]}" ]; then
  "${PIP[@]}" --no-deps "${WHEELS[@]}" >>"$LOG" 2>&1 || echo "the kit's kernel wheel does not install here" >>"$LOG"
fi
if ! bash "$HERE/sglang_cpu_check.sh" >>"$LOG" 2>&1; then
  echo "sglang_env: $(bash "$HERE/sglang_cpu_check.sh" 2>&1); the kit's kernels stay unused here" >&2
elif ! kernel_loads; then
  SRC=("$KIT"/sglang-kernel-cpu-src-*.tar.gz)
  [ -f "${SRC[0]}" ] || fail "SGLang's CPU kernels do not load from the kit's wheel and the kit has no source tarball (see $LOG)"
  echo "sglang_env: the kernel wheel does not load here; building it from ${SRC[0]} (~13 min)" >&2
  for lib in numa tbb; do
    ldconfig -p | grep -q "lib$lib.so " || fail "building SGLang's CPU kernels needs Debian's libnuma-dev numactl libtbb-dev google-perftools (apt-get install them; lib$lib.so is missing)"
  done
  rm -rf "$VENV/kernel-src" && mkdir -p "$VENV/kernel-src" && tar xzf "${SRC[0]}" -C "$VENV/kernel-src" \
    || fail "cannot unpack ${SRC[0]}"
  cd "$VENV/kernel-src/aot" && cp pyproject_cpu.toml pyproject.toml \
    && "${PIP[@]}" scikit-build-core cmake ninja >>"$LOG" 2>&1 \
    && "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$VENV/kernel-wheel" . >>"$LOG" 2>&1 \
    && "${PIP[@]}" --no-deps --force-reinstall "$VENV"/kernel-wheel/*.whl >>"$LOG" 2>&1 \
    || fail "building SGLang's CPU kernels from ${SRC[0]} failed (see $LOG)"
  cd "$HERE"
  kernel_loads || fail "SGLang's CPU kernels built from source do not load (see $LOG)"
fi
"$PY" -c "
import torch, torchvision, sglang, transformers
from sglang.srt.server_args import prepare_server_args
print('sglang', sglang.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)
" >>"$LOG" 2>&1 || fail "sglang does not import in $VENV (see $LOG)"
env_done
