#!/usr/bin/env bash
# GPU check of the TensorRT plugin in one call: build it (sm_90 cubins of the whole pipeline), run its tests
# (enqueue output == crisp_prefill_attention's at 8k, 128k, varlen, 32/8 d128, 9/3 d64, flexprefill, jsd, and the
# chunked plugin with the LSE output: 8k of 128k, varlen chunks; the poison; the op's JIT cubins are the embedded
# ones), compute-sanitizer memcheck on an 8k and a chunked 1k-of-8k enqueue with the LSE, and time
# enqueue vs the torch op. Writes $OUT/plugin_timing.json, $OUT/pytest.log, $OUT/memcheck.log and prints a short
# table last. Carry third_party/TensorRT (headers, < 1 MiB) and, for the registry path, .whl
# (tensorrt-lean-cu13-libs, 43 MB); without the wheel the harness loads the library through its getCreators.
# Each step reports its own failure; the exit status is the number of failed steps.
set -u
GPU_OUT_DEFAULT=bench/results/latest
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # the runners' one setup (lean runtime included)
failed=()
step() { local name=$1; shift; echo "== $name"; "$@" || { echo "== $name FAILED (rc $?)"; failed+=("$name"); }; }
step build timeout 150 scripts/build_plugin.sh third_party/TensorRT -DCRISP_TRT_CUDA_ARCHITECTURES=90
step pytest timeout 200 bash -c "python3 -m pytest -q -rs -s tests/test_plugin.py -k 'not sanitizers' 2>&1 | tee '$OUT/pytest.log'; exit \${PIPESTATUS[0]}"
step memcheck timeout 120 bash -c "compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/plugin_harness.py --smoke > '$OUT/memcheck.log' 2>&1; rc=\$?; tail -3 '$OUT/memcheck.log'; exit \$rc"
step timing timeout 100 python3 tests/plugin_harness.py --json "$OUT/plugin_timing.json"
echo "== summary"
grep -E "passed|failed" "$OUT/pytest.log" | tail -1
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1
python3 - "$OUT/plugin_timing.json" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"no timing JSON ({e})")
print(f"{'case':<12} {'plugin ms':>10} {'torch op ms':>12} {'ratio':>6} {'max |diff|':>11}")
for r in rows:
    print(f"{r['case']:<12} {r['plugin_ms']:>10.3f} {r['torch_ms']:>12.3f} {r['ratio']:>6.3f} {r['max_abs_diff']:>11.3g}")
EOF
echo "gpu_plugin.sh: ${#failed[@]} failed step(s): ${failed[*]:-none}"
exit ${#failed[@]}
