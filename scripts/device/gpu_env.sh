# Sourced by the scripts/device/gpu_*.sh runners (one setup, not one per script): the repo root as the working
# directory, unbuffered Python that sees the checkout, $OUT (default $GPU_OUT_DEFAULT, else bench/results/latest)
# created with the GPU's name in $OUT/gpu.txt, the package installed editable (crisp_trt.builder lives in
# builder/ and imports only through the install: a suite run without it fails to collect), and the TensorRT
# lean runtime on the path when its wheel was carried in .whl.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-${GPU_OUT_DEFAULT:-bench/results/latest}}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 \
    || echo "pip install -e . failed (see $OUT/install.log): crisp_trt.builder will not import"
if ls .whl/tensorrt_lean*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tensorrt_lean*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
