"""`crisp-bench op`: dense (cuDNN, FA2) vs CRISP / FlexPrefill-mode / ablations on the same inputs.

Rows (bench/results/latest/op/op_latest.json, {"rows": [...]}) have exactly ROW_KEYS. On CUDA: SDPA with the
CUDNN_ATTENTION / FLASH_ATTENTION backends, CUDA-event timing, median of `repeats` after warm-up.
On CPU (smoke / small sizes): the dense rows time the pure-PyTorch reference (method names kept so the
schema is the same), CRISP rows time the reference pipeline. routing_ms = estimate+route+select time
(the reference pipeline without its attend step on CPU; on CUDA `kernels.pipeline.routing_only`).
recall = dense attention mass inside the attended blocks on sampled query rows (bench.recall): on CUDA
of the kernels' own Plan at every length, on the CPU of the reference selection up to `recall_max_n`.
Workloads: "synthetic" (SyntheticSpec fitted to SmolLM2, workloads/README.md), "synthetic_classes" (one
spec per class of SmolLM2 layers, one class per kv head: workloads/mixture.py), "synthetic_plain" (the
hand-set SyntheticSpec() defaults), "real" (SmolLM2 Q/K/V of real text, <= 8k); synthetic inputs are
generated on the benchmark's device.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from .. import reference
from ..api import crisp_prefill_attention, dense_prefill_attention
from ..config import CrispConfig, method_config
from ..workloads.fit import fitted_spec
from ..workloads.mixture import fitted_classes, workload_qkv
from ..workloads.synthetic import SyntheticSpec
from .recall import plan_from_masks, plan_recall, same_budget_oracle

ROW_KEYS = ("n", "method", "workload", "ms", "speedup_vs_cudnn", "density", "routing_ms", "routing_share",
            "rel_error", "recall", "gpu")
DENSE = ("dense_cudnn", "dense_fa2")
SPARSE = ("crisp", "flexprefill", "crisp_gamma", "crisp_jsd")
METHODS = DENSE + SPARSE
SHAPES = {"llama3_8b": (32, 8, 128), "smollm2": (9, 3, 64), "qwen": (14, 2, 64)}
SYNTHETIC = {"synthetic": fitted_spec, "synthetic_classes": fitted_classes,  # fitted to SmolLM2
             "synthetic_plain": SyntheticSpec}  # hand-set


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
    return reference.plan(q, k, cfg)[1]


def method_plan(q, k, cfg: CrispConfig, max_n: int):
    """The method's Plan on one sequence (q [1, n, H, d]): on CUDA the kernels' own, at every length; on
    the CPU one from the reference masks, up to max_n, else None."""
    n = q.shape[1]
    if q.is_cuda:
        from ..kernels.pipeline import plan

        return plan(q[0], k[0], torch.tensor([0, n], dtype=torch.int32, device=q.device), n, cfg)
    if n > max_n:
        return None
    return plan_from_masks([reference_masks(q[0].float().cpu(), k[0].float().cpu(), cfg)])


def _one_sequence(q, k, v):
    """q, k, v [1, n, ·, d] → [n, ·, d]; fp32 on the CPU, where the reference masks and recall run."""
    return tuple(t[0] if t.is_cuda else t[0].float() for t in (q, k, v))


def run_op(lengths=(512, 1024), shapes=("smollm2",), methods=METHODS, workloads=("synthetic",), repeats=5,
           device="cpu", dtype=None, base: CrispConfig | None = None, recall_max_n: int = 16384,
           spec: SyntheticSpec | None = None, progress=None, real_layers=(0, 15, 29), model_path=None,
           on_rows=None, real_source: str = "licenses"):
    """Benchmark rows (list of dicts with ROW_KEYS), in (workload, shape, n) order. Dense timings are
    measured once per (shape, n) and shared by the workloads (they do not depend on the values); a
    method that raises is reported on stderr and skipped; on_rows(rows) is called after every input.
    Workload "real": the model at model_path (default SmolLM2; "qwen" for the bundled Qwen) on `real_source`
    text (workloads.real.text_ids), `real_layers` of it (None: every layer) plus their sum (run_real_model),
    with YaRN past the model's native context (models.rope_for)."""
    unknown = [w for w in workloads if w != "real" and w not in SYNTHETIC]
    if unknown:
        raise ValueError(f"workloads={unknown}: expected some of {['real', *SYNTHETIC]}")
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    base = base or CrispConfig()
    rows, dense_ms = [], {}
    gpu = gpu_name(device)
    for workload in workloads:
        if workload == "real":
            rows += [{key: r.get(key) for key in ROW_KEYS} for r in
                     _real_rows(model_path, lengths, methods, real_layers, real_source, repeats, device, dtype, base,
                                progress)]
            if on_rows is not None:
                on_rows(rows)
            continue
        for shape in shapes:
            for n in lengths:
                wname, (q, k, v) = synthetic_input(workload, shape, n, spec, device, dtype)
                group = _measure(q, k, v, n, wname, methods, repeats, device, base, recall_max_n, gpu,
                                 dense_ms.setdefault((shape, n), {}), progress)
                rows += [{key: r.get(key) for key in ROW_KEYS} for r in group]
                del q, k, v
                if on_rows is not None:
                    on_rows(rows)
    return rows


