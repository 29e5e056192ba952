#!/usr/bin/env bash
# The kernel probes that need no model, in one device call (about 3 minutes, nothing to stage):
#   attend_real      attend on a real model's lists (saved by attend_real.py, committed under
#                    bench/results/latest/probes/attend_real/) with random Q/K/V: real vs contiguous vs uniform
#                    lists, program orders, the list read 16 indices at a time (idx16)
#   select_variants  select's rows a program / key blocks a chunk in rows mode (QR / KR), lists checked equal
#   profile_default  the default config's kernels at 8k / 32k / 128k, Qwen shape (route, select, attend, ...)
#   profile_rows16   the same for rows16_g0.97
#   graphs           the op eager vs replayed from a CUDA graph (graphed_op.py: host time, ratio to cuDNN, equal
#                    outputs) and tests/test_graphs.py
# Each writes its JSON and log under $OUT/<probe>/; the last 14 lines of each log print as it ends; at the end
# the probes' folders are packed into $OUT/probes.tgz (a call returns at most 8 files). The exit status is the number of
# probes that failed. Arguments: the probes to run, in that order (default: all), e.g. for a short window
#   bash scripts/device/gpu_probes.sh attend_real profile_rows16        # LENGTHS=32768: the profiles at 32k only
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
LISTS=bench/results/latest/probes/attend_real/lists_32768_code_calib_reference.pt
ROWS16=$(python3 -c 'import json; from crisp_trt import CrispConfig; print(json.dumps(CrispConfig.sampled_rows(gamma=0.97).to_dict()))')
LENGTHS=${LENGTHS:-}
PROBES="attend_real select_variants profile_default profile_rows16 graphs"
for name in "$@"; do
    [[ " $PROBES " == *" $name "* ]] || { echo "gpu_probes.sh: unknown probe '$name'; expected some of: $PROBES" >&2; exit 64; }
done
failed=0
ran=()
probe() {
    local name=$1; shift
    [ -e "$OUT/$name" ] || ran+=("$name")  # only folders made here are packed (and removed) at the end
    mkdir -p "$OUT/$name"
    echo "== $name"
    if ! OUT="$OUT/$name" timeout 240 "$@" > "$OUT/$name/log.txt" 2>&1; then
        echo "== $name FAILED"
        failed=$((failed + 1))
    fi
    grep -v Warning "$OUT/$name/log.txt" | tail -n 14
}
for name in ${*:-$PROBES}; do
    case $name in
        attend_real) probe attend_real python3 scripts/probes/attend_real.py --lists "$LISTS" ;;
        select_variants) probe select_variants python3 scripts/probes/select_variants.py \
            --variants base,qr16_kr64,qr4_kr256,qr2_kr128,qr1_kr256 ;;
        profile_default) probe profile_default env SHAPE=qwen python3 scripts/probes/profile_plan.py \
            ${LENGTHS:-8192 32768 131072} ;;
        profile_rows16) probe profile_rows16 env SHAPE=qwen CONFIG="$ROWS16" python3 scripts/probes/profile_plan.py \
            ${LENGTHS:-32768 131072} ;;
        graphs) probe graphs bash -c 'python3 -m pytest -q -rs tests/test_graphs.py; t=$?
            python3 scripts/probes/graphed_op.py --shapes qwen,llama3_8b --lengths 4k,8k,16k,32k; exit $((t || $?))' ;;
    esac
done
[ ${#ran[@]} -eq 0 ] || (cd "$OUT" && tar czf probes.tgz --remove-files "${ran[@]}") || failed=$((failed + 1))
echo "gpu_probes.sh: $failed probe(s) failed"
exit "$failed"
