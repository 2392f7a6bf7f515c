#!/usr/bin/env bash
# The GPU checks of a lent CUDA machine, in one command (each part under its own time limit, so
# one that hangs leaves the others their turn):
#   1. the `gpu`-marked tests (bf16 step, FP8, TE selection, the memory model in bf16, the real step of `vfm plan --check --on-gpu` against its trace);
#   2. `vfm plan --check --on-gpu` on Table 1's rows 1 and 2 (dit-7b at full depth, 8k tokens
#      under CP2; 74k tokens under TP4 + SP x CP4): pipeline rank 0's step run for real on this
#      GPU beside the trace and the planner;
#   3. benchmarks/gpu_step.py: the bf16 training step of a reduced-depth dit-7b, MFU, FP8 off / on,
#      blocks compiled.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]
#
# Runs with the python on PATH (a GPU image's own torch); packages it lacks can be put on
# PYTHONPATH beforehand (the CLI needs pandera, pydantic and av besides torch). About 8 minutes.
# Writes OUT_DIR/gpu_check.log and OUT_DIR/gpu_step.json.
set -u
out=${1:-.}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=".:${PYTHONPATH:-}"
log="$out/gpu_check.log"
part() {  # part SECONDS TITLE COMMAND...
  local limit=$1 title=$2
  shift 2
  echo "=== $title ($(date +%T), limit ${limit}s)" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "=== $title: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$log"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee -a "$log"
part 170 "gpu-marked tests" python -m pytest -q -p no:cacheprovider -m gpu -rs \
  tests/train/test_gpu_step.py tests/train/test_step_check.py tests/models/test_fp8.py \
  tests/models/test_fp8_torch.py tests/models/test_te_adapter.py tests/perf/test_memory.py \
  tests/models/test_norms.py
part 70 "plan --check --on-gpu, row 1" python -m vfm_core.cli plan --check --on-gpu \
  --recipe dit-7b --seq 8192 --gpus 64 --fixed tp=1,cp=2,pp=1,micro_batch=1
part 220 "gpu_step: dit-7b depth 4, compiled" python benchmarks/gpu_step.py --depth 4 \
  --seq 8192 32768 --fp8 off auto --compile on --attn sdpa --json "$out/gpu_step.json"
part 110 "plan --check --on-gpu, row 2" python -m vfm_core.cli plan --check --on-gpu \
  --recipe dit-7b --seq 73728 --gpus 64 \
  --fixed tp=4,sp=true,cp=4,pp=1,micro_batch=1,recompute=selective
