"""Speed table on the GPU: CRISP op and the sparse attend kernel vs cuDNN / FA2 dense (same run).

Llama-3-8B-like shape (32 q / 8 kv heads, d=128, bf16), synthetic workload. Per n: dense ms
(cuDNN, FLASH), CRISP op ms (today: dense attend kernel, select not yet on GPU), estimate ms, attend over a
fixed vertical-slash list (sink + local + 14 column blocks) with its density and TFLOP/s over the
computed blocks, output rel. error vs cuDNN; at 8k kernel vs the fp32 reference; a CUDA-graph
capture of crisp_prefill_attention. Writes JSON to $OUT and bench/results/, prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from crisp_trt import CrispConfig, crisp_prefill_attention, reference
from crisp_trt.bench.op import dense_fn, median_ms
from crisp_trt.kernels.attend import attend
from crisp_trt.kernels.estimate import estimate
from crisp_trt.workloads.synthetic import synthetic_qkv

H, HKV, D, BLOCK = 32, 8, 128, 128


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def vs_lists(n, dev):
    """Fixed vertical-slash lists: sink block 0, local block qb-1, 14 evenly spread column blocks."""
    nb = -(-n // BLOCK)
    cols = torch.linspace(1, nb - 1, 16).long()
    masks = torch.zeros(nb, nb, dtype=torch.bool, device=dev)
    masks[:, 0] = True
    masks[:, cols] = True
    qb = torch.arange(nb, device=dev)
    masks[qb[1:], qb[1:] - 1] = True
    masks = masks.tril(-1)
    maxk = int(masks.sum(-1).max())
    order = torch.sort((~masks).int(), dim=-1, stable=True).indices[:, :maxk]
    idx = torch.where(torch.gather(masks, -1, order), order, 0).int()
    counts = masks.sum(-1).int()
    blocks = float(masks.sum() + nb)
    return (idx.expand(H, nb, maxk)[None].contiguous(), counts.expand(H, nb)[None].contiguous(),
            blocks / (nb * (nb + 1) / 2), blocks)


def row(n, dev):
    reps = 5 if n >= 131072 else 10
    q, k, v = (t[0].to(dev) for t in synthetic_qkv(n, H, HKV, D, dtype=torch.bfloat16, seed=0))
    cfg = CrispConfig(block_size=BLOCK)
    cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
    r = {"n": n}
    r["cudnn_ms"] = median_ms(dense_fn("dense_cudnn", q, k, v), reps, dev)
    r["flash_ms"] = median_ms(dense_fn("dense_fa2", q, k, v), reps, dev)
    dense_out = dense_fn("dense_cudnn", q, k, v)()
    out = crisp_prefill_attention(q, k, v, config=cfg)
    r["crisp_ms"] = median_ms(lambda: crisp_prefill_attention(q, k, v, config=cfg), reps, dev)
    r["crisp_rel_err_vs_cudnn"] = rel(out, dense_out)
    r["crisp_density"] = 1.0
    r["estimate_ms"] = median_ms(lambda: estimate(q, k, cu, -(-n // BLOCK), BLOCK, cfg.window), reps, dev)
    idx, counts, dens, blocks = vs_lists(n, dev)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    r["sparse_attend_ms"] = median_ms(lambda: attend(q, k, v, cu, idx, counts, flag, BLOCK), reps, dev)
    r["sparse_density"] = dens
    r["sparse_attend_tflops"] = 4 * blocks * BLOCK * BLOCK * D * H / (r["sparse_attend_ms"] * 1e-3) / 1e12
    causal_flops = 4 * (n * (n + 1) / 2) * D * H
    r["cudnn_tflops"] = causal_flops / (r["cudnn_ms"] * 1e-3) / 1e12
    r["dense_attend_tflops"] = causal_flops / (r["crisp_ms"] * 1e-3) / 1e12
    r["sparse_speedup_vs_cudnn"] = r["cudnn_ms"] / r["sparse_attend_ms"]
    if n <= 8192:
        want = reference.dense_attention(q.float(), k.float(), v.float())
        r["kernel_vs_reference_fp32_rel_err"] = rel(out, want)
    print(json.dumps(r), flush=True)
    return r


def graph_capture(dev):
    q, k, v = (t[0].to(dev) for t in synthetic_qkv(4096, H, HKV, D, dtype=torch.bfloat16, seed=1))
    cfg = CrispConfig(block_size=BLOCK)
    crisp_prefill_attention(q, k, v, config=cfg)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = crisp_prefill_attention(q, k, v, config=cfg)
    g.replay()
    torch.cuda.synchronize()
    return {"cuda_graph_capture": "ok", "finite": bool(torch.isfinite(out).all())}


def main():
    dev = "cuda"
    lengths = [int(x) for x in (sys.argv[1:] or ["8192", "32768", "131072", "524288"])]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
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
    print(f"{'n':>7} {'cudnn':>9} {'fa2':>9} {'crisp':>9} {'sparse':>9} {'dens':>6} {'x':>6} {'TF/s':>6} {'relerr':>8} {'est':>7}")
    for r in res["rows"]:
        print(f"{r['n']:>7} {r['cudnn_ms']:9.2f} {r['flash_ms']:9.2f} {r['crisp_ms']:9.2f} {r['sparse_attend_ms']:9.2f} "
              f"{r['sparse_density']:6.3f} {r['sparse_speedup_vs_cudnn']:6.1f} {r['sparse_attend_tflops']:6.0f} "
              f"{r['crisp_rel_err_vs_cudnn']:8.2e} {r['estimate_ms']:7.2f}")


if __name__ == "__main__":
    main()
