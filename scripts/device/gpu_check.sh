#!/usr/bin/env bash
# GPU check: the whole test suite on the GPU (the plugin built first when TensorRT's headers were carried in
# third_party/TensorRT, the lean runtime installed when its wheel was carried in .whl), then a short op bench
# (crisp-bench op at 8k and 128k, Llama-3-8B shape; JSON + plots to $OUT).
set -u
source "$(dirname "$0")/gpu_env.sh"
if [ -d third_party/TensorRT/include ]; then
    timeout 90 scripts/build_plugin.sh third_party/TensorRT -DCRISP_TRT_CUDA_ARCHITECTURES=90 2>&1 | tail -3
fi
timeout 180 python3 -m pytest -q -rs 2>&1 | tail -40 | tee "$OUT/pytest.txt"
timeout 330 python3 -m crisp_trt.bench.cli op --shapes llama3_8b --lengths "${1:-8k,128k}" --device cuda \
    --out "$OUT" 2>&1 | tail -n 20 | tee "$OUT/op.txt"
