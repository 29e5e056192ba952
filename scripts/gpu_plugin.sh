#!/usr/bin/env bash
# GPU check of the TensorRT plugin: build it (sm_90 cubins), run its tests (enqueue vs crisp_prefill_attention),
# compute-sanitizer memcheck on the 8k case, and time enqueue vs the torch op (JSON to $OUT).
# Carry third_party/TensorRT (headers, < 1 MiB) and, for the registry path, .whl (tensorrt-lean-cu13-libs);
# without the wheel the harness loads the library through its getCreators. Each step reports its own failure.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results/plugin}
mkdir -p "$OUT"
failed=()
step() { local name=$1; shift; echo "== $name"; "$@" || { echo "== $name FAILED (rc $?)"; failed+=("$name"); }; }
if ls .whl/tensorrt_lean*.whl >/dev/null 2>&1; then
    step "lean runtime" python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tensorrt_lean*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
step build timeout 120 scripts/build_plugin.sh third_party/TensorRT -DCRISP_TRT_CUDA_ARCHITECTURES=90
step pytest timeout 150 python3 -m pytest -q -rs -s tests/test_plugin.py -k "not sanitizers"
step memcheck timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/aot_harness.py --smoke
step timing timeout 120 python3 scripts/aot_harness.py --json "$OUT/plugin_timing.json"
echo "gpu_plugin.sh: ${#failed[@]} failed step(s): ${failed[*]:-none}"
