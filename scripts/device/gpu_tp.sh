#!/usr/bin/env bash
# Issue 24 on a 2-GPU machine (nvidia-h100-x2 / nvidia-h200-x2): crisp-run's tensor parallelism on the Qwen
# model, TP=1 against TP=2 at 32k and 128k (YaRN ×4): TTFT (median of REPEATS after one warm-up, rank 0's
# clock, all ranks started together) and whether the greedy text is identical, CRISP and dense prefill, bf16.
#   bash scripts/device/unstage.sh qwen && bash scripts/device/gpu_tp.sh      (staging: scripts/device/stage.sh)
# MODEL: the checkpoint (default: the staged GGUF in /tmp/crisp_stage/qwen, else crisp_trt.models.qwen_path(); a
# GGUF needs gguf: carry its wheel as .stage/gguf-*.whl where the machine lacks it; an HF directory does not);
# ART: an artifact to reuse (default: built here, --calibrate 0, YaRN ×4, --max-seq 128k); LENGTHS (32k,128k;
# a prompt is capped so that it and its NEW tokens fit the 128k positions), ATTENTIONS (crisp,dense),
# REPEATS (3), NEW (16), LIMIT (seconds per TP run, 240). DEVICE=cpu is a dry run (gloo, no GPU setup; pass a
# small LENGTHS). NVLink multicast stays off (the device docs say why). $OUT gets tp.json; the table is last.
set -u
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
else
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
  OUT=${OUT:-/tmp/crisp_tp_out}
  mkdir -p "$OUT"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
WORK=/tmp/crisp_tp
ART=${ART:-$WORK/artifact}
mkdir -p "$WORK"
rm -f "$WORK"/tp*.json "$WORK"/logits_*.pt

