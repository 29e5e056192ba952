#!/usr/bin/env bash
# Issue 3 measurements on a GPU machine (H200): op speed/accuracy (synthetic + real) and real-model accuracy.
# Usage: scripts/gpu_bench.sh [OUT_DIR]   (default bench/results). Needs: pip install -e .[eval]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench/results}"
export HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv || true
python3 -m crisp_trt.bench.cli op --lengths "${OP_LENGTHS:-4k,8k,32k,128k,256k,512k,1M}" \
  --shapes llama3_8b,smollm2 --workloads synthetic --repeats 5 --out "$OUT"
mkdir -p "$OUT/real" && python3 -m crisp_trt.bench.cli op --lengths 2k,4k,8k --shapes smollm2 \
  --workloads real --repeats 5 --out "$OUT/real"
python3 -m crisp_trt.bench.cli accuracy --lengths 2k,4k,8k --depths 0,0.25,0.5,0.75,1 --trials 30 \
  --device cuda --out "$OUT"
