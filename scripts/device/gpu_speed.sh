#!/usr/bin/env bash
# Speed tables on the H200 for several synthetic workloads in one run (each its own dense baseline, same
# process per workload), then the GPU test suite:
#   WORKLOADS=synthetic_classes,synthetic OUT=$OUT bash scripts/gpu_speed.sh [lengths...]
# Writes $OUT/speed_<workload>.txt and the speed_*.json of scripts/speed_table.py; prints each table last.
set -u
source "$(dirname "$0")/gpu_env.sh"
IFS=, read -ra LIST <<< "${WORKLOADS:-synthetic_classes,synthetic}"
for w in "${LIST[@]}"; do
    WORKLOAD=$w timeout "${SPEED_LIMIT:-280}" python3 scripts/speed_table.py "$@" > "$OUT/speed_$w.txt" 2>&1 \
        || echo "speed_table $w failed or timed out (rc=$?)"
done
[ "${SUITE:-1}" = 1 ] && timeout 180 python3 -m pytest -q -rs 2>&1 | tail -25 > "$OUT/pytest.txt"
tail -n 3 "$OUT/pytest.txt" 2>/dev/null
for w in "${LIST[@]}"; do echo "== $w"; sed -n '/^ *n  *method/,$p' "$OUT/speed_$w.txt"; done
