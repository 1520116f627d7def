#!/usr/bin/env bash
# Create (once) the cached environment of the drafter trainers used by the trainer test tier
# (tests/integration/trainers): SpecForge, speculators and TensorRT Model Optimizer, each with its
# own data code.
#
#   scripts/trainers_env.sh [VENV_DIR]      (default: the cached folder scripts/env_path.sh trainers names)
#
# Both come from the package index. SpecForge 0.2.0 pins torch==2.11.0, transformers==5.8.1
# and sglang (a GPU server), so it is installed WITHOUT dependencies; speculators 0.9.0 wants
# torchvision/torchaudio and hs-connectors' GPU extras, so it too. What their data code imports
# is installed explicitly, at versions both accept: the local CPU torch wheel (2.13.0; speculators
# takes 2.9-2.14.1), transformers 5.8.1 (SpecForge's pin; speculators takes 5.0-5.19), datasets
# 4.x-5.1 (speculators' range). nvidia-modelopt 0.47.0 (its data reader, ShardedDataset +
# LanguageDataCollator, imports the whole modelopt.torch package) is installed without
# dependencies too (its extras pull GPU wheels), plus its base requirements. draftdata itself is not installed: the tier runs its side in the
# main venv and only the trainers' side in this one.
# A stamp file makes later calls a no-op; delete VENV_DIR to rebuild. Exit status is non-zero
# (and the reason is written to VENV_DIR/.failed) when the packages cannot be installed; the
# tier then skips and prints that reason.
set -u
VENV="${1:-$(bash "$(dirname "$0")/env_path.sh" trainers)}"
TORCH_VERSION="${DRAFTDATA_TRAINERS_TORCH:-2.13.0}"
SPECFORGE_VERSION="${DRAFTDATA_SPECFORGE_VERSION:-0.2.0}"
SPECULATORS_VERSION="${DRAFTDATA_SPECULATORS_VERSION:-0.9.0}"
MODELOPT_VERSION="${DRAFTDATA_MODELOPT_VERSION:-0.47.0}"
STAMP="$VENV/.installed-specforge${SPECFORGE_VERSION}-speculators${SPECULATORS_VERSION}-modelopt${MODELOPT_VERSION}-torch${TORCH_VERSION}"
. "$(dirname "$0")/env_lib.sh"
env_begin trainers_env "$VENV" "$STAMP" \
  "specforge==$SPECFORGE_VERSION speculators==$SPECULATORS_VERSION nvidia-modelopt==$MODELOPT_VERSION torch==$TORCH_VERSION"
LOG="$VENV/install.log"
PIP=("$VENV/bin/python" -m pip install -q)
# What specforge.data, speculators.data_generation and modelopt.torch import (and transformers'
# chat templates).
"${PIP[@]}" "torch==$TORCH_VERSION" "transformers==5.8.1" "datasets>=4.0.0,<=5.1.0" \
  "numpy>=2.0.0,<=2.5.4" "tqdm>=4.66.3,<=4.70.1" "loguru>=0.7.2,<=0.7.3" jinja2 pydantic \
  pydantic-settings pyyaml safetensors huggingface-hub openai-harmony "openai>=2.0.0" httpx \
  aiohttp rich typer click protobuf psutil packaging "nvidia-ml-py>=12" "omegaconf>=2.3.0" \
  "pulp<4.0" regex scipy ninja "setuptools>=80" requests >"$LOG" 2>&1 \
  || fail "pip install of the trainers' data dependencies failed (see $LOG)"
"${PIP[@]}" --no-deps "specforge==$SPECFORGE_VERSION" "speculators==$SPECULATORS_VERSION" \
  "hs-connectors==$SPECULATORS_VERSION" "nvidia-modelopt==$MODELOPT_VERSION" >>"$LOG" 2>&1 \
  || fail "pip install --no-deps specforge==$SPECFORGE_VERSION speculators==$SPECULATORS_VERSION nvidia-modelopt==$MODELOPT_VERSION failed (see $LOG)"
"$VENV/bin/python" -c "
from specforge.data.preprocessing import preprocess_conversations
from specforge.data.template import TEMPLATE_REGISTRY
from speculators.data_generation.preprocessing import build_speculator_training_dataset
from modelopt.torch.utils.plugins.transformers_dataset import LanguageDataCollator, ShardedDataset
import torch, transformers
print('specforge, speculators, modelopt ok;', torch.__version__, transformers.__version__)
" >>"$LOG" 2>&1 || fail "specforge.data, speculators.data_generation or modelopt's transformers_dataset does not import in $VENV (see $LOG)"
env_done
