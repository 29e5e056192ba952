#!/usr/bin/env bash
# GPU check: the whole test suite on the GPU (the plugin built first when TensorRT's headers were carried in
# third_party/TensorRT, the lean runtime installed when its wheel was carried in .whl), then the speed table
# (JSON to $OUT and bench/results/).
set -u
source "$(dirname "$0")/gpu_env.sh"
if [ -d third_party/TensorRT/include ]; then
    timeout 90 scripts/build_plugin.sh third_party/TensorRT -DCRISP_TRT_CUDA_ARCHITECTURES=90 2>&1 | tail -3
fi
timeout 180 python3 -m pytest -q -rs 2>&1 | tail -40 | tee "$OUT/pytest.txt"
timeout 330 python3 scripts/speed_table.py "$@" 2>&1 | tee "$OUT/speed.txt"
