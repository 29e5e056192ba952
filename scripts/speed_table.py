"""Speed table on the GPU: the CRISP op (estimate → route → select → attend) vs cuDNN / FA2 dense.

Llama-3-8B-like shape (32 q / 8 kv heads, d=128, bf16), synthetic workload generated on the GPU (the
spec fitted to SmolLM2, DESIGN.md §6; WORKLOAD=synthetic_classes for one spec per class of SmolLM2
layers, synthetic_plain for the hand-set one: crisp_trt.bench.op.SYNTHETIC), one
default CrispConfig for every length. Per n, all in the same process: dense ms (cuDNN, FLASH); CRISP
and FlexPrefill-mode op ms, density, output rel. error vs cuDNN, routing+select ms (plan) and share,
per-stage ms (estimate, route, select, attend), attend TFLOP/s over the blocks it computes, the
routes taken; on the last 1024 rows the plan's error and kept mass beside the same-budget oracle's (the
best blocks by dense mass, as many per query block: what any block selection of that density could do); at n ≤ 128k the kernels vs the fp32 reference pipeline (last 1024 rows, and the selected
blocks that differ); a CUDA-graph capture of the op.
Writes JSON to $OUT and bench/results/ after every row, prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from crisp_trt import CrispConfig, crisp_prefill_attention, reference
from crisp_trt.bench.op import SYNTHETIC, dense_fn, median_ms, reference_masks
from crisp_trt.bench.recall import same_budget_oracle
from crisp_trt.config import method_config
from crisp_trt.kernels.attend import attend
from crisp_trt.kernels.pipeline import Stages, masks_from_plan
from crisp_trt.workloads.mixture import workload_qkv
from crisp_trt.workloads.synthetic import synthetic_qkv

H, HKV, D = 32, 8, 128
WORKLOAD = os.environ.get("WORKLOAD", "synthetic")
if WORKLOAD not in SYNTHETIC:
    sys.exit(f"WORKLOAD={WORKLOAD!r}: expected one of {sorted(SYNTHETIC)}")
SPEC = SYNTHETIC[WORKLOAD]()


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def method_row(name, cfg, q, k, v, dense_out, cudnn_ms, reps):
    """One sparse method's numbers on [n, H, d] inputs."""
    n = q.shape[0]
    cu = torch.tensor([0, n], dtype=torch.int32, device=q.device)
    st = Stages(q, k, cu, n, cfg)
    r = {"method": name}
    r["ms"] = median_ms(lambda: crisp_prefill_attention(q, k, v, config=cfg), reps, q.device)
    r["plan_ms"] = median_ms(lambda: st.plan(), reps, q.device)
    r["estimate_ms"] = median_ms(st.estimate, reps, q.device)
    r["route_ms"] = median_ms(st.route, reps, q.device)
    r["select_ms"] = median_ms(st.select, reps, q.device)
    p = st.plan()
    r["attend_ms"] = median_ms(lambda: attend(q, k, v, cu, p.idx, p.counts, p.dense, cfg.block_size), reps, q.device)
    out, stats = crisp_prefill_attention(q, k, v, config=cfg, return_stats=True)
    r["density"] = stats.mean_density
    r["rel_err"] = rel(out, dense_out)
    r["speedup_vs_cudnn"] = cudnn_ms / r["ms"]
    r["routing_share"] = r["plan_ms"] / r["ms"]
    r["routes"] = {name: int((stats.route == code).sum()) for code, name in ((1, "vs"), (2, "bs"), (0, "dense"))}
    nb = -(-n // cfg.block_size)
    blocks = float(p.counts.sum() + nb * H)
    r["attend_tflops"] = 4 * blocks * cfg.block_size ** 2 * D / (r["attend_ms"] * 1e-3) / 1e12
    o = same_budget_oracle(q, k, v, p, cfg.block_size, rows=1024)
    r.update({f"last_rows_{key}": value for key, value in o.items()})
    if n <= 131072:
        r.update(kernel_vs_reference(q, k, v, cfg, out, p))
    return r


def kernel_vs_reference(q, k, v, cfg, out, p, rows=1024):
    """The fp32 reference pipeline (estimate/select on the CPU, attend on the GPU over the last `rows`
    query rows): output rel. error of the kernels there, and how many selected blocks differ."""
    n, block = q.shape[0], cfg.block_size
    qc, kc = q.float().cpu(), k.float().cpu()
    masks = reference_masks(qc, kc, cfg)
    first = max(0, n - rows)
    want = reference.attend(q.float(), k.float(), v.float(), masks, block, first_row=first)
    got = masks_from_plan(p, 0, masks.shape[-1]).cpu()
    return {"kernel_vs_reference_rel_err": rel(out[first:], want), "reference_rows": n - first,
            "mask_mismatch_blocks": int((got != masks).sum()), "reference_blocks": int(masks.sum())}


def row(n, dev):
    reps = 5 if n >= 131072 else 10
    q, k, v = (t[0] for t in workload_qkv(SPEC, n, H, HKV, D, dtype=torch.bfloat16, seed=0, device=dev))
    r = {"n": n}
    r["cudnn_ms"] = median_ms(dense_fn("dense_cudnn", q, k, v), reps, dev)
    r["flash_ms"] = median_ms(dense_fn("dense_fa2", q, k, v), reps, dev)
    r["cudnn_tflops"] = 4 * (n * (n + 1) / 2) * D * H / (r["cudnn_ms"] * 1e-3) / 1e12
    dense_out = dense_fn("dense_cudnn", q, k, v)()
    r["methods"] = [method_row(m, method_config(m), q, k, v, dense_out, r["cudnn_ms"], reps)
                    for m in ("crisp", "flexprefill")]
    print(json.dumps(r), flush=True)
    return r


def graph_capture(dev):
    """Capture the sparse op in a CUDA graph (fails on any host sync) and replay it against eager."""
    q, k, v = (t[0] for t in synthetic_qkv(8192, H, HKV, D, dtype=torch.bfloat16, seed=1, device=dev))
    cfg = CrispConfig()
    eager, stats = crisp_prefill_attention(q, k, v, config=cfg, return_stats=True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = crisp_prefill_attention(q, k, v, config=cfg)
    g.replay()
    torch.cuda.synchronize()
    return {"cuda_graph_capture": "ok", "replay_max_abs_diff_vs_eager": float((out.float() - eager.float()).abs().max()),
            "density": stats.mean_density, "sparse_heads": int((stats.route != 0).sum())}


def main():
    dev = "cuda"
    lengths = [int(x) for x in (sys.argv[1:] or ["8192", "32768", "131072", "524288"])]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "workload": WORKLOAD, "rows": []}
    try:
        res["graph"] = graph_capture(dev)
    except Exception as e:  # reported, not hidden
        res["graph"] = {"cuda_graph_capture": f"failed: {e!r}"}
    name = f"speed_{time.strftime('%Y%m%dT%H%M%S')}.json"
    for n in lengths:
        t = time.time()
        res["rows"].append(row(n, dev))
        print(f"n={n} done in {time.time() - t:.0f}s", flush=True)
        torch.cuda.empty_cache()
        for folder in (os.environ.get("OUT"), "bench/results"):  # after every row: a timeout keeps the rest
            if folder:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, name), "w") as f:
                    json.dump(res, f, indent=1)
    print(json.dumps(res["graph"]))
    print(f"{'n':>7} {'method':>11} {'cudnn':>8} {'ms':>8} {'x':>6} {'dens':>6} {'relerr':>8} {'plan':>7} "
          f"{'share':>6} {'est':>6} {'route':>6} {'sel':>6} {'attend':>7} {'TF/s':>5} {'vs_ref':>8} {'mism':>5} "
          f"{'err_last':>8} {'oracle':>8} routes")
    for r in res["rows"]:
        for m in r["methods"]:
            print(f"{r['n']:>7} {m['method']:>11} {r['cudnn_ms']:8.2f} {m['ms']:8.2f} {m['speedup_vs_cudnn']:6.1f} "
                  f"{m['density']:6.3f} {m['rel_err']:8.2e} {m['plan_ms']:7.2f} {m['routing_share']:6.1%} "
                  f"{m['estimate_ms']:6.2f} {m['route_ms']:6.2f} {m['select_ms']:6.2f} {m['attend_ms']:7.2f} "
                  f"{m['attend_tflops']:5.0f} {m.get('kernel_vs_reference_rel_err', float('nan')):8.1e} "
                  f"{m.get('mask_mismatch_blocks', -1):>5} {m['last_rows_plan_rel_err']:8.2e} "
                  f"{m['last_rows_oracle_rel_err']:8.2e} {m['routes']}")


if __name__ == "__main__":
    main()
