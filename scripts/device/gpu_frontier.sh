#!/usr/bin/env bash
# Speedup-vs-error frontiers on the H200 (crisp-bench frontier), one synthetic workload after another:
#   WORKLOADS=synthetic_classes,synthetic OUT=$OUT bash scripts/device/gpu_frontier.sh [lengths, default 32k,128k]
# Each workload's JSON + PNG go to $OUT/frontier_<workload>/ and its table is printed last. A workload gets
# FRONTIER_LIMIT seconds (default 280: 32k + 128k with the default grids); 512k takes ~170 s more per
# workload (pass one workload and FRONTIER_LIMIT=500). CRISP_GRID / FLEX_GRID replace the default grids
# (crisp-bench frontier --crisp / --flexprefill). On a timeout the JSON written after every point stays
# (frontier_latest.json; no table, no PNG). Exits with the number of workloads that failed.
set -u
source "$(dirname "$0")/gpu_env.sh"
failed=0
IFS=, read -ra LIST <<< "${WORKLOADS:-synthetic_classes,synthetic}"
for w in "${LIST[@]}"; do
    dir="$OUT/frontier_$w"
    mkdir -p "$dir"
    timeout "${FRONTIER_LIMIT:-280}" python3 -m crisp_trt.bench.cli frontier --workload "$w" \
        --lengths "${1:-32k,128k}" --out "$dir" ${CRISP_GRID:+--crisp "$CRISP_GRID"} \
        ${FLEX_GRID:+--flexprefill "$FLEX_GRID"} > "$dir/table.txt" 2> "$dir/log.txt" \
        || { echo "frontier $w failed or timed out (rc=$?; partial JSON: $dir/frontier_latest.json):"
             tr '\r' '\n' < "$dir/log.txt" | tail -n 3; failed=$((failed + 1)); }
done
for w in "${LIST[@]}"; do echo "== $w"; cat "$OUT/frontier_$w/table.txt"; done
exit "$failed"
