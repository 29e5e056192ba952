"""Per-layer attention statistics of SmolLM2 on real text at 1k-8k (all 30 layers), saved for the mixture fit."""
import json, time, torch
from crisp_trt.workloads.fit import attention_stats, near_share
from crisp_trt.workloads.real import capture_qkv
t = time.time()
grabbed = capture_qkv(8192, layers=None)
print("captured", len(grabbed), f"{time.time()-t:.0f}s", flush=True)
out = {}
for layer, (q, k, _) in grabbed.items():
    out[layer] = {n: attention_stats(q[0, :n], k[0, :n]) for n in (1024, 2048, 4096, 8192)}
    s = out[layer]
    print(layer, " ".join(f"{n}:bg={s[n]['background_share']:.3f},loc={s[n]['local_share']:.3f},near={near_share(s[n]):.2f}" for n in s), flush=True)
json.dump({str(l): {str(n): v for n, v in d.items()} for l, d in out.items()}, open("bench/results/session6_mixture/per_layer.json", "w"))
print(f"done {time.time()-t:.0f}s")
