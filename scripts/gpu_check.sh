#!/usr/bin/env bash
# GPU check: the whole test suite on the GPU (the plugin built first when TensorRT's headers were carried in
# third_party/TensorRT, the lean runtime installed when its wheel was carried in .whl), then the speed table
# (JSON to $OUT and bench/results/).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
    || echo "pip install -e . failed (see $OUT/install.log): crisp_trt.builder will not import"
if ls .whl/tensorrt_lean*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tensorrt_lean*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if [ -d third_party/TensorRT/include ]; then
    timeout 90 scripts/build_plugin.sh third_party/TensorRT -DCRISP_TRT_CUDA_ARCHITECTURES=90 2>&1 | tail -3
fi
timeout 180 python3 -m pytest -q -rs 2>&1 | tail -40 | tee "$OUT/pytest.txt"
timeout 330 python3 scripts/speed_table.py "$@" 2>&1 | tee "$OUT/speed.txt"
