"""`crisp-bench op`: dense (cuDNN, FA2) vs CRISP / FlexPrefill-mode / ablations on the same inputs.

Rows (bench/results/op_latest.json, {"rows": [...]}) have exactly ROW_KEYS. On CUDA: SDPA with the
CUDNN_ATTENTION / FLASH_ATTENTION backends, CUDA-event timing, median of `repeats` after warm-up.
On CPU (smoke / small sizes): the dense rows time the pure-PyTorch reference (method names kept so the
schema is the same), CRISP rows time the reference pipeline. routing_ms = estimate+route+select time
(the reference pipeline measured without its attend step on CPU; on CUDA the kernels' routing stage
if `crisp_trt.kernels.pipeline.routing_only` exists, else null). recall = dense attention mass inside
the attended blocks on sampled query rows (masks from the reference selection; lengths above
`recall_max_n` report null).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time

import torch

from .. import reference
from ..api import crisp_prefill_attention, dense_prefill_attention
from ..config import CrispConfig, method_config
from ..workloads.synthetic import SyntheticSpec, synthetic_qkv

ROW_KEYS = ("n", "method", "workload", "ms", "speedup_vs_cudnn", "density", "routing_ms", "routing_share",
            "rel_error", "recall", "gpu")
DENSE = ("dense_cudnn", "dense_fa2")
SPARSE = ("crisp", "flexprefill", "crisp_gamma", "crisp_jsd")
METHODS = DENSE + SPARSE
SHAPES = {"llama3_8b": (32, 8, 128), "smollm2": (9, 3, 64)}


def gpu_name(device) -> str:
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"


def median_ms(fn, repeats: int, device) -> float:
    """Median wall time of fn in ms after one warm-up: CUDA events on the GPU, perf_counter on the CPU."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if torch.device(device).type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def dense_fn(method, q, k, v):
    """A closure running dense attention: the reference on the CPU, SDPA with the method's backend on CUDA."""
    if not q.is_cuda:
        return lambda: dense_prefill_attention(q, k, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.CUDNN_ATTENTION if method == "dense_cudnn" else SDPBackend.FLASH_ATTENTION

    def run():
        with sdpa_kernel(backend):
            return dense_prefill_attention(q, k, v)
    return run


def reference_masks(q, k, cfg: CrispConfig):
    """Attended block masks [H, NB, NB] of one sequence (q [n, H, d]) from the reference selection."""
    n, heads, _ = q.shape
    if n < max(cfg.dense_below, 1):
        return reference.causal_block_mask(n, heads, cfg.block_size)
    sel = reference.select_heads(reference.estimate(q, k, cfg), q, k, cfg)
    return reference.block_masks(q, k, sel, cfg)


def mass_recall(q, k, masks, block: int, rows: int = 64, seed: int = 0) -> float:
    """Mean over heads and sampled query rows of the dense softmax mass inside the attended blocks."""
    n, heads, d = q.shape
    g = torch.Generator().manual_seed(seed)
    sample = torch.unique(torch.cat([torch.arange(max(n - rows // 2, 0), n),
                                     torch.randint(0, n, (rows // 2,), generator=g)]))
    kk = k.repeat_interleave(heads // k.shape[1], dim=1).float()
    j = torch.arange(n, device=q.device)
    total = 0.0
    for h in range(heads):
        logits = (q[sample.to(q.device), h].float() @ kk[:, h].T) / math.sqrt(d)
        logits = logits.masked_fill(j[None] > sample.to(q.device)[:, None], float("-inf"))
        p = torch.softmax(logits, -1)
        allowed = masks[h].to(q.device)[(sample // block).to(q.device)][:, j // block]
        total += float((p * allowed).sum(-1).mean())
    return total / heads


def run_op(lengths=(512, 1024), shapes=("smollm2",), methods=METHODS, workloads=("synthetic",), repeats=5,
           device="cpu", dtype=None, base: CrispConfig | None = None, recall_max_n: int = 16384,
           spec: SyntheticSpec | None = None, progress=None, real_layers=(0, 15, 29)):
    """Benchmark rows (list of dicts with ROW_KEYS)."""
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    base = base or CrispConfig()
    rows = []
    gpu = gpu_name(device)
    jobs = [(n, s, w) for w in workloads for s in shapes for n in lengths]
    for n, shape, workload in jobs:
        inputs = _inputs(workload, shape, n, spec, device, dtype, real_layers)
        for wname, (q, k, v) in inputs:
            ref = dense_prefill_attention(q, k, v).float()
            cudnn_ms = None
            for method in methods:
                if method in DENSE:
                    if not q.is_cuda and method == "dense_fa2":
                        ms = cudnn_ms if cudnn_ms is not None else median_ms(dense_fn(method, q, k, v), repeats, device)
                    else:
                        ms = median_ms(dense_fn(method, q, k, v), repeats, device)
                    if method == "dense_cudnn":
                        cudnn_ms = ms
                    row = dict(n=n, method=method, workload=wname, ms=ms, density=1.0, routing_ms=0.0,
                               routing_share=0.0, rel_error=0.0, recall=1.0, gpu=gpu)
                else:
                    cfg = method_config(method, base)
                    ms = median_ms(lambda: crisp_prefill_attention(q, k, v, config=cfg), repeats, device)
                    out, st = crisp_prefill_attention(q, k, v, config=cfg, return_stats=True)
                    rel = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
                    routing_ms = _routing_ms(q, k, cfg, repeats, device)
                    recall = None
                    if n <= recall_max_n:
                        qc, kc = q[0].float().cpu(), k[0].float().cpu()
                        recall = mass_recall(qc, kc, reference_masks(qc, kc, cfg), cfg.block_size)
                    row = dict(n=n, method=method, workload=wname, ms=ms, density=st.mean_density,
                               routing_ms=routing_ms, routing_share=None if routing_ms is None else routing_ms / ms,
                               rel_error=rel, recall=recall, gpu=gpu)
                rows.append(row)
                if progress is not None:
                    progress.update(1)
        for row in rows:
            if row["workload"] in [w for w, _ in inputs] and row["n"] == n:
                base_ms = next((r["ms"] for r in rows if r["n"] == n and r["workload"] == row["workload"]
                                and r["method"] == "dense_cudnn"), None)
                row["speedup_vs_cudnn"] = None if base_ms is None else base_ms / row["ms"]
    return [{key: r.get(key) for key in ROW_KEYS} for r in rows]


def _inputs(workload, shape, n, spec, device, dtype, real_layers):
    heads, kv, d = SHAPES[shape]
    if workload == "synthetic":
        q, k, v = synthetic_qkv(n, heads, kv, d, spec=spec or SyntheticSpec(), seed=n, device=device, dtype=dtype)
        return [(f"synthetic_{shape}", (q, k, v))]
    from ..workloads.real import capture_qkv

    grabbed = capture_qkv(n, layers=real_layers)
    return [(f"real_smollm2_L{layer}", tuple(t.to(device=device, dtype=dtype) for t in grabbed[layer]))
            for layer in sorted(grabbed)]


def _routing_ms(q, k, cfg, repeats, device):
    if q.is_cuda:
        try:
            from ..kernels.pipeline import routing_only  # provided by the kernel engineer, if at all
        except ImportError:
            return None
        return median_ms(lambda: routing_only(q, k, cfg), repeats, device)
    qc, kc = q[0], k[0]
    if qc.shape[0] < max(cfg.dense_below, 1):
        return 0.0
    return median_ms(lambda: reference_masks(qc, kc, cfg), max(1, repeats // 2), device)


def write_results(rows, out_dir="bench/results", plots=True) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "op_latest.json")
    with open(path, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    if plots:
        plot(rows, out_dir)
    return path


def plot(rows, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, fname, log in (("speedup_vs_cudnn", "op_speedup.png", True), ("rel_error", "op_error.png", True),
                            ("density", "op_density.png", True)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for wl in sorted({r["workload"] for r in rows}):
            for m in SPARSE + (("dense_fa2",) if key == "speedup_vs_cudnn" else ()):
                pts = sorted((r["n"], r[key]) for r in rows if r["workload"] == wl and r["method"] == m
                             and r[key] is not None and (r[key] > 0 or not log))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{m} / {wl}")
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel(key)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=120)
        plt.close(fig)