if [ ! -f "$ART/config.json" ]; then
  MODEL=${MODEL:-$(ls /tmp/crisp_stage/qwen/*.gguf 2>/dev/null | head -n 1)}
  [ -n "$MODEL" ] || MODEL=$(python3 -c "from crisp_trt.models import qwen_path; print(qwen_path())") \
    || { echo "gpu_tp.sh: no Qwen model: stage it (scripts/device/stage.sh + unstage.sh qwen) or set MODEL"; exit 1; }
  if [[ "$MODEL" == *.gguf ]] && ! python3 -c "import gguf" 2>/dev/null; then  # the GGUF reader, carried as a wheel
    WHL=$(ls .stage/gguf-*.whl .stage/*/gguf-*.whl /tmp/crisp_stage/gguf-*.whl 2>/dev/null | head -n 1)
    [ -n "$WHL" ] && python3 -m pip install -q --no-deps --no-index "$WHL" \
      || { echo "gpu_tp.sh: gguf is not importable and no gguf wheel was carried (.stage/gguf-*.whl)"; exit 1; }
  fi
  echo "== crisp-build $MODEL → $ART"
  python3 -m crisp_trt.builder --model "$MODEL" --output "$ART" --backend torch --max-seq 128k \
    --rope-scaling yarn:4 --calibrate 0 --dtype bf16 --no-progress > "$WORK/build.log" 2>&1 \
    || { echo "gpu_tp.sh: crisp-build failed:"; tail -n 20 "$WORK/build.log"; exit 1; }
fi

cat > "$WORK/tp_run.py" <<'EOF'
"""One TP size: every length × attention through runtime.generate_tp_modes (the model loaded once per rank);
rows to WORK/tp{N}.json, logits beside."""
import json
import os
import sys

import torch
from transformers import AutoTokenizer

from crisp_trt import runtime
from crisp_trt.bench.e2e import retrieval_prompt_ids
from crisp_trt.lengths import parse_length

if __name__ == "__main__":
    art, tp, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    device, new, repeats = os.environ["DEVICE"], int(os.environ["NEW"]), int(os.environ["REPEATS"])
    limit = runtime.read_crisp(art)["max_seq"] - new
    tok = AutoTokenizer.from_pretrained(art)
    prompts = [retrieval_prompt_ids(tok, min(parse_length(n), limit), 0)[0] for n in os.environ["LENGTHS"].split(",")]
    rows = []
    modes = runtime.generate_tp_modes(art, prompts, os.environ["ATTENTIONS"].split(","), tp=tp, max_new_tokens=new,
                                      device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                                      warmup=1, repeats=repeats)
    for attention, gens in modes.items():
        for gen in gens:
            torch.save(gen.logits, os.path.join(work, f"logits_tp{tp}_{attention}_{gen.prompt_tokens}.pt"))
            rows.append({"tp": tp, "attention": attention, "n": gen.prompt_tokens, "ttft_ms": gen.ttft_s * 1000,
                         "text": gen.text, "token_ids": gen.token_ids})
            print(f"tp {tp} {attention} n {gen.prompt_tokens}: TTFT {gen.ttft_s * 1000:.1f} ms, {gen.text!r}")
    json.dump(rows, open(os.path.join(work, f"tp{tp}.json"), "w"), indent=1)
EOF

export DEVICE LENGTHS=${LENGTHS:-32k,128k} ATTENTIONS=${ATTENTIONS:-crisp,dense} REPEATS=${REPEATS:-3} NEW=${NEW:-16}
for TP in 1 2; do
  echo "== TP=$TP (limit ${LIMIT:-240}s)"
  start=$SECONDS
  timeout -k 10 "${LIMIT:-240}" python3 "$WORK/tp_run.py" "$ART" "$TP" "$WORK" > "$WORK/tp$TP.log" 2>&1
  rc=$?
  grep "^tp " "$WORK/tp$TP.log"
  [ "$rc" -eq 0 ] || { echo "-- TP=$TP failed (rc=$rc; 124 = timeout); log tail:"; tail -n 25 "$WORK/tp$TP.log"; }
  echo "TP=$TP: rc=$rc, $((SECONDS - start)) s"
done

python3 - "$WORK" "$OUT" "$ART" <<'EOF'
import json, os, sys, time
import torch
work, out, art = sys.argv[1:]
runs = {tp: json.load(open(f"{work}/tp{tp}.json")) for tp in (1, 2) if os.path.exists(f"{work}/tp{tp}.json")}
gpu = open(f"{out}/gpu.txt").read().strip() if os.path.exists(f"{out}/gpu.txt") else os.environ["DEVICE"]
rows = []
for one in runs.get(1, []):
    two = next((r for r in runs.get(2, []) if (r["attention"], r["n"]) == (one["attention"], one["n"])), None)
    row = {"attention": one["attention"], "n": one["n"], "ttft_tp1_ms": one["ttft_ms"], "text_tp1": one["text"]}
    if two:
        l1, l2 = (torch.load(f"{work}/logits_tp{tp}_{one['attention']}_{one['n']}.pt") for tp in (1, 2))
        row.update(ttft_tp2_ms=two["ttft_ms"], speedup=one["ttft_ms"] / two["ttft_ms"], text_tp2=two["text"],
                   identical_text=one["text"] == two["text"], identical_tokens=one["token_ids"] == two["token_ids"],
                   max_abs_logit_diff=float((l1 - l2).abs().max()), max_abs_logit=float(l1.abs().max()))
    rows.append(row)
result = {"issue": 24, "gpu": gpu, "artifact": art, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "new_tokens": int(os.environ["NEW"]), "repeats": int(os.environ["REPEATS"]), "rows": rows}
json.dump(result, open(f"{out}/tp.json", "w"), indent=1)
dtype = "bf16" if os.environ["DEVICE"] == "cuda" else "fp32"
print(f"\nQwen2.5-Coder-0.5B {dtype}, TTFT median of {result['repeats']} (ms), greedy {result['new_tokens']} tokens; {gpu}")
print("| attention | n | TP=1 ms | TP=2 ms | TP=1/TP=2 | same text | max |Δlogit| |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    if "ttft_tp2_ms" in r:
        print(f"| {r['attention']} | {r['n']} | {r['ttft_tp1_ms']:.1f} | {r['ttft_tp2_ms']:.1f} | {r['speedup']:.2f} | "
              f"{r['identical_text']} | {r['max_abs_logit_diff']:.3g} of {r['max_abs_logit']:.3g} |")
    else:
        print(f"| {r['attention']} | {r['n']} | {r['ttft_tp1_ms']:.1f} | — (TP=2 failed) | | | |")
EOF