def _real_rows(model_path, lengths, methods, layers, source, repeats, device, dtype, base, progress):
    from pathlib import Path

    from ..models import load_model, model_path as resolve, rope_for

    path = resolve(model_path)
    model, tok = load_model(path, attn_implementation="sdpa", device=device,
                            dtype=dtype if torch.device(device).type == "cuda" else torch.float32)
    name = str(model_path) if str(model_path) in ("smollm2", "qwen") else Path(path).stem.split(".")[0].lower()
    return run_real_model(model, tok, lengths, sources=(source,), methods=methods, rope=rope_for(model),
                          repeats=repeats, base=base, model_name=name, layers=layers, progress=progress)


def _measure(q, k, v, n, wname, methods, repeats, device, base, recall_max_n, gpu, dense_ms, progress,
             configs: dict | None = None, oracle_rows: int = 0):
    """Rows of `methods` and of the extra named CRISP `configs` on one input, against one dense reference."""
    ref = dense_prefill_attention(q, k, v).float()
    group = []
    for method in (*methods, *(configs or {})):
        try:
            if method in DENSE:
                if method not in dense_ms:
                    same = not q.is_cuda and method == "dense_fa2" and "dense_cudnn" in dense_ms
                    dense_ms[method] = dense_ms["dense_cudnn"] if same else \
                        median_ms(dense_fn(method, q, k, v), repeats, device)
                group.append(dict(n=n, method=method, workload=wname, ms=dense_ms[method], density=1.0,
                                  routing_ms=0.0, routing_share=0.0, rel_error=0.0, recall=1.0, gpu=gpu))
            else:
                cfg = (configs or {}).get(method) or method_config(method, base)
                group.append(dict(n=n, method=method, workload=wname, gpu=gpu,
                                  **sparse_numbers(q, k, v, cfg, ref, repeats, device, recall_max_n,
                                                   oracle_rows=oracle_rows)))
        except Exception as exc:  # one broken method must not cost the other rows
            print(f"crisp-bench op: {wname} n={n} {method} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        if progress is not None:
            progress.update(1)
    base_ms = dense_ms.get("dense_cudnn")
    for row in group:
        row["speedup_vs_cudnn"] = None if base_ms is None else base_ms / row["ms"]
    return group


def sparse_numbers(q, k, v, cfg: CrispConfig, ref, repeats, device, recall_max_n, routing=True,
                   oracle_rows=0) -> dict:
    """One sparse config on q, k, v [1, n, H, d]: ms, density, routing ms and share (unless routing=False),
    rel. error against `ref` (dense output, fp32) and recall; with oracle_rows, the plan's and the
    same-budget oracle's error on that many rows in whole query blocks spread over the sequence
    (bench.recall.same_budget_oracle, where="spread"), None where recall is."""
    ms = median_ms(lambda: crisp_prefill_attention(q, k, v, config=cfg), repeats, device)
    out, st = crisp_prefill_attention(q, k, v, config=cfg, return_stats=True)
    routing_ms = _routing_ms(q, k, cfg, repeats, device) if routing else None
    p = method_plan(q, k, cfg, recall_max_n)
    q0, k0, v0 = _one_sequence(q, k, v)
    row = dict(ms=ms, density=st.mean_density, routing_ms=routing_ms,
               routing_share=None if routing_ms is None else routing_ms / ms,
               rel_error=float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)),
               recall=None if p is None else plan_recall(q0, k0, p, cfg.block_size))
    if oracle_rows:
        o = same_budget_oracle(q0, k0, v0, p, cfg.block_size, rows=oracle_rows, where="spread") if p is not None else {}
        row.update(sampled_error=o.get("plan_rel_err"), oracle_error=o.get("oracle_rel_err"))
    return row


