#!/usr/bin/env bash
# Speedup-vs-error frontiers on the H200 (crisp-bench frontier), one synthetic workload after another:
#   WORKLOADS=synthetic_classes,synthetic OUT=$OUT bash scripts/gpu_frontier.sh [lengths, default 32k,128k,512k]
# Each workload's JSON + PNG go to $OUT/frontier_<workload>/; its table and the comparison are printed last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
IFS=, read -ra LIST <<< "${WORKLOADS:-synthetic_classes,synthetic}"
for w in "${LIST[@]}"; do
    mkdir -p "$OUT/frontier_$w"
    timeout "${FRONTIER_LIMIT:-280}" python3 -m crisp_trt.bench.cli frontier --workload "$w" \
        --lengths "${1:-32k,128k,512k}" --out "$OUT/frontier_$w" > "$OUT/frontier_$w/table.txt" 2> "$OUT/frontier_$w/log.txt" \
        || { echo "frontier $w failed or timed out (rc=$?); last log lines:"; tail -n 3 "$OUT/frontier_$w/log.txt"; }
done
for w in "${LIST[@]}"; do echo "== $w"; cat "$OUT/frontier_$w/table.txt"; done
