#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (not these CPU machines): install vLLM beside treeroll in a
# separate virtual environment and print, as one JSON line, computed_over_unique and
# tree-vs-chain wall per leaf through vLLM and through the transformers backend on the GPU,
# and vLLM's logprob agreement with the model (bench/gpu_engines.py).
#
#   bash bench/gpu_engines.sh            # quick (a few minutes once vLLM is installed)
#   bash bench/gpu_engines.sh --full
#
# vLLM pins its own CUDA build of torch, which conflicts with treeroll's CPU pin
# (torch==2.13.0): vLLM is installed first, then treeroll without its dependencies, then the
# rest of treeroll's dependencies that vLLM does not bring. Not yet run by the project (no GPU
# was lent to the session that wrote it); what it prints is what a GPU run measures.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREEROLL_GPU_VENV:-.venv-gpu}
VLLM=${TREEROLL_VLLM:-vllm}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "$VLLM"
  "$VENV/bin/pip" install -q --no-deps -e .
  "$VENV/bin/pip" install -q "gymnasium==1.4.0" "rich==15.0.0" "tyro==1.0.17" pyyaml \
    "matplotlib==3.11.2" "tensorboard==2.21.0"
fi
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ "${1:-}" = "--full" ]; then
  "$VENV/bin/python" bench/gpu_engines.py
else
  "$VENV/bin/python" bench/gpu_engines.py --quick
fi
