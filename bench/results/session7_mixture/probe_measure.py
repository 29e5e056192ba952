"""Per-layer SmolLM2 statistics at 1k-8k on three disjoint-start windows of the real text, last 128 rows
(session 6 used one window, last 64 rows): how noisy is one window, and the class means over windows."""
import json, sys, time
from crisp_trt.models import load_model
from crisp_trt.workloads.fit import attention_stats
from crisp_trt.workloads.real import capture_qkv, real_text
t = time.time()
model, tok = load_model(attn_implementation="sdpa")
total = tok(real_text(), return_tensors="pt").input_ids.shape[1]
print("text tokens", total, flush=True)
out = {}
for offset in (0, 12000, 24000):
    grabbed = capture_qkv(8192, model=model, tok=tok, offset=offset)
    print("captured", offset, f"{time.time()-t:.0f}s", flush=True)
    out[offset] = {layer: {n: attention_stats(q[0, :n], k[0, :n], rows=128) for n in (1024, 2048, 4096, 8192)}
                   for layer, (q, k, _) in grabbed.items()}
    print("stats", offset, f"{time.time()-t:.0f}s", flush=True)
    json.dump({str(o): {str(l): {str(n): v for n, v in d.items()} for l, d in per.items()} for o, per in out.items()},
              open("bench/results/session7_mixture/per_layer_windows.json", "w"))
print(f"done {time.time()-t:.0f}s")