def synthetic_input(workload, shape, n, spec, device, dtype):
    """(name, (q, k, v)) of a synthetic workload at one shape and length, seeded by n."""
    heads, kv, d = SHAPES[shape]
    spec = spec or SYNTHETIC[workload]()
    return f"{workload}_{shape}", workload_qkv(spec, n, heads, kv, d, seed=n, device=device, dtype=dtype)


def run_real_model(model, tok, lengths, sources=("code",), methods=("dense_cudnn", "crisp", "flexprefill"),
                   configs: dict | None = None, rope=None, repeats=5, base: CrispConfig | None = None,
                   oracle_rows: int = 256, model_name: str = "model", progress=None, on_rows=None, layers=None):
    """Every layer of a real model on real text: per (source, n) one capture (workloads.real.capture, kept on
    the model's device in its dtype; `layers`: None = every layer), then per layer the op rows of `methods` and of the extra named CRISP
    `configs` (sparse rows add sampled_error / oracle_error: the plan's and the same-budget oracle's error
    on `oracle_rows` spread rows), and per (source, n, method) one row "<model>_<source>_all" summed over the
    layers (its "layers" says how many): ms (sum), speedup_vs_cudnn (sum of cuDNN's over the sum), density / error / recall / oracle error
    (means over layers), max_error. cuDNN is timed once per n (the shape is every layer's). rope(n) → the
    rope scaling to use at n (None: native)."""
    from ..workloads.real import capture, text_ids
    from .accuracy import use_rope

    base = base or CrispConfig()
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype if device.type == "cuda" else torch.float32
    gpu, rows = gpu_name(device), []
    for n in lengths:
        use_rope(model, rope, n)
        dense_ms: dict = {}
        for source in sources:
            grabbed = capture(model, text_ids(tok, n, source=source), layers, out_device=device, dtype=dtype)
            layer_rows = []
            for layer in sorted(grabbed):
                q, k, v = grabbed.pop(layer)
                wname = f"{model_name}_{source}_L{layer}"
                group = _measure(q, k, v, n, wname, methods, repeats, device, base, 1 << 30, gpu, dense_ms, progress,
                                 configs, oracle_rows)
                layer_rows += [{**row, "layer": layer} for row in group]
                del q, k, v
            rows += layer_rows + model_sums(layer_rows, f"{model_name}_{source}_all")
            if on_rows is not None:
                on_rows(rows)
    return rows


def model_sums(layer_rows, workload: str) -> list[dict]:
    """One row per (n, method) summed over the layers of `layer_rows` (see run_real_model)."""
    out = []
    for n, method in dict.fromkeys((r["n"], r["method"]) for r in layer_rows):
        rs = [r for r in layer_rows if r["n"] == n and r["method"] == method]
        dense = [r for r in layer_rows if r["n"] == n and r["method"] == "dense_cudnn"]
        mean = lambda key: (sum(r[key] for r in rs) / len(rs)) if all(r.get(key) is not None for r in rs) else None  # noqa: E731
        total = sum(r["ms"] for r in rs)
        out.append(dict(n=n, method=method, workload=workload, layers=len(rs), ms=total,
                        speedup_vs_cudnn=sum(r["ms"] for r in dense) / total if len(dense) == len(rs) else None,
                        density=mean("density"), rel_error=mean("rel_error"),
                        max_error=max(r["rel_error"] for r in rs), recall=mean("recall"),
                        routing_ms=sum(r["routing_ms"] or 0.0 for r in rs), sampled_error=mean("sampled_error"),
                        oracle_error=mean("oracle_error"), gpu=rs[0]["gpu"]))
    return out


def _routing_ms(q, k, cfg, repeats, device):
    if q.is_cuda:
        try:
            from ..kernels.pipeline import routing_only
        except ImportError:
            return None
        return median_ms(lambda: routing_only(q, k, cfg), repeats, device)
    qc, kc = q[0], k[0]
    if qc.shape[0] < max(cfg.dense_below, 1):
        return 0.0
    return median_ms(lambda: reference_masks(qc, kc, cfg), max(1, repeats // 2), device)


def write_results(rows, out_dir="bench/results/latest/op", plots=True) -> str:
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
