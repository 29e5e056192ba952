#!/usr/bin/env bash
# GPU check: the whole test suite on the GPU, then the speed table (JSON to $OUT and bench/results/).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q 2>&1 | tail -30 | tee "$OUT/pytest.txt"
timeout 390 python3 scripts/speed_table.py "$@" 2>&1 | tee "$OUT/speed.txt"
