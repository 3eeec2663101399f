#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (not these CPU machines): install vLLM in a virtual
# environment of its own, with its own torch and transformers, and print, as one JSON line,
# computed_over_unique and tree-vs-chain wall per leaf through vLLM and through the
# transformers backend on the GPU, vLLM's logprob agreement with the model, a seeded repeat
# and a weight update through vLLM's in-process path (bench/gpu_engines.py).
#
#   bash bench/gpu_engines.sh            # quick (a few minutes once vLLM is installed)
#   bash bench/gpu_engines.sh --full
#
# Pinned to the releases treeroll's vLLM and SGLang backends were checked against (their
# source, not a run: no GPU has run this script yet): vLLM 0.34.0 wants torch==2.14.0 and
# transformers>=5.16.1,<5.23.0, which conflict with treeroll's CPU pins (torch 2.13.0,
# transformers 5.24.0), so vLLM gets its own environment with what it pins, and treeroll is
# installed there without its dependencies, then the rest of treeroll's runtime that vLLM
# does not bring. SGLang 0.5.23 (its server: python -m sglang.launch_server --model-path DIR
# --enable-deterministic-inference --dtype bfloat16) would get a third environment the same
# way; the SGLang backend talks HTTP, so treeroll itself needs nothing of SGLang's.
#
# Transport: the GPU machines lent to this project reach no package registry, and what can be
# carried to them is 64 MiB; vLLM's wheel and the CUDA torch it pins are over 1 GB, so this
# script cannot run there as things are. It needs a GPU machine with registry access, or a
# wheel cache (pip download -d wheels vllm==0.34.0) mounted on it (TREEROLL_WHEELS below).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREEROLL_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.34.0
WHEELS=${TREEROLL_WHEELS:-}
FIND=()
if [ -n "$WHEELS" ]; then FIND=(--no-index --find-links "$WHEELS"); fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${FIND[@]}" "vllm==$VLLM_VERSION"
  "$VENV/bin/pip" install -q --no-deps -e .
  "$VENV/bin/pip" install -q "${FIND[@]}" "gymnasium==1.4.0" "rich==15.0.0" "tyro==1.0.17" \
    pyyaml "matplotlib==3.11.2" "tensorboard==2.21.0"
fi
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ "${1:-}" = "--full" ]; then
  "$VENV/bin/python" bench/gpu_engines.py
else
  "$VENV/bin/python" bench/gpu_engines.py --quick
fi
